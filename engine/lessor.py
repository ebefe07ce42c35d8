"""The lessor: one receive (or, dry, the default peek) walking a tag's sources in delivery
order — Active-again leases by deadline, then never-delivered messages by priority lane and
delayed ones by visibility — and leasing what it may return (DESIGN.md §3 "Delivery order")."""

from __future__ import annotations

from heapq import heappush
from itertools import repeat
from typing import Any, Sequence

from . import keys
from .records import PREFIX, PREFIX_SIZE
from .core import EngineCore
from .leasebatch import LeaseBatch, encode_head
from .receipts import pack_body as pack_body_
from .results import Delivery, FirstDeliveries, Peeked
from .scope import in_scope, lane_end, skip_settled, topic_gate
from .state import DEAD_MARK, LEASED, Lease, QueueState, TagState
from .store import LaneWalk, Scan, Store

EXAMINE_LIMIT = 4096  # records one receive may look at (skipped ones included)
#: What a delivery takes of ``max_bytes`` beside its record: the receipt and the small fields.
DELIVERY_OVERHEAD_BYTES = 64
NEVER = 1 << 63  # a time after every deadline
LEASED_STATES = bytes([LEASED])
# Entries of one lease batch row at most: a delete writes its batch's row again, so a receive
# of up to 1000 messages deleted one by one writes rows of at most this many entries.
BATCH_ENTRIES = 64
# Receives of at most this many messages from a queue with one lane, or of any number when
# at most ``LaneWalk.STEPS`` records are left in the lane (a long poll woken by a send),
# read their records by point reads (``LaneWalk``), not a new iterator.
LANE_WALK_MAX = 2


def nothing_to_deliver(q: QueueState, t: TagState, now: int) -> bool:
    """Whether a receive of ``t`` at ``now`` would find nothing and change nothing, told
    without walking: no lease deadline nor delay end can be due (``Lessor._active_again``'s
    lower bounds are after ``now``), every lane cursor is past its lane's tail (so
    ``_never_delivered`` has no record to look at) and the tag's row need not be written."""
    if t.min_due_ms <= now or t.delay_hint <= now or t.lease_counter > t.counter_ceiling:
        return False
    cursors, tails = t.cursors, q.lane_tail
    floor = q.gone_seq if q.gone_seq > t.start_seq else t.start_seq
    for lane in q.lanes_used:
        tail = tails[lane]
        if cursors[lane] <= tail and floor <= tail:
            return False
    return True


def push_ascending(heap: list[int], seqs: list[int]) -> None:
    """``heappush(heap, seq)`` for each of ``seqs`` (ascending, distinct), leaving ``heap``
    laid out exactly as those pushes do. Seqs none of whose parents already in the heap
    (entries ``(size - 1) // 2`` to ``(size + len(seqs)) // 2 - 1``) is above the first
    stay where each push puts them, so they are appended as they are: a consumer's next
    batch, past the ones in flight."""
    size = len(heap)
    if not size or max(heap[(size - 1) >> 1:(size + len(seqs)) >> 1]) < seqs[0]:
        heap.extend(seqs)
    else:
        for seq in seqs:
            heappush(heap, seq)


def save_lone_lease(store: Store, qid: int, t: TagState, lane: int, seq: int, due: int,
                    now: int, number: int) -> None:
    """Write a lone first lease made in line as its plain ``leases`` row, index its deadline
    and put its seq on the tag's heaps (``Lessor._save_batch`` of a batch of one)."""
    key = keys.lease_key(qid, t.id, seq)
    store.batch.put(key, Lease.pack(LEASED, lane, due, 1, now, number), store.leases_h)
    store.written.append(key)  # names the queue, should the write fail
    t.due_index.add(due, seq)
    heappush(t.row_heap, seq)
    heappush(t.lease_heap, seq)


