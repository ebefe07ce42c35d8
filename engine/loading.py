"""Reading a queue's state from the store: shared by the engine's open (and reloads after a
failed write) and the offline tools, which read a data directory without an ``Engine``.

What is read here is what the rows say; what the engine derives at open on top of it (wake-ups,
dead-letter sources, parked topics, snapped cursors) stays in the engine.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator

import cbor2

from . import keys, leasebatch, timeindex
from .records import PREFIX, PREFIX_SIZE, body_size
from .state import (DAY_MS, DEAD_MARK, DEFAULT_LANE, ENDED_DELETED, LANE_RANGE, Lease,
                    QueueState, Segment, TagState)
from .store import Store


def read_queue(store: Store, queue_id: int, definition: dict[str, Any],
               watermarks: bytes) -> QueueState:
    """A queue from its definition and watermarks: its lane tails and segments (no tags).

    A send writes neither the watermarks nor (mostly) the open segment's row: ``next_seq``
    is one past the newest log row when that is above the stored one (the newest message is
    never collected: it is in the open segment), and the open segment is completed from the
    log rows after the ``last_seq`` its row holds (``Segment``)."""
    q = QueueState(queue_id, definition["name"], definition["attributes"],
                   definition["created"])
    q.decode_watermarks(watermarks)
    for lane in LANE_RANGE:
        lower, upper = keys.log_lane_bounds(queue_id, lane)
        it = Store.scan(store.log, lower, upper, last=True)
        if it.valid():
            q.lane_tail[lane] = keys.log_seq(it.key())
            q.lanes_used.append(lane)
        else:
            it.check_status()  # RocksDB's error, not an empty lane
    q.next_seq = max(q.next_seq, max(q.lane_tail) + 1)
    lower, upper = keys.queue_bounds(queue_id)
    for key, value in Store.items(store.segments, lower, upper):
        q.segments.append(Segment.decode(keys.segment_key_decode(key)[1], value))
    if q.segments:
        _complete_open_segment(store, q, q.segments[-1])
        q.last_time_ms = q.segments[-1].last_ms
        timeindex.load_newest(store, q)
    return q


def _complete_open_segment(store: Store, q: QueueState, segment: Segment) -> None:
    """Add the log rows after the open segment's stored ``last_seq`` to it (at most
    ``SEGMENT_SAVE_MESSAGES`` messages or about ``SEGMENT_SAVE_BYTES`` bytes): they are also
    the sends the queue's counter rows do not hold yet (``QueueState.unsaved_sends``)."""
    tail = max(q.lane_tail)
    if tail <= segment.last_seq:
        return
    for lane in q.lanes_used:
        lower, upper = keys.log_lane_bounds(q.id, lane, segment.last_seq + 1)
        for value in Store.values(store.log, lower, upper):
            segment.count += 1
            segment.size_bytes += len(value) - PREFIX_SIZE
            enqueue_ms = PREFIX.unpack_from(value)[0]
            if enqueue_ms > segment.last_ms:
                segment.last_ms = enqueue_ms
            sends = q.unsaved_sends.setdefault(enqueue_ms // DAY_MS, [0, 0])
            sends[0] += 1
            sends[1] += body_size(value[PREFIX_SIZE:])
    segment.last_seq = tail


def tag_definitions(store: Store, queue_id: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(tag id, definition) of every tag of the queue, by id."""
    lower, upper = keys.tag_def_bounds(queue_id)
    for key, value in Store.items(store.meta, lower, upper):
        yield keys.tag_def_ids(key)[1], cbor2.loads(value)


def lease_rows(store: Store, queue_id: int, tag_id: int, gone_seq: int
               ) -> Iterator[tuple[int, Lease]]:
    """``(seq, lease)`` of every lease of the tag, by seq (ENDED_DELETED ones too): its
    ``leases`` rows, and the entries of its batch rows at or above ``gone_seq`` that no
    ``leases`` row overrides (leasebatch.py). A ``leases`` row below ``gone_seq`` is
    ENDED_DELETED whatever it holds: a delete that ``gone_seq`` passed at once leaves the
    message's row as it was (docs/STORAGE.md "Leases"); its count and first dequeue time
    are the message's."""
    lower, upper = keys.tag_scope_bounds(queue_id, tag_id)
    rows = ((seq, 0, lease if seq >= gone_seq or lease.state == ENDED_DELETED
             else Lease(ENDED_DELETED, lease.lane, 0, lease.count, lease.first_ms, 0))
            for seq, lease in ((keys.lease_key_decode(key)[2], Lease.decode(value))
                               for key, value in Store.items(store.leases, lower, upper)))
    batches = [((seq, 1, lease) for seq, lease in
                leasebatch.lane_leases(store, queue_id, tag_id, lane, gone_seq))
               for lane in LANE_RANGE]
    last = -1
    for seq, _, lease in heapq.merge(rows, *batches):
        if seq != last:  # a ``leases`` row (0) comes first and overrides a batch entry (1)
            last = seq
            yield seq, lease


def headed_topic(store: Store, q: QueueState, t: TagState, seq: int, lease: Lease) -> int:
    """The topic a LEASED row heads at open, or 0: the lowest leased message of a topic in
    the default lane heads it (rows come in seq order, so the first one met)."""
    if lease.lane != DEFAULT_LANE:
        return 0
    stored = store.log.get(keys.log_key(q.id, lease.lane, seq))
    topic_id = PREFIX.unpack_from(stored)[2] if stored else 0
    return topic_id if 0 < topic_id < DEAD_MARK and topic_id not in t.locked else 0
