"""A read-only view of a data directory, safe beside a running server (DESIGN.md §6).

``Snapshot`` opens ``DATA_DIR/db`` without the LOCK and without writing anything under
``DATA_DIR``; it never reads ``receipt.key``, and works the same on an offline copy (no server)
as beside a live one. Two RocksDB access modes:

- ``read_only`` (the default): a read-only instance sees the files and WAL as of its open;
  ``refresh()`` reopens (about 30 ms). An open reads the manifest, then the files it names,
  while the writer beside may delete a table file or WAL, or reuse a WAL (docs/STORAGE.md
  "WAL files"), in between: RocksDB then fails the open (a missing file, or a table file
  "ahead of" a WAL it read half-reused), or, when a WAL it would have replayed went before it
  listed the WAL files, opens without that WAL's rows. Such an open is tried again
  (``OPEN_ATTEMPTS``, ``_open_read_only``) and reads the newer state.
- ``secondary``: a secondary instance in a private temporary directory; ``refresh()`` is
  ``try_catch_up_with_primary``. **RocksDB does not support BlobDB with secondary instances**
  (RocksDB wiki "BlobDB"; facebook/rocksdb#13296, #13371): reading a value stored in a blob
  file segfaults the process (seen with rocksdict 0.3.29). The engine stores log values of
  4 KiB or more in blob files (engine/store.py), so this mode refuses a directory holding
  ``*.blob`` files, and is not the default. DESIGN.md §6 asks for secondaries; this is why the
  tools use read-only opens.

Rules:

- What a snapshot shows is the directory's state as of its last open or ``refresh()``;
  between refreshes nothing moves, so the checks and scans of one pass see one state.
- Every key is built and decoded by ``lamina.engine.keys``; stored structs are decoded by the
  engine's own classes (``QueueState``, ``TagState``, ``Segment``, ``Lease``), so the layout
  has one definition (docs/STORAGE.md).
- Every iterator keeps its ``ReadOptions`` alive until it is done (rocksdict does not): the
  ``Store.scan`` / ``items`` / ``keys`` / ``values`` helpers, or ``collect_lane`` /
  ``collect_lane_values``.
- A bulk read of the log that RocksDB cannot finish, because the writer beside deleted a
  table or blob file the view needs after it opened, raises ``SnapshotError``; it never ends
  early in silence (``_check_read_through``; ``collect_lane_values`` gives no keys to check
  by, so its caller compares the count with the seqs it expects). A ``refresh()`` reads the
  state as of now.
- Any other read of this class that RocksDB fails on a file (rocksdict raises RocksDB's
  message as a bare ``Exception``) raises ``SnapshotReadError``, naming the file
  (``read_error``); callers reading ``store`` directly raise what they catch with
  ``raise_read_error``.
- Not thread-safe: one caller at a time.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, TypeVar

import cbor2
from rocksdict import ReadOptions

from lamina.engine import keys, timeindex
from lamina.engine.clock import wall_clock_ms
from lamina.engine.core import SCHEMA_VERSION
from lamina.engine.errors import QueueNotFound, TagNotFound
from lamina.engine.loading import headed_topic, lease_rows, read_queue, tag_definitions
from lamina.engine.state import ENDED_DELETED, LEASED, Lease, QueueState, Segment, TagState
from lamina.engine.store import Store, read_failure

__all__ = ["Snapshot", "SnapshotError", "SnapshotReadError"]

READ_ONLY, SECONDARY = "read_only", "secondary"
#: Seqs ``message_rows`` reads per step (memory: that many log values at most).
ROWS_PER_READ = 16384
_SECONDARY_PREFIX = "lamina-secondary-"
#: Read-only opens tried before an error is raised (see the module docstring), and the pause
#: before each new attempt (times the attempts so far).
OPEN_ATTEMPTS = 8
_RETRY_PAUSE_S = 0.005
#: What RocksDB says when the writer changed the files under an open.
_FILES_CHANGED = ("No such file or directory", "SST file is ahead of WALs")
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _sweep_secondaries() -> None:
    """Remove the secondary directories of processes that are gone (a Spark worker killed
    without running ``atexit`` leaves its directory behind)."""
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.glob(f"{_SECONDARY_PREFIX}*-*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(_SECONDARY_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass  # alive (another user's process, or no permission to ask)


def _wal_numbers(path: Path) -> set[int]:
    return {int(entry.stem) for entry in path.glob("*.log") if entry.stem.isdigit()}


def _open_read_only(path: Path) -> Store:
    """A read-only ``Store`` of ``path``, the open tried again while a writer beside changes
    the files under it: when RocksDB fails it, and when a WAL file there before the open is
    gone after it (deleted, or reused under a new name) that the manifest it read still
    needed. RocksDB replays the WAL files it lists after reading the manifest: one that went in
    between, its rows written to table files after the manifest was read, would be missing
    from the view without an error."""
    attempt = 1
    while True:
        wals = _wal_numbers(path)
        try:
            store = Store(path, read_only=True)
        except Exception as exc:  # rocksdict raises a bare Exception with RocksDB's status
            if attempt == OPEN_ATTEMPTS or not any(m in str(exc) for m in _FILES_CHANGED):
                raise
        else:
            needed = store.db.property_int_value("rocksdb.min-log-number-to-keep") or 0
            if all(number < needed for number in wals - _wal_numbers(path)):
                return store
            store.close()
            if attempt == OPEN_ATTEMPTS:
                raise SnapshotError(f"{path}: its WAL files changed during each of "
                                    f"{OPEN_ATTEMPTS} opens; try again")
        time.sleep(_RETRY_PAUSE_S * attempt)
        attempt += 1


def _scan_options(lower: bytes, upper: bytes) -> ReadOptions:
    """Read options of a bounded bulk scan. The blocks it reads are not put in the block
    cache: a scan reads each once, and would only evict what point lookups use (measured
    0.1 µs/row less)."""
    options = ReadOptions()
    options.set_iterate_lower_bound(lower)
    options.set_iterate_upper_bound(upper)
    options.fill_cache(False)
    return options


class SnapshotError(RuntimeError):
    """The directory is not a Lamina data directory this version can read (or not in the
    mode asked for), or a read of it failed."""


class SnapshotReadError(SnapshotError):
    """RocksDB could not read a table or blob file this view needs: ``file`` (None when
    RocksDB does not name it). A server beside removes files after compacting them or
    dropping their rows; a view opened before reads its state as of then, so a ``refresh()``
    (for a command: running it again) reads the state as of now. A file that fails again
    is damaged."""

    def __init__(self, message: str, file: str | None, what: str = "") -> None:
        super().__init__(message)
        self.file = file
        self.what = what or message  # what failed, without the advice


def _reads(method: _Method) -> _Method:
    """A ``Snapshot`` method whose RocksDB read errors are raised as ``read_error``."""
    @functools.wraps(method)
    def reading(self: Snapshot, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            self.raise_read_error(exc)
    return reading  # type: ignore[return-value]


class Snapshot:
    """A lock-free, read-only view of ``DATA_DIR/db``; see the module docstring.

    ``queues()`` / ``queue(name)`` return ``QueueState`` objects filled from RocksDB exactly as
    the engine loads them (watermarks, lanes, lane tails, segments, tag definitions and
    cursors), except that lease rows are read only on demand (``leases``, ``load_leases``).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, mode: str = READ_ONLY):
        if mode not in (READ_ONLY, SECONDARY):
            raise ValueError(f"mode is {READ_ONLY!r} or {SECONDARY!r}")
        self.data_dir = Path(data_dir)
        self.mode = mode
        self._db_path = self.data_dir / "db"
        if not (self._db_path / "CURRENT").is_file():
            raise SnapshotError(f"{self.data_dir}: no Lamina database (missing db/CURRENT)")
        self.secondary_dir: Path | None = None
        self.store: Store | None = None  # type: ignore[assignment]
        self._queues: dict[int, QueueState] | None = None
        self._topic_names: dict[tuple[int, int], str] = {}
        self._open()

    # -- lifecycle ----------------------------------------------------------------------------

    def _open(self) -> None:
        if self.mode == READ_ONLY:
            self.store = _open_read_only(self._db_path)
        else:
            self._refuse_blobs()
            _sweep_secondaries()
            self.secondary_dir = Path(tempfile.mkdtemp(
                prefix=f"{_SECONDARY_PREFIX}{os.getpid()}-"))
            try:
                self.store = Store(self._db_path, secondary=self.secondary_dir)
                self.store.catch_up()
            except Exception:
                self._remove_secondary()
                raise
        self.opened_ms = wall_clock_ms()
        self._check_version()

    def _refuse_blobs(self) -> None:
        if any(self._db_path.glob("*.blob")):
            raise SnapshotError(f"{self.data_dir}: holds blob files, which RocksDB secondary "
                                "instances cannot read (they crash); use the read-only mode")

    def _check_version(self) -> None:
        version = self.store.meta.get(keys.META_VERSION)
        if version is not None and keys.read_u32(version) != SCHEMA_VERSION:
            raise SnapshotError(f"{self.data_dir}: schema version {keys.read_u32(version)}, "
                                f"this Lamina reads {SCHEMA_VERSION}")

    def refresh(self) -> None:
        """See what the directory holds now (the running server's latest writes)."""
        self._queues = None
        self._topic_names.clear()
        if self.mode == READ_ONLY:
            self._close_store()
            self._open()
        else:
            self._refuse_blobs()
            self.store.catch_up()
            self.opened_ms = wall_clock_ms()
            self._check_version()

    def _close_store(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            store.close()

    def close(self) -> None:
        self._close_store()
        self._remove_secondary()

    def _remove_secondary(self) -> None:
        if self.secondary_dir is not None:
            shutil.rmtree(self.secondary_dir, ignore_errors=True)
            self.secondary_dir = None

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- clock --------------------------------------------------------------------------------

    @property
    @_reads
    def clock_ms(self) -> int:
        """The engine clock as last persisted (0 if never)."""
        value = self.store.meta.get(keys.META_CLOCK)
        return keys.read_u64(value) if value else 0

    def now(self) -> int:
        """The engine's ``now`` (DESIGN.md §3): ``max(wall clock, persisted engine clock)``."""
        return max(wall_clock_ms(), self.clock_ms)

    # -- queues and tags ----------------------------------------------------------------------

    def read_error(self, exc: Exception) -> Exception:
        """The ``SnapshotReadError`` of ``exc`` when it is RocksDB's error of a file it could
        not read (rocksdict raises those as a bare ``Exception``), else ``exc`` itself."""
        failure = read_failure(exc)
        if failure is None:
            return exc
        return SnapshotReadError(
            f"{self.data_dir}: {failure.describe()}. A server running on this directory may "
            "have removed it after the read began: run the command again (refresh the "
            "view); if it fails again, the data directory is damaged", failure.file,
            failure.describe())

    def raise_read_error(self, exc: Exception) -> NoReturn:
        """Raise ``read_error(exc)`` (``exc`` as it is when it is not one)."""
        error = self.read_error(exc)
        if error is exc:
            raise exc
        raise error from None

    def _reading(self, rows: Iterator[Any]) -> Iterator[Any]:
        """``rows``, RocksDB's read errors raised as ``read_error``."""
        try:
            yield from rows
        except Exception as exc:
            self.raise_read_error(exc)

    @_reads
    def _load(self) -> dict[int, QueueState]:
        if self._queues is None:
            queues: dict[int, QueueState] = {}
            for key, value in Store.items(self.store.meta, keys.QUEUE_DEF_LOWER,
                                          keys.QUEUE_DEF_UPPER):
                q = self._load_queue(keys.queue_def_id(key), cbor2.loads(value))
                if q is not None:
                    queues[q.id] = q
            self._queues = queues
        return self._queues

    def _load_queue(self, queue_id: int, definition: dict[str, Any]) -> QueueState | None:
        """As the engine reads a queue at open (``lamina.engine.loading``), reading only."""
        store = self.store
        watermarks = store.meta.get(keys.watermarks_key(queue_id))
        if watermarks is None:
            return None  # a queue definition without watermarks: ``verify`` reports it
        q = read_queue(store, queue_id, watermarks=watermarks, definition=definition)
        for tag_id, tag_definition in tag_definitions(store, queue_id):
            t = TagState.from_definition(tag_id, tag_definition)[0]
            cursors = store.tags.get(keys.tag_key(queue_id, tag_id))
            if cursors is not None:
                t.decode_cursors(cursors)
            q.tags[tag_id] = t
            q.tag_names[t.name.lower()] = tag_id
        return q

    def queues(self) -> list[QueueState]:
        """Every queue, ordered like listings (by lower-cased name)."""
        return sorted(self._load().values(), key=lambda q: q.name.lower())

    def queue(self, name: str) -> QueueState:
        for q in self._load().values():
            if q.name.lower() == name.lower():
                return q
        raise QueueNotFound(f"queue: no queue named {name!r} in {self.data_dir}", field="queue")

    def queue_by_id(self, queue_id: int) -> QueueState | None:
        return self._load().get(queue_id)

    @staticmethod
    def tag(q: QueueState, name: str) -> TagState:
        t = q.tag_named(name)
        if t is None:
            raise TagNotFound(f"tag: queue {q.name!r} has no tag {name!r}", field="tag")
        return t

    def leases(self, q: QueueState, t: TagState) -> Iterator[tuple[int, Lease]]:
        """``(seq, lease)`` of every lease of the tag, by seq (``leases`` rows and the
        entries of its batch rows)."""
        return self._reading(lease_rows(self.store, q.id, t.id, q.gone_seq))

    @_reads
    def load_leases(self, q: QueueState, t: TagState) -> None:
        """Fill ``t.leases`` (and ``t.locked``, the topic heads) as the engine does at open."""
        t.leases = {}
        t.locked, t.heads = {}, {}
        for seq, lease in self.leases(q, t):
            if lease.state == ENDED_DELETED:
                continue  # on disk only, for peek (engine/state.py)
            t.leases[seq] = lease
            if lease.state == LEASED:
                topic_id = headed_topic(self.store, q, t, seq, lease)
                if topic_id:
                    t.lock(topic_id, seq)

    # -- the log ------------------------------------------------------------------------------

    @_reads
    def first_seq_at(self, q: QueueState, time_ms: int) -> int:
        """The first seq produced at or after ``time_ms`` (``next_seq`` if none), as
        ``EngineCore._first_seq_at``: the sparse time index and the records between its
        entries."""
        return timeindex.first_seq_at(self.store, q, time_ms)

    def retained_from(self, q: QueueState, now: int) -> int:
        """The first seq the engine still holds at ``now``: ``gone_seq`` raised by retention
        (what ``_advance`` would do at the next operation)."""
        horizon = now - q.attributes["retention"] * 1000
        return max(q.gone_seq, q.expired_seq, q.purge_seq, self.first_seq_at(q, horizon))

    def segment_of(self, q: QueueState, seq: int) -> Segment | None:
        for segment in q.segments:
            if segment.first_seq <= seq <= segment.last_seq:
                return segment
        return None

    @_reads
    def segment_exists(self, queue_id: int, first_seq: int) -> bool:
        return self.store.segments.get(keys.segment_key(queue_id, first_seq)) is not None

    def lane_rows(self, q: QueueState, lane: int, first_seq: int,
                  end_seq: int) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of one lane's log rows with ``first_seq <= seq < end_seq``."""
        return self._reading(Store.items(self.store.log, keys.log_key(q.id, lane, first_seq),
                                         keys.log_key(q.id, lane, end_seq)))

    def lane_chunks(self, queue_id: int, lane: int, first_seq: int,
                    end_seq: int) -> Iterator[tuple[bytes, bytes]]:
        """``lane_rows`` read ``ROWS_PER_READ`` seqs at a time by ``collect_lane``."""
        for low in range(first_seq, end_seq, ROWS_PER_READ):
            yield from self.collect_lane(queue_id, lane, low, min(low + ROWS_PER_READ, end_seq))

    @_reads
    def collect_lane(self, queue_id: int, lane: int, first_seq: int,
                     end_seq: int) -> list[tuple[bytes, bytes]]:
        """``lane_rows`` as a list, built by rocksdict's own iterator (measured 0.64 µs/row
        against 1.0 for ``Store.items``: one call per row instead of four). The rule of
        ``Store``'s helpers holds: the bounds' ``ReadOptions`` stay referenced until the
        iterator is exhausted (rocksdict does not keep them alive)."""
        lower = keys.log_key(queue_id, lane, first_seq)
        options = _scan_options(lower, keys.log_key(queue_id, lane, end_seq))
        rows = list(self.store.log.items(from_key=lower, read_opt=options))
        self._check_read_through(options, rows[-1][0] + b"\0" if rows else lower)
        del options  # only now
        return rows

    def _check_read_through(self, options: ReadOptions, after: bytes) -> None:
        """Raise unless a bulk read of the log with ``options`` ended at its upper bound.
        rocksdict's ``items`` ends silently where RocksDB fails a read (the iterator turns
        invalid): a table or blob file that the writer beside deleted after this snapshot
        opened (compacted away, or its rows dropped) cannot be read, and the rows from it on
        would be missing without an error. One seek past the last row read tells."""
        it = self.store.log.iter(options)
        it.seek(after)
        try:
            it.status()
            complete = not it.valid()
        except Exception as exc:  # rocksdict raises a bare Exception with RocksDB's status
            self.raise_read_error(exc)
        if not complete:
            raise SnapshotError(f"{self.data_dir}: the log read ended before its bound; "
                                "refresh the view or open a new one")

    @_reads
    def collect_lane_values(self, queue_id: int, lane: int, first_seq: int,
                            end_seq: int) -> list[bytes]:
        """The values of ``collect_lane`` without their keys (rocksdict's ``values``: 0.45
        µs/row against 0.75 for ``items``), for a caller that knows the seqs otherwise."""
        lower = keys.log_key(queue_id, lane, first_seq)
        options = _scan_options(lower, keys.log_key(queue_id, lane, end_seq))
        values = list(self.store.log.values(from_key=lower, read_opt=options))
        del options  # only now
        return values

    def message_rows(self, q: QueueState, first_seq: int,
                     end_seq: int) -> Iterator[tuple[bytes, bytes]]:
        """``(log key, log value)`` of the rows with ``first_seq <= seq < end_seq`` in seq
        (production) order, read ``ROWS_PER_READ`` seqs at a time, lanes merged by seq."""
        log_seq = keys.log_seq
        for low in range(first_seq, end_seq, ROWS_PER_READ):
            high = min(low + ROWS_PER_READ, end_seq)
            lanes = [lane for lane in q.lanes_used if low <= q.lane_tail[lane]]
            rows: list[tuple[bytes, bytes]] = []
            for lane in lanes:
                rows.extend(self.collect_lane(q.id, lane, low, high))
            if len(lanes) > 1:
                rows.sort(key=lambda row: log_seq(row[0]))
            yield from rows

    def messages(self, q: QueueState, first_seq: int,
                 end_seq: int) -> Iterator[tuple[int, int, bytes]]:
        """``(seq, lane, log value)`` of ``message_rows``."""
        decode = keys.log_key_decode
        for key, value in self.message_rows(q, first_seq, end_seq):
            _, lane, seq = decode(key)
            yield seq, lane, value

    @_reads
    def topic_name(self, q: QueueState, topic_id: int) -> str | None:
        """The topic name of ``topic_id`` (a walk of the queue's topic names on a miss)."""
        cached = self._topic_names.get((q.id, topic_id))
        if cached is None:
            lower, upper = keys.topic_names_bounds(q.id)
            for key, value in Store.items(self.store.meta, lower, upper):
                # topic_name_key(queue, topic) = the bounds' lower key + the name
                self._topic_names[(q.id, keys.read_u32(value))] = key[len(lower):].decode()
            cached = self._topic_names.get((q.id, topic_id))
        return cached
