"""``Engine``: Lamina's storage engine, embedded and in-process.

    engine = Engine.open("data")            # or Engine.open(path, clock=FakeClock())
    engine.create_queue("orders")
    engine.send("orders", [b"hello", {1: "hi", 4: 1}])
    for delivery in engine.receive("orders", max=10):
        handle(delivery.message)
        engine.delete("orders", [delivery.receipt])
    engine.close()

Public methods mirror the wire operations of PROTOCOL.md §5: same names, same argument names,
typed results (``results.py``), errors as the exceptions of ``errors.py``. Batch operations
return one entry per input, ``None`` / a result or the ``LaminaError`` that refused it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .admin import AdminOps
from .clock import Clock
from .core import SEGMENT_MAX_AGE_MS, SEGMENT_MAX_BYTES, SEGMENT_MAX_MESSAGES
from .extras import ExtrasOps
from .inspection import InspectionOps
from .results import Grant
from .rewind import RewindOps


class Engine(AdminOps, InspectionOps, RewindOps, ExtrasOps):
    # AdminOps brings TagOps; every mixin shares EngineCore (core.py), which owns the
    # components: counters, deadlines, grants.
    """A Lamina data directory, open for reading and writing by one process."""

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, clock: Clock | None = None,
             fsync: bool = False, receipt_key: str | os.PathLike[str] | None = None,
             max_queues: int = 10**6, segment_max_messages: int = SEGMENT_MAX_MESSAGES,
             segment_max_bytes: int = SEGMENT_MAX_BYTES,
             segment_max_age_ms: int = SEGMENT_MAX_AGE_MS) -> Engine:
        """Open (or create) the data directory at ``path``.

        ``clock`` returns epoch milliseconds (tests pass a ``FakeClock``); ``fsync`` makes every
        commit survive power loss, not only a killed process; ``receipt_key`` is the file of
        the receipt MAC key (default ``path/receipt.key``, created on first use).
        """
        return cls(Path(path), clock=clock, fsync=fsync,
                   receipt_key=Path(receipt_key) if receipt_key is not None else None,
                   max_queues=max_queues, segment_max_messages=segment_max_messages,
                   segment_max_bytes=segment_max_bytes, segment_max_age_ms=segment_max_age_ms)

    # -- cheap read-only views (no operation frame, no stats walk) --------------------------

    @property
    def queue_count(self) -> int:
        """How many queues exist."""
        return len(self._queues)

    def queue_attributes(self, queue: str) -> dict[str, Any]:
        """A queue's attributes (``QueueNotFound`` if none), without computing stats."""
        return dict(self._queue(queue).attributes)

    def queue_depths(self) -> dict[str, int]:
        """Retained messages (``next_seq - gone_seq``) per queue name, from memory."""
        return {q.name: q.next_seq - q.gone_seq for q in self._queues.values()}

    # -- grants (grants.py) -------------------------------------------------------------------

    def grant(self, queue: str, key: str, permissions: list[str], *,
              caller: str | None = None) -> None:
        """Give ``key`` ``permissions`` on ``queue`` (a name or, for admins, a glob)."""
        with self._operation():
            self._grants.grant(queue, key, permissions, caller=caller)

    def revoke(self, queue: str, key: str, permissions: list[str] | None = None, *,
               caller: str | None = None) -> None:
        """Take ``permissions`` (default all) on ``queue`` from ``key``."""
        with self._operation():
            self._grants.revoke(queue, key, permissions, caller=caller)

    def list_grants(self, queue: str | None = None, key: str | None = None, *,
                    caller: str | None = None) -> list[Grant]:
        """Grants, ordered by key then queue pattern; a non-admin sees its own grants, or
        those on a queue where it holds ``grant``."""
        with self._operation():
            return self._grants.list_grants(queue, key, caller=caller)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
