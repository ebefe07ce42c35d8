"""The operation frame: what every engine operation runs inside (``EngineCore._operation``).

On entry: the engine clock's ``now``, and the dead-letter moves and topic-head lapses due
by then (each written as its own batch, so the operation reads them). On exit: what the
operation changed written as one atomic batch (and the WAL synced with ``fsync`` outside a
group); a failed write becomes ``Unavailable`` (nothing changed), a bug ``InternalError``
once memory is rebuilt from the store (rules 1 and 2 of core.py). A read that RocksDB fails (a
table or blob file missing or damaged) becomes ``Unavailable`` as well, once memory is rebuilt
from the store: what the operation changed in memory before the read failed is undone, and
nothing of it was written.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from .clock import EngineClock
from .deadlines import Deadlines
from .errors import InternalError, LaminaError, Unavailable
from .store import read_failure

log = logging.getLogger("lamina.engine")


class WriteFailed(Exception):
    """A batch could not be written; nothing of it took effect."""


class FrameContext(Protocol):
    """What the frame reads and calls of the engine core (core.py)."""

    fsync: bool
    _closed: bool
    _broken: str | None
    _clock: EngineClock
    _now: int
    _deadlines: Deadlines
    _group_depth: int
    _unsynced: bool

    def _ensure_store(self) -> None: ...

    def _apply_due_expiries(self, now: int) -> None: ...

    def _apply_due_lapses(self, now: int) -> None: ...

    def _write_pending(self) -> None: ...

    def sync_wal(self) -> None: ...

    def _recover(self) -> None: ...

    def _read_failed(self) -> None: ...


class OperationFrame:
    """The operation frame (``EngineCore._operation``) as a plain context manager: a
    generator-based one cost a generator, its frame and two extra calls per operation."""

    __slots__ = ("_core",)

    def __init__(self, core: FrameContext) -> None:
        self._core = core

    def __enter__(self) -> int:
        core = self._core
        if core._closed:
            raise Unavailable("the engine is closed")
        if core._broken is not None:  # a write (or a rebuild) failed: recovery.py first
            core._ensure_store()
        now = core._now = core._clock.now()
        deadlines = core._deadlines
        if ((deadlines.expiry_heap and deadlines.expiry_heap[0][0] <= now)
                or (deadlines.lapse_heap and deadlines.lapse_heap[0][0] <= now)):
            try:
                if deadlines.expiry_heap and deadlines.expiry_heap[0][0] <= now:
                    # Dead-letter moves due anywhere come first, written as their own batch
                    # so that the operation reads them.
                    core._apply_due_expiries(now)
                    core._write_pending()
                if deadlines.lapse_heap and deadlines.lapse_heap[0][0] <= now:
                    core._apply_due_lapses(now)  # likewise: topic heads whose lease ran out
                    core._write_pending()
            except Exception as exc:
                self._raise_failure(exc)
        return now

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: Any) -> None:
        core = self._core
        if exc_type is None:
            try:
                core._write_pending()
            except Exception as error:
                self._raise_failure(error)
            if core.fsync and core._group_depth == 0 and core._unsynced:
                core.sync_wal()
            return
        if not issubclass(exc_type, Exception):
            return  # KeyboardInterrupt and the like pass through untouched
        if issubclass(exc_type, LaminaError):
            # Refused before changing anything (rule 1); what is pending was brought to
            # ``now`` by the frame (expiries) and stands on its own.
            try:
                core._write_pending()
            except Exception as error:
                self._raise_failure(error)
            return
        assert exc is not None
        self._raise_failure(exc)

    def _raise_failure(self, exc: BaseException) -> None:
        """Raise what an operation that failed with ``exc`` raises: ``Unavailable`` for a
        failed write (nothing changed), a ``LaminaError`` as it is, ``Unavailable`` for a
        failed read once memory is rebuilt from the store, anything else (a bug)
        ``InternalError`` once memory is rebuilt from the store (rule 2)."""
        if isinstance(exc, WriteFailed):
            raise Unavailable(f"storage write failed, nothing changed: {exc}") from None
        if isinstance(exc, LaminaError):
            raise exc
        failure = read_failure(exc)
        if failure is not None:
            log.error("storage read failed, nothing changed: %s; check the data directory "
                      "(`lamina inspect DATA_DIR verify` names a file it cannot read)",
                      failure.describe(), extra={"event": "read_failed", "file": failure.file})
            self._core._read_failed()
            raise Unavailable(f"storage read failed, nothing changed: {failure.describe()}"
                              ) from None
        log.error("internal error; rebuilding state from the store", exc_info=exc,
                  extra={"event": "internal_error"})
        self._core._recover()
        raise InternalError(f"{type(exc).__name__}: {exc}") from exc