def save_batch(store: Store, qid: int, t: TagState, lane: int, batch: LeaseBatch,
               seqs: list[int], numbers: Sequence[int], due: int, now: int) -> None:
    """Write the row of ``batch``, first leases made in line of ``seqs`` (ascending, in
    ``t.leases`` already) with lease ``numbers``, index their deadline and put their seqs on
    the tag's heaps; a lone lease is written as its plain ``leases`` row instead (and leaves
    ``batch``): one row either way, and that one costs less to build."""
    if len(seqs) == 1:
        t.leases[seqs[0]].batch = None
        save_lone_lease(store, qid, t, lane, seqs[0], due, now, numbers[0])
        return
    key = batch.key = keys.batch_key(qid, t.id, lane, seqs[-1])
    batch.head = encode_head(due, now, seqs, numbers)
    batch.states = bytearray(LEASED_STATES * len(seqs))
    store.batch.put(key, batch.row(), store.leasebatches_h)
    t.due_index.add_all(due, seqs)
    store.written.append(key)  # names the queue, should the write fail
    push_ascending(t.row_heap, seqs)
    push_ascending(t.lease_heap, seqs)


def lease_first(engine: EngineCore, q: QueueState, t: TagState, now: int,
                visibility_ms: int, count: int = 1) -> Delivery | bool | None:
    """A receive of up to ``count``, done as ``Lessor.run`` does it, in the commonest case
    where it leases one message: one lane, no deadline nor delay end due, the tag's row not
    to be written, and the cursor's record a plain first delivery (no topic, no delay, in a
    scope without filter) — for ``count`` above one, the lane's last record (a long poll
    woken by a send of one: the Lessor would lease it alone, whatever ``max_bytes``, since a
    receive's first delivery always fits). Otherwise, having changed nothing: False when
    the lane has nothing to deliver (``nothing_to_deliver`` would say so), True when the
    general path has (the Lessor's case), None when neither is told here (one lane with no
    deadline due is the case this looks at)."""
    if (t.min_due_ms <= now or t.delay_hint <= now or t.lease_counter >= t.counter_ceiling
            or len(q.lanes_used) != 1 or t.filter is not None):
        return None
    lane = q.lanes_used[0]
    tail, cursors, start_seq = q.lane_tail[lane], t.cursors, t.start_seq
    seq = max(cursors[lane], q.gone_seq, start_seq)
    # From here the lane's cursor and the floor are at most ``tail``, or past it: what
    # ``nothing_to_deliver`` looks at, in one lane.
    if seq > tail:
        return False
    if seq < tail and count > 1:
        return True
    store, qid, leases, start_ms = engine._store, q.id, t.leases, t.start_ms
    log, last = store.log, store.last_record
    key = keys.log_key(qid, lane, seq)
    value = last[1] if last[0] == key else log.get(key)
    if value is None:
        return True
    last[0], last[1] = key, value
    enqueue_ms, visible_ms, topic_id, _ = PREFIX.unpack_from(value)
    if (visible_ms != enqueue_ms or topic_id != 0 or enqueue_ms < start_ms
            or seq in leases):
        return True
    # ``_never_delivered``'s in-line first lease and ``_save_batch`` of a lone lease.
    number = t.lease_counter
    t.lease_counter = number + 1
    due = now + visibility_ms
    body = pack_body_(qid, t.id, lane, seq, number)
    mac = engine._receipts.keyed_copy()
    mac.update(body)
    receipt = body + mac.digest()
    leases[seq] = Lease(LEASED, lane, due, 1, now, number, receipt, None)
    save_lone_lease(store, qid, t, lane, seq, due, now, number)
    # Where the cursor rests: the next record a cursor has to do with (``skip_settled``).
    cursor = seq + 1
    if cursor > tail:
        cursor = tail + 1
    else:
        key = keys.log_key(qid, lane, cursor)
        after = log.get(key)
        if after is not None:
            last[0], last[1] = key, after
            enqueue_ms, visible_ms, _, _ = PREFIX.unpack_from(after)
        if after is None or not (visible_ms == enqueue_ms and cursor not in leases
                                 and enqueue_ms >= start_ms):
            walk = LaneWalk(log, qid, lane, cursor, tail, last)
            cursor = skip_settled(t, walk, tail)
    if cursor != cursors[lane]:
        cursors[lane] = cursor
        t.row_behind = True
    store.pending += 1
    engine._deadlines.watch_lease_due(q, t, due)
    return Delivery(value[PREFIX_SIZE:], receipt, 1, now, due)


