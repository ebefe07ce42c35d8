"""The RocksDB instance behind an engine: column families, options, and the one write path.

Invariants:
- One ``WriteBatch`` collects everything the current request (or group of requests) changes,
  across column families; it reaches RocksDB in one ``write``: atomic.
- ``write`` never syncs. Durability beyond the WAL in the page cache is ``sync_wal``: one
  ``flush_wal(sync=True)``, which releases the GIL, so a server runs it in a worker thread once
  per group (FACTS.md: a synced write per request holds the GIL and does not scale).
- Reads go to RocksDB directly, so a reader must see pending writes first: the engine calls
  ``flush`` before any read that iterates a column family.
- WAL files are recycled (``RECYCLED_WAL_FILES``). RocksDB keeps that only with its default
  WAL recovery mode (point in time) and no WAL TTL or size limit, and it refuses writes
  without the WAL then; a recovery over recycled WALs relies on consecutive sequence numbers
  from one WAL to the next, so nothing here may take sequence numbers outside the WAL
  (ingested table files, writes with ``disableWAL``). tests/engine/test_wal_recycling.py fails
  if recycling is off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NoReturn

from rocksdict import (
    AccessType,
    ColumnFamily,
    DBCompressionType,
    Options,
    ReadOptions,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from . import keys
from .storememory import MemoryBounds, MemoryUsage, StoreMemory

#: Table files RocksDB keeps open at most (its table cache); without a bound it keeps every
#: one open, and a server could not know its file descriptor budget (server/files.py).
MAX_OPEN_FILES = 512
#: Files RocksDB opens besides its table cache: WAL, manifest, info log, blob files, the
#: outputs of running flushes and compactions.
OTHER_OPEN_FILES = 64
#: Obsolete WAL files RocksDB keeps to write the next WALs over (WAL recycling): a sync of a
#: write over a file's existing blocks is about half as costly as of an append to a new file
#: (no file size or block allocation to commit with it). Enough for the WALs one flush makes
#: obsolete together (``max_total_wal_size`` below); RocksDB reuses only WALs of the running
#: instance, so after each open the first WALs are new files.
RECYCLED_WAL_FILES = 4
#: Walks one kept lane iterator serves before a new one is made (``Store.lane_scan``): an
#: iterator pins the files and memtables of its creation, so none is kept for long.
LANE_SCAN_USES = 1024

COLUMN_FAMILIES = (
    "meta", "log", "time", "segments", "delays", "delayseq", "topics", "tags", "leases",
    "leasebatches",
)
#: Families of older schema versions: a read-write open opens them when present, so that the
#: engine's migration can drop them (``drop_legacy_families``).
LEGACY_FAMILIES = ("timers",)
# Families whose rows are written and deleted at message rate: tombstones pile up there, so
# files with many deletions are compacted early.
CHURN_FAMILIES = ("leases", "leasebatches", "delays", "delayseq", "topics")


#: How RocksDB's message begins when it could not read a file (rocksdict raises it as a bare
#: ``Exception``): an I/O error naming a table or blob file (one missing or unreadable; an
#: I/O error of the WAL, the manifest or the LOCK is not a read's), or damage found.
_IO_ERROR, _CORRUPTION = "IO error: ", "Corruption: "
#: The file's path is absolute, or relative to the working directory (as the data directory
#: was given: ``lamina inspect lamina-data ...``).
_DATA_FILE = re.compile(r"(\S+?\.(?:sst|blob))\b")


@dataclass(frozen=True)
class ReadFailure:
    """RocksDB could not read a file a read needed. rocksdict raises that as a bare
    ``Exception`` from a point read (``get``, ``get_entity``, a multi-get), an iterator's
    ``status()`` (``Scan.check_status``) or a positioning that loads a blob value."""

    message: str  # RocksDB's own
    file: str | None  # the table or blob file it names, when it names one

    def describe(self) -> str:
        """What failed, in a user's terms: the file, and whether it is gone."""
        if self.file is None:
            return f"RocksDB could not read a data file ({self.message})"
        if not Path(self.file).exists():
            return f"the data file {self.file} is gone"
        return f"the data file {self.file} could not be read ({self.message})"


