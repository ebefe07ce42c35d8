"""A receive of a run of first deliveries from one lane, on a short path (``lease_run``).

The commonest receive of a batch — a consumer reading a backlog: one lane in use, no lease
deadline nor delay end due, no filter, and plain messages (no topic) from the lane's cursor on
— makes exactly what ``Lessor.run`` makes for it (the same leases, receipts, lease batch row,
due index entries, heap entries, cursor, tag row and ``FirstDeliveries``) without the
``Lessor`` and its general walk:

- it reads the lane without reading each record's key: in a queue with one lane in use the
  lane's seqs from ``gone_seq`` up are dense (``LaneWalk``), so the n-th record after the
  walk's start is at seq ``start + n``. The walk proves it before changing anything: it ends
  on the record at the counted seq (its key is read once), or past the lane's tail exactly
  there; otherwise the short path gives up and the ``Lessor`` reads the keys;
- it leases nothing until the walk is done and proved, so giving up changes nothing. A record
  it does not handle (a topic, a dead letter's mark, out of the tag's scope) makes it give up
  too; delayed and leased records are passed as the ``Lessor`` passes them.
"""

from __future__ import annotations

from typing import Any

from . import keys
from .core import EngineCore
from .leasebatch import LeaseBatch
from .lessor import (
    BATCH_ENTRIES,
    DELIVERY_OVERHEAD_BYTES,
    EXAMINE_LIMIT,
    LANE_WALK_MAX,
    save_batch,
)
from .receipts import pack_body
from .records import PREFIX, PREFIX_SIZE
from .results import FirstDeliveries
from .scope import skip_settled
from .state import LEASED, Lease, QueueState, TagState
from .store import LaneWalk

_unpack = PREFIX.unpack_from
_seq_of = keys.LOG_SEQ.unpack_from


def lease_run(engine: EngineCore, q: QueueState, t: TagState, now: int, visibility_ms: int,
              count: int, max_bytes: int | None
              ) -> tuple[FirstDeliveries | list[Any], int] | None:
    """A receive of up to ``count`` (3 to ``BATCH_ENTRIES``) done as ``Lessor.run`` does it,
    in its commonest case (module docstring) -> (the deliveries, the rows put: the batch's
    and perhaps the tag's), or None having changed nothing (the ``Lessor``'s case)."""
    if (t.min_due_ms <= now or t.delay_hint <= now or len(q.lanes_used) != 1
            or t.filter is not None or not LANE_WALK_MAX < count <= BATCH_ENTRIES):
        return None
    lane = q.lanes_used[0]
    tail, cursors = q.lane_tail[lane], t.cursors
    start = max(cursors[lane], q.gone_seq, t.start_seq)
    if tail - start < LaneWalk.STEPS:  # a record or two: the ``Lessor``'s point reads
        return None
    store, leases, start_ms = engine._store, t.leases, t.start_ms
    qid, tid, due = q.id, t.id, now + visibility_ms
    keyed_copy = engine._receipts.keyed_copy
    it = store.lane_scan(qid, lane, start, tail)
    valid, value_of, step = it.valid, it.value, it.next
    seqs: list[int] = []
    made: list[Lease] = []
    records: list[bytes] = []
    receipts: list[bytes] = []
    add_seq, add_lease, add_record, add_receipt = (seqs.append, made.append, records.append,
                                                   receipts.append)
    batch = LeaseBatch(b"", b"", seqs, bytearray())
    number = first_number = t.lease_counter
    limited = max_bytes is not None
    room = max_bytes if max_bytes is not None else 0
    # ``_never_delivered``'s examine budget: ``cap`` falls as records are passed.
    bound = EXAMINE_LIMIT
    cap = count if count < bound else bound
    seq, have = start, 0
    while have < cap and valid():
        value = value_of()
        enqueue_ms, visible_ms, topic_id, _ = _unpack(value)
        if visible_ms != enqueue_ms or seq in leases:  # delayed, or leased: passed
            bound -= 1
            if bound < cap:
                cap = bound
        elif topic_id or enqueue_ms < start_ms:  # the general gate's: not this path's case
            return None
        else:
            if limited:
                needed = len(value) + DELIVERY_OVERHEAD_BYTES  # as ``Lessor._fits``
                if have and needed > room:
                    break
                room -= needed
            body = pack_body(qid, tid, lane, seq, number)
            mac = keyed_copy()  # ReceiptCodec.issue, in line
            mac.update(body)
            receipt = body + mac.digest()
            add_lease(Lease(LEASED, lane, due, 1, now, number, receipt, batch))
            number += 1
            add_seq(seq)
            add_record(value[PREFIX_SIZE:])
            add_receipt(receipt)
            have += 1
        step()
        seq += 1
    # The walk read ``seq - start`` records from the key at or after ``start``: resting on
    # the record at ``seq`` (or past the tail at ``tail + 1``) proves it read every seq in
    # between, one record each, so the counted seqs are the records' own.
    if valid():
        if _seq_of(it.key(), 5)[0] != seq:
            return None  # not dense after all: the ``Lessor`` reads the keys
    elif seq != tail + 1:
        return None
    # Leased as ``_never_delivered`` and ``Lessor._save_batch`` lease them.
    t.lease_counter = number
    rows = 0
    if have:
        leases.update(zip(seqs, made))
        save_batch(store, qid, t, lane, batch, seqs, range(first_number, number), due, now)
        store.pending += 1
        rows = 1
        engine._deadlines.watch_lease_due(q, t, due)
    cursor = skip_settled(t, it, tail) if have >= count else seq
    if t.lease_counter > t.counter_ceiling:
        if cursor != cursors[lane]:
            cursors[lane] = cursor
        store.put(store.tags_h, keys.tag_key(qid, tid), t.encode_cursors())
        rows += 1
    elif cursor != cursors[lane]:
        cursors[lane] = cursor
        t.row_behind = True
    if have:
        return FirstDeliveries(records, receipts, now, due), rows
    return [], rows
