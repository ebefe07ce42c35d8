"""Which messages a tag receives, and when a topic message may be leased: plain functions
over ``TagState`` / ``QueueState`` and the store, shared by the engine's delivery paths, its
peek, and the offline tools (which rebuild a tag from the stored rows).

The topic rules these follow are in topics.py.
"""

from __future__ import annotations

import struct
from typing import AbstractSet, Any

import cbor2

from . import keys
from .records import PREFIX, PREFIX_SIZE
from .state import DEFAULT_LANE, LEASED, QueueState, TagState
from .store import Store

#: A ``topics`` row's value: enqueue_ms:u64 | visible_ms:u64.
TOPIC_VALUE = struct.Struct(">QQ")


def filter_matches(filter: dict[str, Any], attributes: dict[str, Any] | None) -> bool:
    """A value matches only an equal value of the same CBOR type; null means "present"."""
    attributes = attributes or {}
    results = []
    for name, wanted in filter["attributes"].items():
        if name not in attributes:
            results.append(False)
        elif wanted is None:
            results.append(True)
        else:
            have = attributes[name]
            results.append(type(have) is type(wanted) and have == wanted)
    return all(results) if filter["match"] == "all" else any(results)


def in_scope(t: TagState, seq: int, enqueue_ms: int, record: bytes | None) -> bool:
    """Whether tag ``t`` receives the message (start and filter; fixed at creation)."""
    if seq < t.start_seq or enqueue_ms < t.start_ms:
        return False
    if t.filter is None:
        return True
    return filter_matches(t.filter, cbor2.loads(record)[2])  # type: ignore[arg-type]


def record_of(store: Store, q: QueueState, seq: int, lane: int = DEFAULT_LANE) -> bytes | None:
    """The record (log value without its prefix) of ``seq``, None when collected."""
    value = store.log.get(keys.log_key(q.id, lane, seq))
    return None if value is None else value[PREFIX_SIZE:]


def topic_in_scope(store: Store, q: QueueState, t: TagState, seq: int, enqueue_ms: int) -> bool:
    """``in_scope`` for a topic message known by its ``topics`` row (its record is read only
    when the tag has a filter)."""
    if seq < t.start_seq or enqueue_ms < t.start_ms:
        return False
    return t.filter is None or in_scope(t, seq, enqueue_ms, record_of(store, q, seq))


def pending(t: TagState, seq: int, enqueue_ms: int, visible_ms: int) -> bool:
    """Whether an in-scope message without a lease row is not Ended for ``t``: a delayed
    one not yet taken from the delay index, or one its lane cursor has not reached."""
    if visible_ms != enqueue_ms:
        return not t.delay_taken(visible_ms, seq)
    return seq >= t.cursors[DEFAULT_LANE]


def ended_in_turn(t: TagState, topic_id: int, seq: int, enqueue_ms: int,
                  visible_ms: int) -> bool:
    """Whether ``seq`` (of ``topic_id``, no row, passed) is Ended: marked so when an earlier
    message came back out of turn (``topic_ended``). Else it was parked."""
    mark = t.topic_ended.get(topic_id)
    if mark is None or seq >= mark[0]:
        return False
    return visible_ms == enqueue_ms or (visible_ms, seq) <= (mark[1], mark[2])


def topic_gate(store: Store, q: QueueState, t: TagState, topic_id: int, seq: int) -> bool:
    """Whether ``seq`` (in scope, of ``topic_id``) may be leased now: no earlier message of
    its topic in the tag's scope is still not Ended. If one is, the earliest such is the
    topic's head, and remembered as such (``t.lock``).

    Walking back, a message delivered and deleted in its turn (no row, passed, not
    pending) ends the walk: everything before it had ended when it was leased. Rows
    ended out of turn (delete_by_id) do not."""
    head = t.locked.get(topic_id)
    if head is not None:
        return head == seq
    earliest = None
    lower = keys.topic_key(q.id, topic_id, max(q.gone_seq, t.start_seq))
    upper = keys.topic_key(q.id, topic_id, seq)
    # Walks of a queue's topics index share one iterator (the gate and the successor search
    # run once per topic message received or ended).
    reader = store.reader(store.topics, *keys.queue_bounds(q.id))
    for key, value in reader.backward(lower, upper):
        previous = keys.topic_key_decode(key)[2]
        enqueue_ms, visible_ms = TOPIC_VALUE.unpack(value)
        if topic_in_scope(store, q, t, previous, enqueue_ms):
            lease = t.leases.get(previous)
            if lease is not None:
                if lease.state == LEASED:
                    earliest = previous
                    break
            elif pending(t, previous, enqueue_ms, visible_ms):
                earliest = previous
            else:
                break
    if earliest is None:
        return True
    t.lock(topic_id, earliest)
    return False