def read_failure(exc: BaseException) -> ReadFailure | None:
    """The ``ReadFailure`` that ``exc`` reports, or None when it is anything else."""
    if type(exc) is not Exception:
        return None
    text = str(exc)
    match = _DATA_FILE.search(text)
    if text.startswith(_CORRUPTION) or (match is not None and text.startswith(_IO_ERROR)):
        return ReadFailure(text, match.group(1) if match else None)
    return None


class DataDirectoryError(RuntimeError):
    """The engine cannot open a data directory: another process holds it, or it is damaged
    (a table or blob file missing or unreadable). The message names the directory and says
    what to do."""


def open_error(data_dir: Path, exc: BaseException) -> DataDirectoryError | None:
    """The ``DataDirectoryError`` of RocksDB's error ``exc`` (a bare ``Exception`` from
    rocksdict) opening or loading ``data_dir``; None for anything else."""
    if type(exc) is not Exception:
        return None
    text = str(exc)
    if "While lock file" in text or "lock hold by current process" in text:
        # RocksDB's lock is held by another process, or by an engine open in this one
        return DataDirectoryError(
            f"{data_dir}: in use (a lamina serve or an embedded engine holds its lock, "
            f"{data_dir / 'db' / 'LOCK'}): close it, or give another data directory")
    failure = read_failure(exc)
    if failure is not None:
        return DataDirectoryError(
            f"{data_dir}: cannot be opened, {failure.describe()}: the directory is damaged; "
            "restore it from a copy")
    return DataDirectoryError(f"{data_dir}: RocksDB cannot open it: {text}")


def raise_open_error(data_dir: Path, exc: BaseException) -> NoReturn:
    """Raise what opening ``data_dir`` failed with: RocksDB's error as a
    ``DataDirectoryError`` saying what to do (``open_error``), anything else as it is."""
    error = open_error(data_dir, exc)
    if error is None:
        raise exc
    raise error from None


def _options(memory: StoreMemory, name: str | None = None) -> Options:
    options = Options(raw_mode=True)
    options.set_compression_type(DBCompressionType.lz4())
    memory.apply(options, name)
    if name == "log":
        # Bodies of 4 KiB or more go to blob files: compaction then moves small keys, not bodies.
        options.set_enable_blob_files(True)
        options.set_min_blob_size(4096)
        options.set_enable_blob_gc(True)
    if name in CHURN_FAMILIES:
        options.add_compact_on_deletion_collector_factory(1024, 256, 0.5)
    return options


def _db_options(memory: StoreMemory) -> Options:
    options = _options(memory)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    # Rarely written families must not pin old WALs: past this much WAL, the families holding
    # data of the oldest WAL are flushed and it becomes obsolete. As much as the write buffers:
    # a recovery replays at most about that, and obsolete WALs come soon enough to be reused.
    options.set_max_total_wal_size(memory.bounds.write_buffer_bytes)
    # An obsolete WAL is renamed and written over, not deleted (see RECYCLED_WAL_FILES).
    options.set_recycle_log_file_num(RECYCLED_WAL_FILES)
    options.set_max_open_files(MAX_OPEN_FILES)
    options.increase_parallelism(2)
    return options


def _bounds(lower: bytes, upper: bytes) -> ReadOptions:
    options = ReadOptions()
    options.set_iterate_lower_bound(lower)
    options.set_iterate_upper_bound(upper)
    return options


class Scan:
    """A bounded RocksDB iterator that owns its read options (see ``Store`` reads).

    Step it (``next``, ``prev``) only while ``valid()``: rocksdict's iterator crashes the
    process (a segmentation fault) when stepped past its end; ``key`` and ``value`` give None
    there."""

    __slots__ = ("_options", "_it", "valid", "key", "value", "next", "prev", "check_status")

    def __init__(self, family: Rdict, lower: bytes, upper: bytes, last: bool,
                 start: bytes | None = None):
        """Positioned on the last key (``last``), else on the first at or above ``start``
        (default ``lower``)."""
        self._options = _bounds(lower, upper)
        self._it = it = family.iter(self._options)
        if last:
            it.seek_to_last()
            # RocksDB may step below iterate_lower_bound going backwards (seen with an empty
            # range): a reverse scan checks the bound itself.
            self.valid = lambda: it.valid() and it.key() >= lower
        else:
            it.seek(lower if start is None else start)
            self.valid = it.valid
        self.key = it.key
        self.value = it.value
        self.next = it.next
        self.prev = it.prev
        # Raises RocksDB's error once ``valid()`` turned False for one (a file that cannot
        # be read), rather than the end of the range.
        self.check_status = it.status


