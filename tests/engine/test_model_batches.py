"""The readers model (``test_model_readers.py``) driven where the engine's short paths live:
sends of runs of plain messages (``appending``: the lone send, the run of 4 or more), receives
of many at once (``leaserun``: a run of first deliveries from one lane, batch rows of up to
64 leases, more than one row), receives within a byte budget (``max_bytes``, as a server
passes its frame budget: the first delivery always, then only what fits, and a default-mode
``peek`` with the same budget shows the same), and deletes of slices of a receive's receipts
(``deleting``: a run, a lone delete, a run broken by a stale or repeated receipt).

Every rule and check of the readers machine runs too; the model decides every answer.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter, defaultdict
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from lamina.engine import Delivery, Engine
from lamina.engine.clock import CLOCK_AHEAD_MS
from lamina.engine.counters import day_name
from lamina.engine.state import DAY_MS
from lamina.engine.lessor import DELIVERY_OVERHEAD_BYTES
from lamina.engine.records import PREFIX_SIZE

try:  # tests/engine is a package
    from . import strategies as S
    from .model import (DEAD, DELETED, ModelMessage, ModelQueue, ModelTag, error_name,
                        machine_settings)
    from .test_model_readers import ReadersMachine, queue_index
except ImportError:  # rootdir-relative import (tests/engine on sys.path)
    import strategies as S  # type: ignore[no-redef]
    from model import (DEAD, DELETED, ModelMessage, ModelQueue,  # type: ignore[no-redef]
                       ModelTag, error_name, machine_settings)
    from test_model_readers import ReadersMachine, queue_index  # type: ignore[no-redef]

#: Plain bodies (bytes: the short paths' case) and a few entries that are not plain.
plain_bodies = st.binary(min_size=1, max_size=24)
run_entries = st.one_of(plain_bodies, plain_bodies, plain_bodies, S.reader_entries)


def fitting(records: list[int], max_bytes: int) -> int:
    """How many deliveries of records of these lengths a receive within ``max_bytes`` makes:
    the first always, then each while the summed sizes (each its stored value and the
    delivery's overhead) stay within the budget."""
    spent = 0
    for index, size in enumerate(records):
        spent += PREFIX_SIZE + size + DELIVERY_OVERHEAD_BYTES
        if index and spent > max_bytes:
            return index
    return len(records)


class BatchesMachine(ReadersMachine):
    def __init__(self) -> None:
        super().__init__()
        self.last_batch: tuple[str, str | None, ModelTag, list[Delivery]] | None = None
        # The daily counters (DESIGN.md §8) as the model counts them: (queue, tag uid or 0
        # for the queue's own, day) -> figures; ``dead`` and ``expired`` over all days, by
        # (queue, tag uid).
        self.counted: dict[tuple[str, int, int], Counter[str]] = defaultdict(Counter)
        self.other_counted: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
        self.messages_seen: dict[str, int] = {}
        self.expired_seen: dict[str, int] = {}
        delete = self.model.delete

        def counting_delete(t: ModelTag, m: ModelMessage) -> None:
            queue = next(q.name for q in self.model.queues.values() if t in q.tags.values())
            self.counted[(queue, t.uid, self.now // DAY_MS)]["deleted"] += 1
            delete(t, m)

        self.model.delete = counting_delete  # type: ignore[method-assign]

    # Rules of the readers machine left out here (plain methods replace them), so that the
    # ones below are drawn often enough: listings and the second copies of its sends and
    # receives.
    def list_tags(self, index: int) -> None: ...

    def peek_from(self, *args: Any) -> None: ...

    def peek_ids(self, *args: Any) -> None: ...

    def send_more(self, *args: Any) -> None: ...

    def send_to_alpha(self, *args: Any) -> None: ...

    def receive_more(self, *args: Any) -> None: ...

    def get_queue(self, index: int) -> None: ...

    # -- the daily counters ------------------------------------------------------------------

    def count_new_messages(self) -> None:
        """Count the messages the model learnt of since the last look (sends, and dead-letter
        copies): ``sent`` / ``bytes_in`` once for the queue and for each tag receiving it
        (tags that exist now: a tag counts no send from before it existed); a copy counts
        ``dead`` for the tag it died under."""
        for q in self.model.queues.values():
            for m in q.messages[self.messages_seen.get(q.name, 0):]:
                day = self.now // DAY_MS
                for uid in [0] + [t.uid for t in q.tags.values() if t.scope(m)]:
                    self.counted[(q.name, uid, day)].update(sent=1, bytes_in=len(m.data))
                if m.dead is not None:
                    self.other_counted[(m.dead[0], m.dead_tag.uid)]["dead"] += 1
            self.messages_seen[q.name] = q.next_seq
            # ``expired`` (per tag: expired while not Ended for it; purged ones are not)
            expired = q.expired_seq(self.now)
            for m in q.messages[max(self.expired_seen.get(q.name, 0), q.purge):expired]:
                for t in q.tags.values():
                    # (a message gone when the tag was created never existed for it)
                    if (t.scope(m) and m.seq >= t.gone_at_creation
                            and self.model.view(t, m).status not in (DELETED, DEAD)):
                        self.other_counted[(q.name, t.uid)]["expired"] += 1
            self.expired_seen[q.name] = max(self.expired_seen.get(q.name, 0), expired)

    def sync(self) -> None:
        super().sync()
        self.count_new_messages()

    def after(self) -> None:
        super().after()
        self.count_new_messages()

    def do_receive(self, q: ModelQueue, name: str | None, t: ModelTag | None, count: int,
                   visibility: float | None, max_bytes: int | None = None,
                   options: list[list[ModelMessage]] | None = None) -> list[Delivery]:
        got = super().do_receive(q, name, t, count, visibility, max_bytes, options)
        if got:
            assert t is not None
            self.counted[(q.name, t.uid, self.now // DAY_MS)].update(
                received=len(got), bytes_out=sum(len(d.record) for d in got))
        return got

    def check_counters(self) -> None:
        """``stats`` of every queue and tag against the model's counts: per day ``sent``,
        ``received``, ``deleted`` and the bytes; ``dead`` over the days (a move that came
        due before midnight and was applied after it may count on either day); the queue's
        totals sum its tags' (its own ``sent`` and ``bytes_in`` once)."""
        fields = ("sent", "received", "deleted", "bytes_in", "bytes_out")
        for q in self.model.queues.values():
            tags = list(q.tags.values())
            for t in [None] + tags:
                rows = self.engine.stats(q.name, tag=None if t is None else t.name, days=31)
                got = {row["day"]: {f: row[f] for f in fields} for row in rows}
                got = {day: row for day, row in got.items() if any(row.values())}
                want: dict[str, dict[str, int]] = {}
                uids = [u.uid for u in tags] if t is None else [t.uid]
                for (queue, uid, day), figures in self.counted.items():
                    if queue != q.name or (uid not in uids and uid != 0):
                        continue
                    row = want.setdefault(day_name(day), dict.fromkeys(fields, 0))
                    for f in fields:
                        # the queue's own sends (uid 0), else the tag's (or the tags') figures
                        if (uid == 0) == (t is None and f in ("sent", "bytes_in")):
                            row[f] += figures[f]
                want = {day: row for day, row in want.items() if any(row.values())}
                where = f"stats of {q.name}" + ("" if t is None else f", tag {t.name}")
                assert got == want, f"{where}: got {got}, want {want}"
                for f in ("dead", "expired"):
                    total = sum(row[f] for row in rows)
                    want_total = sum(self.other_counted[(q.name, u)][f] for u in uids)
                    assert total == want_total, f"{where}: {f} {total}, want {want_total}"

    @rule()
    def counters(self) -> None:
        self.sync()
        self.check_counters()

    @rule(really=st.integers(0, 3))
    def reopen(self, really: int) -> None:  # the readers' rule, then the counters
        super().reopen(really)
        if not really:
            self.check_counters()

    @rule(really=st.integers(0, 3))
    def crash(self, really: int) -> None:
        """The process dies (no ``close``): what it acknowledged is in the WAL, so a copy of
        the data directory taken now opens with every message, lease, receipt and figure
        (the receives whose figures were held back are counted again from their leases)."""
        if really:
            return
        self.sync()
        for attempt in range(10):  # RocksDB may drop a file compacted meanwhile: again
            copy = tempfile.mkdtemp(prefix="lamina-crashed-")
            try:
                shutil.copytree(self.path, copy, dirs_exist_ok=True)
                break
            except shutil.Error:
                shutil.rmtree(copy, ignore_errors=True)
                if attempt == 9:
                    raise
        self.engine.close()  # the original directory is left behind as it is
        shutil.rmtree(self.path, ignore_errors=True)
        self.path = copy
        # A restart takes longer than the clock row runs ahead of the clock (docs/STORAGE.md
        # "The clock"): a reopened engine whose clock is behind that row holds time there.
        self.clock.advance(CLOCK_AHEAD_MS)
        self.engine = Engine.open(self.path, clock=self.clock, **self.options)
        self.sync()
        self.check_counters()

    @rule(index=queue_index, change=st.sampled_from([
        {"visibility_timeout": 1}, {"visibility_timeout": 2}, {"visibility_timeout": 30},
        {"delay": 0}, {"delay": 1}, {"max_messages": 1}, {"max_messages": 5},
        {"max_messages": 100_000_000}, {"max_message_size": 1024},
        {"max_message_size": 262144}, {"polling_wait": 3},
        {"redrive": None}, {"redrive": {"dlq": "Beta", "max_receives": 1}},
        {"redrive": {"dlq": "beta", "max_receives": 2}},
        {"retention": 60}, {"retention": 120}, {"retention": 345600}]))
    def set_attributes(self, index: int, change: dict[str, Any]) -> None:
        """``set_queue_attributes`` mid-run (``rewind`` aside): what comes next follows the
        new values — a lease that ends moves to the DLQ by the policy in force then, sends
        by the new limits and default delay, expiry by the new retention (a shorter one
        expires messages at once; a longer one brings nothing back)."""
        self.sync()
        q = self.queue(index)
        if "redrive" in change and q.name != "alpha":
            return  # Beta is alpha's DLQ (a DLQ cannot have a policy)
        if change.get("redrive") is not None:
            change = {"redrive": {**change["redrive"], "dlq": "Beta"}}  # as resolved
        merged = {**q.attrs, **change}
        if merged["rewind"] > merged.get("retention"):
            return
        assert self.engine.set_queue_attributes(q.name, change) == merged
        if "retention" in change:
            q.set_retention(change["retention"], self.now)
        q.attrs = merged
        event(f"set attributes: {next(iter(change))}")
        self.after()

    @rule(offset=st.sampled_from([-1, 0, 1]))
    def to_midnight(self, offset: int) -> None:
        """Onto (or 1 ms around) the next day's start: the counters' day rolls over."""
        self.clock.advance((self.now // DAY_MS + 1) * DAY_MS + offset - self.now)

    @initialize(plain=st.integers(0, 2))
    def choose_mode(self, plain: int) -> None:
        """Two runs in three send no topic and no priority: a queue with one lane in use and
        tags without topic heads, where the short paths apply (once a second lane or a
        topic is in use, most of them step aside)."""
        self.plain = plain > 0
        event(f"mode: {'plain' if self.plain else 'mixed'}")

    def send(self, index: int, entries: list[Any]) -> None:  # the helper, no longer a rule
        if getattr(self, "plain", False):
            entries = [e for e in entries if not isinstance(e, dict)
                       or (e.get(3) is None and e.get(4) in (None, 8))]
            if not entries:
                return
        super().send(index, entries)

    @rule(index=queue_index, entries=S.reader_batches)
    def send_entries(self, index: int, entries: list[Any]) -> None:
        self.send(index, entries)

    @rule(index=queue_index, bodies=st.lists(plain_bodies, min_size=4, max_size=70))
    def send_plain_run(self, index: int, bodies: list[bytes]) -> None:
        self.send(index, bodies)

    @rule(index=queue_index, bodies=st.lists(plain_bodies, min_size=4, max_size=70))
    def send_plain_run_more(self, index: int, bodies: list[bytes]) -> None:
        self.send(index, bodies)

    @rule(index=queue_index, entries=st.lists(run_entries, min_size=1, max_size=12))
    def send_mixed_run(self, index: int, entries: list[Any]) -> None:
        self.send(index, entries)

    @rule(index=queue_index, body=plain_bodies)
    def send_lone(self, index: int, body: bytes) -> None:
        self.send(index, [body])

    def record_sizes(self, q: ModelQueue, name: str | None, messages: list[ModelMessage]
                     ) -> list[int]:
        """The stored record length of each message (peek never changes anything)."""
        if not messages:
            return []
        page = self.engine.peek(q.name, tag=name, ids=[m.id for m in messages])
        return [len(p.record) for p in page.messages]

    def receive_batch(self, index: int, data: st.DataObject, count: int,
                      max_bytes: int | None, visibility: float | None) -> None:
        self.sync()
        q = self.queue(index)
        name, t = self.draw_tag(data, q, missing=False)
        assert t is not None
        if max_bytes is None:
            got = self.do_receive(q, name, t, count, visibility)
        else:
            now = self.now
            options = self.model.orders(q, t, now, count)
            cut = [o[:fitting(self.record_sizes(q, name, o), max_bytes)] for o in options]
            page = self.engine.peek(q.name, tag=name, max=count, max_bytes=max_bytes)
            peeked = [p.message.id for p in page.messages]
            assert peeked in [[m.id for m in o] for o in cut], (
                f"peek max={count} max_bytes={max_bytes}: got seqs "
                f"{[self.seq_of(q, i) for i in peeked]}, want {[m.seq for m in cut[0]]}")
            got = self.do_receive(q, name, t, count, visibility, max_bytes=max_bytes,
                                  options=cut)
            assert [d.id for d in got] == peeked, "receive after peek returned something else"
            if len(got) < len(options[0]):
                event("receive batch: cut by max_bytes")
        event(f"receive batch: {'0' if not got else '1-4' if len(got) < 5 else '5-63' if len(got) < 64 else '64+'}")
        self.last_batch = (q.name, name, t, list(got))

    @rule(index=queue_index, data=st.data(), count=st.integers(3, 70),
          visibility=st.none() | st.sampled_from([1, 2, 3]))
    def receive_many(self, index: int, data: st.DataObject, count: int,
                     visibility: float | None) -> None:
        self.receive_batch(index, data, count, None, visibility)

    @rule(index=queue_index, data=st.data(), count=st.integers(1, 70),
          max_bytes=st.integers(0, 2000), visibility=st.none() | st.sampled_from([1, 2]))
    def receive_within(self, index: int, data: st.DataObject, count: int, max_bytes: int,
                       visibility: float | None) -> None:
        self.receive_batch(index, data, count, max_bytes, visibility)

    @rule(index=queue_index, data=st.data(), count=st.integers(3, 70),
          max_bytes=st.none() | st.none() | st.integers(0, 2000))
    def consume_batch(self, index: int, data: st.DataObject, count: int,
                      max_bytes: int | None) -> None:
        """A consumer's loop: a receive of many, then one delete of all its receipts."""
        self.receive_batch(index, data, count, max_bytes, None)
        queue, name, t, got = self.last_batch  # type: ignore[misc]
        if got:
            self.delete_these(self.model.queues[queue], name, t, [d.receipt for d in got])

    def has_batch(self) -> bool:
        return self.last_batch is not None and bool(self.last_batch[3])

    @precondition(has_batch)
    @rule(data=st.data(), how=st.sampled_from(["all", "all", "slice", "one", "reversed",
                                                "repeat", "skip one", "with a stranger"]))
    def delete_from_batch(self, data: st.DataObject, how: str) -> None:
        """Delete receipts of the last receive as a consumer would: all in order (the run),
        a slice, one, or a run broken by a repeat, a gap or another receipt."""
        self.sync()
        queue, name, t, got = self.last_batch  # type: ignore[misc]
        q = self.model.queues[queue]
        if q.tag(name) is not t:  # the tag was deleted (or re-created) since
            return
        receipts = [d.receipt for d in got]
        n = len(receipts)
        i = data.draw(st.integers(0, n - 1), label="from")
        j = data.draw(st.integers(i + 1, n), label="to")
        if how == "slice":
            receipts = receipts[i:j]
        elif how == "one":
            receipts = [receipts[i]]
        elif how == "reversed":
            receipts = receipts[::-1]
        elif how == "repeat":
            receipts = receipts[:j] + [receipts[i]] + receipts[j:]
        elif how == "skip one" and n > 1:
            del receipts[i]
        elif how == "with a stranger" and self.receipts:
            stranger = data.draw(st.sampled_from(self.receipts[-20:]), label="stranger")
            receipts.insert(i, stranger.raw)
        event(f"delete from batch: {how}")
        self.delete_these(q, name, t, receipts)

    def delete_these(self, q: ModelQueue, name: str | None, t: ModelTag,
                     receipts: list[bytes]) -> None:
        expected = []
        for raw in receipts:
            outcome = self.receipt_outcome(q, t, raw)
            if outcome == "current":
                self.model.delete(t, q.messages[self.issued[raw].seq])
                outcome = "ok"
            expected.append(outcome)
        results = self.engine.delete(q.name, receipts, tag=name)
        assert [error_name(r) for r in results] == expected
        self.after()


BatchesMachine.TestCase.settings = machine_settings(25, 40)
TestBatchesModel = BatchesMachine.TestCase
