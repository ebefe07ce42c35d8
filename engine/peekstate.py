"""A message's state for one tag, as ``peek`` answers it (PROTOCOL.md §4 "Peeked"),
derived from the tag's state and the stored rows: shared by the engine and the offline tools.
"""

from __future__ import annotations

from . import keys, leasebatch
from .records import PREFIX
from .scope import ended_in_turn, topic_gate
from .state import DEAD_MARK, ENDED_AHEAD, ENDED_DEAD, LEASED, Lease, QueueState, TagState
from .store import Store

#: (state, dequeue_count, first_dequeue_time, next_visible_time)
PeekState = tuple[str, int, "int | None", "int | None"]

_STATE_OF_ROW = {ENDED_AHEAD: "deleted", ENDED_DEAD: "dead"}


def peek_state(store: Store, q: QueueState, t: TagState, seq: int, value: bytes,
               now: int) -> PeekState:
    """-> (state, dequeue_count, first_dequeue_time, next_visible_time) of a message of
    the tag's scope that is above ``gone_seq``; ``value`` is its log value."""
    enqueue_ms, visible_ms, topic_id, lane = PREFIX.unpack_from(value)
    lease = t.leases.get(seq)
    topic = topic_id if 0 < topic_id < DEAD_MARK else 0
    if lease is not None:
        first = lease.first_ms or None
        if lease.state != LEASED:
            return _STATE_OF_ROW[lease.state], lease.count, first, None
        if lease.due_ms > now:
            return "inflight", lease.count, first, lease.due_ms
        return active_or_parked(store, q, t, topic, seq), lease.count, first, None
    if visible_ms != enqueue_ms:
        if not t.delay_taken(visible_ms, seq):
            if visible_ms > now:
                return "delayed", 0, None, None
            return active_or_parked(store, q, t, topic, seq), 0, None, None
    elif seq >= t.cursors[lane]:
        return active_or_parked(store, q, t, topic, seq), 0, None, None
    if topic and not ended_in_turn(t, topic, seq, enqueue_ms, visible_ms):
        # Passed by the cursor: parked behind its topic's head (a later one too, when
        # it was rewound behind an Inflight head: ``topic_from``), or ended.
        head = t.locked.get(topic)
        if head is None:
            if not topic_gate(store, q, t, topic, seq):
                return "parked", 0, None, None
        elif head < seq or t.topic_from.get(topic, seq + 1) <= seq:
            return "parked", 0, None, None
    # Deleted after delivery: its count is kept on disk, in its ``leases`` row or else in
    # the entry of its receive's batch (leasebatch.py).
    row = store.leases.get(keys.lease_key(q.id, t.id, seq))
    deleted = Lease.decode(row) if row is not None else leasebatch.find(store, q.id, t.id,
                                                                         lane, seq)
    if deleted is not None:
        return "deleted", deleted.count, deleted.first_ms or None, None
    return "deleted", 0, None, None


def active_or_parked(store: Store, q: QueueState, t: TagState, topic: int, seq: int) -> str:
    """An Active message of ``topic`` (0: none) is ``parked`` while it waits behind its head."""
    if not topic:
        return "active"
    head = t.locked.get(topic)
    if head is None:
        return "active" if topic_gate(store, q, t, topic, seq) else "parked"
    return "active" if head == seq else "parked"
