"""Message operations for one tag: send, receive, delete, change_visibility, and deadlines.

Where a tag's next message comes from (DESIGN.md §2 "Delivery order", §3):

1. *Active again*, ordered by (time it became Active, seq), merged from two ordered sources:
   - lease deadlines with ``due <= now``: leases that ran out (or were ended by
     ``change_visibility 0``) — a lease row LEASED with due in the past *is* Active again, so
     expiry writes nothing;
   - ``delays`` entries past the tag's delay position with ``visible <= now``: delayed messages
     whose delay ended (lane cursors step over every delayed message, so each one arrives here
     exactly once per tag).
2. *Never delivered*, by (priority, seq): the lane cursors, lane 1 (highest priority) first.

A receive (``Lessor``, lessor.py) examines at most ``EXAMINE_LIMIT`` records, persists how far
it got, and may return fewer than ``max`` even when more are Active; a waiting receive simply
looks again.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from hmac import compare_digest
from typing import Any, Sequence

from . import keys
from .core import EngineCore
from .deleting import delete_lone, delete_run
from .leasebatch import LeaseBatch
from .leaserun import lease_run
from .lessor import LANE_WALK_MAX, Lessor, lease_first, nothing_to_deliver
from .errors import (
    InvalidArgument,
    InvalidReceipt,
    LaminaError,
    StaleReceipt,
)
from .receipts import RECEIPT_BYTES, ReceiptCodec, unpack_claim
from .results import Delivery, FirstDeliveries, Sent, SentColumns, VisibilityChanged
from .state import DAY_MS, ENDED_DELETED, LEASED, Lease, QueueState, TagState
from .validation import (
    MAX_BATCH,
    MAX_VISIBILITY_S,
    check_batch,
    check_int,
    check_seconds,
)

#: No batch: what ``_delete_receipts`` compares a lease's batch with before any (never one).
_NO_BATCH = LeaseBatch(b"", b"", [], bytearray())


def _floor_held(core: EngineCore, q: QueueState, t: TagState) -> bool:
    """A lease of ``t`` at ``gone_seq`` holds the tag's floor there, so settling could not
    raise ``gone_seq`` (``_settle_queue`` stops at it); a dead-letter queue's sources are
    settled all the same."""
    at_gone = t.leases.get(q.gone_seq)
    return (at_gone is not None and at_gone.state == LEASED
            and not core._dead_sources.get(q.id))


class MessagingOps:
    """send / receive / delete / change_visibility and the deadline interface."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core


    # -- send -------------------------------------------------------------------------------

    def send(self, queue: str, messages: Sequence[Any], *,
             caller: str | None = None) -> list[Sent | LaminaError] | SentColumns:
        """Append messages; per entry a ``Sent`` or the error that refused that entry, or
        ``SentColumns`` for a batch of plain messages all accepted (what a server splices
        into its answer, no ``Sent`` built per entry; ``Engine.send`` makes them)."""
        core = self._core
        with core._frame as now:  # ``_operation()``, a call less
            core._grants.check(caller, "send", queue)
            q = core._queue(queue)
            if messages.__class__ is not list or not messages or len(messages) > MAX_BATCH:
                messages = check_batch(messages, "messages")  # a copy, checked
            if now > q.quiet_until_ms:  # else ``_advance`` finds nothing due
                core._advance(q, now)
            core._settle(q, now)
            return core._appender.append(q, messages, now)

    # -- receive -----------------------------------------------------------------------------

    def receive(self, queue: str, tag: str | None = None, max: int = 1,
                visibility_timeout: float | None = None, *, max_bytes: int | None = None,
                caller: str | None = None) -> list[Delivery] | FirstDeliveries:
        """Lease up to ``max`` Active messages of ``tag`` (DESIGN.md §2 "Delivery order").

        ``max_bytes`` bounds the summed record sizes (a server passes its frame budget); a
        message that would pass it is not leased. Waiting is the server's business. The
        deliveries come as ``FirstDeliveries`` columns when all are first deliveries made in
        line (``Lessor.run``)."""
        core = self._core
        with core._frame as now:  # ``_operation()``, a call less
            core._grants.check(caller, "receive", queue)
            q = core._queue(queue)
            t = core._tag(q, tag)
            count = max if type(max) is int and 0 < max <= 1000 else check_int(
                max, "max", 1, 1000)
            if visibility_timeout is None:
                visibility_ms = q.attributes["visibility_timeout"] * 1000
            else:
                visibility_ms = check_seconds(visibility_timeout, "visibility_timeout", 1,
                                              MAX_VISIBILITY_S)
            core._advance(q, now)
            counters = core._counters
            deliveries: list[Delivery] | FirstDeliveries
            if count > LANE_WALK_MAX and (run := lease_run(
                    core, q, t, now, visibility_ms, count, max_bytes)) is not None:
                # A consumer's batch from a backlog, on a short path.
                deliveries, rows, leased, record_bytes = run
                held = leased > 0 and counters.received(q.id, t.id, leased, record_bytes, True)
            else:
                first = lease_first(core, q, t, now, visibility_ms, count)
                if first is None:  # not told there: the general tests
                    first = not nothing_to_deliver(q, t, now)
                if first is False:  # nothing to deliver (a long poll's receive, again)
                    core._settle(q, now)
                    return []
                if first is not True:  # the commonest receive of one, as the Lessor does it
                    deliveries, rows = [first], 1
                    held = counters.received(q.id, t.id, 1, len(first.record), True)
                else:
                    lessor = Lessor(core, q, t, now, visibility_ms, count, max_bytes)
                    deliveries, rows = lessor.run(), lessor.rows
                    if deliveries.__class__ is FirstDeliveries:
                        record_bytes = deliveries.record_bytes()
                    else:
                        record_bytes = sum([len(d.record) for d in deliveries])
                    held = bool(deliveries) and counters.received(
                        q.id, t.id, len(deliveries), record_bytes, lessor.first_in_line)
            # A consumer's in-order receive, or any while the oldest lease is held, leaves
            # the tag's floor at ``gone_seq``: settling could not raise it.
            if not _floor_held(core, q, t):
                core._settle(q, now)
            if held and core._store.pending == rows:
                # The batch holds this receive's lease rows alone (and perhaps the tag's row):
                # the figures held back can be found again from them at open.
                counters.held_batch = rows
            return deliveries

    # -- delete / change_visibility ----------------------------------------------------------

    def _current_lease(self, q: QueueState, t: TagState, receipt: object,
                       now: int) -> tuple[int, Lease]:
        """-> (seq, lease) for a receipt naming the current lease of a message, or raise
        ``InvalidReceipt`` (not ours for this queue and tag) / ``StaleReceipt`` (not current)."""
        core = self._core
        lease = None
        if type(receipt) is bytes and len(receipt) == RECEIPT_BYTES:
            # The usual case: the very receipt this process issued for the lease (no MAC).
            seq, number = ReceiptCodec.claimed_lease(receipt)
            lease = t.leases.get(seq)
            if lease is not None and (lease.receipt is None
                                      or not compare_digest(lease.receipt, receipt)):
                lease = None
        if lease is None:
            _, seq, number = core._receipts.open(receipt, q.id, t.id)
            lease = t.leases.get(seq)
        if (lease is None or lease.state != LEASED or lease.number != number
                or lease.due_ms <= now or seq < q.gone_seq):
            raise StaleReceipt("receipt: the lease is no longer current")
        return seq, lease

    def _tag_operation(self, caller: str | None, queue: str, tag: str | None,
                       now: int) -> tuple[QueueState, TagState]:
        """The common start of an operation on received messages of one tag."""
        core = self._core
        core._grants.check(caller, "receive", queue)
        q = core._queue(queue)
        t = core._tag(q, tag)
        core._advance(q, now)
        return q, t

    def _by_receipt(self, q: QueueState, t: TagState, receipts: Sequence[object], now: int,
                    end: Any) -> list[LaminaError | None]:
        """``end(seq, lease)`` for each receipt naming a current lease; per receipt None or
        the error that refused it."""
        results: list[LaminaError | None] = []
        for receipt in receipts:
            try:
                seq, lease = self._current_lease(q, t, receipt, now)
            except LaminaError as exc:
                results.append(exc.with_traceback(None))
                continue
            end(seq, lease)
            results.append(None)
        return results

    def delete(self, queue: str, receipts: Sequence[object], tag: str | None = None, *,
               caller: str | None = None) -> list[LaminaError | None]:
        """End messages for ``tag`` by their current receipts; per receipt None or an error."""
        core = self._core
        with core._frame as now:  # ``_operation()``, a call less
            core._grants.check(caller, "receive", queue)  # ``_tag_operation``, in line
            q = core._queue(queue)
            t = core._tag(q, tag)
            core._advance(q, now)
            store = core._store
            plain = not t.heads and not t.rewind_vt  # no topic head, no rewind in effect
            touched: list[LeaseBatch] = []
            ended: list[tuple[int, bytes, Lease]] = []
            if receipts.__class__ is list and len(receipts) == 1:  # as ``check_batch`` has it
                lone = plain and delete_lone(store, q, t, receipts[0], now)
                if lone:  # a consumer's delete of one
                    results: list[LaminaError | None] = [None]
                else:
                    results = self._delete_receipts(q, t, receipts, now, touched, ended)
            else:
                receipts = check_batch(receipts, "receipts")
                lone = None
                if len(receipts) > 1 and plain and (
                        batch := delete_run(q, t, receipts, now)) is not None:
                    touched.append(batch)  # a consumer's delete of a receive's batch
                    results = [None] * len(receipts)
                    store.pending += len(results)
                    store.written.append(batch.key)  # names the queue, should the write fail
                else:
                    results = self._delete_receipts(q, t, receipts, now, touched, ended)
            deleted = results.count(None)
            if _floor_held(core, q, t):
                # Settling could not raise ``gone_seq``, so no watermarks row is written: the
                # deletes count in the tag's counter row.
                if deleted:
                    day = self._deletes_day(q, now)
                    core._counters.count_deleted((q.id, t.id, day), deleted)
            else:
                self._settle_counting(q, t, deleted, now)
            if lone:
                ended.append(lone)
            # A lease row (or batch row) wholly below ``gone_seq`` means nothing: opening
            # reads a ``leases`` row below it as deleted and no batch row below it,
            # reclaiming drops both; the watermarks row written with them says so. So the
            # rows of deletes that ``gone_seq`` passed in this very operation are not
            # written again (docs/STORAGE.md "Leases").
            batch_put, gone = store.batch.put, q.gone_seq
            if ended:
                pack, leases_h = Lease.pack, store.leases_h
                for seq, key, lease in ended:
                    if seq >= gone:
                        batch_put(key, pack(ENDED_DELETED, lease.lane, 0, lease.count,
                                            lease.first_ms, 0), leases_h)
            if touched:
                batches_h = store.leasebatches_h
                for batch in touched:
                    if batch.seqs[-1] >= gone:
                        batch_put(batch.key, batch.row(), batches_h)
            return results

    def _deletes_day(self, q: QueueState, now: int) -> int:
        """The day a delete at ``now`` counts in; the queue's unsaved deletes of another day
        go to their counter rows first."""
        day = now // DAY_MS
        if q.unsaved_deletes and q.unsaved_day != day:
            self._core._counters.save_deletes(q)
            self._core._persist_watermarks(q)
        q.unsaved_day = day
        return day

    def _settle_counting(self, q: QueueState, t: TagState, deleted: int, now: int) -> None:
        """Settle after ``deleted`` deletes of ``t``, counting them in the watermarks row
        when it is written (``gone_seq`` rose), else in the tag's counter row."""
        core = self._core
        counters = core._counters
        unsaved = q.unsaved_deletes
        moved = None  # held receive figures moved to the watermarks row (counters.py)
        day = now // DAY_MS
        if deleted:  # unsaved until we know whether the watermarks row is written
            self._deletes_day(q, now)
            unsaved[t.id] = unsaved.get(t.id, 0) + deleted
            if counters.unsaved:  # into the watermarks row too, if it is written
                moved = counters.hold_in_watermarks(q, t, day)
        gone = q.gone_seq
        core._settle(q, now)
        if deleted and q.gone_seq == gone:  # no watermarks row: the tag's counter row
            if moved is not None:
                counters.unhold(q, t, day, moved)
            left = unsaved[t.id] - deleted
            if left:
                unsaved[t.id] = left
            else:
                del unsaved[t.id]
            counters.count_deleted((q.id, t.id, day), deleted)

    def _delete_receipts(self, q: QueueState, t: TagState, receipts: Sequence[object],
                         now: int, touched_out: list[LeaseBatch],
                         ended_out: list[tuple[int, bytes, Lease]]) -> list[LaminaError | None]:
        """``delete``'s loop: per receipt None or the error that refused it.

        The usual delete — the very receipt this process issued for a current lease, on a
        tag with no topic head and no rewind in effect, below its lane's cursor — is done
        here in line: the lease leaves memory, exactly as ``EngineCore._lease_dropped`` does
        for it, and goes to ``ended_out`` as (seq, row key, lease) for ``delete`` to write
        its row back ``ENDED_DELETED`` after settling ``gone_seq``; a lease held by a batch
        row (leasebatch.py) is marked deleted there, and each such row goes to
        ``touched_out`` once, likewise. After a lease of a batch with dense seqs the next
        receipt is first tried as the batch's next entry (a consumer deletes a receive's
        batch in order). Anything else goes the general way (``_current_lease``,
        ``_lease_dropped``)."""
        core = self._core
        store = core._store
        leases, cursors, gone = t.leases, t.cursors, q.gone_seq
        plain = not t.heads and not t.rewind_vt  # no topic head, no rewind in effect
        lease_key = keys.lease_key
        end = ended_out.append
        # The seqs of the leases ended in line, by due time: runs of one due (a receive's
        # leases share theirs), ``due_seqs[due]`` the seqs of each.
        due_seqs: dict[int, list[int]] = {}
        run_due = -1
        run: list[int] = []
        qid, tid = q.id, t.id
        results: list[LaminaError | None] = []
        append = results.append
        key = b""
        general = 0  # receipts that went the general way
        touched: dict[int, LeaseBatch] = {}  # the batch rows of deleted leases (usually one)
        # The batch of the latest lease ended in line while ``run`` is its due's run (its
        # states and seqs below), or none.
        last = _NO_BATCH
        states, first, dense = bytearray(), 0, False
        batch_seqs: list[int] = []
        seq, cursor = -1, 0  # the seq ended last, the cursor of ``last``'s lane
        for receipt in receipts:
            if dense:  # ``last`` has dense seqs: guess the entry after the one ended last
                lease = leases.get(seq := seq + 1)  # a wrong guess: the seq is read below
                # The receipt issued for it proves itself (it holds the seq and the lease
                # number); an entry of ``last`` is LEASED (a changed lease leaves its batch)
                # and due when ``last``'s entries are (checked on the first of them); the
                # seq is above the one ended last, so at or above ``gone_seq``.
                if (lease is not None and lease.batch is last and type(receipt) is bytes
                        and (issued := lease.receipt) is not None
                        and compare_digest(issued, receipt) and seq < cursor):
                    del leases[seq]
                    states[seq - first] = ENDED_DELETED
                    run.append(seq)
                    append(None)
                    continue
            if plain and type(receipt) is bytes and len(receipt) == RECEIPT_BYTES:
                seq, number = unpack_claim(receipt)  # ReceiptCodec.claimed_lease
                lease = leases.get(seq)
                if (lease is not None and lease.number == number and lease.state == LEASED
                        and lease.receipt is not None and compare_digest(lease.receipt, receipt)
                        and lease.due_ms > now and seq >= gone and seq < cursors[lease.lane]):
                    del leases[seq]
                    batch = lease.batch
                    if batch is last:  # the batch of the receipt before: its run, its due
                        states[seq - first if dense else bisect_left(batch_seqs, seq)] = \
                            ENDED_DELETED
                        run.append(seq)
                        append(None)
                        continue
                    if batch is None:
                        key = lease_key(qid, tid, seq)
                        end((seq, key, lease))
                    else:  # its batch row is written once, below
                        last = touched[id(batch)] = batch
                        key = batch.key
                        states, batch_seqs = batch.states, batch.seqs
                        first = batch_seqs[0]  # dense seqs: an entry's index is its offset
                        dense = batch_seqs[-1] - first == len(batch_seqs) - 1
                        cursor = cursors[lease.lane]
                        states[seq - first if dense else bisect_left(batch_seqs, seq)] = \
                            ENDED_DELETED
                    if lease.due_ms != run_due:
                        run_due = lease.due_ms
                        run = due_seqs.setdefault(run_due, [])
                        if batch is None:
                            last = _NO_BATCH  # a batch's entries share its due: its run again
                    append(None)
                    run.append(seq)
                    continue
            general += 1
            try:
                seq, lease = self._current_lease(q, t, receipt, now)
            except LaminaError as exc:
                append(exc.with_traceback(None))
                continue
            core._lease_dropped(q, t, seq, lease)
            append(None)
            plain = not t.heads and not t.rewind_vt
            if not plain:
                dense = False  # no guess either
        in_line = len(results) - general
        if due_seqs:
            t.due_index.discard_runs(due_seqs)
            if not leases:
                # Every entry of the two heaps names a lease no longer in memory, which their
                # readers skip (``_raise_gone``, ``floors.tag_floor``): drop them at once
                # rather than one pop each.
                t.lease_heap.clear()
                t.row_heap.clear()
        if touched:
            touched_out.extend(touched.values())
        if in_line:
            store.pending += in_line
            store.written.append(key)  # names the queue, should the write fail
        return results

    def change_visibility(self, queue: str, entries: Sequence[object], tag: str | None = None,
                          *, caller: str | None = None) -> list[VisibilityChanged | LaminaError]:
        """Per ``[receipt, timeout_s]``: end the lease ``timeout`` from now with a new receipt
        (the old one goes stale); 0 ends it at once -> ``VisibilityChanged(None, now)``."""
        with self._core._operation() as now:
            q, t = self._tag_operation(caller, queue, tag, now)
            entries = check_batch(entries, "entries")
            results: list[VisibilityChanged | LaminaError] = []
            for index, entry in enumerate(entries):
                try:
                    if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                        raise InvalidArgument(f"entries[{index}]", "must be [receipt, timeout]")
                    timeout_ms = check_seconds(entry[1], f"entries[{index}].timeout", 0,
                                               MAX_VISIBILITY_S)
                    if type(entry[0]) is not bytes:
                        raise InvalidReceipt(f"entries[{index}].receipt: must be a byte string")
                    seq, lease = self._current_lease(q, t, entry[0], now)
                except LaminaError as exc:
                    results.append(exc.with_traceback(None))
                    continue
                old_due = lease.due_ms
                lease.due_ms = now + timeout_ms
                if timeout_ms:
                    lease.number = t.lease_counter
                    t.lease_counter += 1
                    # The tag's rows get a mark past the new number (it is no receive).
                    self._core._counters.numbered(q.id, t.id)
                    receipt: bytes | None = self._core._receipts.issue(q.id, t.id, lease.lane, seq,
                                                                 lease.number)
                else:
                    receipt = None
                lease.receipt = receipt
                self._core._lease_saved(q, t, seq, lease, old_due)
                results.append(VisibilityChanged(receipt, lease.due_ms))
                if not timeout_ms:  # the lease ended now: a dead letter, or Active again
                    policy = q.attributes["redrive"]
                    if policy is not None and self._core._dead_letters.dlq_of(q) is not None \
                            and lease.count >= policy["max_receives"]:
                        self._core._dead_letters.move(q, t, seq, lease, now)
                    else:
                        self._core._notify(q)
            store = self._core._store
            store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())
            self._core._settle(q, now)
            return results

    def receipt_standing(self, queue: str, receipt: object, tag: str | None = None, *,
                         caller: str | None = None) -> str:
        """Where the lease a receipt names stands, for a gateway saying why it is stale:
        "current" (the lease holds), "visible" (it ended and no receive leased the message
        since), "released" (a later receive leased it) or "gone" (the message was deleted,
        dead-lettered or left the queue). ``InvalidReceipt`` for a receipt this server never
        issued for the queue and tag."""
        with self._core._operation() as now:
            q, t = self._tag_operation(caller, queue, tag, now)
            _, seq, number = self._core._receipts.open(receipt, q.id, t.id)
            lease = t.leases.get(seq)
            if lease is None or lease.state != LEASED or seq < q.gone_seq:
                return "gone"
            if lease.number != number:
                return "released"
            return "current" if lease.due_ms > now else "visible"

    # -- deadlines ----------------------------------------------------------------------------

    def process_deadlines(self) -> list[tuple[str, str | None]]:
        """Apply every deadline due by now; -> the (queue, tag) pairs that may have messages
        Active because of it (tag None: every tag of the queue), for waking receives."""
        with self._core._operation() as now:
            heap = self._core._deadlines.wake_heap
            woken: set[tuple[str, str | None]] = set()
            while heap and heap[0][0] <= now:
                due, queue_id, tag_id = heapq.heappop(heap)
                q = self._core._queues.get(queue_id)
                if q is None:
                    continue
                if tag_id == 0:
                    if due == q.next_delay_wake_ms:
                        woken.add((q.name, None))
                        self._core._deadlines.schedule_delay_wake(self._core._store, q, now)
                    continue
                t = q.tags.get(tag_id)
                if t is not None and due == t.next_wake_ms:
                    woken.add((q.name, t.name))
                    self._core._deadlines.reschedule_tag_wake(q, t, now)
                    # dead-letter moves happen at their time
                    self._core._dead_letters.apply_expiries(q, now)
            return sorted(woken, key=lambda pair: (pair[0], pair[1] or ""))
