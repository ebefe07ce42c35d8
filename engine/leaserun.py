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
  too; delayed and leased records are passed as the ``Lessor`` passes them;
- the run of plain first deliveries from the cursor (the usual receive: no record passed)
  takes per record only what its lease needs — the record read and checked, its receipt —:
  its seqs are a range, the byte budget is summed once after the run (and cuts it where
  ``Lessor._fits`` would have stopped), and the ``Lease`` objects, the records and the batch
  are made once the walk is proved. At the first record that is not one, the walk goes on
  record by record as the ``Lessor``'s does.
"""

from __future__ import annotations

from functools import partial
from itertools import repeat
from operator import itemgetter
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
_record_of = itemgetter(slice(PREFIX_SIZE, None))  # a log value's record: its prefix cut


def lease_run(engine: EngineCore, q: QueueState, t: TagState, now: int, visibility_ms: int,
              count: int, max_bytes: int | None
              ) -> tuple[FirstDeliveries | list[Any], int, int, int] | None:
    """A receive of up to ``count`` (3 to ``BATCH_ENTRIES``) done as ``Lessor.run`` does it,
    in its commonest case (module docstring) -> (the deliveries, the rows put: the batch's
    and perhaps the tag's, how many were leased, their records' summed length), or None
    having changed nothing (the ``Lessor``'s case)."""
    if (not LANE_WALK_MAX < count <= BATCH_ENTRIES or t.min_due_ms <= now
            or t.delay_hint <= now or len(q.lanes_used) != 1 or t.filter is not None):
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
    values: list[bytes] = []  # the leased records' log values (prefix and all), in order
    receipts: list[bytes] = []
    add_value, add_receipt = values.append, receipts.append
    number = first_number = t.lease_counter
    # The run of plain first deliveries from the cursor, the commonest receive: up to the
    # first record that is not one (or the lane's end), each leased with no other step (no
    # seq listed, the byte budget counted once after it). ``walked``: the seq counted.
    end = walked = start + count
    for walked in range(start, end):
        if not valid():
            break
        value = value_of()
        enqueue_ms, visible_ms, topic_id, _ = _unpack(value)
        if visible_ms != enqueue_ms or topic_id or enqueue_ms < start_ms or walked in leases:
            break
        body = pack_body(qid, tid, lane, walked, number)
        mac = keyed_copy()  # ReceiptCodec.issue, in line
        mac.update(body)
        add_receipt(body + mac.digest())
        add_value(value)
        number += 1
        step()
    else:
        walked = end
    have = number - first_number
    seqs: list[int] | None = None  # while None: the leased seqs run from ``start``, dense
    room = 0
    cut = False  # the byte budget stopped the run
    if max_bytes is not None:  # ``Lessor._fits`` of each in turn (the first always fits)
        room = max_bytes - (sum(map(len, values)) + DELIVERY_OVERHEAD_BYTES * have)
        if room < 0 and have > 1:
            have, spent = 1, len(values[0]) + DELIVERY_OVERHEAD_BYTES
            for value in values[1:]:
                spent += len(value) + DELIVERY_OVERHEAD_BYTES
                if spent > max_bytes:
                    break
                have += 1
            del values[have:], receipts[have:]
            number = first_number + have
            cut = True
    if not cut and have < count and valid():
        # Stopped at a record that is not a plain first delivery: ``_never_delivered``'s
        # loop on from it (delayed and leased records passed, the rest the ``Lessor``'s).
        seqs = [*range(start, walked)]
        add_seq = seqs.append
        # The examine budget: ``cap`` falls as records are passed (none was yet).
        bound = EXAMINE_LIMIT
        cap = count if count < bound else bound
        while have < cap and valid():
            value = value_of()
            enqueue_ms, visible_ms, topic_id, _ = _unpack(value)
            if visible_ms != enqueue_ms or walked in leases:  # delayed, or leased: passed
                bound -= 1
                if bound < cap:
                    cap = bound
            elif topic_id or enqueue_ms < start_ms:  # the general gate's: not this path's
                return None
            else:
                if max_bytes is not None:
                    needed = len(value) + DELIVERY_OVERHEAD_BYTES  # as ``Lessor._fits``
                    if have and needed > room:
                        break
                    room -= needed
                body = pack_body(qid, tid, lane, walked, number)
                mac = keyed_copy()
                mac.update(body)
                add_receipt(body + mac.digest())
                add_value(value)
                add_seq(walked)
                number += 1
                have += 1
            step()
            walked += 1
    # The walk read ``walked - start`` records from the key at or after ``start``: resting on
    # the record at ``walked`` (or past the tail at ``tail + 1``) proves it read every seq
    # in between, one record each, so the counted seqs are the records' own.
    resting = valid()
    if resting:
        if _seq_of(it.key(), 5)[0] != walked:
            return None  # not dense after all: the ``Lessor`` reads the keys
    elif walked != tail + 1:
        return None
    # Leased as ``_never_delivered`` and ``Lessor._save_batch`` lease them.
    t.lease_counter = number
    rows = 0
    if have:
        if seqs is None:
            seqs = [*range(start, start + have)]
        batch = LeaseBatch(b"", b"", seqs, bytearray())
        numbers = range(first_number, number)
        leases.update(zip(seqs, map(partial(Lease, LEASED, lane, due, 1, now), numbers,
                                    receipts, repeat(batch))))
        save_batch(store, qid, t, lane, batch, seqs, numbers, due, now)
        store.pending += 1
        rows = 1
        engine._deadlines.watch_lease_due(q, t, due)
    if cut:  # the first that did not fit (the walk read on past it)
        cursor = start + have
    elif have < count:
        cursor = walked
    elif not resting:
        cursor = tail + 1
    else:  # ``skip_settled``, whose usual answer is the record the walk rests on
        enqueue_ms, visible_ms, _, _ = _unpack(value_of())
        cursor = walked if (visible_ms == enqueue_ms and walked not in leases
                            and enqueue_ms >= start_ms) else skip_settled(t, it, tail)
    if t.lease_counter > t.counter_ceiling:
        if cursor != cursors[lane]:
            cursors[lane] = cursor
        store.put(store.tags_h, keys.tag_key(qid, tid), t.encode_cursors())
        rows += 1
    elif cursor != cursors[lane]:
        cursors[lane] = cursor
        t.row_behind = True
    if have:
        records = [*map(_record_of, values)]
        return FirstDeliveries(records, receipts, now, due), rows, have, sum(map(len, records))
    return [], rows, 0, 0
