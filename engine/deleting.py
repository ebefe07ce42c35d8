"""A consumer's delete, on short paths: the receipts of a receive's batch as a run, or one
receipt of a lease of its own row (``MessagingOps.delete``, messaging.py, on a tag with no
topic head and no rewind in effect). Each ends its leases exactly as the general loop
(``MessagingOps._delete_receipts``) does in line, or changes nothing and leaves the
receipts to that loop; tests/engine/test_delete_run.py and test_delete_lone.py play the
same scenarios both ways."""

from __future__ import annotations

from heapq import heappop, heappush
from hmac import compare_digest
from itertools import repeat
from typing import Any, Sequence

from . import keys
from .leasebatch import LeaseBatch
from .receipts import RECEIPT_BYTES, unpack_claim
from .state import ENDED_DELETED, LEASED, Lease, QueueState, TagState
from .store import Store

#: The states of a batch row's entries deleted (a row holds at most 64).
_DELETED_STATES = bytes((ENDED_DELETED,)) * 64


def delete_run(q: QueueState, t: TagState, receipts: Sequence[object],
               now: int) -> LeaseBatch | None:
    """A consumer's delete of a receive's batch (``MessagingOps.delete``, on a tag with no
    topic head and no rewind in effect): when ``receipts`` (more than one) are, in order,
    the receipts issued here for the current leases of consecutive seqs that one batch row
    of dense seqs holds, below their lane's cursor, end them as ``_delete_receipts``' loop
    does in line (the leases out of memory, the due index and the heaps, their entries
    marked deleted) -> that batch; else change nothing -> None (the loop's case).

    The checks are the loop's, made for the run at once: the first receipt's claim as the
    loop reads it; then every seq's lease held by the same batch (so LEASED, due when the
    first is: a changed lease leaves its batch), every receipt of type ``bytes`` and equal
    (``compare_digest``) to the one issued for its lease — which holds the seq and the lease
    number, so equality proves the claim."""
    receipt = receipts[0]
    if receipt.__class__ is not bytes or len(receipt) != RECEIPT_BYTES:
        return None
    seq, number = unpack_claim(receipt)
    leases = t.leases
    lease = leases.get(seq)
    if lease is None or (batch := lease.batch) is None:
        return None
    seqs, count = batch.seqs, len(receipts)
    offset = seq - seqs[0]
    stop = seq + count
    if (lease.number != number or lease.due_ms <= now or seq < q.gone_seq
            or stop > t.cursors[lease.lane] or offset + count > len(seqs)
            or seqs[-1] - seqs[0] != len(seqs) - 1):  # dense: an entry's index its offset
        return None
    run = range(seq, stop)
    entries: list[Any] = [*map(leases.get, run)]  # a None raises, caught below
    try:
        for entry, receipt in zip(entries, receipts):
            if (entry.batch is not batch or receipt.__class__ is not bytes
                    or not compare_digest(entry.receipt, receipt)):
                return None
    except (AttributeError, TypeError):  # a seq without a lease, a lease without a receipt
        return None
    [*map(leases.pop, run)]
    batch.states[offset:offset + count] = _DELETED_STATES[:count]
    ended = seqs[offset:offset + count]
    t.due_index.discard_run(lease.due_ms, ended)
    if not leases:  # every heap entry names a lease gone (as ``_delete_receipts``)
        t.lease_heap.clear()
        t.row_heap.clear()
    else:  # the oldest batch of several in flight: its entries head the heaps
        last = stop - 1
        for heap in (t.lease_heap, t.row_heap):
            if heap and heap[0] == seq and len(heap) >= count:
                # The ``count`` least entries, at least ``seq``: those of ``ended`` (each
                # names a lease gone, which the heaps' readers would pop one by one), or,
                # should an entry of the run be missing, one past ``last`` put back.
                popped = [*map(heappop, repeat(heap, count))]
                if popped[-1] > last:
                    for other in popped:
                        if other > last:
                            heappush(heap, other)
    return batch


def delete_lone(store: Store, q: QueueState, t: TagState, receipt: object,
                now: int) -> tuple[int, bytes, Lease] | None:
    """A consumer's delete of one message (``MessagingOps.delete``, on a tag with no topic
    head and no rewind in effect): when ``receipt`` is the one issued here for a current
    lease of its own row (``leases``, no batch), end it as ``_delete_receipts``' loop does
    in line (the lease out of memory and the due index) -> (seq, row key, lease) for
    ``delete`` to write its ``ENDED_DELETED`` row unless settling passes it; else change
    nothing -> None (the loop's case)."""
    if receipt.__class__ is not bytes or len(receipt) != RECEIPT_BYTES:
        return None
    seq, number = unpack_claim(receipt)
    leases = t.leases
    lease = leases.get(seq)
    if (lease is None or lease.batch is not None or lease.number != number
            or lease.state != LEASED or lease.receipt is None
            or not compare_digest(lease.receipt, receipt) or lease.due_ms <= now
            or seq < q.gone_seq or seq >= t.cursors[lease.lane]):
        return None
    del leases[seq]
    t.due_index.discard(lease.due_ms, seq)
    if not leases:  # every heap entry names a lease gone (as ``_delete_receipts``)
        t.lease_heap.clear()
        t.row_heap.clear()
    key = keys.lease_key(q.id, t.id, seq)
    store.pending += 1
    store.written.append(key)  # names the queue, should the write fail
    return seq, key, lease
