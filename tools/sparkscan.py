"""The scanning half of the ``lamina`` Spark source (``spark.py``): the schema, the read
options, planning partitions (one per segment, cut to the time options and pushed-down
filters), and reading a partition on an executor from that process's read-only snapshot."""

from __future__ import annotations

import atexit
import gc
import importlib
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .snapshot import Snapshot, SnapshotError
from .timefmt import parse_time_ms

if TYPE_CHECKING:
    import numpy as np


SCHEMA = StructType([
    StructField("queue", StringType()),
    StructField("seq", LongType()),
    StructField("id", StringType()),
    StructField("enqueue_time", TimestampType()),
    StructField("priority", IntegerType()),
    StructField("topic", StringType()),
    StructField("attributes", MapType(StringType(), StringType())),
    StructField("body", BinaryType()),
    StructField("md5", BinaryType()),
    StructField("segment", LongType()),
])
STATE_FIELD = StructField("state", StringType())
#: Rows and bytes per Arrow record batch a partition yields (at most).
BATCH_ROWS = 16384
BATCH_BYTES = 64 << 20
_NO_SEQ = 1 << 63  # above every seq


class SegmentGone(RuntimeError):
    """A planned segment was reclaimed (retention, or consumption with no rewind window)
    before an executor read it: the scan would silently miss rows, so it fails instead."""


# -- options ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReadOptions:
    path: str
    queue: str | None
    since_ms: int | None
    until_ms: int | None
    tag: str | None

    @classmethod
    def parse(cls, options: Any) -> ReadOptions:
        path = options.get("path")
        if not path:
            raise ValueError('the lamina source needs .option("path", DATA_DIR)')
        since, until = options.get("since"), options.get("until")
        return cls(
            path=os.path.abspath(path), queue=options.get("queue") or None,
            since_ms=parse_time_ms(since) if since not in (None, "") else None,
            until_ms=parse_time_ms(until) if until not in (None, "") else None,
            tag=options.get("tag") or None,
        )


def int_option(options: Any, name: str, default: int | None, low: int,
               high: int | None = None) -> int | None:
    """The whole-number option ``name`` (``default`` when not given), refused with a
    ``ValueError`` naming it when it is not one or lies outside ``low``..``high``."""
    text = options.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {name}: not a whole number: {text!r}") from None
    if value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ValueError(f"option {name}: must be {span}, got {value}")
    return value


def schema_for(tag: str | None) -> StructType:
    return StructType([*SCHEMA.fields, STATE_FIELD]) if tag else SCHEMA


# -- partitions ------------------------------------------------------------------------------

class LaminaPartition(InputPartition):
    """One segment's seqs ``[first_seq, end_seq)`` of one queue, as planned."""

    def __init__(self, queue_id: int, queue: str, segment: int, first_seq: int, end_seq: int,
                 lanes: list[int], tag: str | None = None, now_ms: int = 0,
                 must_exist: bool = True):
        super().__init__(segment)
        self.queue_id = queue_id
        self.queue = queue
        self.segment = segment
        self.first_seq = first_seq
        self.end_seq = end_seq
        self.lanes = lanes
        self.tag = tag
        self.now_ms = now_ms
        self.must_exist = must_exist

    def __repr__(self) -> str:
        return (f"LaminaPartition({self.queue!r}, segment {self.segment}, seqs "
                f"{self.first_seq}..{self.end_seq - 1})")


@dataclass
class _Bounds:
    """What pushed-down filters and options leave of a scan (all exact)."""

    queues: frozenset[str] | None = None
    first_seq: int = 0
    end_seq: int = _NO_SEQ
    since_ms: int | None = None
    until_ms: int | None = None
    first_segment: int = 0
    end_segment: int = _NO_SEQ

    def time(self, since_ms: int | None, until_ms: int | None) -> None:
        if since_ms is not None:
            self.since_ms = since_ms if self.since_ms is None else max(self.since_ms, since_ms)
        if until_ms is not None:
            self.until_ms = until_ms if self.until_ms is None else min(self.until_ms, until_ms)


def plan(snapshot: Snapshot, options: ReadOptions, bounds: _Bounds,
         now_ms: int | None = None) -> list[LaminaPartition]:
    """One partition per retained segment, cut to the options and bounds."""
    now = snapshot.now() if now_ms is None else now_ms
    bounds.time(options.since_ms, options.until_ms)
    queues = [snapshot.queue(options.queue)] if options.queue else snapshot.queues()
    partitions: list[LaminaPartition] = []
    for q in queues:
        if bounds.queues is not None and q.name not in bounds.queues:
            continue
        first = max(snapshot.retained_from(q, now), bounds.first_seq)
        end = min(q.next_seq, bounds.end_seq)
        if bounds.since_ms is not None:
            first = max(first, snapshot.first_seq_at(q, bounds.since_ms))
        if bounds.until_ms is not None:
            end = min(end, snapshot.first_seq_at(q, bounds.until_ms))
        partitions.extend(segment_partitions(q, first, end, options.tag, now, bounds))
    return partitions


