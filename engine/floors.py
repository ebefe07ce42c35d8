"""Floors: the lowest seq each tag (and the delay index) still holds, from which a queue's
``gone_seq`` is raised (DESIGN.md §3, rule 3 of core.py). Plain functions over
``QueueState`` / ``TagState`` and the store."""

from __future__ import annotations

import heapq

from . import keys
from .records import PREFIX
from .scope import topic_or_plain_in_scope
from .state import DEFAULT_TAG, ENDED_DEAD, LEASED, NO_DELAYED, Lease, QueueState, TagState
from .store import Store


def tag_floor(store: Store, queues: dict[int, QueueState], now: int, q: QueueState, t: TagState,
              dead_letters: bool = True) -> int:
    """The lowest seq not Ended for ``t`` among those its cursors passed or did not reach,
    its leases and the messages waiting behind an Inflight head of their topic
    (``topic_from``: the first of them is not Ended); with ``dead_letters``, also its
    dead letters whose DLQ copy is still alive (they hold ``gone_seq``: a redrive needs
    the original)."""
    floor = q.next_seq
    cursors, tails = t.cursors, q.lane_tail
    for lane in q.lanes_used:
        cursor = cursors[lane]
        if cursor <= tails[lane] and cursor < floor:
            floor = cursor
    heap, leases = t.lease_heap, t.leases
    while heap:
        lease = leases.get(heap[0])
        if lease is not None and lease.state == LEASED:
            floor = min(floor, heap[0])
            break
        heapq.heappop(heap)
    if t.topic_from:  # rewound or redriven messages waiting behind an Inflight head
        floor = min(floor, min(t.topic_from.values()))
    heap = t.dead_heap
    while heap and dead_letters:
        lease = leases.get(heap[0])
        if lease is not None and lease.state == ENDED_DEAD and copy_alive(store, queues, now, lease):
            floor = min(floor, heap[0])
            break
        heapq.heappop(heap)
    return floor


def copy_alive(store: Store, queues: dict[int, QueueState], now: int, lease: Lease) -> bool:
    """Whether the DLQ copy named by an ENDED_DEAD lease is not yet Ended for the DLQ's
    default tag (copies have no delay and no topic: a passed one without a row ended)
    nor expired: older than the DLQ's retention at the engine's now, even if no operation
    on the DLQ has applied that yet."""
    dlq = queues.get(lease.due_ms)
    if dlq is None or lease.number < dlq.gone_seq:
        return False
    horizon = now - dlq.attributes["retention"] * 1000
    if dlq.oldest_live_ms < horizon:  # else nothing retained in the DLQ can have expired
        # Records from gone_seq up are never collected: None is a copy appended by this
        # very operation (still in the pending batch), so it is new.
        value = store.log.get(keys.log_key(dlq.id, lease.lane, lease.number))
        if value is not None and PREFIX.unpack_from(value)[0] < horizon:
            return False
    default = dlq.tag_named(DEFAULT_TAG)
    assert default is not None
    copy = default.leases.get(lease.number)
    if copy is not None:
        return copy.state == LEASED
    return lease.number >= default.cursors[lease.lane]


def delayed_floor(store: Store, q: QueueState) -> int:
    """The lowest seq of a delayed message some tag still holds (``holds_delayed``).

    ``delayseq_from`` only moves up here, past entries no tag holds; a send of a delayed
    message lowers it in memory (its row is not written yet), a new tag or a rewind
    resets it."""
    tags = list(q.tags.values())
    if not tags:
        return q.next_seq
    position = min((t.delay_vt, t.delay_seq) for t in tags)
    lower = keys.delayseq_key(q.id, max(q.delayseq_from, q.gone_seq))
    for key, value in Store.items(store.delayseq, lower, keys.queue_bounds(q.id)[1]):
        seq, visible = keys.delayseq_key_decode(key)[1], keys.read_u64(value)
        if (visible, seq) > position and any(
                holds_delayed(store, q, t, seq, visible) for t in tags):
            q.delayseq_from = seq
            return seq
    q.delayseq_from = NO_DELAYED  # until a delayed send, a new tag or a rewind lowers it
    return q.next_seq


def holds_delayed(store: Store, q: QueueState, t: TagState, seq: int, visible: int) -> bool:
    """Whether delayed message ``seq`` is not Ended for ``t`` and only the delay index
    brings it: in the tag's scope, not yet taken (nor handled by a rewind), no row (a
    LEASED row counts in the tag floor; an ENDED one, e.g. deleted by id, is Ended)."""
    if seq in t.leases or t.delay_taken(visible, seq):
        return False
    if t.filter is None and t.start_ms <= 0 and seq >= t.start_seq:
        return True
    return topic_or_plain_in_scope(store, q, t, seq)