class Lessor:
    """One receive: walks the sources in delivery order and leases what it may return.

    With ``dry_run`` (peek) it walks the same way and changes nothing: it returns ``Peeked``
    entries for what a receive would lease now."""

    def __init__(self, engine: EngineCore, q: QueueState, t: TagState, now: int,
                 visibility_ms: int, count: int, max_bytes: int | None, dry_run: bool = False):
        self.dry_run = dry_run
        self.topics_taken: set[int] = set()
        self.engine = engine
        self.store = engine._store
        self.q, self.t, self.now = q, t, now
        self.due_ms = now + visibility_ms
        self.count = count
        self.room = max_bytes
        self.budget = EXAMINE_LIMIT
        self.out: list[Delivery | Peeked] = []
        # The first deliveries leased in line after ``out``'s (``_never_delivered``), as
        # columns: ``Delivery`` objects are made only if something else joins them.
        self.records: list[bytes] = []
        self.receipts: list[bytes] = []
        self.tag_moved = False  # the tag's row must be written (delay position, cursors)
        self.cursor_moved = False  # a cursor moved where the log alone tells it at open
        self.issue = engine._receipts.issue
        self._due_watched = False  # watch_lease_due ran for this receive's due time
        self.batches = 0  # rows of first leases made in line (``_save_batch``)
        self.rows = 0  # rows this receive put: its lease rows and perhaps the tag's row
        # Every lease of this receive is a first delivery made in line, whose row tells
        # its delivery at open (a receive's figures may be held back: counters.py).
        self.first_in_line = True

    def run(self) -> list[Any] | FirstDeliveries:
        """What the receive leased: ``FirstDeliveries`` when every one is a first delivery
        made in line (they share their times), else a list of ``Delivery`` objects."""
        t, now = self.t, self.now
        if t.min_due_ms <= now or t.delay_hint <= now:  # else nothing can be Active again
            self._active_again()
        if len(self.out) < self.count and self.budget > 0:
            self._never_delivered()
        if self.dry_run:
            return self.out
        out: list[Any] | FirstDeliveries = self.out
        if self.records:
            if self.out:
                self._columns_to_out()
            else:
                out = FirstDeliveries(self.records, self.receipts, self.now, self.due_ms)
        if self.tag_moved or t.lease_counter > t.counter_ceiling:
            self.store.put(self.store.tags_h, keys.tag_key(self.q.id, t.id), t.encode_cursors())
            self.rows += 1
        elif self.cursor_moved:
            # The cursors passed only records the log and the lease rows tell at open (each
            # leased — its row is in this batch or before —, delayed or out of scope): the
            # open finds them again (``EngineCore._load_tag``), so the row is not written.
            t.row_behind = True
        return out

    def peeked(self) -> list[Any]:
        """``run`` of a dry run: the ``Peeked`` entries of what a receive would lease now."""
        self.run()
        return self.out

    def _columns_to_out(self) -> None:
        """Append the first deliveries held as columns to ``out`` as ``Delivery`` objects
        (another delivery comes after them) and empty the columns."""
        records, receipts, count = self.records, self.receipts, len(self.records)
        self.out.extend(map(Delivery, records, receipts, repeat(1, count),
                            repeat(self.now, count), repeat(self.due_ms, count)))
        records.clear()
        receipts.clear()

    def _fits(self, record: bytes) -> bool:
        """Whether one more delivery of ``record`` stays within ``max_bytes``."""
        if self.room is None:
            return True
        needed = len(record) + DELIVERY_OVERHEAD_BYTES
        if (self.out or self.records) and needed > self.room:
            return False
        self.room -= needed
        return True

    def _admit(self, seq: int, value: bytes) -> bool:
        """Scope and topic gate for a message met by a cursor or the delay index: False means
        pass it (out of scope: Ended for the tag; or parked behind its topic's head)."""
        enqueue_ms, _, topic_id, _ = PREFIX.unpack_from(value)
        t = self.t
        if t.filter is not None or enqueue_ms < t.start_ms or seq < t.start_seq:
            if not in_scope(t, seq, enqueue_ms, value[PREFIX_SIZE:]):
                return False
        if 0 < topic_id < DEAD_MARK:
            if topic_id in self.topics_taken or not topic_gate(self.engine._store, self.q, t,
                                                                          topic_id, seq):
                if not self.dry_run and topic_id not in t.parked_topics:
                    self.engine._topics.parked(self.q, t, topic_id)  # passed while parked
                return False
        return True

    def _lease(self, seq: int, lane: int, value: bytes, lease: Lease | None) -> None:
        t = self.t
        topic_id = PREFIX.unpack_from(value)[2]
        if 0 < topic_id < DEAD_MARK:
            self.topics_taken.add(topic_id)
        if self.dry_run:
            self.out.append(Peeked(value[PREFIX_SIZE:], "active", lease.count if lease else 0,
                                   (lease.first_ms or None) if lease else None, None))
            return
        self.first_in_line = False
        if self.records:  # in the order they were leased
            self._columns_to_out()
        number = t.lease_counter
        t.lease_counter += 1
        if lease is None:
            lease = Lease(LEASED, lane, self.due_ms, 1, self.now, number)
            old_due = None
        else:
            old_due = lease.due_ms
            lease.count += 1
            lease.due_ms = self.due_ms
            lease.number = number
            if not lease.first_ms:
                lease.first_ms = self.now
        receipt = lease.receipt = self.issue(self.q.id, t.id, lane, seq, number)
        if 0 < topic_id < DEAD_MARK:
            t.lock(topic_id, seq)
        self.engine._lease_saved(self.q, t, seq, lease, old_due)
        self.out.append(Delivery(value[PREFIX_SIZE:], receipt, lease.count, lease.first_ms,
                                 lease.due_ms))

    def _active_again(self) -> None:
        """Merge expired leases (``due_index``) and ended delays, by (time Active, seq).

        Each source is walked only when something in it can be due: ``t.min_due_ms`` and
        ``t.delay_hint`` are lower bounds of the next deadline in each, refreshed by the walk
        itself (it reads one row past ``now`` and remembers its time)."""
        q, t, store, now = self.q, self.t, self.store, self.now
        timers = delays = None
        if t.min_due_ms <= now:
            timers = t.due_index.walk(t.min_due_ms, now)
        if t.delay_hint <= now:
            lower = keys.delay_key(q.id, t.delay_vt, t.delay_seq + 1)
            delays = Store.scan(store.delays, lower, keys.queue_bounds(q.id)[1])
        log = store.log
        kept_due = NEVER  # the first deadline met that stays (not leased now)
        while len(self.out) < self.count and self.budget > 0:
            timer = delay = None
            if timers is not None:
                timer = timers.current
                if timer is None:  # every deadline left is after now: the first of them
                    after = t.due_index.first_due_after(now)
                    self._timers_done(kept_due if after is None or kept_due < after else after)
                    timers = None
            if delays is not None:
                if delays.valid():
                    delay = keys.delay_key_decode(delays.key())[1:]
                    if delay[0] > now:
                        self._delays_done(delay[0])
                        delays = delay = None
                else:
                    delays.check_status()  # RocksDB's error, not the end of the delays
                    self._delays_done(NEVER)
                    delays = None
            if timer is None and delay is None:
                return
            self.budget -= 1
            if delay is None or (timer is not None and timer <= delay):
                due, seq = timer  # type: ignore[misc]  # not None here
                timers.next()  # type: ignore[union-attr]
                lease = t.leases.get(seq)
                if lease is None or lease.state != LEASED or lease.due_ms != due:
                    if not self.dry_run:  # left behind by a change of its lease: drop it now
                        t.due_index.discard(due, seq)
                    continue
                lane = lease.lane
                value = log.get(keys.log_key(q.id, lane, seq)) if seq >= q.gone_seq else None
                if value is None:
                    continue
                topic_id = PREFIX.unpack_from(value)[2]
                if 0 < topic_id < DEAD_MARK and (t.locked.get(topic_id, seq) != seq
                                                 or topic_id in self.topics_taken):
                    kept_due = min(kept_due, due)
                    continue  # waits behind the Inflight head of its topic
                if not self._fits(value):
                    return
                self._lease(seq, lane, value, lease)
            else:
                visible, seq = delay
                lane = delays.value()[0]  # type: ignore[union-attr]
                handled = t.rewind_handled(visible, seq)
                if seq >= q.gone_seq and seq not in t.leases and not handled:
                    value = log.get(keys.log_key(q.id, lane, seq))
                    if value is not None and self._admit(seq, value):
                        if not self._fits(value):
                            return
                        self._lease(seq, lane, value, None)
                delays.next()  # type: ignore[union-attr]
                if not self.dry_run:
                    t.delay_vt, t.delay_seq = visible, seq
                    self.tag_moved = True

    def _timers_done(self, next_due: int) -> None:
        """The deadline walk reached ``now``: nothing is due before ``next_due`` nor before the
        leases this receive made (due after ``now``)."""
        if not self.dry_run:
            self.t.min_due_ms = min(next_due, self.due_ms) if self.out else next_due

    def _delays_done(self, next_visible: int) -> None:
        if not self.dry_run:
            self.t.delay_hint = next_visible

    def _save_batch(self, lane: int, batch: LeaseBatch, seqs: list[int],
                    numbers: list[int] | None, next_number: int) -> None:
        """``save_batch`` of a batch of first leases made in line (``_never_delivered``):
        their lease ``numbers``, or when None (no gap among them, the usual case) the
        numbers up to ``next_number``."""
        self.batches += 1
        entries: Sequence[int] = (range(next_number - len(seqs), next_number)
                                  if numbers is None else numbers)
        save_batch(self.store, self.q.id, self.t, lane, batch, seqs, entries, self.due_ms,
                   self.now)

    def _never_delivered(self) -> None:
        """Lane cursors, highest priority first; delayed records are stepped over.

        The first lease of a message without a topic (not a dry run) is made in line: the
        same rows and state as ``EngineCore._lease_saved`` of a new LEASED row, and what
        depends only on the due time (the same for every lease of this receive,
        ``Deadlines.watch_lease_due``) is done once."""
        q, t, store = self.q, self.t, self.store
        unpack, seq_of, leases = PREFIX.unpack_from, keys.LOG_SEQ.unpack_from, t.leases
        out, count = self.out, self.count
        records, receipts = self.records, self.receipts
        add_record, add_receipt = records.append, receipts.append
        pack_body, keyed_copy = pack_body_, self.engine._receipts.keyed_copy
        qid, tid, due, now = q.id, t.id, self.due_ms, self.now
        for lane in q.lanes_used:
            have = len(out) + len(records)  # deliveries so far
            if have >= count or self.budget <= 0:
                break
            tail = q.lane_tail[lane]
            start = max(t.cursors[lane], q.gone_seq, t.start_seq)
            if start > tail:
                continue
            it: Scan | LaneWalk
            if len(q.lanes_used) == 1 and (count - have <= LANE_WALK_MAX
                                           or tail - start < LaneWalk.STEPS):
                # A record or two: point reads.
                it = LaneWalk(store.log, qid, lane, start, tail, store.last_record)
            else:
                it = store.lane_scan(qid, lane, start, tail)
            valid, value_of, key_of, step = it.valid, it.value, it.key, it.next
            # A plain message (no topic) that every message of the tag's scope passes is
            # admitted without the general gate: a scope without filter, from its start time
            # (the walk starts at or past ``start_seq``); with a filter every record goes
            # through the gate.
            start_ms = t.start_ms if t.filter is None else NEVER
            in_line = not self.dry_run
            limited = self.room is not None  # ``_fits``, in line: the bytes left to fill
            room = self.room if self.room is not None else 0
            # This lane's first leases: one row (leasebatch.py), its seqs and lease numbers
            # (None while they run without a gap up to ``number``: a lease made the general
            # way between two gives them one); a lone one becomes its plain row.
            seqs: list[int] = []
            numbers: list[int] | None = None
            batch = LeaseBatch(b"", b"", seqs, bytearray())
            # The next lease number: ``t.lease_counter`` once the lane is walked (``_admit``
            # does not read it; ``_lease`` is handed it).
            number = t.lease_counter
            # The examine budget (``self.budget``: records looked at) in the loop's terms:
            # while ``have`` is below ``bound`` some is left, as every record looked at is
            # either leased (``have`` rises) or passed (``bound`` falls); ``cap`` the lower
            # of ``bound`` and ``count``. (``_admit`` and ``_lease`` do not read the budget.)
            bound = self.budget + have
            cap = count if count < bound else bound
            while have < cap and valid():
                value = value_of()
                enqueue_ms, visible_ms, topic_id, _ = unpack(value)
                if visible_ms == enqueue_ms and (seq := seq_of(key_of(), 5)[0]) not in leases:
                    if not ((topic_id == 0 and enqueue_ms >= start_ms)
                            or self._admit(seq, value)):
                        self.tag_moved = True  # passed (a parked topic): the row tells it
                        bound -= 1
                        if bound < cap:
                            cap = bound
                    else:
                        if limited:
                            needed = len(value) + DELIVERY_OVERHEAD_BYTES  # as ``_fits``
                            if have and needed > room:
                                bound -= 1  # looked at
                                break
                            room -= needed
                        if topic_id == 0 and in_line:
                            body = pack_body(qid, tid, lane, seq, number)
                            mac = keyed_copy()  # ReceiptCodec.issue, in line
                            mac.update(body)
                            receipt = body + mac.digest()
                            if len(seqs) == BATCH_ENTRIES:
                                self._save_batch(lane, batch, seqs, numbers, number)
                                seqs, numbers = [], None
                                batch = LeaseBatch(b"", b"", seqs, bytearray())
                            leases[seq] = Lease(LEASED, lane, due, 1, now, number, receipt, batch)
                            if numbers is not None:
                                numbers.append(number)
                            number += 1
                            seqs.append(seq)
                            add_record(value[PREFIX_SIZE:])
                            add_receipt(receipt)
                            have += 1
                        else:
                            if seqs and numbers is None:  # a gap in the batch's numbers
                                numbers = [*range(number - len(seqs), number)]
                            t.lease_counter = number
                            self._lease(seq, lane, value, None)
                            number = t.lease_counter
                            have = len(out) + len(records)
                else:  # delayed (the delay index brings it), or leased: passed
                    bound -= 1
                    if bound < cap:
                        cap = bound
                step()
            t.lease_counter = number
            self.budget = bound - have
            if limited:
                self.room = room
            if seqs:
                self._save_batch(lane, batch, seqs, numbers, number)
            if self.dry_run:
                continue
            cursor = skip_settled(t, it, tail) if have >= count \
                else (keys.log_seq(it.key()) if it.valid() else lane_end(it, tail))
            if cursor != t.cursors[lane]:
                t.cursors[lane] = cursor
                self.cursor_moved = True
        if self.batches:
            store.pending += self.batches
            self.rows += self.batches
            if not self._due_watched:
                self._due_watched = True
                self.engine._deadlines.watch_lease_due(q, t, due)
