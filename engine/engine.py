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

The class below lists every operation, each handing over to the part that does it. The
engine's lifetime and durability come from its base, ``EngineCore`` (``core.py``):
``close()``, ``group()`` (a group commit: the operations inside share one WAL sync),
``sync_wal()``, ``needs_sync`` (written but not yet synced), ``on_activity`` (a callback
told the queue whenever messages may have become Active outside a deadline), and the
attributes ``path`` and ``fsync``.
"""

from __future__ import annotations

import heapq
import os
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Mapping, Sequence

from .admin import MAX_LIST_LIMIT, AdminOps
from .clock import Clock
from .core import SEGMENT_MAX_AGE_MS, SEGMENT_MAX_BYTES, SEGMENT_MAX_MESSAGES, EngineCore
from .deadletter import DeadLetterOps
from .errors import LaminaError
from .extras import DEDUP_WINDOW_MS, ExtrasOps
from .inspection import InspectionOps
from .messaging import MessagingOps
from .results import (
    Delivery,
    FirstDeliveries,
    Grant,
    PeekPage,
    QueueInfo,
    QueuePage,
    Redriven,
    Rewound,
    Sent,
    SentColumns,
    TagInfo,
    VisibilityChanged,
)
from .rewind import RewindOps
from .storememory import MemoryBounds, MemoryUsage
from .tagging import TagOps


class Engine(EngineCore):
    """A Lamina data directory, open for reading and writing by one process.

    The facade over ``EngineCore`` (core.py: state, the operation frame and the components it
    owns): every public method is listed here and hands over to one operation group, an
    object that receives the core (and the groups it uses)."""

    def __init__(self, path: Path, *, clock: Clock | None, fsync: bool,
                 receipt_key: Path | None, max_queues: int, segment_max_messages: int,
                 segment_max_bytes: int, segment_max_age_ms: int,
                 memory: MemoryBounds) -> None:
        self._messaging = MessagingOps(self)
        # ``send_columns`` is ``MessagingOps.send`` itself (a server's every send: no call
        # in between).
        self.send_columns = self._messaging.send  # type: ignore[method-assign]
        self._dead_letter_ops = DeadLetterOps(self, self._messaging)
        self._tags = TagOps(self)
        self._admin = AdminOps(self, self._tags)
        self._inspection = InspectionOps(self, self._dead_letter_ops)
        self._rewind = RewindOps(self, self._dead_letter_ops)
        self._extras_ops = ExtrasOps(self)
        super().__init__(path, clock=clock, fsync=fsync, receipt_key=receipt_key,
                         max_queues=max_queues, segment_max_messages=segment_max_messages,
                         segment_max_bytes=segment_max_bytes,
                         segment_max_age_ms=segment_max_age_ms, memory=memory)

    def _load(self) -> None:
        super()._load()
        self._extras_ops.load()

    def _reload(self, queue_ids: Iterable[int]) -> None:
        super()._reload(queue_ids)
        self._extras_ops.load(tidy=False)  # a failed write's extras and keys were in memory

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, clock: Clock | None = None,
             fsync: bool = False, receipt_key: str | os.PathLike[str] | None = None,
             max_queues: int = 10**6, segment_max_messages: int = SEGMENT_MAX_MESSAGES,
             segment_max_bytes: int = SEGMENT_MAX_BYTES,
             segment_max_age_ms: int = SEGMENT_MAX_AGE_MS,
             memory: MemoryBounds = MemoryBounds()) -> Engine:
        """Open (or create) the data directory at ``path``.

        ``clock`` returns epoch milliseconds (tests pass a ``FakeClock``); ``fsync`` makes every
        commit survive power loss, not only a killed process; ``receipt_key`` is the file of
        the receipt MAC key (default ``path/receipt.key``, created on first use); ``memory``
        bounds RocksDB's write buffers and block cache (``docs/STORAGE.md``, "Memory").
        """
        return cls(Path(path), clock=clock, fsync=fsync,
                   receipt_key=Path(receipt_key) if receipt_key is not None else None,
                   max_queues=max_queues, segment_max_messages=segment_max_messages,
                   segment_max_bytes=segment_max_bytes, segment_max_age_ms=segment_max_age_ms,
                   memory=memory)

    # -- cheap read-only views (no operation frame, no stats walk) --------------------------

    @property
    def queue_count(self) -> int:
        """How many queues exist."""
        return len(self._queues)

    def queue_attributes(self, queue: str) -> dict[str, Any]:
        """A queue's attributes (``QueueNotFound`` if none), without computing stats."""
        return dict(self._queue(queue).attributes)

    @property
    def storage_failures(self) -> dict[str, int]:
        """Operations the store failed since the engine opened, by kind: ``write`` (a write
        RocksDB refused: a full disk, no file descriptors) and ``read`` (a file it could not
        read); each was answered ``Unavailable`` and changed nothing."""
        return dict(self._storage_failures)

    def queue_depths(self) -> dict[str, int]:
        """Retained messages (``next_seq - gone_seq``) per queue name, from memory."""
        return {q.name: q.next_seq - q.gone_seq for q in self._queues.values()}

    def memory_usage(self) -> MemoryUsage:
        """What RocksDB holds in memory now, and its bounds (``Engine.open``'s ``memory``)."""
        return self._store.memory_usage()

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

    # -- messaging.py ---------------------------------------------------------------------------

    def send(self, queue: str, messages: Sequence[Any], *,
             caller: str | None = None) -> list[Sent | LaminaError]:
        """Append messages; per entry a ``Sent`` or the error that refused that entry."""
        results = self._messaging.send(queue, messages, caller=caller)
        return results if type(results) is list else list(results)

    def send_columns(self, queue: str, messages: Sequence[Any], *,
                     caller: str | None = None) -> list[Sent | LaminaError] | SentColumns:
        """``send`` for a server: a batch of plain messages all accepted comes back as
        ``SentColumns`` (ids and digests, spliced into the answer), without a ``Sent`` each."""
        return self._messaging.send(queue, messages, caller=caller)

    def receive(self, queue: str, tag: str | None = None, max: int = 1,
                visibility_timeout: float | None = None, *, max_bytes: int | None = None,
                caller: str | None = None) -> list[Delivery]:
        """Lease up to ``max`` Active messages of ``tag`` (DESIGN.md §2 "Delivery order").

        ``max_bytes`` bounds the summed record sizes (a server passes its frame budget); a
        message that would pass it is not leased. Waiting is the server's business."""
        deliveries = self._messaging.receive(queue, tag, max, visibility_timeout,
                                             max_bytes=max_bytes, caller=caller)
        if deliveries.__class__ is FirstDeliveries:
            return deliveries.deliveries()
        return deliveries  # type: ignore[return-value]

    def receive_columns(self, queue: str, tag: str | None = None, max: int = 1,
                        visibility_timeout: float | None = None, *, max_bytes: int | None = None,
                        caller: str | None = None) -> Sequence[Delivery]:
        """``receive``, with first deliveries left as ``FirstDeliveries`` columns that a
        server splices into its answer without a ``Delivery`` object each (the other
        entries of a receive are a list of ``Delivery`` as ``receive`` gives)."""
        return self._messaging.receive(queue, tag, max, visibility_timeout, max_bytes=max_bytes,
                                       caller=caller)

    def delete(self, queue: str, receipts: Sequence[object], tag: str | None = None, *,
               caller: str | None = None) -> list[LaminaError | None]:
        """End messages for ``tag`` by their current receipts; per receipt None or an error."""
        return self._messaging.delete(queue, receipts, tag, caller=caller)

    def change_visibility(self, queue: str, entries: Sequence[object], tag: str | None = None,
                          *, caller: str | None = None) -> list[VisibilityChanged | LaminaError]:
        """Per ``[receipt, timeout_s]``: end the lease ``timeout`` from now with a new receipt
        (the old one goes stale); 0 ends it at once -> ``VisibilityChanged(None, now)``."""
        return self._messaging.change_visibility(queue, entries, tag, caller=caller)

    def receipt_standing(self, queue: str, receipt: object, tag: str | None = None, *,
                         caller: str | None = None) -> str:
        """Why a receipt is stale: "current", "visible" (its lease ended, the message waits),
        "released" (received again since) or "gone" (deleted or no longer in the queue)."""
        return self._messaging.receipt_standing(queue, receipt, tag, caller=caller)

    def next_deadline(self) -> int | None:
        """The earliest time (ms) at which a message may become Active without a request
        (lease expiry, delay end), or None. A server's timer task sleeps until then."""
        heap, queues = self._deadlines.wake_heap, self._queues
        while heap and heap[0][1] not in queues:  # a deleted queue's entry
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def process_deadlines(self) -> list[tuple[str, str | None]]:
        """Apply every deadline due by now; -> the (queue, tag) pairs that may have messages
        Active because of it (tag None: every tag of the queue), for waking receives."""
        return self._messaging.process_deadlines()

    # -- deadletter.py --------------------------------------------------------------------------

    def dead(self, queue: str, receipts: Sequence[object], tag: str | None = None, *,
             caller: str | None = None) -> list[LaminaError | None]:
        """Dead-letter received messages at once, by their current receipts."""
        return self._dead_letter_ops.dead(queue, receipts, tag, caller=caller)

    def redrive(self, queue: str, source: str | None = None, since: int | None = None,
                until: int | None = None, max: int = 1000, dry_run: bool = False, *,
                caller: str | None = None) -> Redriven:
        """Send dead letters of the DLQ ``queue`` back to the tag they died under (all
        chunks of ``redrive_steps`` at once)."""
        return self._dead_letter_ops.redrive(queue, source, since, until, max, dry_run,
                                             caller=caller)

    def redrive_steps(self, queue: str, source: str | None = None, since: int | None = None,
                      until: int | None = None, max: int = 1000, dry_run: bool = False, *,
                      caller: str | None = None, chunk: int | None = None
                      ) -> Generator[None, None, Redriven]:
        """``redrive`` as long work in chunks (DESIGN.md §3): each chunk is one operation that
        looks at up to ``chunk`` records of the DLQ (default ``REDRIVE_CHUNK``); the generator
        yields between chunks (other operations may run then) and returns the result. Each
        message moves atomically; the copies considered are those the DLQ held when the
        redrive began (a later dead letter waits for the next redrive), in lane then seq
        order."""
        return self._dead_letter_ops.redrive_steps(queue, source, since, until, max, dry_run,
                                                   caller=caller, chunk=chunk)

    # -- tagging.py -----------------------------------------------------------------------------

    def create_tag(self, queue: str, tag: str, start: int | str = "now",
                   filter: dict[str, Any] | None = None, *,
                   caller: str | None = None) -> TagInfo:
        """A new reader of ``queue`` seeing messages produced at or after ``start`` (ms,
        ``"oldest"`` = everything retained, ``"now"`` = exactly what is sent from now on)
        that pass ``filter``. Start and filter are fixed at creation."""
        return self._tags.create_tag(queue, tag, start, filter, caller=caller)

    def delete_tag(self, queue: str, tag: str, *, caller: str | None = None) -> None:
        """Drop a tag and its state (the ``default`` tag cannot be deleted)."""
        return self._tags.delete_tag(queue, tag, caller=caller)

    # -- admin.py -------------------------------------------------------------------------------

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None, *,
                     extras: Mapping[str, Any] | None = None,
                     caller: str | None = None) -> QueueInfo:
        """Create a queue (and its ``default`` tag). Idempotent for an equal definition.
        ``extras``: a new queue's extras (``set_queue_extras``), written in one batch with
        it, so a queue never exists without them; an existing queue's are left as they are."""
        return self._admin.create_queue(queue, attributes, caller=caller,
                                        created=self._extras_writer(extras))

    def copy_queue(self, queue: str, source: str, *, caller: str | None = None) -> QueueInfo:
        """A new queue with ``source``'s attributes (redrive included) and tags (filters kept,
        starting now): no messages, no grants."""
        return self._admin.copy_queue(queue, source, caller=caller)

    def delete_queue(self, queue: str, *, caller: str | None = None) -> None:
        """Remove a queue, its tags and all its data; policies naming it as DLQ are removed."""
        return self._admin.delete_queue(queue, caller=caller)

    def list_queues(self, prefix: str | None = None, after: str | None = None,
                    limit: int = MAX_LIST_LIMIT, *, caller: str | None = None) -> QueuePage:
        """Queue names ordered by lower-cased name; ``next`` is the ``after`` of the next page."""
        return self._admin.list_queues(prefix, after, limit, caller=caller)

    def get_queue(self, queue: str, *, caller: str | None = None) -> QueueInfo:
        """Attributes, creation time and the stats of DESIGN.md §8."""
        return self._admin.get_queue(queue, caller=caller)

    def set_queue_attributes(self, queue: str, attributes: Mapping[str, Any], *,
                             extras: Mapping[str, Any] | None = None,
                             caller: str | None = None) -> dict[str, Any]:
        """Change the given attributes (all rules hold afterwards, else nothing changes);
        ``extras``: the queue's new extras (``set_queue_extras``), in the same batch."""
        return self._admin.set_queue_attributes(queue, attributes, caller=caller,
                                                changed=self._extras_writer(extras))

    def _extras_writer(self, extras: Mapping[str, Any] | None) -> Callable[[int], object] | None:
        return None if extras is None else self._extras_ops.extras_writer(extras)

    def purge_queue(self, queue: str, *, caller: str | None = None) -> int:
        """Every message produced so far is gone for every tag; -> how many were retained."""
        return self._admin.purge_queue(queue, caller=caller)

    def stats(self, queue: str, tag: str | None = None, days: int = 7, *,
              caller: str | None = None) -> list[dict[str, Any]]:
        """Daily counters, newest first (days without activity omitted); without ``tag`` the
        queue's totals (sent counted once, the rest summed over tags)."""
        return self._admin.stats(queue, tag, days, caller=caller)

    def list_tags(self, queue: str, *, caller: str | None = None) -> list[TagInfo]:
        """Every tag of ``queue`` (ordered by lower-cased name) with its stats."""
        return self._admin.list_tags(queue, caller=caller)

    # -- inspection.py --------------------------------------------------------------------------

    def peek(self, queue: str, tag: str | None = None, max: int = 1, start: int | None = None,
             after: str | None = None, ids: Sequence[str] | None = None, *,
             max_bytes: int | None = None, caller: str | None = None) -> PeekPage:
        """Look without changing anything: what ``receive(max)`` would return now (no
        ``start``/``ids``); messages produced from ``start`` on with their states, paged by
        ``after``; or the messages with ``ids``, one entry per id."""
        return self._inspection.peek(queue, tag, max, start, after, ids, max_bytes=max_bytes,
                                     caller=caller)

    def delete_by_id(self, queue: str, ids: Sequence[str], tag: str | None = None, *,
                     caller: str | None = None) -> list[LaminaError | None]:
        """End messages for ``tag`` by id whatever their state (idempotent; a lease on one
        goes stale, a parked one is unlinked)."""
        return self._inspection.delete_by_id(queue, ids, tag, caller=caller)

    # -- rewind.py ------------------------------------------------------------------------------

    def rewind(self, queue: str, time: int, tag: str | None = None, *,
               caller: str | None = None) -> Rewound:
        """Make everything a tag (or every tag) received from ``time`` on never-delivered
        again, except what is Inflight now."""
        return self._rewind.rewind(queue, time, tag, caller=caller)

    # -- extras.py ------------------------------------------------------------------------------

    def check_queue_access(self, queue: str, *, caller: str | None = None) -> str:
        """The queue's name, if it exists and ``caller`` holds any permission on it (a
        gateway's lookup by name); else ``QueueNotFound`` / ``AccessDenied``."""
        return self._extras_ops.check_queue_access(queue, caller=caller)

    def queue_summary(self, queue: str, *, caller: str | None = None) -> QueueInfo:
        """``get_queue`` without the stats (no walk of the backlog)."""
        return self._extras_ops.queue_summary(queue, caller=caller)

    def queue_extras(self, queue: str, *, caller: str | None = None) -> dict[str, Any]:
        """The queue's extras (empty when none were set)."""
        return self._extras_ops.queue_extras(queue, caller=caller)

    def set_queue_extras(self, queue: str, extras: Mapping[str, Any], *,
                         caller: str | None = None) -> dict[str, Any]:
        """Replace the queue's extras with ``extras`` (empty: none)."""
        return self._extras_ops.set_queue_extras(queue, extras, caller=caller)

    def send_deduplicated(self, queue: str, messages: Sequence[Any], dedup_keys: Sequence[bytes],
                          *, window_ms: int = DEDUP_WINDOW_MS, caller: str | None = None
                          ) -> list[Sent | LaminaError]:
        """``send``, except that an entry whose key (``dedup_keys[i]``, 1-512 bytes) was
        accepted within ``window_ms`` answers the first acceptance's ``Sent`` instead of
        being appended again (the first one's body digest is not kept: ``md5`` is this
        entry's)."""
        return self._extras_ops.send_deduplicated(queue, messages, dedup_keys, window_ms=window_ms,
                                                  caller=caller)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