def not_ended_between(store: Store, q: QueueState, t: TagState, low: int, high: int) -> int:
    """How many messages with ``low <= seq < high`` are not Ended for ``t`` (for the
    ``expired`` counter; costs a walk of the range, once per expiry)."""
    count = 0
    for seq, lease in t.leases.items():
        count += lease.state == LEASED and low <= seq < high
    unpack = PREFIX.unpack_from
    for lane in q.lanes_used:  # never delivered: ahead of the cursor, in scope, no row
        start = max(t.cursors[lane], low)
        if start >= high or start > q.lane_tail[lane]:
            continue
        lower, upper = keys.log_key(q.id, lane, start), keys.log_key(q.id, lane, high)
        for key, value in Store.items(store.log, lower, upper):
            enqueue_ms, visible_ms, _, _ = unpack(value)
            seq = keys.log_seq(key)
            count += (visible_ms == enqueue_ms and seq not in t.leases
                      and in_scope(t, seq, enqueue_ms, value[PREFIX_SIZE:]))
    lower, upper = keys.delayseq_key(q.id, low), keys.delayseq_key(q.id, high)
    for key, value in Store.items(store.delayseq, lower, upper):  # delayed, not taken
        seq, visible_ms = keys.delayseq_key_decode(key)[1], keys.read_u64(value)
        if seq in t.leases or t.delay_taken(visible_ms, seq):
            continue
        count += topic_or_plain_in_scope(store, q, t, seq)
    for topic, head in list(t.locked.items()):  # parked behind a head
        lower = keys.topic_key(q.id, topic, max(head + 1, low))
        for key in Store.keys(store.topics, lower, keys.topic_key(q.id, topic, high)):
            seq = keys.topic_key_decode(key)[2]
            if seq not in t.leases and seq < t.cursors[DEFAULT_LANE]:
                stored = store.log.get(keys.log_key(q.id, DEFAULT_LANE, seq))
                count += stored is not None and unpack(stored)[0] == unpack(stored)[1] and \
                    in_scope(t, seq, unpack(stored)[0], stored[PREFIX_SIZE:])
    return count


def topic_or_plain_in_scope(store: Store, q: QueueState, t: TagState, seq: int) -> bool:
    """Whether the message ``seq``, in whatever lane it is, is in the tag's scope."""
    for lane in q.lanes_used:
        value = store.log.get(keys.log_key(q.id, lane, seq))
        if value is not None:
            return in_scope(t, seq, PREFIX.unpack_from(value)[0], value[PREFIX_SIZE:])
    return False


def skip_settled(t: TagState, it: Any, tail: int, deleted: AbstractSet[int] = frozenset()) -> int:
    """Advance a lane iterator past records a cursor has nothing to do with -> the seq it
    rests on, or tail + 1. Settled: delayed (they reach tags through the delay index),
    holding a lease row (leased, ended ahead of the cursor, or ``deleted``), or outside
    the tag's scope (Ended for it). Stepping over them passes nothing that is not Ended
    or counted elsewhere in the floor."""
    unpack = PREFIX.unpack_from
    leases = t.leases
    while it.valid():
        value = it.value()
        enqueue_ms, visible_ms, _, _ = unpack(value)
        if visible_ms == enqueue_ms:
            seq = keys.log_seq(it.key())
            if seq not in leases and seq not in deleted and (
                    (t.filter is None and enqueue_ms >= t.start_ms and seq >= t.start_seq)
                    or in_scope(t, seq, enqueue_ms, value[PREFIX_SIZE:])):
                return seq
        it.next()
    return lane_end(it, tail)


def lane_end(it: Any, tail: int) -> int:
    """``tail + 1``, the cursor of a lane walked to its end by ``it`` (no longer valid),
    unless RocksDB failed a read there: that raises (``Scan.check_status``) rather than
    moving the cursor past records it could not read."""
    it.check_status()
    return tail + 1