def segment_partitions(q: Any, first: int, end: int, tag: str | None, now: int,
                        bounds: _Bounds | None = None,
                        must_exist: bool = True) -> Iterator[LaminaPartition]:
    for segment in q.segments:
        if bounds is not None and not bounds.first_segment <= segment.first_seq \
                < bounds.end_segment:
            continue
        low, high = max(first, segment.first_seq), min(end, segment.last_seq + 1)
        if low < high:
            lanes = [lane for lane in q.lanes_used if q.lane_tail[lane] >= low]
            yield LaminaPartition(q.id, q.name, segment.first_seq, low, high, lanes, tag, now,
                                  must_exist)


# -- reading on an executor ------------------------------------------------------------------

_SNAPSHOTS: dict[str, Snapshot] = {}
_heap_frozen = False


def freeze_worker_heap() -> None:
    """Once per Spark Python worker (``read`` calls it): move every object that exists now
    into the collector's permanent generation (``gc.freeze``).

    Spark's Python daemon runs a full ``gc.collect()`` after each task of a reused worker; with
    pyspark, pyarrow and numpy imported that walks ~50,000 objects, measured 15-70 ms a task
    here: most of a task's Python overhead, paid 16 times by a 16-segment scan. Frozen, the
    modules, classes and functions of those imports are no longer walked; what tasks create
    later is collected as before. The price: what is frozen is never freed as a reference
    cycle, which for imported modules (alive for good anyway) is nothing."""
    global _heap_frozen
    if not _heap_frozen:
        importlib.import_module(".arrowbatch", __package__)  # the read path's imports, first
        _heap_frozen = True
        gc.freeze()


def executor_snapshot(path: str) -> Snapshot:
    """This process's read-only view of ``path`` (opened once, refreshed on demand)."""
    snapshot = _SNAPSHOTS.get(path)
    if snapshot is None:
        snapshot = _SNAPSHOTS[path] = Snapshot(path)
        if len(_SNAPSHOTS) == 1:
            atexit.register(_close_snapshots)
    return snapshot


def _close_snapshots() -> None:
    while _SNAPSHOTS:
        _SNAPSHOTS.popitem()[1].close()


def _partition_values(snapshot: Snapshot,
                      partition: LaminaPartition) -> tuple[np.ndarray, list[bytes]]:
    """The seqs and log values of the partition's rows, in seq (production) order.

    One lane whose row count is the range's size holds every seq of the range (seqs are dense
    and unique), so its values are read without their keys (the cheapest scan rocksdict has),
    and the seqs are the range. Otherwise the keys say which seqs are there, and the lanes are
    merged by seq."""
    import numpy as np

    from .arrowbatch import log_seqs

    if len(partition.lanes) == 1:
        values = snapshot.collect_lane_values(partition.queue_id, partition.lanes[0],
                                              partition.first_seq, partition.end_seq)
        if len(values) == partition.end_seq - partition.first_seq:
            return np.arange(partition.first_seq, partition.end_seq, dtype=np.int64), values
    rows: list[tuple[bytes, bytes]] = []
    for lane in partition.lanes:
        rows.extend(snapshot.collect_lane(partition.queue_id, lane, partition.first_seq,
                                          partition.end_seq))
    seqs = log_seqs([key for key, _ in rows])
    values = [value for _, value in rows]
    if len(partition.lanes) > 1:
        order = np.argsort(seqs, kind="stable")
        seqs = seqs[order]
        values = [values[i] for i in order.tolist()]
    return seqs, values


