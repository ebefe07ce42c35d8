"""Getting past a failed write without a restart: a full disk, no file descriptors left.

Once RocksDB fails a write (its WAL append, or creating a new WAL file), it keeps that
background error and refuses every later write until the database is reopened (rocksdict
does not expose ``DB::Resume``). So:

1. The failed batch is dropped. Memory was changed ahead of it (operations change memory,
   then write), so what the batch would have changed is rebuilt from the store, which never
   saw it: the queues its keys name, and the caches of rows shared by all queues (grants,
   topic ids, daily counters, id counters). Nothing else can differ, so nothing else is
   reloaded. The store is marked broken.
2. Before a later operation (at most every ``REOPEN_INTERVAL_S``), once the data directory's
   file system has room for what a reopen writes (the WAL it replays, plus a margin), the
   store is closed and opened again; the queues touched by failed batches are rebuilt once
   more from the reopened store. Until then each write fails at once with the same error
   (``Unavailable``, nothing changed) and reads are answered.
3. If a reopen fails (the room was not enough, or descriptors are still short), the store
   stays closed and every operation answers ``Unavailable`` until a later attempt opens it.
4. A read that RocksDB fails (a table or blob file missing or damaged) fails its operation
   with ``Unavailable`` once memory is rebuilt from the store, as after a bug (core.py rule
   2): the operation may have changed memory ahead of its writes, and none of them was
   written. Should the rebuild fail too (it reads the same file), memory is not to be
   trusted: every operation answers ``Unavailable`` while a new rebuild (tried before an
   operation, at most every ``REOPEN_INTERVAL_S``) fails. The store stays open: RocksDB
   reads a file again from its path (one put back, say), and closing it would wait for
   the iterators the failed operation left behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import time
from typing import TYPE_CHECKING, Any, Iterable

import cbor2

from . import keys
from .errors import Unavailable
from .store import Store, read_failure

if TYPE_CHECKING:
    from pathlib import Path

    from .counters import Counters
    from .grants import Grants
    from .topics import Topics
    from .state import QueueState
    from .storememory import MemoryBounds

log = logging.getLogger("lamina.engine")

#: Least time between two attempts to reopen a store whose writes failed.
REOPEN_INTERVAL_S = 0.5
#: Free bytes a reopen needs besides replaying the WAL (a manifest, an options file).
REOPEN_MARGIN_BYTES = 1 << 20

_U32 = struct.Struct(">I")
#: Meta rows keyed ``prefix | queue id | ...`` (keys.py): watermarks, definitions of queues
#: and tags, topic names, parked-topic markers, daily counters.
_QUEUE_META_PREFIXES = frozenset(b"WQTPKD")


def queues_named_by(written: Iterable[bytes]) -> set[int]:
    """Every queue id a written key may belong to. Keys of the data families start with the
    queue id, queue rows of ``meta`` with a letter and then the id; a key is read both ways
    (the family is not known here), which can only name more queues than needed."""
    ids: set[int] = set()
    for key in written:
        if len(key) >= 4:
            ids.add(_U32.unpack_from(key)[0])
        if len(key) >= 5 and key[0] in _QUEUE_META_PREFIXES:
            ids.add(_U32.unpack_from(key, 1)[0])
    return ids


class StoreRecovery:
    """The part of ``EngineCore`` that survives failed writes (module docstring)."""

    if TYPE_CHECKING:
        path: Path
        memory: MemoryBounds
        _store: Store
        _queues: dict[int, QueueState]
        _queue_names: dict[str, int]
        _counters: Counters
        _grants: Grants
        _topics: Topics
        _next_queue_id: int
        _next_tag_id: int

        def _load_queue(self, queue_id: int, definition: dict[str, Any]) -> QueueState: ...

        def _recover(self) -> None: ...

    def _init_recovery(self) -> None:
        self._broken: str | None = None  # the error of the failed write, while not recovered
        self._store_open = True
        self._failed_queues: set[int] = set()
        self._next_reopen_s = 0.0
        self._unloaded: str | None = None  # rule 4: why the last rebuild failed
        #: Operations failed by the store since the engine opened, by kind (rules 1 and 4).
        self._storage_failures = {"write": 0, "read": 0}

    def _write_failed(self, exc: Exception) -> None:
        """Rule 1: drop the pending batch and rebuild what it would have changed."""
        store = self._store
        touched = queues_named_by(store.written)
        store.discard()
        self._storage_failures["write"] += 1
        self._broken = str(exc) or type(exc).__name__
        self._failed_queues |= touched
        log.error("storage write failed: %s", self._broken,
                  extra={"event": "write_failed", "queues": len(touched)})
        self._reload(touched)

    def _read_failed(self) -> None:
        """Rule 4: rebuild memory from the store; should that fail, refuse every operation
        until a rebuild succeeds."""
        self._storage_failures["read"] += 1
        self._rebuild()
        if self._unloaded is not None:
            log.error("rebuilding state from the store failed, every operation answers "
                      "Unavailable until it succeeds: %s", self._unloaded,
                      extra={"event": "reload_failed"})

    def _rebuild(self) -> None:
        """Rule 4: rebuild all of memory from the store (``_unloaded`` None once done)."""
        if self._broken == self._unloaded:
            self._broken = None  # not a failed write's: it goes with a rebuild
        try:
            self._recover()
        except Exception as exc:
            failure = read_failure(exc)
            self._unloaded = (failure.describe() if failure is not None
                              else str(exc) or type(exc).__name__)
            if self._broken is None:
                self._broken = self._unloaded  # the frame calls ``_ensure_store`` first
            return
        if self._unloaded is not None:
            self._unloaded = None
            log.warning("state rebuilt from the store", extra={"event": "store_reloaded"})

    def _reload(self, queue_ids: Iterable[int]) -> None:
        """Rebuild the given queues (and the caches of shared rows) from the store."""
        self._counters.reset(keep_unsaved=True)  # the queues read again count theirs again
        self._grants.reset()
        self._topics.reset()
        meta = self._store.meta
        ids = meta.get(keys.META_IDS)
        self._next_queue_id, self._next_tag_id = (
            (keys.read_u32(ids), keys.read_u32(ids, 4)) if ids else (1, 1))
        for queue_id in queue_ids:
            old = self._queues.pop(queue_id, None)
            if old is not None and self._queue_names.get(old.name.lower()) == queue_id:
                del self._queue_names[old.name.lower()]
            definition = meta.get(keys.queue_def_key(queue_id))
            if definition is not None:
                self._load_queue(queue_id, cbor2.loads(definition))

    def _ensure_store(self) -> None:
        """Rules 2 to 4, before an operation while the store is broken."""
        now_s = time.monotonic()
        if self._unloaded is not None:
            if now_s >= self._next_reopen_s:
                self._next_reopen_s = now_s + REOPEN_INTERVAL_S
                self._rebuild()
            if self._unloaded is not None:
                raise Unavailable(f"storage unavailable, nothing changed: {self._unloaded}")
            if self._broken is None:
                return
        if now_s >= self._next_reopen_s and (not self._store_open or self._room_to_reopen()):
            self._next_reopen_s = now_s + REOPEN_INTERVAL_S
            self._reopen()
        if not self._store_open:
            raise Unavailable(f"storage unavailable, nothing changed: {self._broken}")

    def _room_to_reopen(self) -> bool:
        """Whether the file system has room for a reopen: replaying the WAL into tables."""
        db = self.path / "db"
        try:
            wal_bytes = sum(entry.stat().st_size for entry in os.scandir(db)
                            if entry.name.endswith(".log"))
            return shutil.disk_usage(db).free >= wal_bytes + REOPEN_MARGIN_BYTES
        except OSError:  # e.g. no file descriptor to list the directory with
            return False

    def _reopen(self) -> None:
        if self._store_open:
            self._store_open = False
            try:
                self._store.close()
            except Exception as exc:  # it reports the background error, and closes
                log.info("closing the failed store: %s", exc, extra={"event": "store_closed"})
        try:
            self._store = Store(self.path / "db", memory=self.memory)
        except Exception as exc:
            self._broken = str(exc) or type(exc).__name__
            log.error("reopening the store failed: %s", exc,
                      extra={"event": "reopen_failed"})
            return
        self._store_open = True
        self._reload(self._failed_queues)
        self._failed_queues.clear()
        self._broken = None
        log.warning("storage writable again after reopening the store",
                    extra={"event": "store_recovered"})

    def _close_store(self) -> None:
        """Close the store whatever state it is in (a failed store reports its error)."""
        if not self._store_open:
            return
        self._store_open = False
        try:
            self._store.close()
        except Exception as exc:
            log.warning("closing the store: %s", exc, extra={"event": "store_closed"})
