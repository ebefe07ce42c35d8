"""``lamina inspect verify``: re-check a data directory's derived data against its log.

What is checked, per queue (each check has a name; ``damage`` fails the run, ``warning`` does
not):

    record.decode     a log value: 21-byte prefix + a CBOR array of 9 fields of the right types
    record.id         the record's id names the key's queue, seq and lane
    record.md5        MD5 of the body (UTF-8 for text) equals the stored md5
    record.prefix     prefix and record agree: enqueue and visible time, priority (= the lane),
                      topic (prefix topic id 0 <=> no topic; else the queue's id of that topic
                      name; a dead-letter mark <=> a ``dead`` field)
    log.order         production times never decrease with seq
    log.duplicate     one seq stored in two lanes
    log.orphan        a log row outside every segment, or in a lane outside 1-16
    segment.table     segments contiguous, the last one ending at next_seq - 1, none wholly
                      below gone_seq (those are reclaimed), present while messages are retained
    segment.summary   a segment's count, bytes, first/last time equal its log rows'
    segment.missing   seqs of a segment with no log row
    time.order        time index entries: seqs increase with time
    time.entry        an entry's seq has a log row, produced at that ms, and is the first seq of
                      that ms; no entry outside the retained log
    time.missing      a ms with messages has no entry where the sparse index needs one
    lease.decode      a lease row decodes (state 1-4, lane 1-16); a lease batch row decodes,
                      its seqs ascend and end at its key's seq, its states are leased/deleted
    lease.message     a lease above gone_seq names a log row (seq, lane)
    lease.batch_overlap  two batch rows of one lane hold overlapping seq ranges
    lease.below_gone  (warning) a lease row below gone_seq, not deleted nor leased: dropped later
    meta              queue name index, definitions, watermarks, tag cursors rows
    orphan            rows of unknown queues or tags in any per-queue column family
    file              a table or blob file RocksDB cannot read, also once the view is reopened
                      (``lamina inspect verify`` reopens the view first; the run stops there)

Memory grows with one segment (a byte and a time per message) and with a tag's leases, not with
the log. Reads go through one ``Snapshot`` (one read-only open), so a run beside a live server
checks the state as of that open.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import cbor2

from lamina.engine import keys, timeindex
from lamina.engine.records import PREFIX, PREFIX_SIZE, body_md5
from lamina.engine.state import (
    DEAD_MARK,
    DEFAULT_LANE,
    ENDED_AHEAD,
    ENDED_DEAD,
    ENDED_DELETED,
    LANE_RANGE,
    LANES,
    LEASED,
    Lease,
    QueueState,
)
from lamina.engine.store import COLUMN_FAMILIES, Store

from .batchcheck import batch_findings
from .snapshot import Snapshot

__all__ = ["DAMAGE", "Finding", "Report", "verify"]

DAMAGE = "damage"
WARNING = "warning"
#: Findings kept in full per (queue, check); the rest are counted.
DETAIL_LIMIT = 20
_LEASE_SIZE = len(Lease(1, 1, 0, 0, 0, 0).encode())
_PER_QUEUE_FAMILIES = tuple(name for name in COLUMN_FAMILIES if name != "meta")


@dataclass(frozen=True)
class Finding:
    severity: str   # "damage" or "warning"
    check: str      # e.g. "record.md5" (module docstring)
    queue: str | None
    where: str      # e.g. "seq 42 lane 8"
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "check": self.check, "queue": self.queue,
                "where": self.where, "detail": self.detail}

    def __str__(self) -> str:
        queue = f"queue {self.queue!r} " if self.queue is not None else ""
        return f"{self.severity.upper():7} {self.check:16} {queue}{self.where}: {self.detail}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    #: (severity, check, queue) -> findings beyond DETAIL_LIMIT, counted only
    suppressed: dict[tuple[str, str, str | None], int] = field(default_factory=dict)
    queues: int = 0
    messages: int = 0
    time_entries: int = 0
    leases: int = 0

    def count(self, severity: str) -> int:
        return (sum(f.severity == severity for f in self.findings)
                + sum(n for (s, _, _), n in self.suppressed.items() if s == severity))

    @property
    def damaged(self) -> bool:
        return self.count(DAMAGE) > 0

    def summary(self) -> dict[str, Any]:
        return {"queues": self.queues, "messages": self.messages,
                "time_entries": self.time_entries, "leases": self.leases,
                "damage": self.count(DAMAGE),
                "warnings": self.count(WARNING),
                "suppressed": [{"severity": s, "check": c, "queue": q, "count": n}
                               for (s, c, q), n in sorted(self.suppressed.items(),
                                                          key=lambda item: str(item[0]))]}


class _Collector:
    def __init__(self, report: Report):
        self.report = report
        self._kept: dict[tuple[str, str, str | None], int] = {}

    def __call__(self, severity: str, check: str, queue: str | None, where: str,
                 detail: str) -> None:
        slot = (severity, check, queue)
        kept = self._kept.get(slot, 0)
        if kept < DETAIL_LIMIT:
            self._kept[slot] = kept + 1
            self.report.findings.append(Finding(severity, check, queue, where, detail))
        else:
            self.report.suppressed[slot] = self.report.suppressed.get(slot, 0) + 1


Progress = Callable[[int], None]


def verify(snapshot: Snapshot, queues: list[str] | None = None, *,
           progress: Progress | None = None) -> Report:
    """Check ``queues`` (default: all, plus the rows no queue owns); ``progress(n)`` is called
    as messages are checked."""
    report = Report()
    found = _Collector(report)
    selected = snapshot.queues() if queues is None else [snapshot.queue(n) for n in queues]
    if queues is None:
        _check_meta(snapshot, found)
        _check_unknown_queues(snapshot, found)
    for q in selected:
        report.queues += 1
        _QueueCheck(snapshot, q, found, report, progress).run()
    return report


def total_messages(snapshot: Snapshot, queues: list[str] | None = None) -> int:
    """The number of log rows ``verify`` will read (for a progress bar)."""
    selected = snapshot.queues() if queues is None else [snapshot.queue(n) for n in queues]
    return sum(s.count for q in selected for s in q.segments)


# -- meta and rows of unknown queues ----------------------------------------------------------

def _check_meta(snapshot: Snapshot, found: _Collector) -> None:
    meta = snapshot.store.meta
    known = {q.id: q for q in snapshot.queues()}
    for key, value in Store.items(meta, keys.QUEUE_NAME_LOWER, keys.QUEUE_NAME_UPPER):
        name = keys.queue_name_from_key(key)
        queue_id = keys.read_u32(value) if len(value) == 4 else -1
        q = known.get(queue_id)
        if q is None or q.name.lower() != name:
            found(DAMAGE, "meta", None, f"name index {name!r}",
                  f"points at queue id {queue_id}, which has no definition of that name")
    names = {keys.queue_name_from_key(key)
             for key in Store.keys(meta, keys.QUEUE_NAME_LOWER, keys.QUEUE_NAME_UPPER)}
    for key, value in Store.items(meta, keys.QUEUE_DEF_LOWER, keys.QUEUE_DEF_UPPER):
        queue_id = keys.queue_def_id(key)
        if queue_id not in known:
            found(DAMAGE, "meta", None, f"queue id {queue_id}",
                  "a definition without watermarks")
            continue
        q = known[queue_id]
        if q.name.lower() not in names:
            found(DAMAGE, "meta", q.name, f"queue id {queue_id}",
                  "missing from the name index")
        for t in q.tags.values():
            if snapshot.store.tags.get(keys.tag_key(q.id, t.id)) is None:
                found(DAMAGE, "meta", q.name, f"tag {t.name!r} (id {t.id})",
                      "no cursors row in the tags family")


def _gaps(ids: list[int], upper: int) -> Iterator[tuple[int, int]]:
    """Half-open id ranges not in ``ids`` (sorted), up to ``upper``."""
    low = 0
    for value in ids:
        if value > low:
            yield low, value
        low = value + 1
    if low < upper:
        yield low, upper


def _count_rows(family: Any, lower: bytes, upper: bytes, limit: int = 1_000_000) -> int:
    count = 0
    for _ in Store.keys(family, lower, upper):
        count += 1
        if count >= limit:
            break
    return count


def _check_unknown_queues(snapshot: Snapshot, found: _Collector) -> None:
    ids = sorted(q.id for q in snapshot.queues())
    for name in _PER_QUEUE_FAMILIES:
        family = getattr(snapshot.store, name)
        for low, high in _gaps(ids, 1 << 32):
            lower = keys.u32(low)
            upper = keys.u32(high) if high < 1 << 32 else b"\xff" * 64
            count = _count_rows(family, lower, upper)
            if count:
                found(DAMAGE, "orphan", None, f"family {name!r}",
                      f"{count} rows of queue ids {low}..{high - 1}, which do not exist")


# -- one queue -------------------------------------------------------------------------------

class _QueueCheck:
    def __init__(self, snapshot: Snapshot, q: QueueState, found: _Collector, report: Report,
                 progress: Progress | None):
        self.snapshot = snapshot
        self.store = snapshot.store
        self.q = q
        self.report = report
        self.progress = progress
        self.clock_ms = snapshot.clock_ms
        self._found = found
        self._topic_ids: dict[str, int | None] = {}

    def found(self, severity: str, check: str, where: str, detail: str) -> None:
        self._found(severity, check, self.q.name, where, detail)

    def run(self) -> None:
        self.check_segment_table()
        self.check_orphan_log_rows()
        self.check_log_and_time_index()
        self.check_leases()

    # -- segment table ----------------------------------------------------------------------

    def check_segment_table(self) -> None:
        q = self.q
        previous = None
        for segment in q.segments:
            where = f"segment {segment.first_seq}"
            if segment.last_seq < segment.first_seq:
                self.found(DAMAGE, "segment.table", where,
                           f"last seq {segment.last_seq} before first seq")
            if previous is not None and segment.first_seq != previous.last_seq + 1:
                self.found(DAMAGE, "segment.table", where,
                           f"not contiguous: the previous segment ends at {previous.last_seq}")
            if segment.last_seq < q.gone_seq:
                self.found(DAMAGE, "segment.table", where,
                           f"wholly below gone_seq {q.gone_seq}: should have been reclaimed")
            previous = segment
        if previous is not None and previous.last_seq != q.next_seq - 1:
            self.found(DAMAGE, "segment.table", f"segment {previous.first_seq}",
                       f"the last segment ends at {previous.last_seq}, next_seq is "
                       f"{q.next_seq}")
        if not q.segments and q.gone_seq < q.next_seq:
            self.found(DAMAGE, "segment.table", "segments",
                       f"none, but seqs {q.gone_seq}..{q.next_seq - 1} are retained")

    # -- log rows outside segments -----------------------------------------------------------------

    def check_orphan_log_rows(self) -> None:
        q, log = self.q, self.store.log
        ranges: list[tuple[bytes, bytes, str]] = []
        lower, upper = keys.queue_bounds(q.id)
        ranges.append((lower, keys.log_key(q.id, 1, 0), "lane 0"))
        ranges.append((keys.log_key(q.id, LANES + 1, 0), upper, f"lanes above {LANES}"))
        first = q.segments[0].first_seq if q.segments else None
        last = q.segments[-1].last_seq if q.segments else None
        for lane in range(1, LANES + 1):
            lane_lower, lane_upper = keys.log_lane_bounds(q.id, lane)
            if first is None:
                ranges.append((lane_lower, lane_upper, f"lane {lane} (no segments)"))
                continue
            ranges.append((lane_lower, keys.log_key(q.id, lane, first),
                           f"lane {lane} below segment {first}"))
            if last is not None and last + 1 < 1 << 64:
                ranges.append((keys.log_key(q.id, lane, last + 1), lane_upper,
                               f"lane {lane} after seq {last}"))
            for before, after in zip(q.segments, q.segments[1:]):  # gaps in the table
                if after.first_seq > before.last_seq + 1:
                    ranges.append((keys.log_key(q.id, lane, before.last_seq + 1),
                                   keys.log_key(q.id, lane, after.first_seq),
                                   f"lane {lane} seqs {before.last_seq + 1}.."
                                   f"{after.first_seq - 1}"))
        for low, high, what in ranges:
            if low >= high:
                continue
            count = _count_rows(log, low, high)
            if count:
                self.found(DAMAGE, "log.orphan", what,
                           f"{count} log rows outside every segment")

    # -- the log, segment by segment, and the time index ---------------------------------------

    def check_log_and_time_index(self) -> None:
        q = self.q
        self._last_entry: tuple[int, int] | None = None  # (ms, seq): check_time_entries
        entries = self._time_entries()
        entry = next(entries, None)
        first = q.segments[0].first_seq if q.segments else q.next_seq
        # entries below the retained log
        while entry is not None and entry[1] < first:
            self.found(DAMAGE, "time.entry", f"time {entry[0]} seq {entry[1]}",
                       f"below the first retained seq {first}")
            entry = next(entries, None)
        # production time of the seq before the segment: -1 when there is none in the log,
        # None when unknown (a gap in the segment table, reported by check_segment_table)
        previous_ms: int | None = -1
        previous_last = first - 1
        for segment in q.segments:
            while entry is not None and entry[1] < segment.first_seq:
                self.found(DAMAGE, "time.entry", f"time {entry[0]} seq {entry[1]}",
                           "names a seq outside every segment")
                entry = next(entries, None)
            if segment.first_seq != previous_last + 1:
                previous_ms = None
            ms_of = self.check_segment(segment)
            segment_entries: list[tuple[int, int]] = []
            while entry is not None and entry[1] <= segment.last_seq:
                segment_entries.append(entry)
                entry = next(entries, None)
            self.check_time_entries(segment.first_seq, ms_of, previous_ms, segment_entries)
            previous_ms = _last_time(ms_of, -1 if previous_ms is None else previous_ms)
            previous_last = segment.last_seq
            if self.progress is not None:
                self.progress(segment.count)
        while entry is not None:
            self.found(DAMAGE, "time.entry", f"time {entry[0]} seq {entry[1]}",
                       f"after the last message (next_seq {q.next_seq})")
            entry = next(entries, None)

    def _time_entries(self) -> Iterator[tuple[int, int]]:
        """(ms, seq) of the queue's time index, checking their order on the way."""
        lower, upper = keys.queue_bounds(self.q.id)
        last_ms = last_seq = -1
        for key in Store.keys(self.store.time, lower, upper):
            self.report.time_entries += 1
            if len(key) != len(keys.time_key(0, 0, 0)):
                self.found(DAMAGE, "time.entry", f"key {key.hex()}", "malformed key")
                continue
            _, ms, seq = keys.time_key_decode(key)
            if ms == last_ms:
                self.found(DAMAGE, "time.order", f"time {ms}",
                           f"two entries (seqs {last_seq} and {seq}): one per ms")
            elif seq <= last_seq:
                self.found(DAMAGE, "time.order", f"time {ms} seq {seq}",
                           f"seq not above the previous entry's (time {last_ms} seq "
                           f"{last_seq})")
            last_ms, last_seq = ms, seq
            yield ms, seq

    def check_segment(self, segment: Any) -> array:
        """Check every record of one segment; -> production ms per seq offset (-1: no row)."""
        q, found = self.q, self.found
        first, end = segment.first_seq, segment.last_seq + 1
        size = max(end - first, 0)
        ms_of = array("q", [-1]) * size
        rows = total_bytes = 0
        unpack, loads = PREFIX.unpack_from, cbor2.loads
        log_seq = keys.log_seq
        id_prefix = f"{q.id:08x}"
        for lane in q.lanes_used:
            if q.lane_tail[lane] < first:
                continue
            lane_digit = f"{lane - 1:x}"
            for key, value in self.snapshot.lane_chunks(q.id, lane, first, end):
                seq = log_seq(key)
                offset = seq - first
                rows += 1
                if len(value) < PREFIX_SIZE + 1:
                    found(DAMAGE, "record.decode", f"seq {seq} lane {lane}",
                          f"value of {len(value)} bytes, shorter than the prefix")
                    continue
                enqueue_ms, visible_ms, topic_id, priority = unpack(value)
                if ms_of[offset] >= 0:
                    found(DAMAGE, "log.duplicate", f"seq {seq}",
                          f"stored in lane {lane} and another lane")
                ms_of[offset] = enqueue_ms
                record = value[PREFIX_SIZE:]
                total_bytes += len(record)
                try:
                    fields = loads(record)
                except Exception as exc:  # any decoding failure is the finding
                    found(DAMAGE, "record.decode", f"seq {seq} lane {lane}",
                          f"CBOR: {type(exc).__name__}: {exc}")
                    continue
                if type(fields) is not list or len(fields) != 9:
                    found(DAMAGE, "record.decode", f"seq {seq} lane {lane}",
                          f"not an array of 9 fields: {_short(fields)}")
                    continue
                msg_id, body, attributes, topic, rec_priority, rec_enqueue, rec_visible, \
                    digest, dead = fields
                if msg_id != f"{id_prefix}{seq:016x}{lane_digit}":
                    found(DAMAGE, "record.id", f"seq {seq} lane {lane}",
                          f"id {_short(msg_id)} does not name queue {q.id} seq {seq} "
                          f"lane {lane}")
                if type(body) is bytes:
                    body_bytes = body
                elif type(body) is str:
                    body_bytes = body.encode()
                else:
                    found(DAMAGE, "record.decode", f"seq {seq} lane {lane}",
                          f"body is {type(body).__name__}, not bytes or text")
                    continue
                if type(digest) is not bytes or body_md5(body_bytes) != digest:
                    found(DAMAGE, "record.md5", f"seq {seq} lane {lane}",
                          f"stored md5 {_hex(digest)} != MD5 of the body "
                          f"{body_md5(body_bytes).hex()}")
                if not (rec_enqueue == enqueue_ms and rec_visible == visible_ms
                        and rec_priority == priority == lane):
                    found(DAMAGE, "record.prefix", f"seq {seq} lane {lane}",
                          f"prefix (enqueue {enqueue_ms}, visible {visible_ms}, priority "
                          f"{priority}) vs record (enqueue {_short(rec_enqueue)}, visible "
                          f"{_short(rec_visible)}, priority {_short(rec_priority)}), lane "
                          f"{lane}")
                if topic_id or topic is not None or dead is not None or (
                        attributes is not None and type(attributes) is not dict):
                    self._check_rare_fields(seq, lane, topic_id, topic, dead, attributes)
        if rows != segment.count or total_bytes != segment.size_bytes:
            found(DAMAGE, "segment.summary", f"segment {first}",
                  f"table says {segment.count} messages / {segment.size_bytes} bytes, the log "
                  f"holds {rows} / {total_bytes}")
        missing = ms_of.count(-1)
        if missing:
            holes = [first + i for i, ms in enumerate(ms_of) if ms < 0]
            found(DAMAGE, "segment.missing", f"segment {first}",
                  f"{missing} seqs without a log row: {_seqs(holes)}")
        first_ms = next((ms for ms in ms_of if ms >= 0), -1)
        last_ms = _last_time(ms_of, -1)
        if first_ms >= 0 and (first_ms != segment.first_ms or last_ms != segment.last_ms):
            found(DAMAGE, "segment.summary", f"segment {first}",
                  f"table says times {segment.first_ms}..{segment.last_ms}, the log "
                  f"{first_ms}..{last_ms}")
        self.report.messages += rows
        return ms_of

    def _check_rare_fields(self, seq: int, lane: int, topic_id: int, topic: Any, dead: Any,
                           attributes: Any) -> None:
        where = f"seq {seq} lane {lane}"
        if attributes is not None and type(attributes) is not dict:
            self.found(DAMAGE, "record.decode", where,
                       f"attributes is {type(attributes).__name__}, not a map")
        if topic_id & DEAD_MARK:
            if dead is None or type(dead) is not list or len(dead) != 5:
                self.found(DAMAGE, "record.prefix", where,
                           f"prefix marks a dead-letter copy, record dead is {_short(dead)}")
            if topic is not None:
                self.found(DAMAGE, "record.prefix", where,
                           "a dead-letter copy with a topic")
            return
        if dead is not None:
            self.found(DAMAGE, "record.prefix", where,
                       "record has a dead field, prefix has no dead-letter mark")
        if topic is None:
            if topic_id:
                self.found(DAMAGE, "record.prefix", where,
                           f"prefix topic id {topic_id}, record has no topic")
            return
        if type(topic) is not str:
            self.found(DAMAGE, "record.decode", where, f"topic is {type(topic).__name__}")
            return
        if lane != DEFAULT_LANE:
            self.found(DAMAGE, "record.prefix", where,
                       f"topic message in lane {lane}, not the default lane")
        if topic not in self._topic_ids:
            stored = self.store.meta.get(keys.topic_name_key(self.q.id, topic))
            self._topic_ids[topic] = keys.read_u32(stored) if stored else None
        if self._topic_ids[topic] != topic_id:
            self.found(DAMAGE, "record.prefix", where,
                       f"topic {topic!r} has id {self._topic_ids[topic]}, prefix says "
                       f"{topic_id}")

    def check_time_entries(self, first: int, ms_of: array, previous_ms: int | None,
                           entries: list[tuple[int, int]]) -> None:
        """Entries of one segment against its production times (``ms_of``); ``previous_ms``
        is the time of the seq before the segment (-1 when there is none in the log, None
        when unknown: then the segment's first seq needs no entry)."""
        found = self.found
        size = len(ms_of)
        # Seqs starting a new ms (each may need an entry), and time order.
        starts = set()
        entered: set[int] = set()  # those with their entry
        last = -1 if previous_ms is None else previous_ms
        order_reported = False
        for offset, ms in enumerate(ms_of):
            if ms < 0:
                continue
            if ms != last:
                if ms < last and not order_reported:
                    found(DAMAGE, "log.order", f"seq {first + offset}",
                          f"produced at {ms}, before the previous message ({last})")
                    order_reported = True
                starts.add(offset)
                last = ms
        for ms, seq in entries:
            offset = seq - first
            where = f"time {ms} seq {seq}"
            if not 0 <= offset < size or ms_of[offset] < 0:
                found(DAMAGE, "time.entry", where, "no log row for that seq")
            elif ms_of[offset] != ms:
                found(DAMAGE, "time.entry", where,
                      f"that seq was produced at {ms_of[offset]}")
            elif offset not in starts:
                found(DAMAGE, "time.entry", where,
                      "not the first seq of that ms (an earlier seq has the same time)")
            else:
                entered.add(offset)
        if previous_ms is None:
            starts.discard(0)  # whether it starts its ms is unknown
        seqs, self._last_entry = timeindex.missing_entries(
            [(ms_of[o], first + o, o in entered) for o in sorted(starts | entered)],
            self._last_entry)
        if seqs:
            found(DAMAGE, "time.missing", f"segment {first}",
                  f"{len(seqs)} ms with messages and no time index entry, first seqs "
                  f"{_seqs(seqs)}")

    # -- leases ---------------------------------------------------------------------------------

    def check_leases(self) -> None:
        q, store = self.q, self.store
        tag_ids = sorted(q.tags)
        for family in ("tags", "leases", "leasebatches"):
            for low, high in _gaps(tag_ids, 1 << 32):
                lower = keys.tag_key(q.id, low)
                upper = keys.tag_key(q.id, high) if high < 1 << 32 else keys.queue_bounds(
                    q.id)[1]
                count = _count_rows(getattr(store, family), lower, upper)
                if count:
                    self.found(DAMAGE, "orphan", f"family {family!r}",
                               f"{count} rows of tag ids {low}..{high - 1}, which do not "
                               "exist")
        for t in q.tags.values():
            self._check_tag(t.id, t.name)

    def _check_tag(self, tag_id: int, tag_name: str) -> None:
        q, store, found = self.q, self.store, self.found
        lower, upper = keys.tag_scope_bounds(q.id, tag_id)
        for key, value in Store.items(store.leases, lower, upper):
            self.report.leases += 1
            seq = keys.lease_key_decode(key)[2]
            where = f"tag {tag_name!r} lease seq {seq}"
            if len(value) != _LEASE_SIZE:
                found(DAMAGE, "lease.decode", where, f"{len(value)} bytes")
                continue
            lease = Lease.decode(value)
            if lease.state not in (LEASED, ENDED_AHEAD, ENDED_DEAD, ENDED_DELETED) or \
                    not 1 <= lease.lane <= LANES:
                found(DAMAGE, "lease.decode", where,
                      f"state {lease.state}, lane {lease.lane}")
                continue
            if seq < q.gone_seq:
                if lease.state in (ENDED_DELETED, LEASED):  # read as deleted: kept for
                    continue  # peek's count until its segment is reclaimed
                found(WARNING, "lease.below_gone", where,
                      f"below gone_seq {q.gone_seq} (dropped when gone_seq next rises)")
            elif store.log.get(keys.log_key(q.id, lease.lane, seq)) is None:
                found(DAMAGE, "lease.message", where,
                      f"no log row for seq {seq} in lane {lease.lane}")
        counted = [0]
        for lane in LANE_RANGE:
            for check, where, detail, seqs in batch_findings(store, q, tag_id, tag_name, lane,
                                                             counted):
                found(DAMAGE, check, where, f"{detail} {_seqs(seqs)}" if seqs else detail)
        self.report.leases += counted[0]

def _last_time(ms_of: array, default: int) -> int:
    for index in range(len(ms_of) - 1, -1, -1):
        if ms_of[index] >= 0:
            return ms_of[index]
    return default


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _hex(value: object) -> str:
    return value.hex() if isinstance(value, bytes) else _short(value)


def _seqs(seqs: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(seq) for seq in seqs[:limit])
    return shown + (f", ... ({len(seqs)} in all)" if len(seqs) > limit else "")
