"""The time index (docs/STORAGE.md "The time index"): sparse entries, exact lookups.

An entry ``queue · ms · seq`` says that ``seq`` is the first message produced at ``ms``. A
send whose millisecond is new writes one only when the queue's newest entry is
``EVERY_MS`` or more older, or ``EVERY_MESSAGES`` or more seqs behind: nearly every send of a
queue sent to a few thousand times a second is in a new millisecond, and its entry would be
a row of its own. Between two entries lie at most ``EVERY_MESSAGES`` messages of later
milliseconds than the first's, so a lookup finds the entries around its time with one seek
each way and reads the records between them for their production times (``PREFIX``):
production times rise with seqs (the engine clock never goes back), so the answer is exact.
"""

from __future__ import annotations

from . import keys
from .records import PREFIX
from .state import QueueState
from .store import Store

#: A send in a new millisecond writes an entry when the newest one is this much older...
EVERY_MS = 16
#: ...or this many seqs behind its first message.
EVERY_MESSAGES = 32
#: Records a lookup reads one by one from the last one's answer before it seeks, when it
#: asks for a time less than ``STEP_WITHIN_MS`` after the last one's.
STEPS = 6
STEP_WITHIN_MS = 64


def needs_entry(ms: int, seq: int, entry_ms: int, entry_seq: int) -> bool:
    """Whether the first message ``seq`` of a new millisecond ``ms`` gets an entry, the
    newest one being ``(entry_ms, entry_seq)`` (appending.py applies it in line)."""
    return ms - entry_ms >= EVERY_MS or seq - entry_seq >= EVERY_MESSAGES


def missing_entries(starts: list[tuple[int, int, bool]], entry: tuple[int, int] | None
                    ) -> tuple[list[int], tuple[int, int] | None]:
    """For ``lamina inspect verify``: of the first messages of new milliseconds, ``(ms,
    seq, has an entry)`` in seq order, the seqs that lack the entry they need, and the last
    entry among them (``entry``: the one before them, None when unknown)."""
    missing = []
    for ms, seq, entered in starts:
        if entered:
            entry = (ms, seq)
        elif entry is not None and needs_entry(ms, seq, *entry):
            missing.append(seq)
    return missing, entry


def first_seq_at(store: Store, q: QueueState, time_ms: int) -> int:
    """The first seq produced at or after ``time_ms`` (``next_seq`` if none)."""
    if time_ms > q.last_time_ms:
        return q.next_seq
    if time_ms == q.last_time_ms and q.last_time_seq >= 0:  # the newest ms, known
        return q.last_time_seq
    if time_ms == q.indexed_ms and q.indexed_seq >= 0:  # the newest entry, known
        return q.indexed_seq
    hint_ms, hint_seq = q.time_hint
    if time_ms == hint_ms:
        return hint_seq
    if hint_ms < time_ms < hint_ms + STEP_WITHIN_MS and len(q.lanes_used) == 1:
        # A settle's rewind bound, a little later than the last: the few records produced
        # since, read by point reads (a lane's seqs are dense where its records are kept).
        seq = _step_from(store, q, q.lanes_used[0], hint_seq, time_ms)
        if seq >= 0:
            q.time_hint = (time_ms, seq)
            return seq
    time_ms = max(time_ms, 0)
    lower = keys.time_key(q.id, time_ms, 0)
    after = Store.scan(store.time, lower, keys.time_queue_upper(q.id))
    end = q.next_seq
    if after.valid():
        _, entry_ms, end = keys.time_key_decode(after.key())
        if entry_ms == time_ms:
            return end
    else:
        after.check_status()  # RocksDB's error, not the end of the index
    # The answer is at or above the last one found for an earlier time (a settle's rewind
    # bound moves forward with the clock): near it, the walk starts there.
    start = max(hint_seq, 0) if hint_ms < time_ms else 0
    if end - start > 2 * EVERY_MESSAGES:
        before = Store.scan(store.time, keys.time_key(q.id, 0, 0), lower, last=True)
        if before.valid():
            start = max(start, keys.time_key_decode(before.key())[2])
        else:
            before.check_status()
    seq = _first_produced(store, q, start, end, time_ms)
    if seq < q.next_seq:  # a fact that stays true: later messages are produced later
        q.time_hint = (time_ms, seq)
    return seq


def _step_from(store: Store, q: QueueState, lane: int, seq: int, time_ms: int) -> int:
    """The first seq from ``seq`` on produced at or after ``time_ms``, reading at most
    ``STEPS`` records of ``lane``, the queue's only one; -1 when that does not find it."""
    get, log_key, unpack, queue_id = store.log.get, keys.log_key, PREFIX.unpack_from, q.id
    for seq in range(max(seq, 0), min(seq + STEPS, q.next_seq)):
        value = get(log_key(queue_id, lane, seq))
        if value is None:
            return -1
        if unpack(value)[0] >= time_ms:
            return seq
    return -1


def _first_produced(store: Store, q: QueueState, start: int, end: int, time_ms: int) -> int:
    """The first seq in ``[start, end)`` whose record was produced at or after ``time_ms``,
    else ``end``: each lane's records there, read until one qualifies. When the record
    before ``end`` was produced before ``time_ms``, so were all before it (a millisecond of
    many messages before a quiet spell): no walk."""
    unpack = PREFIX.unpack_from
    found = end
    if start < end:
        for lane in q.lanes_used:
            value = store.log.get(keys.log_key(q.id, lane, end - 1))
            if value is not None:
                if unpack(value)[0] < time_ms:
                    return end
                break
    for lane in q.lanes_used:
        if q.lane_tail[lane] < start:
            continue
        it = Store.scan(store.log, keys.log_key(q.id, lane, start),
                        keys.log_key(q.id, lane, found))
        while it.valid():
            if unpack(it.value())[0] >= time_ms:
                found = keys.log_seq(it.key())
                break
            it.next()
        else:
            it.check_status()  # RocksDB's error, not the end of the lane
    return found


def load_newest(store: Store, q: QueueState) -> None:
    """Opening: the newest entry of the queue, which the next sends measure from."""
    it = Store.scan(store.time, keys.time_key(q.id, 0, 0), keys.time_queue_upper(q.id),
                    last=True)
    if it.valid():
        _, q.indexed_ms, q.indexed_seq = keys.time_key_decode(it.key())
    else:
        it.check_status()