def _batch_bounds(values: Sequence[bytes]) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of the record batches the rows are yielded in: ``BATCH_ROWS`` rows,
    fewer if they reach ``BATCH_BYTES`` (at least one row)."""
    import numpy as np

    ends = np.cumsum(np.fromiter(map(len, values), np.int64, len(values)))
    start = 0
    while start < len(values):
        before = int(ends[start - 1]) if start else 0
        full = int(np.searchsorted(ends, before + BATCH_BYTES)) + 1  # the row reaching it
        stop = min(start + BATCH_ROWS, full, len(values))
        yield start, stop
        start = stop


def read_partition(path: str, partition: LaminaPartition, schema: StructType) -> Iterator[Any]:
    """The partition's rows as Arrow record batches of exactly ``schema``'s types.

    Seqs are dense, so the planned range holds exactly ``end_seq - first_seq`` rows while its
    segment exists: a view that shows fewer is older than the plan and is refreshed; if the
    segment is gone then, the task fails (``SegmentGone``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from .arrowbatch import record_batch

    snapshot = executor_snapshot(path)
    expected = partition.end_seq - partition.first_seq
    try:
        seqs, values = _partition_values(snapshot, partition)
    except SnapshotError:  # a file the view read was removed beside it: an older view too
        values = []
    if len(values) != expected:
        snapshot.refresh()
        if partition.must_exist and not snapshot.segment_exists(partition.queue_id,
                                                                partition.segment):
            raise SegmentGone(
                f"segment {partition.segment} of queue {partition.queue!r} in {path} was "
                f"reclaimed after the scan was planned (seqs {partition.first_seq}.."
                f"{partition.end_seq - 1}); re-run the query")
        seqs, values = _partition_values(snapshot, partition)
        if len(values) != expected and partition.must_exist:
            raise SegmentGone(
                f"queue {partition.queue!r} in {path}: seqs {partition.first_seq}.."
                f"{partition.end_seq - 1} hold {len(values)} messages, not {expected} (the "
                "directory changed under the scan, or is damaged: `lamina inspect verify`)")
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    with_state = "state" in schema.names
    states = _tag_states(snapshot, partition) if with_state else None
    for start, stop in _batch_bounds(values):
        chunk, chunk_seqs = values[start:stop], seqs[start:stop]
        chunk_states = None
        if with_state:
            chunk_states = [None] * len(chunk) if states is None else [
                states.state(seq, value)[0] for seq, value in zip(chunk_seqs.tolist(), chunk)]
        yield record_batch(arrow_schema, partition.queue, partition.segment, chunk_seqs, chunk,
                           chunk_states)


def _tag_states(snapshot: Snapshot, partition: LaminaPartition) -> Any:
    from .tagstate import TagStates
    if partition.tag is None:
        return None
    q = snapshot.queue_by_id(partition.queue_id)
    if q is None:
        return None
    t = q.tag_named(partition.tag)
    return None if t is None else TagStates(snapshot, q, t, partition.now_ms)


# -- batch reader -------------------------------------------------------------------------------

class LaminaReader(DataSourceReader):
    """Plans one partition per segment on the driver; reads them on executors."""

    def __init__(self, options: ReadOptions, schema: StructType):
        self.options = options
        self.schema = schema
        self.bounds = _Bounds()

    def partitions(self) -> Sequence[InputPartition]:
        with Snapshot(self.options.path) as snapshot:
            partitions = plan(snapshot, self.options, self.bounds)
        # Spark runs one empty partition when given none; an impossible range reads nothing.
        return partitions or [LaminaPartition(0, "", 0, 0, 0, [], must_exist=False)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, LaminaPartition)
        freeze_worker_heap()
        if partition.first_seq >= partition.end_seq:
            return iter(())
        return read_partition(self.options.path, partition, self.schema)


class LaminaPushdownReader(LaminaReader):
    """``LaminaReader`` with filter pushdown (see the module docstring)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        for item in filters:
            if not _push(item, self.bounds):
                yield item


def _push(item: Any, bounds: _Bounds) -> bool:
    """Fold one filter into ``bounds`` if the source can apply it exactly."""
    from pyspark.sql import datasource as ds
    column = getattr(item, "attribute", None)
    value = getattr(item, "value", None)
    if column == ("queue",):
        if isinstance(item, ds.EqualTo) and isinstance(value, str):
            names = frozenset((value,))
        elif isinstance(item, ds.In) and all(isinstance(v, str) for v in value):
            names = frozenset(value)
        else:
            return False
        bounds.queues = names if bounds.queues is None else bounds.queues & names
        return True
    if column == ("enqueue_time",) and isinstance(value, datetime):
        span = _compare_span(item, _micros(value), scale=1000)
        if span is None:
            return False
        bounds.time(*span)
        return True
    if column in (("seq",), ("segment",)) and type(value) is int:
        span = _compare_span(item, value, scale=1)
        if span is None:
            return False
        low, high = span
        if column == ("seq",):
            bounds.first_seq = max(bounds.first_seq, low if low is not None else 0)
            bounds.end_seq = min(bounds.end_seq, high if high is not None else _NO_SEQ)
        else:
            bounds.first_segment = max(bounds.first_segment, low if low is not None else 0)
            bounds.end_segment = min(bounds.end_segment,
                                     high if high is not None else _NO_SEQ)
        return True
    return False


def _compare_span(item: Any, value: int, scale: int) -> tuple[int | None, int | None] | None:
    """``column OP value`` as an integer range ``[low, high)`` of the column's unit, where the
    filter's value is in units ``scale`` times finer (µs against ms: 1000)."""
    from pyspark.sql import datasource as ds
    floor, ceil = value // scale, -(-value // scale)
    if isinstance(item, ds.GreaterThan):
        return floor + 1, None
    if isinstance(item, ds.GreaterThanOrEqual):
        return ceil, None
    if isinstance(item, ds.LessThan):
        return None, ceil
    if isinstance(item, ds.LessThanOrEqual):
        return None, floor + 1
    if isinstance(item, ds.EqualTo):
        return (floor, floor + 1) if value % scale == 0 else (0, 0)
    return None


def _micros(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