class LaneScan(Scan):
    """A forward ``Scan`` over one lane of the log kept for the next walk of that lane
    (``Store.lane_scan``): creating an iterator costs several times a seek, more so right
    after a write. It reads the state of its creation, which for a lane's records from
    ``gone_seq`` up stays the state of the store while the lane's tail is the same: a record
    there never changes, and a new one raises the tail."""

    __slots__ = ("tail", "uses")

    def __init__(self, family: Rdict, lower: bytes, upper: bytes, start: bytes, tail: int):
        super().__init__(family, lower, upper, False, start)
        self.tail = tail
        self.uses = 0

    def seek(self, key: bytes) -> None:
        self._it.seek(key)


class LaneWalk:
    """A lane of a queue whose every seq from ``start`` to ``tail`` has a log record (a queue
    with one lane in use: seqs are dense, and none at or above ``gone_seq`` is collected),
    walked like a ``Scan`` by point reads: a receive of one message reads two records, and
    creating and seeking an iterator costs more than that. Past ``STEPS`` records, or at a
    record that is not there, it goes on as a ``Scan`` from where it is."""

    __slots__ = ("_log", "_key", "_lane", "_seq", "_tail", "_value", "_current", "_steps",
                 "_scan", "_last")

    STEPS = 4

    def __init__(self, log: Rdict, queue_id: int, lane: int, start: int, tail: int,
                 last: list[bytes] | None = None):
        self._log = log
        self._key = keys.log_key
        self._lane = (queue_id, lane)
        self._tail = tail
        self._steps = 0
        self._scan: Scan | None = None
        # ``[key, record]``: the last record a walk read (``Store.last_record``). A receive
        # of one reads the record after the one it leases, where the next receive starts:
        # a record at a seq a walk may read (at or above ``gone_seq``) never changes, and a
        # seq is never given to another message, so it is read once.
        self._last = last
        self._read(start)

    def _read(self, seq: int) -> None:
        self._seq = seq
        self._current = key = self._key(*self._lane, seq)
        if seq > self._tail:
            self._value = None
            return
        last = self._last
        if last is not None and last[0] == key:
            self._value = last[1]
            return
        value = self._log.get(key)
        if value is None:  # not dense after all: the iterator knows
            self._scan = Scan(self._log, key, keys.log_lane_bounds(*self._lane)[1], False)
        elif last is not None:
            last[0], last[1] = key, value
        self._value = value

    def valid(self) -> bool:
        if self._scan is not None:
            return self._scan.valid()
        return self._value is not None

    def key(self) -> bytes:
        return self._current if self._scan is None else self._scan.key()

    def value(self) -> bytes:
        return self._value if self._scan is None else self._scan.value()  # type: ignore

    def check_status(self) -> None:
        """As ``Scan.check_status`` (a point read raises RocksDB's error itself)."""
        if self._scan is not None:
            self._scan.check_status()

    def next(self) -> None:
        if self._scan is not None:
            self._scan.next()
            return
        self._steps += 1
        if self._steps >= self.STEPS and self._seq < self._tail:
            lower, upper = keys.log_lane_bounds(*self._lane, self._seq + 1)
            self._scan = Scan(self._log, lower, upper, False)
            return
        self._read(self._seq + 1)


