"""Model-based test of the engine's reader semantics (DESIGN.md §2): tags, topics, dead-letter
queues, rewind, peek and delete_by_id, on top of the core of ``test_model.py``.

A Hypothesis ``RuleBasedStateMachine`` drives the real ``Engine`` and the reference model of
``model.py`` side by side: two queues, ``alpha`` (often with a redrive policy naming ``Beta``)
and ``Beta`` (its DLQ, and an ordinary queue too), tags created and deleted with starts and
filters, messages with topics, priorities, delays and attributes the filters look at, rewinds,
redrives, purges, a fake clock and reopening. Every result is checked against the model: the
exact sequence of a receive on any tag, per-entry outcomes, the DLQ copies, every peek mode,
and the stats of ``get_queue`` (watermarks included).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lamina.engine import (
    Delivery,
    Engine,
    FakeClock,
    InvalidArgument,
    InvalidReceipt,
    LaminaError,
    MessageNotFound,
    NoDeadLetterQueue,
    Peeked,
    QueueFull,
    Redriven,
    RewindDisabled,
    RewindOutOfRange,
    Rewound,
    Sent,
    StaleReceipt,
    TagAlreadyExists,
    TagInfo,
    TagNotFound,
    VisibilityChanged,
)

try:  # tests/engine is a package
    from . import strategies as S
    from .model import (
        DEAD,
        DEFAULTS,
        DELETED,
        INFLIGHT,
        LEASED,
        Invalid,
        Model,
        ModelMessage,
        ModelQueue,
        ModelTag,
        Parsed,
        error_name,
        floor_ms,
        machine_settings,
        visibility_entry_ok,
        parse_entry,
        typed,
    )
except ImportError:  # rootdir-relative import (tests/engine on sys.path)
    import strategies as S  # type: ignore[no-redef]
    from model import (  # type: ignore[no-redef]
        DEAD, DEFAULTS, DELETED, INFLIGHT, LEASED, Invalid, Model,
        ModelMessage, ModelQueue, ModelTag, Parsed, error_name, floor_ms,
        machine_settings, parse_entry, typed, visibility_entry_ok)

START_MS = 1_700_000_000_000
QUEUE_NAMES = ("alpha", "Beta")   # alpha's DLQ, when it has a redrive policy, is Beta
queue_index = st.integers(min_value=0, max_value=1)


@dataclass(frozen=True)
class Issued:
    """A receipt the engine handed out, as the model knows it."""

    queue: str
    tag: int        # the tag's uid
    seq: int
    lease: int
    raw: bytes


class ReadersMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="lamina-readers-")
        self.clock = FakeClock(START_MS)
        self.engine: Engine | None = None
        self.options: dict[str, Any] = {}
        self.model = Model(START_MS)
        self.issued: dict[bytes, Issued] = {}
        self.receipts: list[Issued] = []
        self.ids: set[str] = set()
        self.stats_every_step = True

    # -- setup / teardown ------------------------------------------------------------------

    @initialize(alpha=S.reader_queue_attributes(), beta=S.reader_queue_attributes(),
                max_receives=st.sampled_from([None, 1, 2, 2]), options=S.engine_options,
                stats_every_step=st.booleans())
    def open_engine(self, alpha: dict[str, Any], beta: dict[str, Any], max_receives: int | None,
                    options: dict[str, Any], stats_every_step: bool) -> None:
        self.options = options
        self.stats_every_step = stats_every_step
        self.engine = Engine.open(self.path, clock=self.clock, **options)
        if max_receives is not None:
            alpha = {**alpha, "redrive": {"dlq": "Beta", "max_receives": max_receives}}
            event(f"setup: redrive max_receives {max_receives}")
        for name, attrs in (("Beta", beta), ("alpha", alpha)):
            resolved = {**DEFAULTS, **attrs}
            info = self.engine.create_queue(name, attrs)
            assert info.attributes == resolved and info.created == self.now
            self.model.add_queue(name, resolved)

    def teardown(self) -> None:
        try:
            if self.engine is not None:
                self.engine.close()
        finally:
            shutil.rmtree(self.path, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.clock.now_ms

    def queue(self, index: int) -> ModelQueue:
        return self.model.queues[QUEUE_NAMES[index % 2]]

    def sync(self) -> None:
        """Bring the model to the clock (deadlines that passed, in time order) and learn the
        DLQ copies of the moves that happened meanwhile; raise the watermarks."""
        self.model.sweep(self.now)
        self.learn_copies()
        self.model.settle(self.now)

    def after(self) -> None:
        """After an operation: categories at now, copies of the moves it made, watermarks."""
        self.model.recompute(self.now)
        self.learn_copies()
        self.model.settle(self.now)

    def learn_copies(self) -> None:
        """Peek each DLQ from the earliest pending move on: the copies the engine appended."""
        pending = self.model.pending
        for dlq in {id(p.dlq): p.dlq for p in pending}.values():
            start = min(p.dead_time for p in pending if p.dlq is dlq)
            records, after = [], None
            for _ in range(100):
                page = self.engine.peek(dlq.name, start=start, after=after, max=1000)
                records += [p.message for p in page.messages if p.message.id not in self.ids]
                if page.next is None:
                    break
                after = page.next
            event(f"dead letters: {min(len(records), 3)} copies at once")
            problems = self.model.resolve(dlq, records)
            assert not problems, "\n".join(problems)
            self.ids.update(r.id for r in records)

    def pin(self, q: ModelQueue) -> None:
        """Where the model only knows bounds for ``gone_seq``, learn the engine's value (and
        check everything else ``get_queue`` shows) before an operation that depends on it."""
        if q.gone < q.gone_high:
            event("gone_seq: the engine's value lies between the bounds")
            self.check_stats(q)

    def draw_tag(self, data: st.DataObject, q: ModelQueue, missing: bool = True
                 ) -> tuple[str | None, ModelTag | None]:
        """A tag argument and the tag it names: the default one (as None or by name in any
        letter case), a created one, or (sometimes) one that does not exist."""
        names = [t.name for t in q.sorted_tags()]
        choices = [st.none(), st.sampled_from(names), st.sampled_from(names),
                   st.sampled_from(names).map(str.upper)]
        if missing:
            choices.append(st.sampled_from(S.TAG_NAMES))
        name = data.draw(st.one_of(choices), label="tag")
        return name, q.tag(name)

    def issue(self, q: ModelQueue, t: ModelTag, m: ModelMessage, raw: object) -> None:
        assert type(raw) is bytes and raw, f"receipt {raw!r} is not a byte string"
        assert raw not in self.issued, "the engine issued the same receipt twice"
        x = self.model.view(t, m)
        self.model.lease_counter += 1
        x.lease = self.model.lease_counter
        record = Issued(q.name, t.uid, m.seq, x.lease, raw)
        self.issued[raw] = record
        self.receipts.append(record)

    def receipt_outcome(self, q: ModelQueue, t: ModelTag, raw: object) -> str:
        record = self.issued.get(raw) if type(raw) is bytes else None
        if record is None or record.queue != q.name or record.tag != t.uid:
            return "InvalidReceipt"
        current = self.model.is_current(q, t, record.seq, record.lease, self.now)
        return "current" if current else "StaleReceipt"

    def draw_receipt_target(self, data: st.DataObject, index: int
                            ) -> tuple[ModelQueue, str | None, ModelTag | None]:
        """Queue and tag for delete / dead / change_visibility: mostly those of a receipt that
        is current now (so that they do something), else any (most receipts then fail)."""
        now = self.now
        current = [r for r in self.receipts
                   if self.model.is_current(self.model.queues[r.queue],
                                            self.tag_by_uid(r.queue, r.tag), r.seq, r.lease, now)]
        if current and data.draw(st.integers(0, 3), label="around a current receipt"):
            r = data.draw(st.sampled_from(current), label="current receipt")
            q = self.model.queues[r.queue]
            t = self.tag_by_uid(r.queue, r.tag)
            name = None if t.name == "default" and data.draw(st.booleans(), label="as None") \
                else data.draw(st.sampled_from([t.name, t.name.upper()]), label="tag name")
            return q, name, t
        q = self.queue(index)
        name, t = self.draw_tag(data, q)
        return q, name, t

    def tag_by_uid(self, queue: str, uid: int) -> ModelTag:
        q = self.model.queues[queue]
        found = next((t for t in q.tags.values() if t.uid == uid), None)
        return found if found is not None else ModelTag(uid, "(deleted)", 0, 0, None, 0)

    def draw_receipts(self, data: st.DataObject, q: ModelQueue, t: ModelTag) -> list[bytes]:
        now = self.now
        mine = [r for r in self.receipts if r.queue == q.name and r.tag == t.uid]
        current = [r.raw for r in mine if self.model.is_current(q, t, r.seq, r.lease, now)]
        choices: list[st.SearchStrategy[bytes]] = [S.random_receipts]
        if current:
            choices += [st.sampled_from(current)] * 4
        if mine:
            choices.append(st.sampled_from([r.raw for r in mine[-6:]]))
        if self.receipts:
            raws = [r.raw for r in self.receipts]
            choices.append(st.sampled_from(raws))
            choices.append(st.builds(
                lambda raw, at, bit: raw[:at % len(raw)] + bytes((raw[at % len(raw)] ^ bit,))
                + raw[at % len(raw) + 1:],
                st.sampled_from(raws), st.integers(0, 63), st.integers(1, 255)))
        receipts = data.draw(st.lists(st.one_of(choices), min_size=1, max_size=4),
                             label="receipts")
        if data.draw(st.integers(0, 3), label="repeat one") == 0:
            receipts.append(receipts[0])
        return receipts

    def seq_of(self, q: ModelQueue, message_id: str) -> int | str:
        m = q.by_id(message_id)
        return m.seq if m is not None else message_id

    def check_record(self, m: ModelMessage, msg: Any, where: str) -> None:
        assert msg.id == m.id, where
        assert typed(msg.body) == typed(m.body), where
        assert typed(msg.attributes) == typed(m.attributes), where
        assert (msg.topic, msg.priority, msg.enqueue_time, msg.visible_time) == \
            (m.topic, m.priority, m.enqueue, m.visible), where
        assert typed(msg.dead) == typed(m.dead), where
        assert msg.md5 == hashlib.md5(m.data).digest(), where

    # -- send / receive ----------------------------------------------------------------------

    @rule(index=queue_index, entries=S.reader_batches)
    def send(self, index: int, entries: list[Any]) -> None:
        self.sync()
        q, now = self.queue(index), self.now
        self.pin(q)
        capacity = q.attrs["max_messages"] - (q.next_seq - q.gone)
        expected: list[Parsed | type[LaminaError]] = []
        for raw in entries:
            if capacity <= 0:
                expected.append(QueueFull)
                continue
            try:
                parsed = parse_entry(raw, q.attrs)
            except Invalid as exc:
                expected.append(exc.error)
                continue
            capacity -= 1
            expected.append(parsed)
        results = self.engine.send(q.name, entries)
        assert len(results) == len(entries)
        for i, (want, got) in enumerate(zip(expected, results)):
            event(f"send: {error_name(got)}")
            if not isinstance(want, Parsed):
                assert isinstance(got, want), f"entry {i} {entries[i]!r}: want {want.__name__}, " \
                                              f"got {got!r}"
                continue
            assert isinstance(got, Sent), f"entry {i} {entries[i]!r}: want Sent, got {got!r}"
            assert got.enqueue_time == now
            assert got.md5 == hashlib.md5(want.data).digest()
            assert isinstance(got.id, str) and got.id not in self.ids, f"id {got.id!r} reused"
            assert got.id > q.last_id, "ids must sort in production order"
            self.ids.add(got.id)
            q.last_id = got.id
            if want.topic is not None:
                event("send: a topic message")
            q.messages.append(ModelMessage(
                q.next_seq, got.id, want.body, want.data, want.attributes, want.priority,
                want.topic, now, now + want.delay_ms))
        self.after()

    def do_receive(self, q: ModelQueue, name: str | None, t: ModelTag | None, count: int,
                   visibility: float | None, max_bytes: int | None = None,
                   options: list[list[ModelMessage]] | None = None) -> list[Delivery]:
        """A receive checked against the model (``options``: the answers it allows, when
        the caller narrowed the model's, e.g. to a byte budget)."""
        now = self.now
        kwargs: dict[str, Any] = {} if visibility is None else {"visibility_timeout": visibility}
        if max_bytes is not None:
            kwargs["max_bytes"] = max_bytes
        if t is None:
            with pytest.raises(TagNotFound):
                self.engine.receive(q.name, tag=name, max=count, **kwargs)
            return []
        visibility_ms = (q.attrs["visibility_timeout"] * 1000 if visibility is None
                         else floor_ms(visibility))
        if options is None:
            options = self.model.orders(q, t, now, count)
        got = self.engine.receive(q.name, tag=name, max=count, **kwargs)
        ids = [d.id for d in got]
        chosen = next((o for o in options if [m.id for m in o] == ids), None)
        assert chosen is not None, (
            f"receive on {q.name}/{t.name} max={count}: got seqs "
            f"{[self.seq_of(q, i) for i in ids]}, want {[m.seq for m in options[0]]}"
            + (f" (or {[[m.seq for m in o] for o in options[1:]]})" if options[1:] else ""))
        if chosen is not options[0]:
            event("receive: a message its topic let go, in its source's order")
        event(f"receive: {min(len(got), 2)}{'+' if len(got) >= 2 else ''} delivered")
        for m, d in zip(chosen, got):
            assert isinstance(d, Delivery)
            x = self.model.view(t, m)
            event("receive: redelivery" if x.status == LEASED else
                  "receive: a topic message" if m.topic else
                  "receive: a dead letter" if m.dead else "receive: first delivery")
            self.model.lease(t, m, now, visibility_ms)
            assert (d.dequeue_count, d.first_dequeue_time, d.next_visible_time) == \
                (x.count, x.first, x.due), f"delivery of {q.name} seq {m.seq} on {t.name}"
            self.check_record(m, d.message, f"delivery of {q.name} seq {m.seq}")
            self.issue(q, t, m, d.receipt)
        self.after()
        return got

    @rule(index=queue_index, data=st.data(), count=st.integers(1, 5),
          visibility=st.none() | S.receive_visibilities)
    def receive(self, index: int, data: st.DataObject, count: int,
                visibility: float | None) -> None:
        self.sync()
        q = self.queue(index)
        name, t = self.draw_tag(data, q)
        self.do_receive(q, name, t, count, visibility)

    # Sends and receives feed every other rule: more rules each raise their weight.
    @rule(index=queue_index, entries=S.reader_batches)
    def send_more(self, index: int, entries: list[Any]) -> None:
        self.send(index, entries)

    @rule(index=st.just(0), entries=S.reader_batches)
    def send_to_alpha(self, index: int, entries: list[Any]) -> None:
        self.send(index, entries)

    @rule(index=queue_index, data=st.data(), count=st.integers(1, 5),
          visibility=st.none() | S.receive_visibilities)
    def receive_more(self, index: int, data: st.DataObject, count: int,
                     visibility: float | None) -> None:
        self.receive(index, data, count, visibility)

    @rule(index=queue_index, data=st.data(), count=st.integers(1, 5))
    def consume(self, index: int, data: st.DataObject, count: int) -> None:
        """Receive, then delete every delivery in one batch."""
        self.sync()
        q = self.queue(index)
        name, t = self.draw_tag(data, q, missing=False)
        got = self.do_receive(q, name, t, count, None)
        if got:
            for d in got:
                self.model.delete(t, q.by_id(d.id))
            assert self.engine.delete(q.name, [d.receipt for d in got], tag=name) == \
                [None] * len(got)
            self.after()

    # -- receipts ----------------------------------------------------------------------------

    def has_receipts(self) -> bool:
        return bool(self.receipts)

    def by_receipts(self, data: st.DataObject, index: int, op: str) -> None:
        """delete / dead: per receipt None or the error that refused it."""
        self.sync()
        q, name, t = self.draw_receipt_target(data, index)
        receipts = self.draw_receipts(data, q, t) if t is not None else [b"x"]
        call = getattr(self.engine, op)
        if t is None:
            with pytest.raises(TagNotFound):
                call(q.name, receipts, tag=name)
            return
        if op == "dead" and self.model.dlq_of(q) is None:
            with pytest.raises(NoDeadLetterQueue):
                call(q.name, receipts, tag=name)
            return
        expected = []
        for raw in receipts:
            outcome = self.receipt_outcome(q, t, raw)
            if outcome == "current":
                m = q.messages[self.issued[raw].seq]
                if op == "delete":
                    self.model.delete(t, m)
                else:
                    self.model.move(q, t, m, self.now)
                outcome = "ok"
            expected.append(outcome)
        results = call(q.name, receipts, tag=name)
        for outcome in expected:
            event(f"{op}: {outcome}")
        assert [error_name(r) for r in results] == expected
        assert all(r is None for r in results if not isinstance(r, LaminaError))
        self.after()

    @precondition(has_receipts)
    @rule(index=queue_index, data=st.data())
    def delete(self, index: int, data: st.DataObject) -> None:
        self.by_receipts(data, index, "delete")

    @precondition(has_receipts)
    @rule(index=queue_index, data=st.data())
    def dead(self, index: int, data: st.DataObject) -> None:
        self.by_receipts(data, index, "dead")

    @precondition(has_receipts)
    @rule(index=queue_index, data=st.data())
    def change_visibility(self, index: int, data: st.DataObject) -> None:
        self.sync()
        now = self.now
        q, name, t = self.draw_receipt_target(data, index)
        if t is None:
            with pytest.raises(TagNotFound):
                self.engine.change_visibility(q.name, [[b"x", 0]], tag=name)
            return
        entries: list[Any] = []
        for raw in self.draw_receipts(data, q, t):
            entries.append(S.draw_visibility_entry(data, raw))
        expected: list[Any] = []
        for entry in entries:
            if not visibility_entry_ok(entry):
                expected.append(InvalidArgument)
                continue
            raw, timeout = entry
            outcome = self.receipt_outcome(q, t, raw)
            if outcome != "current":
                expected.append({"InvalidReceipt": InvalidReceipt,
                                 "StaleReceipt": StaleReceipt}[outcome])
                continue
            m = q.messages[self.issued[raw].seq]
            x = self.model.view(t, m)
            due = now + floor_ms(timeout)
            if due > now:
                x.due, x.lease = due, -1   # a new lease (its number comes with its receipt)
            else:
                self.model.end_lease_now(q, t, m, now)
                event("change_visibility: 0" + (" (dead-lettered)" if x.status == DEAD else ""))
            expected.append((m, due))
        results = self.engine.change_visibility(q.name, entries, tag=name)
        assert len(results) == len(entries)
        for i, (want, got) in enumerate(zip(expected, results)):
            event(f"change_visibility: {error_name(got)}")
            if not isinstance(want, tuple):
                assert isinstance(got, want), f"entry {i} {entries[i]!r}: want " \
                                              f"{want.__name__}, got {got!r}"
                continue
            m, due = want
            assert isinstance(got, VisibilityChanged), f"entry {i}: got {got!r}"
            assert got.next_visible_time == due
            if due > now:
                self.issue(q, t, m, got.receipt)
            else:
                assert got.receipt is None
        self.after()

    # -- tags ----------------------------------------------------------------------------------

    @rule(index=queue_index, data=st.data(), name=st.sampled_from(S.TAG_NAMES + ("Default",)),
          start=st.sampled_from(["oldest", "now", "past", "message", "future"]))
    def create_tag(self, index: int, data: st.DataObject, name: str, start: str) -> None:
        self.sync()
        q, now = self.queue(index), self.now
        self.pin(q)  # a new tag does not see what is gone by now
        flt = data.draw(S.tag_filters(dlq=index == 1), label="filter")
        if start == "past":
            arg: Any = now - data.draw(st.integers(0, 10_000), label="ms before now")
        elif start == "message" and q.messages:
            arg = data.draw(st.sampled_from(q.messages), label="message").enqueue
        elif start == "future":
            arg = now + data.draw(st.sampled_from([1, 1000, 2500]), label="ms after now")
        else:
            arg = "oldest" if start == "message" else start
        if q.tag(name) is not None:
            with pytest.raises(TagAlreadyExists):
                self.engine.create_tag(q.name, name, start=arg, filter=flt)
            return
        info = self.engine.create_tag(q.name, name, start=arg, filter=flt)
        normal = None if flt is None else {"attributes": flt["attributes"],
                                           "match": flt.get("match", "all")}
        start_ms = {"oldest": 0, "now": now}.get(arg, arg)
        assert info == TagInfo(name, start_ms, normal, now)
        event(f"create_tag: start {start}" + (" filtered" if flt else ""))
        t = self.model.add_tag(q, name, start_ms, q.next_seq if arg == "now" else 0, normal)
        t.gone_at_creation = q.gone
        self.after()

    @rule(index=queue_index, name=st.sampled_from(S.TAG_NAMES + ("default", "DEFAULT")))
    def delete_tag(self, index: int, name: str) -> None:
        self.sync()
        q = self.queue(index)
        if name.lower() == "default":
            with pytest.raises(InvalidArgument) as caught:
                self.engine.delete_tag(q.name, name)
            assert caught.value.field == "tag"
            return
        if q.tag(name) is None:
            with pytest.raises(TagNotFound):
                self.engine.delete_tag(q.name, name)
            return
        self.engine.delete_tag(q.name, name)
        del q.tags[name.lower()]
        event("delete_tag")
        self.after()

    @rule(index=queue_index)
    def list_tags(self, index: int) -> None:
        self.sync()
        q = self.queue(index)
        got = [(i.tag, i.start, i.filter, i.created) for i in self.engine.list_tags(q.name)]
        assert got == [(t.name, t.start_ms, t.filter, t.created) for t in q.sorted_tags()]

    # -- rewind, redrive, purge ----------------------------------------------------------------

    @rule(index=queue_index, data=st.data(),
          when=st.sampled_from(["window start", "now", "message", "message", "inside",
                                "too early", "too late"]))
    def rewind(self, index: int, data: st.DataObject, when: str) -> None:
        self.sync()
        q, now = self.queue(index), self.now
        window = q.attrs["rewind"] * 1000
        low = q.low(now)
        if when == "message" and q.messages[low:]:
            time = data.draw(st.sampled_from(q.messages[low:]), label="message").enqueue
            time += data.draw(st.sampled_from([0, 0, 1]), label="+ms")
        elif when == "inside" and window:
            time = now - data.draw(st.integers(0, window), label="ms before now")
        else:
            time = {"window start": now - window, "too early": now - window - 1,
                    "too late": now + 1}.get(when, now)
        all_tags = data.draw(st.booleans(), label="every tag")
        name, t = (None, None) if all_tags else self.draw_tag(data, q)
        if not all_tags and name is None:
            name = "default"  # no tag means every tag here
        if not all_tags and t is None:
            with pytest.raises(TagNotFound):
                self.engine.rewind(q.name, time, tag=name)
            return
        if not window:
            with pytest.raises(RewindDisabled):
                self.engine.rewind(q.name, time, tag=name)
            return
        if not now - window <= time <= now:
            with pytest.raises(RewindOutOfRange):
                self.engine.rewind(q.name, time, tag=name)
            return
        targets = q.sorted_tags() if all_tags else [t]
        result = self.engine.rewind(q.name, time, tag=name)
        assert result == Rewound(time, [x.name for x in targets])
        event(f"rewind: {'every tag' if all_tags else 'one tag'}")
        for x in targets:
            cats = [(m, y, c) for m, y, c in self.model.categories(q, x, now)
                    if m.enqueue >= max(time, x.start_ms)]
            if any(c == INFLIGHT for _, _, c in cats):
                event("rewind: an Inflight message keeps its lease")
            if any(y.status in (DELETED, DEAD) for _, y, _ in cats):
                event("rewind: an Ended message comes back")
            if any(y.count for _, y, c in cats if c != INFLIGHT):
                event("rewind: a dequeue_count is reset")
            if x.start_ms > time and any(m.enqueue >= time for m in q.messages[q.gone:]):
                event("rewind: before the tag's start")
        self.model.rewind(q, time, targets, now)
        self.after()

    @rule(index=st.sampled_from([1, 1, 1, 0]), data=st.data(),
          dry_run=st.sampled_from([False, False, True]),
          source=st.sampled_from([None, None, "alpha", "ALPHA", "Beta"]))
    def redrive(self, index: int, data: st.DataObject, dry_run: bool,
                source: str | None) -> None:
        self.sync()
        dlq, now = self.queue(index), self.now
        candidates = self.model.redrive_candidates(dlq, now)
        times = sorted({m.dead[2] for m, _ in candidates})
        kwargs: dict[str, Any] = {}
        if source is not None:
            kwargs["source"] = source
            candidates = [(m, tg) for m, tg in candidates if m.dead[0].lower() == source.lower()]
        if times and data.draw(st.booleans(), label="narrow by time"):
            since = data.draw(st.sampled_from([None] + times), label="since")
            until = data.draw(st.sampled_from([None] + times), label="until")
            if since is not None:
                kwargs["since"] = since
            if until is not None:
                kwargs["until"] = until
            candidates = [(m, tg) for m, tg in candidates
                          if (since is None or m.dead[2] >= since)
                          and (until is None or m.dead[2] <= until)]
        if candidates and data.draw(st.booleans(), label="max"):
            kwargs["max"] = len(candidates)
        moved = sum(tg is not None for _, tg in candidates)
        result = self.engine.redrive(dlq.name, dry_run=dry_run, **kwargs)
        assert result == Redriven(moved, len(candidates) - moved), \
            f"redrive {kwargs}: want {moved} moved, {len(candidates) - moved} skipped"
        event(f"redrive: {'dry run ' if dry_run else ''}{min(moved, 2)} moved, "
              f"{min(len(candidates) - moved, 1)} skipped")
        if not dry_run:
            for m, target in candidates:
                if target is not None:
                    self.model.redrive_one(dlq, m, target, now)
        self.after()

    # Rules that only run when they have something to work on (more weight where it counts).

    def has_dead_letters(self) -> bool:
        beta = self.model.queues.get("Beta")
        return beta is not None and any(m.dead is not None for m in beta.messages[beta.gone:])

    @precondition(has_dead_letters)
    @rule(data=st.data(), dry_run=st.sampled_from([False, False, False, True]))
    def redrive_dead_letters(self, data: st.DataObject, dry_run: bool) -> None:
        self.redrive(1, data, dry_run, None)

    def has_redelivery(self) -> bool:
        now = self.now
        return any(x.status == LEASED and x.due <= now
                   for q in self.model.queues.values() for m in q.messages[q.gone:]
                   for x in m.per.values())

    @precondition(has_redelivery)
    @rule(data=st.data(), count=st.integers(1, 5), visibility=st.sampled_from([None, 1, 2]))
    def receive_again(self, data: st.DataObject, count: int, visibility: float | None) -> None:
        """Receive on a tag that has a message whose lease ran out."""
        self.sync()
        now = self.now
        found = [(q, t) for q in self.model.queues.values() for t in q.tags.values()
                 if any(x.status == LEASED and x.due <= now for x in
                        (m.per.get(t.uid) for m in q.messages[q.gone:]) if x is not None)]
        if not found:
            return  # it ended meanwhile (expired, dead-lettered)
        q, t = data.draw(st.sampled_from(found), label="queue and tag")
        self.do_receive(q, t.name, t, count, visibility)

    def has_rewind(self) -> bool:
        return any(q.attrs["rewind"] for q in self.model.queues.values())

    @precondition(has_rewind)
    @rule(data=st.data(), when=st.sampled_from(["window start", "message", "inside"]))
    def rewind_window(self, data: st.DataObject, when: str) -> None:
        index = 0 if self.model.queues["alpha"].attrs["rewind"] else 1
        self.rewind(index, data, when)

    @rule(index=queue_index, really=st.integers(0, 3))
    def purge(self, index: int, really: int) -> None:
        if really:  # one draw in four: a purge wipes what the other rules built up
            return
        self.sync()
        q = self.queue(index)
        purged = self.engine.purge_queue(q.name)
        problem = self.model.learn_gone(q, q.next_seq - purged, self.now)
        assert problem is None, f"purge_queue answered {purged}: {problem}"
        self.model.purge(q, self.now)
        event("purge")
        self.after()

    # -- peek, delete_by_id --------------------------------------------------------------------

    @rule(index=queue_index, data=st.data(), count=st.integers(1, 5), then_receive=st.booleans())
    def peek(self, index: int, data: st.DataObject, count: int, then_receive: bool) -> None:
        """Default mode: exactly what ``receive(max)`` would return now, changing nothing."""
        self.sync()
        q, now = self.queue(index), self.now
        name, t = self.draw_tag(data, q)
        if t is None:
            with pytest.raises(TagNotFound):
                self.engine.peek(q.name, tag=name, max=count)
            return
        options = self.model.orders(q, t, now, count)
        page = self.engine.peek(q.name, tag=name, max=count)
        assert page.next is None
        ids = [p.message.id for p in page.messages]
        chosen = next((o for o in options if [m.id for m in o] == ids), None)
        assert chosen is not None, (
            f"peek on {q.name}/{t.name} max={count}: got seqs "
            f"{[self.seq_of(q, i) for i in ids]}, want {[m.seq for m in options[0]]}")
        for m, p in zip(chosen, page.messages):
            x = self.model.view(t, m)
            assert (p.state, p.dequeue_count, p.first_dequeue_time, p.next_visible_time) == \
                ("active", x.count, x.first, None), f"peek of seq {m.seq}"
            self.check_record(m, p.message, f"peek of seq {m.seq}")
        if then_receive:
            got = self.do_receive(q, name, t, count, None)
            assert [d.id for d in got] == ids, "receive after peek returned something else"

    def expected_listing(self, q: ModelQueue, t: ModelTag, start: int
                         ) -> list[tuple[ModelMessage, Any]]:
        return [(m, (self.model.peek_state(x, cat), x))
                for m, x, cat in self.model.categories(q, t, self.now) if m.enqueue >= start]

    def check_peeked(self, m: ModelMessage, want: tuple[str, Any], p: Any, where: str) -> None:
        state, x = want
        assert isinstance(p, Peeked), f"{where}: got {p!r}"
        self.check_record(m, p.message, where)
        assert (p.state, p.dequeue_count, p.first_dequeue_time, p.next_visible_time) == \
            (state, x.count, x.first, x.due if state == INFLIGHT else None), where

    @rule(index=queue_index, data=st.data(), count=st.integers(1, 6),
          start=st.sampled_from(["zero", "message", "now", "later"]))
    def peek_from(self, index: int, data: st.DataObject, count: int, start: str) -> None:
        """Start mode: production order with each message's state, paged by ``next``."""
        self.sync()
        q, now = self.queue(index), self.now
        name, t = self.draw_tag(data, q)
        if start == "message" and q.messages:
            time = data.draw(st.sampled_from(q.messages), label="message").enqueue
        else:
            time = {"now": now, "later": now + 1}.get(start, 0)
        if t is None:
            with pytest.raises(TagNotFound):
                self.engine.peek(q.name, tag=name, start=time, max=count)
            return
        want = self.expected_listing(q, t, time)
        got: list[Any] = []
        after, pages = None, []
        for _ in range(len(want) + 2):
            page = self.engine.peek(q.name, tag=name, start=time, after=after, max=count)
            pages.append(len(page.messages))
            got += page.messages
            if page.next is None:
                break
            after = page.next
        assert page.next is None, "paging did not end"
        assert all(n == count for n in pages[:-1]) and pages[-1] <= count, \
            f"pages of {pages} entries, max {count}"
        # Messages the model only knows to be gone or not (below gone_high) may be missing.
        skip = len(want) - len(got)
        assert skip >= 0 and all(m.seq < q.gone_high for m, _ in want[:skip]), (
            f"peek from {time} on {q.name}/{t.name}: got seqs "
            f"{[self.seq_of(q, p.message.id) for p in got]}, want {[m.seq for m, _ in want]}")
        want = want[skip:]
        assert [p.message.id for p in got] == [m.id for m, _ in want], (
            f"peek from {time} on {q.name}/{t.name}: got seqs "
            f"{[self.seq_of(q, p.message.id) for p in got]}, want {[m.seq for m, _ in want]}")
        for (m, state), p in zip(want, got):
            event(f"peek start: {state[0]}")
            self.check_peeked(m, state, p, f"peek from {time}: {q.name} seq {m.seq} on {t.name}")

    def draw_ids(self, data: st.DataObject, q: ModelQueue) -> list[str]:
        other = self.queue(1 if q.name == QUEUE_NAMES[0] else 0)
        choices: list[st.SearchStrategy[str]] = [st.sampled_from(
            ["nonsense", "0" * 25, "f" * 25, q.last_id[:-2] + "f7" if q.last_id else "x"])]
        if q.messages:
            choices += [st.sampled_from([m.id for m in q.messages])] * 4
        if other.messages:
            choices.append(st.sampled_from([m.id for m in other.messages]))
        ids = data.draw(st.lists(st.one_of(choices), min_size=1, max_size=5), label="ids")
        if data.draw(st.integers(0, 4), label="repeat one") == 0:
            ids.append(ids[0])
        return ids

    @rule(index=queue_index, data=st.data())
    def peek_ids(self, index: int, data: st.DataObject) -> None:
        self.sync()
        q = self.queue(index)
        name, t = self.draw_tag(data, q)
        ids = self.draw_ids(data, q)
        if t is None:
            with pytest.raises(TagNotFound):
                self.engine.peek(q.name, tag=name, ids=ids)
            return
        listing = {m.id: (m, state) for m, state in self.expected_listing(q, t, 0)}
        page = self.engine.peek(q.name, tag=name, ids=ids)
        assert page.next is None and len(page.messages) == len(ids)
        for i, (message_id, p) in enumerate(zip(ids, page.messages)):
            if message_id not in listing:  # never produced here, gone, or outside the scope
                event("peek ids: MessageNotFound")
                assert isinstance(p, MessageNotFound), f"ids[{i}] {message_id}: got {p!r}"
                continue
            m, state = listing[message_id]
            if m.seq < q.gone_high and isinstance(p, MessageNotFound):
                continue  # gone, though the model only knew it might be
            event(f"peek ids: {state[0]}")
            self.check_peeked(m, state, p, f"peek ids[{i}]: {q.name} seq {m.seq} on {t.name}")

    @rule(index=queue_index, data=st.data())
    def delete_by_id(self, index: int, data: st.DataObject) -> None:
        self.sync()
        q = self.queue(index)
        name, t = self.draw_tag(data, q)
        ids = self.draw_ids(data, q)
        if t is None:
            with pytest.raises(TagNotFound):
                self.engine.delete_by_id(q.name, ids, tag=name)
            return
        expected: list[set[str]] = []
        for message_id in ids:
            m = q.by_id(message_id)
            if m is None:
                expected.append({"MessageNotFound"})
            elif m.seq < q.gone:
                # below gone_seq: null for any tag, its scope aside (the record may be
                # collected; test_gone_message_inside_a_new_tags_start_is_null)
                expected.append({"ok"})
            elif not t.scope(m):
                expected.append({"MessageNotFound"})
            else:
                if self.model.view(t, m).status not in (DELETED, DEAD):
                    event(f"delete_by_id: {self.model.view(t, m).cat}")
                    self.model.delete(t, m)
                expected.append({"ok"})
        results = self.engine.delete_by_id(q.name, ids, tag=name)
        assert len(results) == len(ids)
        for i, (want, got) in enumerate(zip(expected, results)):
            assert error_name(got) in want, f"ids[{i}] {ids[i]}: got {got!r}, want {want}"
            assert got is None or isinstance(got, LaminaError)
        self.after()

    # -- clock, reopen -------------------------------------------------------------------------

    @rule(ms=S.clock_steps)
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def a_second_passes(self) -> None:
        """The rule Hypothesis draws most (it sorts first): one second, enough to end the
        shortest leases and delays."""
        self.clock.advance(1000)

    @rule(nth=st.integers(0, 3), offset=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_deadline(self, nth: int, offset: int) -> None:
        """Onto (or 1 ms around) a lease's end, a delay's end or a retention limit."""
        now = self.now
        deadlines = set()
        for q in self.model.queues.values():
            for m in q.messages[q.low(now):]:
                deadlines.add(m.visible)
                deadlines.add(m.enqueue + q.retention_ms + 1)
                deadlines.update(x.due for x in m.per.values() if x.status == LEASED)
        future = sorted(d + offset for d in deadlines if d + offset > now)
        if future:
            self.clock.advance(future[min(nth, len(future) - 1)] - now)

    @rule(really=st.integers(0, 3))
    def reopen(self, really: int) -> None:
        """Close and reopen the data directory (one draw in four: Hypothesis favours the
        first rule it sorts, and this one used to be it)."""
        if really:
            return
        self.sync()
        self.engine.close()
        self.engine = Engine.open(self.path, clock=self.clock, **self.options)

    # -- stats -------------------------------------------------------------------------------

    def check_stats(self, q: ModelQueue) -> None:
        info = self.engine.get_queue(q.name)
        assert info.attributes == q.attrs
        where = f"stats of {q.name} at +{self.now - START_MS} ms"
        problem = self.model.learn_gone(q, q.next_seq - info.stats["messages"], self.now)
        assert problem is None, f"{where}: {problem}"
        stats, want = info.stats, self.model.stats(q, self.now)
        for key in ("messages", "oldest", "newest", "rewindable"):
            assert stats[key] == want[key], f"{where}: {key} {stats[key]}, want {want[key]}"
        assert list(stats["tags"]) == list(want["tags"]), where
        for name, tag in want["tags"].items():
            got = stats["tags"][name]
            filtered = q.tag(name).filter is not None
            assert filtered or not got["approximate"], f"{where}: {name} approximate"
            keys = ["inflight", "delayed"]
            if not got["approximate"]:
                keys += ["active", "parked"]
            assert {k: got[k] for k in keys} == {k: tag[k] for k in keys}, f"{where}, tag {name}"
            assert got["lag"] == tag["lag"], \
                f"{where}, tag {name}: lag {got['lag']}, want {tag['lag']}"
        if q.gone > q.expired_seq(self.now):
            event("stats: ended messages gone")

    @rule(index=queue_index)
    def get_queue(self, index: int) -> None:
        self.sync()
        self.check_stats(self.queue(index))

    @invariant()
    def stats_agree(self) -> None:
        if self.engine is None or not self.stats_every_step:
            return
        self.sync()
        for q in self.model.queues.values():
            self.check_stats(q)


ReadersMachine.TestCase.settings = machine_settings(200, 50)
TestReadersModel = ReadersMachine.TestCase


# ----------------------------------------------------------------------------------------------
# Minimal examples of what the machine found where the engine disagreed with DESIGN.md, kept as
# regression tests. Each docstring describes the engine's behaviour before the fix; a "was:"
# comment gives its old answer.
# ----------------------------------------------------------------------------------------------

# (the ``clock`` and ``engine`` fixtures come from tests/conftest.py; START_MS is its clock)


def test_peek_before_receive_does_not_lose_the_topic_head(engine, clock):
    """DESIGN.md §2 "Peek": peek never changes state; "Topics": one at a time in production
    order, a Delayed predecessor holds its successors back. A peek (start or ids mode) or a
    get_queue before the first receive makes the engine park the head behind its delayed
    successor: it is never delivered, shows "deleted", and is gone after the delay."""
    engine.create_queue("q")
    head, _, _ = engine.send("q", [{1: b"head", 3: "t"}, {1: b"late", 3: "t", 5: 1},
                                   {1: b"third", 3: "t"}])
    engine.get_queue("q")  # or peek(start=...), peek(ids=...)
    assert [d.body for d in engine.receive("q", max=5)] == [b"head"]   # was: []
    clock.advance(1000)
    assert engine.peek("q", ids=[head.id]).messages[0].state == "inflight"


def test_unparked_successor_is_active_again(engine, clock):
    """DESIGN.md §2 "Delivery order": a receive first takes messages Active again — "after
    ... the end of the topic predecessor that parked them" — then never-delivered ones. Here a
    receive passed t2 while t1 was Inflight (it took "a" after it)."""
    engine.create_queue("q")
    engine.send("q", [{1: b"t1", 3: "t"}, {1: b"t2", 3: "t"}, b"a", b"b"])
    t1, a = engine.receive("q", max=2)
    assert a.body == b"a"
    clock.advance(5)
    engine.delete("q", [t1.receipt])
    assert [d.body for d in engine.receive("q", max=5)] == [b"t2", b"b"]


def test_unparked_successor_not_yet_reached(engine, clock):
    """The engine's documented deviation (docs/STORAGE.md): a successor no receive had passed
    when its head ended is brought by its lane cursor, in never-delivered order (after "a"),
    not as Active again: otherwise every such message ahead of the cursor would need a row,
    and memory would grow with the backlog. Stats still count it parked meanwhile."""
    engine.create_queue("q")
    engine.send("q", [{1: b"t1", 3: "t"}, b"a", {1: b"t2", 3: "t"}])
    (t1,) = engine.receive("q", max=1)
    assert engine.get_queue("q").stats["tags"]["default"]["parked"] == 1
    clock.advance(5)
    engine.delete("q", [t1.receipt])
    assert [d.body for d in engine.receive("q", max=5)] == [b"a", b"t2"]


def test_delayed_message_deleted_by_id_is_gone(engine, clock):
    """DESIGN.md §2 "Watermarks": after every operation gone_seq stands at the highest value
    its definition allows; a message deleted by id is Ended. A delayed message deleted by id
    before its delay ended stays retained (stats, max_messages, peek) until a receive walks
    the tag's delay position past it."""
    engine.create_queue("q", {"max_messages": 1})
    (sent,) = engine.send("q", [{1: b"a", 5: 1}])
    clock.advance(1)
    assert engine.delete_by_id("q", [sent.id]) == [None]
    clock.advance(1)
    assert engine.get_queue("q").stats["messages"] == 0               # was: 1
    assert isinstance(engine.peek("q", ids=[sent.id]).messages[0], MessageNotFound)
    assert isinstance(engine.send("q", [b"b"])[0], Sent)               # was: QueueFull


def test_delayed_message_a_filter_skips_is_gone(engine, clock):
    """The same for a tag that never receives the delayed message (filtered out: Ended for
    it): it holds gone_seq until a receive on that tag."""
    engine.create_queue("q")
    engine.create_tag("q", "f", filter={"attributes": {"k": 1}})
    engine.send("q", [{1: b"a", 2: {"k": 2}, 5: 1}])
    clock.advance(1000)
    assert engine.delete("q", [engine.receive("q")[0].receipt]) == [None]
    clock.advance(1)
    assert engine.get_queue("q").stats["messages"] == 0               # was: 1


def test_gone_message_inside_a_new_tags_start_is_null(tmp_path, clock):
    """DESIGN.md §2: delete_by_id "is idempotent (an id of this queue below gone_seq answers
    null)"; MessageNotFound only for ids outside the tag's start or filter; and "what a
    message operation sees never depends on when a segment was collected". A tag created
    with a start in ms after the message's segment was collected answers MessageNotFound
    ("before the start of tag") for a message produced at its start."""
    engine = Engine.open(tmp_path / "data", clock=clock, segment_max_messages=1)
    engine.create_queue("q")
    (a,) = engine.send("q", [b"a"])
    clock.advance(1)
    engine.send("q", [b"b"])
    assert engine.delete("q", [engine.receive("q")[0].receipt]) == [None]
    clock.advance(1)
    assert engine.get_queue("q").stats["messages"] == 1               # a is gone
    engine.create_tag("q", "t", start=a.enqueue_time)
    assert engine.delete_by_id("q", [a.id], tag="t") == [None]       # was: MessageNotFound
    engine.close()


def test_lag_skips_dead_lettered_messages(engine, clock):
    """DESIGN.md §8: ``lag`` is the production time of the oldest message not Ended for the
    tag; §2: a message is Ended for a tag once "dead-lettered". The engine reports the
    dead letter's production time while its DLQ copy is alive."""
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("src", [b"m"])
    clock.advance(1000)
    assert engine.dead("src", [engine.receive("src")[0].receipt]) == [None]
    stats = engine.get_queue("src").stats
    assert stats["messages"] == 1  # kept for redrive, as the watermark rule says
    assert stats["tags"]["default"]["lag"] is None                    # was: START_MS


def test_new_tag_does_not_see_a_message_gone_by_time(engine, clock):
    """DESIGN.md §2 "Watermarks": gone_seq stands at the highest value its definition allows
    at now, and below it a message "does not exist for any message operation". ``m``, Ended
    for default in the ms it was produced, is gone one ms later; a tag created then with
    start "oldest" still receives it, unless another operation on the queue came first."""
    engine.create_queue("q")
    engine.send("q", [b"m"])
    assert engine.delete("q", [engine.receive("q")[0].receipt]) == [None]
    clock.advance(1000)
    engine.create_tag("q", "late", start="oldest")
    assert engine.receive("q", tag="late") == []                      # was: m
    assert engine.get_queue("q").stats["messages"] == 0               # was: 1


def test_dead_letters_follow_the_moves_order(engine, clock):
    """DESIGN.md §2: at a lease's end the message "is moved — at that moment, atomically —
    into the DLQ", and every operation first applies the deadlines due by now. Two moves due
    at +2 s (tag b) and +5 s (default), applied by one later operation, should be produced in
    that order; the engine appends them tag after tag (and stamps both with the time of the
    applying operation), so the DLQ delivers the later move first."""
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.create_tag("src", "b")
    engine.send("src", [b"m"])
    engine.receive("src", visibility_timeout=5)
    engine.receive("src", tag="b", visibility_timeout=2)
    clock.advance(6000)
    copies = engine.receive("dlq", max=5)
    assert [c.message.dead[1] for c in copies] == ["b", "default"]    # was: default, b


def test_expired_message_is_not_dead_lettered(engine, clock):
    """DESIGN.md §2: a message is Expired "for everyone once older than retention", and below
    gone_seq it "does not exist for any message operation". A lease that ends after its
    message expired still moves it to the DLQ when no operation touched the source queue in
    between (with one in between, it is not moved)."""
    engine.create_queue("dlq")
    engine.create_queue("src", {"retention": 60, "redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("src", [b"m"])
    clock.advance(59_000)
    engine.receive("src", visibility_timeout=5)  # lease ends at +64 s; m expires after +60 s
    clock.advance(6_000)
    assert engine.receive("dlq", max=5) == []   # was: the copy, dead_time +64 s


def test_reopen_does_not_pin_the_watermark_on_an_expired_delayed_message(tmp_path, clock):
    """DESIGN.md §3: in-memory state is a cache rebuilt at open; §2: gone_seq stands at the
    highest value its definition allows after every operation. Without the reopen, ``a``
    (deleted for default, filtered out for red) is gone; after it, an expired delayed message
    below gone_seq keeps ``a`` retained for a tag created after the reopen."""
    engine = Engine.open(tmp_path / "data", clock=clock)
    engine.create_queue("q")
    engine.send("q", [{1: b"old", 5: 1}])
    clock.advance(1000 + 345_600_000)      # "old" expires unreceived
    assert engine.get_queue("q").stats["messages"] == 0
    engine.close()
    engine = Engine.open(tmp_path / "data", clock=clock)
    engine.create_tag("q", "red", start="oldest", filter={"attributes": {"k": None}})
    engine.send("q", [b"a", b"b"])
    clock.advance(1000)
    assert engine.delete("q", [engine.receive("q")[0].receipt]) == [None]
    assert engine.get_queue("q").stats["messages"] == 1               # was: 2
    engine.close()


def test_redriven_rewound_messages_deleted_leave_no_lag(engine, clock):
    """DESIGN.md §8: ``lag`` is the oldest message not Ended for the tag. After a rewind moved
    the cursor back and a redrive made the messages Active again, deleting them ended them:
    the cursor must not rest on them (it did: lag stayed at their production time)."""
    engine.create_queue("dlq")
    engine.create_queue("src", {"visibility_timeout": 1, "rewind": 30,
                                "redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("src", [b"a", b"b"])
    assert len(engine.receive("src", max=2)) == 2
    clock.advance(1000)  # both leases ran out: dead-lettered
    engine.rewind("src", clock.now_ms - 30_000, tag="default")
    assert engine.redrive("dlq").moved == 2
    deliveries = engine.receive("src", max=2)
    assert engine.delete("src", [d.receipt for d in deliveries]) == [None, None]
    assert engine.get_queue("src").stats["tags"]["default"]["lag"] is None  # was: a's time


def test_delayed_message_deleted_after_a_rewind_from_seq_0_stays_deleted(engine, clock):
    """DESIGN.md §2 "Rewind": an Inflight message keeps its lease; deleted then, it is Ended.
    A delayed message at seq 0, in flight through a rewind, came back as Active after its
    delete (the engine took "rewind from seq 0" for "no rewind")."""
    engine.create_queue("q", {"delay": 1, "rewind": 30})
    engine.send("q", [b"m"])
    clock.advance(1000)
    (delivery,) = engine.receive("q")
    engine.rewind("q", clock.now_ms - 30_000, tag="default")
    assert engine.delete("q", [delivery.receipt]) == [None]
    assert engine.peek("q", max=2).messages == []                     # was: m, "active"
    assert engine.receive("q", max=2) == []


def test_redriven_topic_message_goes_before_its_successor(engine, clock):
    """DESIGN.md §2 "Topics": one at a time in production order, the head being the first
    message not Ended. Redriving a dead topic head makes it not Ended again: it goes before
    the successor that took over its topic (unless that one is Inflight)."""
    engine.create_queue("dlq")
    engine.create_queue("q", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("q", [{1: b"t0", 3: "t"}, {1: b"t1", 3: "t"}, b"a"])
    t0, _ = engine.receive("q", max=3)  # t1 is passed, parked behind t0
    assert engine.dead("q", [t0.receipt]) == [None]
    clock.advance(10)
    assert engine.redrive("dlq").moved == 1
    clock.advance(10)
    assert [d.body for d in engine.receive("q", max=5)] == [b"t0"]    # was: t1


def _pass_t2_while_parked_then_end_t0(engine, clock) -> None:
    """Topic t: t0 Inflight while "a1" is received, which passes t2 (its delay ended) behind
    it; then t0 is deleted while t1 is still ahead of the cursor and t3 still delayed."""
    engine.create_queue("q")
    engine.send("q", [{1: b"t0", 3: "t"}, b"a1", {1: b"t1", 3: "t"},
                      {1: b"t2", 3: "t", 5: 1}, {1: b"t3", 3: "t", 5: 2}])
    (t0,) = engine.receive("q", max=1)
    clock.advance(1000)
    assert [d.body for d in engine.receive("q", max=1)] == [b"a1"]  # passes t2
    assert engine.delete("q", [t0.receipt]) == [None]


def test_successor_passed_while_parked_keeps_waiting_after_its_head_ends(engine, clock):
    """DESIGN.md §2 "Topics": one at a time in production order. t2 was passed by the delay
    index while t0 was Inflight; when t0 ended, the next successor t1 was still ahead of the
    cursor, and the topic was left unlocked: t3's delay then ended and it went first."""
    _pass_t2_while_parked_then_end_t0(engine, clock)
    clock.advance(1000)
    (t1,) = engine.receive("q", max=1)
    assert t1.body == b"t1"                                            # was: t3
    assert engine.delete("q", [t1.receipt]) == [None]
    assert [d.body for d in engine.receive("q", max=5)] == [b"t2"]


def test_successor_passed_while_parked_keeps_waiting_across_a_reopen(tmp_path, clock):
    """The same across a restart: which topics have successors passed while parked is
    persisted, and the topic is locked again at open on its earliest pending message."""
    engine = Engine.open(tmp_path / "data", clock=clock)
    _pass_t2_while_parked_then_end_t0(engine, clock)
    engine.close()
    engine = Engine.open(tmp_path / "data", clock=clock)
    clock.advance(1000)
    (t1,) = engine.receive("q", max=1)
    assert t1.body == b"t1"
    assert engine.delete("q", [t1.receipt]) == [None]
    assert [d.body for d in engine.receive("q", max=5)] == [b"t2"]
    engine.close()


def test_messages_expire_after_a_reopen_and_a_dead_letter(tmp_path, clock):
    """DESIGN.md §2: a message is Expired once older than retention. After a reopen, the first
    message appended to a queue (here a dead-letter copy) made the engine believe it was the
    oldest live one, so older messages stopped expiring until the copy's own age."""
    engine = Engine.open(tmp_path / "data", clock=clock)
    engine.create_queue("dlq", {"retention": 60})
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("dlq", [b"old"])
    engine.send("src", [b"m"])
    engine.close()
    engine = Engine.open(tmp_path / "data", clock=clock)
    engine.receive("src", visibility_timeout=30)
    clock.advance(35_000)
    engine.peek("src")  # the lease ran out: the copy is appended to dlq now
    clock.advance(60_000)  # "old" (produced at 0) is 95 s old; the copy 60 s
    assert [p.message.body for p in engine.peek("dlq", start=0, max=5).messages] == [b"m"]
    engine.close()


def test_deleted_delayed_message_before_a_rewind_time_stays_deleted(engine, clock):
    """DESIGN.md §2 "Rewind": only messages produced at or after the rewind time become
    never-delivered again. A delayed message deleted before it showed "active" in peek and
    stats (the receive path skipped it rightly), and counted as pending for its topic."""
    engine.create_queue("q", {"delay": 1, "rewind": 30})
    engine.send("q", [b"m0"])
    clock.advance(1000)
    (m1,) = engine.send("q", [b"m1"])
    (d,) = engine.receive("q")
    assert engine.delete("q", [d.receipt]) == [None]
    engine.rewind("q", m1.enqueue_time, tag="default")
    clock.advance(85)
    states = [(p.message.body, p.state) for p in engine.peek("q", start=0, max=5).messages]
    assert states == [(b"m0", "deleted"), (b"m1", "delayed")]        # was: m0 "active"
    assert engine.get_queue("q").stats["tags"]["default"]["active"] == 0


def test_rewind_after_a_topic_head_keeps_its_parked_successor(engine, clock):
    """DESIGN.md §2 "Rewind" changes only messages produced from its time on. A rewind to a
    time after an Inflight topic head unlocked its topic anyway: when the head was deleted its
    parked successor (passed by the cursor) was never offered again, and gone_seq then
    passed it: the message was lost."""
    engine.create_queue("q", {"rewind": 30})
    engine.send("q", [{1: b"t0", 3: "t"}, {1: b"t1", 3: "t"}])
    clock.advance(1000)
    engine.send("q", [b"x"])
    (t0,) = engine.receive("q", max=1)
    assert [d.body for d in engine.receive("q", max=1)] == [b"x"]  # passes t1
    engine.rewind("q", clock.now_ms, tag="default")
    assert engine.delete("q", [t0.receipt]) == [None]
    assert [d.body for d in engine.receive("q", max=5)] == [b"t1"]    # was: []


def test_delete_by_id_of_a_message_gone_by_time_is_null(engine, clock):
    """DESIGN.md §2: ``gone_seq`` stands at the highest value its definition allows at now,
    and ``delete_by_id`` answers null below it. A message Ended for every tag leaves the rewind
    window with time alone; a tag that never received it (filtered out) got MessageNotFound
    until another operation raised ``gone_seq``."""
    engine.create_queue("q", {"rewind": 30})
    engine.create_tag("q", "blue", start="oldest", filter={"attributes": {"k": 1}})
    (m,) = engine.send("q", [b"m"])
    assert engine.delete("q", [engine.receive("q")[0].receipt]) == [None]
    clock.advance(31_000)
    assert engine.delete_by_id("q", [m.id], tag="blue") == [None]    # was: MessageNotFound


def test_rewound_topic_messages_go_first_once_the_head_is_no_longer_inflight(engine, clock):
    """DESIGN.md §2 "Topics": a rewound message waits behind an *Inflight* message of its
    topic. When that head's lease ran out, the engine kept it as the head (Active again, so
    delivered again) and the rewound earlier messages of its topic waited until it ended:
    production order broken. Now the earliest rewound one takes the topic over at the lease
    end and the old head waits behind it, across a reopen too."""
    engine.create_queue("q", {"rewind": 30})
    sent = engine.send("q", [{1: b"t1", 3: "t"}, {1: b"t2", 3: "t"}, {1: b"t3", 3: "t"}])
    clock.advance(1000)
    assert engine.delete_by_id("q", [sent[0].id, sent[1].id]) == [None, None]
    (t3,) = engine.receive("q", max=1, visibility_timeout=1)
    assert t3.body == b"t3"
    engine.rewind("q", clock.now_ms - 5000, tag="default")  # t1, t2 again; t3 stays Inflight
    assert engine.receive("q", max=5) == []                   # behind Inflight t3
    clock.advance(1000)                                       # t3's lease runs out
    assert [d.body for d in engine.receive("q", max=5)] == [b"t1"]      # was: [b"t3"]
    assert engine.peek("q", ids=[t3.id]).messages[0].state == "parked"
    stats = engine.get_queue("q").stats["tags"]["default"]
    assert (stats["inflight"], stats["parked"]) == (1, 2)


def test_rewound_topic_messages_go_first_after_a_reopen(tmp_path, clock):
    """The same when the head's lease runs out while the engine is closed (the deadline is
    watched again at open), with the rewound messages not yet reached by the cursor (the
    topic is locked on the first of them at open)."""
    engine = Engine.open(tmp_path / "data", clock=clock)
    engine.create_queue("q", {"rewind": 30})
    sent = engine.send("q", [{1: b"t1", 3: "t"}, b"a", {1: b"t2", 3: "t"}])
    clock.advance(1000)
    assert engine.delete_by_id("q", [sent[0].id, sent[1].id]) == [None, None]
    (t2,) = engine.receive("q", max=1, visibility_timeout=1)
    engine.rewind("q", clock.now_ms - 5000, tag="default")   # t1 and a again; t2 Inflight
    engine.close()
    clock.advance(2000)
    engine = Engine.open(tmp_path / "data", clock=clock)
    assert [d.body for d in engine.receive("q", max=5)] == [b"t1", b"a"]  # t2 behind t1
    engine.close()
    engine = Engine.open(tmp_path / "data", clock=clock)
    assert engine.receive("q", max=5) == []
    assert engine.peek("q", ids=[t2.id]).messages[0].state == "parked"
    engine.close()


def test_an_expired_dead_letter_copy_frees_its_original(engine, clock):
    """DESIGN.md §2: a dead letter's original is kept while a redrive could bring it back,
    i.e. while its DLQ copy is alive. A copy that expired by the DLQ's retention held the
    original (and ``gone_seq`` of its queue) until an operation on the DLQ applied that
    expiry."""
    engine.create_queue("dlq", {"retention": 60})
    engine.create_queue("q", {"visibility_timeout": 1,
                              "redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("q", [b"m"])
    engine.receive("q")
    clock.advance(1000)                    # the lease runs out: the copy goes to dlq
    assert engine.get_queue("q").stats["messages"] == 1
    clock.advance(61_000)                  # the copy expires
    assert engine.get_queue("q").stats["messages"] == 0               # was: 1
