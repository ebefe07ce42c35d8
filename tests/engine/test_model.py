"""Model-based test of the engine's core message semantics (DESIGN.md §2, PROTOCOL.md §4-5).

A Hypothesis ``RuleBasedStateMachine`` drives the real ``Engine`` and a plain in-memory
reference model side by side and checks that every observable result agrees: send results,
the exact sequence of a receive, per-entry outcomes of delete / change_visibility, and the
stats of ``get_queue``. The model is written from DESIGN.md §2, not from the engine's code.

Scope (the core semantics): one or two queues, the ``default`` tag, no topics, no DLQ, no
rewind; a fake clock; reopening the data directory. Tags, topics, dead-letter queues, rewind and
peek are the readers machine's (``test_model_readers.py``, model in ``model.py``).
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
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lamina.engine import (
    Delivery,
    Engine,
    FakeClock,
    InvalidArgument,
    InvalidReceipt,
    LaminaError,
    QueueFull,
    QueueNotFound,
    Sent,
    StaleReceipt,
    VisibilityChanged,
)

try:  # tests/engine is a package
    from . import strategies as S
    from .model import (
        DEFAULTS,
        Invalid,
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
        DEFAULTS, Invalid, Parsed, error_name, floor_ms,
        machine_settings, parse_entry, typed, visibility_entry_ok)

START_MS = 1_700_000_000_000

# ----------------------------------------------------------------------------------------------
# The reference model (DESIGN.md §2), deliberately naive: lists and linear scans. The entry
# rules and helpers are shared with the readers machine (model.py).
# ----------------------------------------------------------------------------------------------

NEW, LEASED, ENDED = "never-delivered", "leased", "ended"


@dataclass
class ModelMessage:
    seq: int
    id: str                      # the engine's id, learned from the send result
    body: bytes | str
    data: bytes
    attributes: dict[str, Any] | None
    priority: int
    enqueue: int
    visible: int
    state: str = NEW             # for the default tag
    due: int = 0                 # LEASED: the lease deadline (Inflight while now < due)
    lease: int = -1              # LEASED: the model's number of the current lease
    count: int = 0               # dequeue_count
    first: int | None = None     # first_dequeue_time

    @property
    def sent_delayed(self) -> bool:
        return self.visible > self.enqueue


class ModelQueue:
    def __init__(self, name: str, attributes: dict[str, Any]):
        self.name = name
        self.attrs = attributes
        self.messages: list[ModelMessage] = []   # index == seq
        self.gone = 0
        self.last_id = ""

    @property
    def next_seq(self) -> int:
        return len(self.messages)

    def expired_seq(self, now: int) -> int:
        """Messages with ``enqueue_time < now - retention`` are Expired (a prefix of seqs)."""
        horizon = now - self.attrs["retention"] * 1000
        for m in self.messages:
            if m.enqueue >= horizon:
                return m.seq
        return self.next_seq

    def gone_seq(self, now: int) -> int:
        """DESIGN.md §2: everything below is Expired, or Ended (for the only tag) and produced
        before ``now`` (``rewind`` is 0). Only ever increases."""
        expired = self.expired_seq(now)
        floor = next((m.seq for m in self.messages[expired:] if m.state != ENDED),
                     self.next_seq)
        bound = next((m.seq for m in self.messages if m.enqueue >= now), self.next_seq)
        self.gone = max(self.gone, expired, min(floor, bound))
        return self.gone

    def live(self, now: int) -> list[ModelMessage]:
        """Messages that exist for message operations and are not Ended."""
        return [m for m in self.messages[self.gone_seq(now):] if m.state != ENDED]

    def is_current(self, seq: int, lease: int, now: int) -> bool:
        m = self.messages[seq]
        return (m.state == LEASED and m.lease == lease and now < m.due
                and seq >= self.expired_seq(now))

    def receivable(self, now: int) -> list[ModelMessage]:
        """Active messages in delivery order: first those Active *again* (a lease ran out or
        was ended, or a delay ended) by (time they became Active, seq); then never-delivered
        messages sent without a delay by (priority, seq)."""
        again: list[tuple[int, int, ModelMessage]] = []
        fresh: list[tuple[int, int, ModelMessage]] = []
        for m in self.live(now):
            if m.state == LEASED and m.due <= now:
                again.append((m.due, m.seq, m))
            elif m.state == NEW and m.sent_delayed and m.visible <= now:
                again.append((m.visible, m.seq, m))
            elif m.state == NEW and not m.sent_delayed:
                fresh.append((m.priority, m.seq, m))
        return [m for *_, m in sorted(again)] + [m for *_, m in sorted(fresh)]

    def stats(self, now: int) -> dict[str, Any]:
        gone = self.gone_seq(now)
        active = inflight = delayed = 0
        for m in self.live(now):
            if m.state == LEASED:
                if m.due > now:
                    inflight += 1
                else:
                    active += 1
            elif m.visible > now:
                delayed += 1
            else:
                active += 1
        retained = self.messages[gone:]
        lag = next((m.enqueue for m in retained if m.state != ENDED), None)
        return {
            "messages": self.next_seq - gone,
            "oldest": retained[0].enqueue if retained else None,
            "newest": retained[-1].enqueue if retained else None,
            "rewindable": 0,
            "default": {"active": active, "inflight": inflight, "delayed": delayed,
                        "parked": 0, "lag": lag},
        }


@dataclass(frozen=True)
class Issued:
    """A receipt the engine handed out, as the model knows it."""

    queue: str
    seq: int
    lease: int
    raw: bytes


# ----------------------------------------------------------------------------------------------
# The state machine
# ----------------------------------------------------------------------------------------------

QUEUE_NAMES = ("alpha", "Beta")
queue_index = st.integers(min_value=0, max_value=1)


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="lamina-model-")
        self.clock = FakeClock(START_MS)
        self.engine: Engine | None = None
        self.options: dict[str, Any] = {}
        self.queues: list[ModelQueue] = []
        self.issued: dict[bytes, Issued] = {}
        self.receipts: list[Issued] = []    # every receipt issued, oldest first
        self.ids: set[str] = set()
        self.lease_counter = 0
        self.stats_every_step = True

    # -- setup / teardown ------------------------------------------------------------------------

    @initialize(attributes=st.lists(S.queue_attributes(), min_size=1, max_size=2),
                options=S.engine_options, stats_every_step=st.booleans())
    def open_engine(self, attributes: list[dict[str, Any]], options: dict[str, Any],
                    stats_every_step: bool) -> None:
        self.options = options
        self.stats_every_step = stats_every_step
        self.engine = Engine.open(self.path, clock=self.clock, **options)
        for name, attrs in zip(QUEUE_NAMES, attributes):
            resolved = {**DEFAULTS, **attrs}
            info = self.engine.create_queue(name, attrs)
            assert info.attributes == resolved
            assert info.created == self.now
            self.queues.append(ModelQueue(name, resolved))

    def teardown(self) -> None:
        try:
            if self.engine is not None:
                self.engine.close()
        finally:
            shutil.rmtree(self.path, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.clock.now_ms

    def queue(self, index: int) -> ModelQueue:
        return self.queues[index % len(self.queues)]

    def issue(self, q: ModelQueue, m: ModelMessage, raw: object) -> None:
        """The engine issued ``raw`` for a new lease of ``m``: the model's lease number."""
        assert type(raw) is bytes and raw, f"receipt {raw!r} is not a byte string"
        assert raw not in self.issued, "the engine issued the same receipt twice"
        self.lease_counter += 1
        m.lease = self.lease_counter
        record = Issued(q.name, m.seq, m.lease, raw)
        self.issued[raw] = record
        self.receipts.append(record)

    def receipt_outcome(self, q: ModelQueue, raw: object) -> str:
        """What a receipt is for queue ``q`` now: current / StaleReceipt / InvalidReceipt."""
        record = self.issued.get(raw) if type(raw) is bytes else None
        if record is None or record.queue != q.name:
            return "InvalidReceipt"
        return "current" if q.is_current(record.seq, record.lease, self.now) else "StaleReceipt"

    def draw_receipts(self, data: st.DataObject, q: ModelQueue, label: str) -> list[bytes]:
        """1-4 receipts for ``q``: current ones (likely), any issued one (stale, or of the other
        queue), random bytes, tampered real receipts; sometimes one repeated in the batch."""
        now = self.now
        current = [r.raw for r in self.receipts
                   if r.queue == q.name and q.is_current(r.seq, r.lease, now)]
        # The receipt of each message's latest lease: current, or stale only because its
        # deadline passed (perhaps exactly now), the message ended or it expired.
        latest = [r.raw for r in self.receipts
                  if r.queue == q.name and q.messages[r.seq].lease == r.lease]
        choices: list[st.SearchStrategy[bytes]] = [S.random_receipts]
        if current:
            choices += [st.sampled_from(current)] * 3
        if latest:
            choices += [st.sampled_from(latest)] * 2
        if self.receipts:
            raws = [r.raw for r in self.receipts]
            choices.append(st.sampled_from(raws[-8:]))
            choices.append(st.sampled_from(raws))
            choices.append(st.builds(
                lambda raw, at, bit: raw[:at % len(raw)] + bytes((raw[at % len(raw)] ^ bit,))
                + raw[at % len(raw) + 1:],
                st.sampled_from(raws), st.integers(0, 63), st.integers(1, 255)))
        receipts = data.draw(st.lists(st.one_of(choices), min_size=1, max_size=4), label=label)
        if data.draw(st.integers(0, 3), label=f"{label}: repeat one") == 0:
            receipts.append(receipts[0])
        return receipts

    # -- rules ------------------------------------------------------------------------------------

    @rule(index=queue_index, entries=S.send_batches)
    def send(self, index: int, entries: list[Any]) -> None:
        q = self.queue(index)
        now = self.now
        capacity = q.attrs["max_messages"] - (q.next_seq - q.gone_seq(now))
        expected: list[Parsed | type[LaminaError]] = []
        for raw in entries:
            # Entries are taken in order; once the queue retains max_messages every further
            # entry gets QueueFull, whatever else might be wrong with it.
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
        for result in results:
            event(f"send: {error_name(result)}")
        for i, (want, got) in enumerate(zip(expected, results)):
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
            q.messages.append(ModelMessage(
                q.next_seq, got.id, want.body, want.data, want.attributes, want.priority,
                now, now + want.delay_ms))

    @rule(index=queue_index, count=st.integers(1, 5),
          visibility=st.none() | S.receive_visibilities)
    def receive(self, index: int, count: int, visibility: float | None) -> None:
        q = self.queue(index)
        now = self.now
        visibility_ms = (q.attrs["visibility_timeout"] * 1000 if visibility is None
                         else floor_ms(visibility))
        expected = q.receivable(now)[:count]
        kwargs = {} if visibility is None else {"visibility_timeout": visibility}
        got = self.engine.receive(q.name, max=count, **kwargs)
        event(f"receive: {min(len(got), 2)}{'+' if len(got) >= 2 else ''} delivered")
        for m in expected:
            event("receive: redelivery" if m.state == LEASED else
                  "receive: delay ended" if m.sent_delayed else "receive: first delivery")
        assert [d.id for d in got] == [m.id for m in expected], (
            f"receive order: got seqs {[self.seq_of(q, d.id) for d in got]}, "
            f"want {[m.seq for m in expected]}")
        for m, d in zip(expected, got):
            assert isinstance(d, Delivery)
            m.state, m.due = LEASED, now + visibility_ms
            m.count += 1
            if m.first is None:
                m.first = now
            assert (d.dequeue_count, d.first_dequeue_time, d.next_visible_time) == \
                (m.count, m.first, m.due), f"delivery of seq {m.seq}"
            msg = d.message
            assert msg.id == m.id
            assert typed(msg.body) == typed(m.body)
            assert typed(msg.attributes) == typed(m.attributes)
            assert (msg.topic, msg.priority, msg.enqueue_time, msg.visible_time, msg.dead) == \
                (None, m.priority, m.enqueue, m.visible, None)
            assert msg.md5 == hashlib.md5(m.data).digest()
            self.issue(q, m, d.receipt)

    # Sends and receives feed every other rule: a second rule each doubles their weight.
    @rule(index=queue_index, entries=S.send_batches)
    def send_more(self, index: int, entries: list[Any]) -> None:
        self.send(index, entries)

    @rule(index=queue_index, count=st.integers(1, 5),
          visibility=st.none() | S.receive_visibilities)
    def receive_more(self, index: int, count: int, visibility: float | None) -> None:
        self.receive(index, count, visibility)

    @rule(index=queue_index, count=st.integers(1, 5))
    def consume(self, index: int, count: int) -> None:
        """The usual consumer loop: receive, then delete every delivery in one batch (ends
        messages in production order often enough to move ``gone_seq``)."""
        q = self.queue(index)
        before = len(self.receipts)
        self.receive(index, count, None)
        receipts = [r.raw for r in self.receipts[before:]]
        if receipts:
            for raw in receipts:
                q.messages[self.issued[raw].seq].state = ENDED
            assert self.engine.delete(q.name, receipts) == [None] * len(receipts)

    @staticmethod
    def seq_of(q: ModelQueue, message_id: str) -> int | str:
        return next((m.seq for m in q.messages if m.id == message_id), message_id)

    def has_receipts(self) -> bool:
        return bool(self.receipts)

    @precondition(has_receipts)
    @rule(index=queue_index, data=st.data())
    def delete(self, index: int, data: st.DataObject) -> None:
        q = self.queue(index)
        receipts = self.draw_receipts(data, q, "delete receipts")
        expected = []
        for raw in receipts:
            outcome = self.receipt_outcome(q, raw)
            if outcome == "current":
                q.messages[self.issued[raw].seq].state = ENDED
                outcome = "ok"
            expected.append(outcome)
        results = self.engine.delete(q.name, receipts)
        for outcome in expected:
            event(f"delete: {outcome}")
        assert [error_name(r) for r in results] == expected
        assert all(r is None for r in results if not isinstance(r, LaminaError))

    @precondition(has_receipts)
    @rule(index=queue_index, data=st.data())
    def change_visibility(self, index: int, data: st.DataObject) -> None:
        q = self.queue(index)
        now = self.now
        receipts = self.draw_receipts(data, q, "change_visibility receipts")
        entries: list[Any] = []
        for raw in receipts:
            entries.append(S.draw_visibility_entry(data, raw))
        expected: list[Any] = []
        for entry in entries:
            if not visibility_entry_ok(entry):
                expected.append(InvalidArgument)
                continue
            raw, timeout = entry
            outcome = self.receipt_outcome(q, raw)
            if outcome != "current":
                expected.append({"InvalidReceipt": InvalidReceipt,
                                 "StaleReceipt": StaleReceipt}[outcome])
                continue
            m = q.messages[self.issued[raw].seq]
            m.due = now + floor_ms(timeout)
            m.lease = -1  # superseded at once: a repeat in this batch is stale
            expected.append(m)
        results = self.engine.change_visibility(q.name, entries)
        assert len(results) == len(entries)
        for result in results:
            event(f"change_visibility: {error_name(result)}")
        for i, (want, got) in enumerate(zip(expected, results)):
            if not isinstance(want, ModelMessage):
                assert isinstance(got, want), f"entry {i} {entries[i]!r}: want " \
                                              f"{want.__name__}, got {got!r}"
                continue
            assert isinstance(got, VisibilityChanged), f"entry {i}: got {got!r}"
            assert got.next_visible_time == want.due
            if want.due > now:
                self.issue(q, want, got.receipt)
            else:  # timeout 0 (or under 1 ms): the lease ends now, Active again at now
                assert got.receipt is None
                assert got.next_visible_time == now

    @rule(ms=S.clock_steps)
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(nth=st.integers(0, 3), offset=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_deadline(self, nth: int, offset: int) -> None:
        """Move the clock onto (or 1 ms around) a future deadline: a lease's due time, a
        delay's end, or a message's retention limit, where off-by-one errors live."""
        now = self.now
        deadlines = set()
        for q in self.queues:
            for m in q.live(now):
                if m.state == LEASED:
                    deadlines.add(m.due)
                elif m.sent_delayed:
                    deadlines.add(m.visible)
                deadlines.add(m.enqueue + q.attrs["retention"] * 1000)
        future = sorted(d + offset for d in deadlines if d + offset > now)
        if future:
            self.clock.advance(future[min(nth, len(future) - 1)] - now)

    @rule()
    def reopen(self) -> None:
        """Reopening changes no figure of a queue (a send writes neither the watermarks nor,
        mostly, the open segment's row: opening derives them from the log)."""
        storage = ("messages", "bytes", "segments", "oldest", "newest", "rewindable")
        before = {q.name: {key: self.engine.get_queue(q.name).stats[key] for key in storage}
                  for q in self.queues}
        self.engine.close()
        self.engine = Engine.open(self.path, clock=self.clock, **self.options)
        after = {q.name: {key: self.engine.get_queue(q.name).stats[key] for key in storage}
                 for q in self.queues}
        assert after == before

    @rule(index=queue_index, kind=st.sampled_from(
        ["max", "visibility", "empty send", "empty delete", "empty change", "no queue"]),
        bad=S.bad_durations.filter(lambda v: v is not None),
        bad_max=st.sampled_from([0, 1001, -1, True, 2.0, "1", None]))
    def invalid_request(self, index: int, kind: str, bad: Any, bad_max: Any) -> None:
        """Requests that fail whole and change nothing."""
        q = self.queue(index)
        engine = self.engine
        calls = {
            "max": (InvalidArgument, lambda: engine.receive(q.name, max=bad_max)),
            "visibility": (InvalidArgument,
                           lambda: engine.receive(q.name, visibility_timeout=bad)),
            "empty send": (InvalidArgument, lambda: engine.send(q.name, [])),
            "empty delete": (InvalidArgument, lambda: engine.delete(q.name, [])),
            "empty change": (InvalidArgument, lambda: engine.change_visibility(q.name, [])),
            "no queue": (QueueNotFound, lambda: engine.send("gamma", [b"x"])),
        }
        error, call = calls[kind]
        with pytest.raises(error):
            call()

    @rule(index=queue_index)
    def get_queue(self, index: int) -> None:
        self.check_stats(self.queue(index))

    # -- invariants -------------------------------------------------------------------------------

    def check_stats(self, q: ModelQueue) -> None:
        info = self.engine.get_queue(q.name)
        assert info.attributes == q.attrs
        stats = info.stats
        want = q.stats(self.now)
        tag = stats["tags"]["default"]
        got = {
            "messages": stats["messages"], "oldest": stats["oldest"],
            "newest": stats["newest"], "rewindable": stats["rewindable"],
            "default": {k: tag[k] for k in ("active", "inflight", "delayed", "parked", "lag")},
        }
        assert got == want, f"stats of {q.name} at +{self.now - START_MS} ms"
        if q.expired_seq(self.now):
            event("stats: some messages expired")
        if q.gone and q.gone > q.expired_seq(self.now):
            event("stats: ended messages gone")
        assert list(stats["tags"]) == ["default"]

    @invariant()
    def stats_agree(self) -> None:
        if self.engine is None or not self.stats_every_step:
            return
        for q in self.queues:
            self.check_stats(q)


EngineMachine.TestCase.settings = machine_settings(80, 40)
TestEngineModel = EngineMachine.TestCase


# ----------------------------------------------------------------------------------------------
# Focused examples in the same spirit (each one a scenario the machine also reaches)
# ----------------------------------------------------------------------------------------------

# (the ``clock`` and ``engine`` fixtures come from tests/conftest.py; START_MS is its clock)


def test_delivery_order_active_again_then_priority(engine, clock):
    """Active again by (time it became Active, seq), then never-delivered by (priority, seq)."""
    engine.create_queue("q")
    a, b, c, d = engine.send("q", [b"a", {1: b"b", 5: 2}, {1: b"c", 4: 1}, {1: b"d", 4: 16}])
    first = engine.receive("q", max=1, visibility_timeout=1)
    assert [x.id for x in first] == [c.id]            # priority 1 before 8 and 16
    clock.advance(2000)                               # c Active again at +1 s, b at +2 s
    got = engine.receive("q", max=5)
    assert [x.id for x in got] == [c.id, b.id, a.id, d.id]
    assert [x.dequeue_count for x in got] == [2, 1, 1, 1]
    assert [x.first_dequeue_time for x in got] == [START_MS] + [START_MS + 2000] * 3
    assert all(x.next_visible_time == START_MS + 2000 + 30_000 for x in got)
    assert got[1].message.visible_time == START_MS + 2000
    assert engine.receive("q", max=5) == []


def test_receipts_current_stale_invalid(tmp_path, clock):
    engine = Engine.open(tmp_path / "data", clock=clock)
    engine.create_queue("q")
    engine.create_queue("other")
    engine.send("q", [b"x", b"y"])
    engine.send("other", [b"z"])
    x, y = engine.receive("q", max=2, visibility_timeout=10)
    (z,) = engine.receive("other")
    changed, = engine.change_visibility("q", [[x.receipt, 5]])
    assert changed.next_visible_time == START_MS + 5000 and changed.receipt != x.receipt
    forged = bytearray(y.receipt)
    forged[-1] ^= 1
    results = engine.delete("q", [x.receipt, bytes(forged), z.receipt, b"", y.receipt,
                                  y.receipt])
    assert [error_name(r) for r in results] == [
        "StaleReceipt", "InvalidReceipt", "InvalidReceipt", "InvalidReceipt", "ok",
        "StaleReceipt"]
    engine.close()
    engine = Engine.open(tmp_path / "data", clock=clock)   # receipts survive a restart
    ended, = engine.change_visibility("q", [[changed.receipt, 0]])
    assert ended == VisibilityChanged(None, START_MS)
    assert [error_name(r) for r in engine.delete("q", [changed.receipt])] == ["StaleReceipt"]
    again, = engine.receive("q")
    assert again.id == x.id and again.dequeue_count == 2
    assert engine.delete("other", [z.receipt]) == [None]
    engine.close()


def test_queue_full_until_the_clock_passes_production(engine, clock):
    """A message Ended in the ms it was produced still counts against max_messages."""
    engine.create_queue("q", {"max_messages": 1})
    assert isinstance(engine.send("q", [b"a", b"b"])[1], QueueFull)
    (delivery,) = engine.receive("q")
    assert engine.delete("q", [delivery.receipt]) == [None]
    assert engine.get_queue("q").stats["messages"] == 1
    assert isinstance(engine.send("q", [b"b"])[0], QueueFull)
    clock.advance(1)
    assert engine.get_queue("q").stats["messages"] == 0
    assert isinstance(engine.send("q", [b"b"])[0], Sent)


def test_retention_expires_messages_and_their_leases(engine, clock):
    engine.create_queue("q", {"retention": 60})
    engine.send("q", [b"a", b"b", b"c"])
    a, b = engine.receive("q", max=2, visibility_timeout=43200)
    clock.advance(60_000)                             # exactly retention old: not Expired yet
    assert engine.delete("q", [a.receipt]) == [None]
    stats = engine.get_queue("q").stats
    assert (stats["messages"], stats["tags"]["default"]["inflight"]) == (2, 1)
    clock.advance(1)
    assert [error_name(r) for r in engine.delete("q", [b.receipt])] == ["StaleReceipt"]
    assert engine.receive("q", max=5) == []
    stats = engine.get_queue("q").stats
    assert stats["messages"] == 0 and stats["oldest"] is None
    assert {k: stats["tags"]["default"][k] for k in ("active", "inflight", "delayed")} == \
        {"active": 0, "inflight": 0, "delayed": 0}


def test_invalid_entries_are_refused_one_by_one(engine, clock):
    engine.create_queue("q", {"max_message_size": 1024})
    results = engine.send("q", [b"ok", b"", {1: b"x", 4: 0}, {1: b"x", 4: True},
                                {1: b"x", 9: 1}, {1: b"x", 2: {"DLQ.a": 1}}, "\u00e9" * 513,
                                "t\u00e9xt"])
    assert [error_name(r) for r in results] == [
        "ok", "InvalidArgument", "InvalidArgument", "InvalidArgument", "InvalidArgument",
        "InvalidArgument", "MessageTooLarge", "ok"]
    assert results[-1].md5 == hashlib.md5("t\u00e9xt".encode()).digest()
    got = engine.receive("q", max=5)
    assert [x.body for x in got] == [b"ok", "t\u00e9xt"]
    assert engine.get_queue("q").stats["messages"] == 2


def test_stats_lag_counts_a_delayed_message(engine, clock):
    """DESIGN.md §8: ``lag`` is the production time of the oldest message not Ended for the
    tag. A Delayed message is not Ended, even after later messages were delivered and
    deleted."""
    engine.create_queue("q")
    engine.send("q", [{1: b"later", 5: 1}, b"now"])
    (now,) = engine.receive("q")
    assert engine.delete("q", [now.receipt]) == [None]
    clock.advance(5)
    stats = engine.get_queue("q").stats
    assert stats["messages"] == 2 and stats["tags"]["default"]["delayed"] == 1
    assert stats["tags"]["default"]["lag"] == START_MS