class RangeReader:
    """One iterator over a fixed key range, reused for many short walks inside it: creating
    an iterator (with its read options) costs several times a seek. An iterator reads the
    state of its creation, so ``Store`` drops its readers whenever it writes. One walk at a
    time: a new walk moves the iterator under the previous one."""

    __slots__ = ("_options", "_it")

    def __init__(self, family: Rdict, lower: bytes, upper: bytes):
        self._options = _bounds(lower, upper)
        self._it = family.iter(self._options)

    def forward(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items with ``lower <= key < upper``, ascending."""
        it = self._it
        it.seek(lower)
        while it.valid():
            key = it.key()
            if key >= upper:
                return
            yield key, it.value()
            it.next()
        it.status()  # RocksDB's error, should one end the walk (as ``Scan.check_status``)

    def backward(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items with ``lower <= key < upper``, descending."""
        it = self._it
        it.seek_for_prev(upper)
        while it.valid():
            key = it.key()
            if key < lower:
                return
            if key < upper:
                yield key, it.value()
            it.prev()
        it.status()


class Store:
    """Column families plus the pending write batch."""

    # One attribute per column family (``COLUMN_FAMILIES``), set when the store opens: the
    # family to read, and its handle to write in the batch.
    meta: Rdict
    meta_h: ColumnFamily
    log: Rdict
    log_h: ColumnFamily
    time: Rdict
    time_h: ColumnFamily
    segments: Rdict
    segments_h: ColumnFamily
    delays: Rdict
    delays_h: ColumnFamily
    delayseq: Rdict
    delayseq_h: ColumnFamily
    topics: Rdict
    topics_h: ColumnFamily
    tags: Rdict
    tags_h: ColumnFamily
    leases: Rdict
    leases_h: ColumnFamily
    leasebatches: Rdict
    leasebatches_h: ColumnFamily

    def __init__(self, path: Path, *, read_only: bool = False, secondary: Path | None = None,
                 memory: MemoryBounds = MemoryBounds()):
        self.path = path
        self._memory = StoreMemory(memory)
        column_families = {name: _options(self._memory, name) for name in COLUMN_FAMILIES}
        if secondary is not None:
            access = AccessType.secondary(str(secondary))
        elif read_only:
            access = AccessType.read_only()
        else:
            access = AccessType.read_write()
        existing = set(Rdict.list_cf(str(path))) if (path / "CURRENT").exists() else set()
        if read_only or secondary is not None:
            column_families = {k: v for k, v in column_families.items() if k in existing}
        else:  # RocksDB opens a database for writing only with every family it has
            column_families.update((name, _options(self._memory, name))
                                   for name in LEGACY_FAMILIES
                                   if name in existing)
        self.legacy_families = [name for name in LEGACY_FAMILIES if name in column_families]
        self.db = Rdict(str(path), _db_options(self._memory), column_families=column_families,
                        access_type=access)
        for name in COLUMN_FAMILIES:
            if name in column_families:
                setattr(self, name, self.db.get_column_family(name))
                setattr(self, f"{name}_h", self.db.get_column_family_handle(name))
        self._write_options = WriteOptions()
        self._write_options.sync = False
        self.batch = WriteBatch(raw_mode=True)
        self.pending = 0  # operations in ``batch`` not yet written
        # Keys put or deleted through this class since the last write: should the write fail,
        # they name what memory must be rebuilt from (recovery.py; the hot paths that put
        # straight into ``batch`` always put a row of the same queue through here too).
        self.written: list[bytes] = []
        self._readers: dict[tuple[int, bytes], RangeReader] = {}
        self._lanes: dict[tuple[int, int], LaneScan] = {}  # ``lane_scan``'s kept iterators
        self.last_record: list[bytes] = [b"", b""]  # the last record a ``LaneWalk`` read

    def drop_legacy_families(self) -> None:
        """Drop the families an older schema version had and this one does not use."""
        for name in self.legacy_families:
            self.db.drop_column_family(name)
        self.legacy_families = []

    def memory_usage(self) -> MemoryUsage:
        """What RocksDB holds in memory now (write buffers, block cache, table readers)."""
        return self._memory.usage([getattr(self, name) for name in COLUMN_FAMILIES
                                   if hasattr(self, name)])

    # -- the write path -------------------------------------------------------------------

    def put(self, handle: ColumnFamily, key: bytes, value: bytes) -> None:
        self.batch.put(key, value, handle)
        self.pending += 1
        self.written.append(key)

    def delete(self, handle: ColumnFamily, key: bytes) -> None:
        self.batch.delete(key, handle)
        self.pending += 1
        self.written.append(key)

    def delete_range(self, handle: ColumnFamily, begin: bytes, end: bytes) -> None:
        self._lanes.clear()  # reclaimed segments, a deleted queue: no iterator pins them
        self.batch.delete_range(begin, end, handle)
        self.pending += 1
        self.written.append(begin)

    def flush(self) -> None:
        """Write the pending batch (into the WAL, not synced). On failure the batch is kept
        (with ``written``) for the caller to look at and ``discard``."""
        if self.pending:
            if self._readers:
                self._readers.clear()
            self.db.write(self.batch, self._write_options)
            self.batch = WriteBatch(raw_mode=True)
            self.pending = 0
            self.written = []

    def discard(self) -> None:
        self._readers.clear()
        self._lanes.clear()
        self.batch = WriteBatch(raw_mode=True)
        self.pending = 0
        self.written = []

    def catch_up(self) -> None:
        """A secondary store: see the primary's latest writes (the reusable readers, which
        read the state of their creation, go)."""
        self._readers.clear()
        self._lanes.clear()
        self.db.try_catch_up_with_primary()

    def sync_wal(self) -> None:
        """Sync the WAL to stable storage. Releases the GIL: run it in a worker thread."""
        self.db.flush_wal(True)

    # -- reads ----------------------------------------------------------------------------
    #
    # Every iterator has tight bounds (tombstones slow unbounded scans). rocksdict does not
    # keep the ``ReadOptions`` that carry an iterator's bounds alive: freed early, the bounds
    # dangle and the iterator stops at random. So the options always live as long as their
    # iterator: inside ``Scan`` or the frame of the ``items`` / ``keys`` generators.

    @staticmethod
    def scan(family: Rdict, lower: bytes, upper: bytes, *, last: bool = False) -> Scan:
        """A bounded iterator positioned at its first (or ``last``) key; ``upper`` is
        exclusive."""
        return Scan(family, lower, upper, last)

    def log_appended(self) -> None:
        """Records are appended to the log (any queue's): the kept lane iterators go. One
        pins the memtables and files of its creation, so one kept while sends fill and
        flush memtables would hold them all in memory; kept only while the log is not
        written, it pins what the store holds anyway."""
        if self._lanes:
            self._lanes.clear()

    def lane_scan(self, queue_id: int, lane: int, start: int, tail: int) -> Scan:
        """A forward iterator over the log records of one lane from seq ``start`` (at or
        above the queue's ``gone_seq``), ``tail`` the lane's last seq, every record up to it
        written. The iterator of the lane's previous walk serves again when the tail is the
        same (nothing appended since it was made: it reads what the store holds there; and
        ``log_appended`` drops it at any append), at most ``LANE_SCAN_USES`` times, sought
        unless it rests on ``start`` already; a new one is made otherwise. One walk of a
        lane at a time: the next moves the iterator under the previous one."""
        lower = keys.log_key(queue_id, lane, start)
        scan = self._lanes.get((queue_id, lane))
        if scan is not None and scan.tail == tail and scan.uses < LANE_SCAN_USES:
            scan.uses += 1
            # The walk before left it where the lane's cursor rests, where the next usually
            # starts: resting on ``lower``, it is where a seek would put it.
            if not (scan.valid() and scan.key() == lower):
                scan.seek(lower)
            return scan
        first, upper = keys.log_lane_bounds(queue_id, lane)
        scan = self._lanes[(queue_id, lane)] = LaneScan(self.log, first, upper, lower, tail)
        return scan

    def reader(self, family: Rdict, lower: bytes, upper: bytes) -> RangeReader:
        """The reusable iterator over ``[lower, upper)`` of ``family``, until the next write."""
        key = (id(family), lower)
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = RangeReader(family, lower, upper)
        return reader

    @staticmethod
    def items(family: Rdict, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The rows of ``[lower, upper)``; RocksDB's error, should it end the scan early (a
        file that cannot be read), is raised rather than taken for the end."""
        it = Scan(family, lower, upper, False)
        while it.valid():
            yield it.key(), it.value()
            it.next()
        it.check_status()

    @staticmethod
    def values(family: Rdict, lower: bytes, upper: bytes) -> Iterator[bytes]:
        return (value for _, value in Store.items(family, lower, upper))

    @staticmethod
    def keys(family: Rdict, lower: bytes, upper: bytes) -> Iterator[bytes]:
        """The keys of ``[lower, upper)``, as ``items``."""
        it = Scan(family, lower, upper, False)
        while it.valid():
            yield it.key()
            it.next()
        it.check_status()

    def close(self) -> None:
        self._readers.clear()
        self._lanes.clear()
        for name in COLUMN_FAMILIES:  # column family handles keep the database open
            for attribute in (name, f"{name}_h"):
                if hasattr(self, attribute):
                    delattr(self, attribute)
        try:
            self.db.close()  # raises the background error of a failed write, and closes
        finally:
            del self.db
