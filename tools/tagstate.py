"""A message's state for one tag, derived from the stored rows alone (no ``Engine``).

``Engine.open`` takes the LOCK and writes, so the inspection tools cannot ask the engine. This
module re-derives what ``peek`` would answer, following ``InspectionOps._peek_state``
(engine/inspection.py) line for line, with its helpers ``_active_or_parked`` (same file) and
``TopicOps._topic_gate`` / ``_topic_in_scope`` / ``_pending`` / ``_in_scope`` (engine/topics.py).
The tag's in-memory state is rebuilt as ``EngineCore._load_tag`` does at open
(``Snapshot.load_leases``): lease rows, cursors, delay position, and topic heads from the
LEASED rows. When those rules change, this file must follow.

States (PROTOCOL.md §4 "Peeked"): ``active``, ``inflight``, ``delayed``, ``parked``,
``deleted``, ``dead``; and, for messages ``peek`` would not show at all:

    gone          below the queue's gone_seq (Ended for every tag, or purged)
    expired       older than the queue's retention at ``now`` (the engine's next operation
                  raises gone_seq over it)
    out_of_scope  before the tag's start or not matching its filter (Ended for the tag)

Not emulated: a dead-letter move or topic hand-over that is due but not yet applied by the
engine (its next operation on the queue applies them first); such a message shows the state its
rows hold now (an expired lease with ``max_receives`` reached shows ``active``).
"""

from __future__ import annotations

from lamina.engine import keys
from lamina.engine.records import PREFIX, PREFIX_SIZE
from lamina.engine.state import (
    DEAD_MARK,
    DEFAULT_LANE,
    ENDED_AHEAD,
    ENDED_DEAD,
    LEASED,
    Lease,
    QueueState,
    TagState,
)
from lamina.engine.store import Store
from lamina.engine.topics import TopicOps

from .snapshot import Snapshot

__all__ = ["TagStates"]

_STATE_OF_ROW = {ENDED_AHEAD: "deleted", ENDED_DEAD: "dead"}
_in_scope = TopicOps._in_scope  # a staticmethod: start and filter, nothing else


class TagStates:
    """``state(seq, value)`` of messages of one queue for one tag at ``now``."""

    def __init__(self, snapshot: Snapshot, q: QueueState, t: TagState, now: int):
        snapshot.load_leases(q, t)
        self.snapshot = snapshot
        self.q = q
        self.t = t
        self.now = now
        self.retained_from = snapshot.retained_from(q, now)

    def state(self, seq: int, value: bytes) -> tuple[str, int, int | None, int | None]:
        """-> (state, dequeue_count, first_dequeue_time, next_visible_time) of the message
        ``seq`` whose log value is ``value``."""
        q, t = self.q, self.t
        if seq < q.gone_seq:
            return "gone", 0, None, None
        if seq < self.retained_from:
            return "expired", 0, None, None
        if not _in_scope(t, seq, PREFIX.unpack_from(value)[0], value[PREFIX_SIZE:]):
            return "out_of_scope", 0, None, None
        return self._peek_state(seq, value)

    # -- engine/inspection.py -----------------------------------------------------------------

    def _peek_state(self, seq: int, value: bytes) -> tuple[str, int, int | None, int | None]:
        """``InspectionOps._peek_state``."""
        t, now = self.t, self.now
        enqueue_ms, visible_ms, topic_id, _ = PREFIX.unpack_from(value)
        lease = t.leases.get(seq)
        topic = topic_id if 0 < topic_id < DEAD_MARK else 0
        if lease is not None:
            first = lease.first_ms or None
            if lease.state != LEASED:
                return _STATE_OF_ROW[lease.state], lease.count, first, None
            if lease.due_ms > now:
                return "inflight", lease.count, first, lease.due_ms
            return self._active_or_parked(topic, seq), lease.count, first, None
        if visible_ms != enqueue_ms:
            if not t.delay_taken(visible_ms, seq):
                if visible_ms > now:
                    return "delayed", 0, None, None
                return self._active_or_parked(topic, seq), 0, None, None
        elif seq >= t.cursors[PREFIX.unpack_from(value)[3]]:
            return self._active_or_parked(topic, seq), 0, None, None
        if topic:  # passed by the cursor: parked behind its topic's head, or ended
            head = t.locked.get(topic)
            if head is not None and head < seq or head is None and not self._topic_gate(
                    topic, seq):
                return "parked", 0, None, None
        row = self.snapshot.store.leases.get(keys.lease_key(self.q.id, t.id, seq))
        if row is not None:  # deleted after delivery: its count is kept on disk
            deleted = Lease.decode(row)
            return "deleted", deleted.count, deleted.first_ms or None, None
        return "deleted", 0, None, None

    def _active_or_parked(self, topic: int, seq: int) -> str:
        """``InspectionOps._active_or_parked``."""
        if not topic:
            return "active"
        head = self.t.locked.get(topic)
        if head is None:
            return "active" if self._topic_gate(topic, seq) else "parked"
        return "active" if head == seq else "parked"

    # -- engine/topics.py ---------------------------------------------------------------------

    def _topic_gate(self, topic_id: int, seq: int) -> bool:
        """``TopicOps._topic_gate``: may ``seq`` be leased now? If not, the topic is locked
        behind the nearest pending predecessor (in this view's copy of the tag only)."""
        q, t = self.q, self.t
        head = t.locked.get(topic_id)
        if head is not None:
            return head == seq
        lower = keys.topic_key(q.id, topic_id, max(q.gone_seq, t.start_seq))
        it = Store.scan(self.snapshot.store.topics, lower, keys.topic_key(q.id, topic_id, seq),
                        last=True)
        while it.valid():
            previous = keys.topic_key_decode(it.key())[2]
            stored = it.value()  # enqueue_ms:u64 | visible_ms:u64 (keys.py, ``topics``)
            enqueue_ms, visible_ms = keys.read_u64(stored), keys.read_u64(stored, 8)
            if self._topic_in_scope(previous, enqueue_ms):
                lease = t.leases.get(previous)
                if (lease.state == LEASED) if lease is not None else \
                        self._pending(previous, enqueue_ms, visible_ms):
                    t.lock(topic_id, previous)
                    return False
                return True
            it.prev()
        return True

    def _topic_in_scope(self, seq: int, enqueue_ms: int) -> bool:
        """``TopicOps._topic_in_scope``."""
        t = self.t
        if seq < t.start_seq or enqueue_ms < t.start_ms:
            return False
        if t.filter is None:
            return True
        value = self.snapshot.store.log.get(keys.log_key(self.q.id, DEFAULT_LANE, seq))
        return _in_scope(t, seq, enqueue_ms, None if value is None else value[PREFIX_SIZE:])

    def _pending(self, seq: int, enqueue_ms: int, visible_ms: int) -> bool:
        """``TopicOps._pending``."""
        t = self.t
        if visible_ms != enqueue_ms:
            return not t.delay_taken(visible_ms, seq)
        return seq >= t.cursors[DEFAULT_LANE]
