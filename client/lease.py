"""Keeping leases alive while work runs (DESIGN.md §5, the MNS "ChangeVisibility manager").

A worker that receives messages holds each one's lease only for the visibility timeout. A
:class:`LeaseKeeper` extends the leases it holds (one ``change_visibility`` for all of them)
every third of ``lease_s``, so a slow handler never loses its message; ``complete`` deletes a
message with its current receipt. When the worker crashes, nothing extends any more and the
message comes back after at most one ``lease_s``: keep ``lease_s`` short.

    with client.lease_keeper("orders", lease_s=10) as keeper:
        deliveries = client.receive("orders", max=10, visibility_timeout=10)
        keeper.hold(deliveries)
        for delivery in deliveries:
            handle(delivery)
            keeper.complete(delivery)

``complete_all`` deletes several with one request; ``complete_and_receive`` does that with the
next receive in the same round trip (``Client.delete_and_receive``) and holds what it receives.

``process_sync`` / ``process_async`` are that loop, one round trip per batch, behind
``Client.process`` and ``AsyncClient.process``. A lease the keeper could not extend (the
message was deleted by id, purged, or the lease had already lapsed) is reported in ``lost``
and ``complete`` raises ``StaleReceipt`` for it: the message may be handled twice.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence

import trio

from lamina.engine.errors import LaminaError
from lamina.engine.results import VisibilityChanged

from .operations import Delivery

__all__ = ["AsyncLeaseClient", "AsyncLeaseKeeper", "LeaseClient", "LeaseKeeper", "process_async",
           "process_sync"]

log = logging.getLogger("lamina.client")



class LeaseClient(Protocol):
    """What a :class:`LeaseKeeper` needs of its client (the blocking ``Client`` has it)."""

    def delete(self, queue: str, receipts: Iterable[Any],
               tag: str | None = None) -> list[LaminaError | None]: ...

    def delete_and_receive(self, queue: str, receipts: Iterable[Any], tag: str | None = None,
                           max: int | None = None, wait: float | None = None,
                           visibility_timeout: float | None = None
                           ) -> tuple[list[LaminaError | None], list[Delivery]]: ...

    def change_visibility(self, queue: str, entries: Iterable[Sequence[Any]],
                          tag: str | None = None) -> list[VisibilityChanged | LaminaError]: ...


class AsyncLeaseClient(Protocol):
    """What an :class:`AsyncLeaseKeeper` needs of its client (``AsyncClient`` has it). The
    methods return awaitables of what :class:`LeaseClient`'s return; they are written once for
    both clients (``operations.py``), so they are typed ``Any`` here."""

    def delete(self, queue: str, receipts: Iterable[Any], tag: str | None = None) -> Any: ...

    def delete_and_receive(self, queue: str, receipts: Iterable[Any], tag: str | None = None,
                           max: int | None = None, wait: float | None = None,
                           visibility_timeout: float | None = None) -> Any: ...

    def change_visibility(self, queue: str, entries: Iterable[Sequence[Any]],
                          tag: str | None = None) -> Any: ...


#: Leases are extended when this fraction of ``lease_s`` has passed since the last extension.
EXTEND_FRACTION = 1 / 3


class _Leases:
    """The receipts a keeper holds, by message id; the bookkeeping both keepers share."""

    def __init__(self, lease_s: float) -> None:
        if not 1 <= lease_s <= 43200:
            raise ValueError("lease_s must be 1..43200 seconds (a visibility timeout)")
        self.lease_s = lease_s
        self.receipts: dict[str, bytes] = {}
        self.lost: set[str] = set()

    def hold(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self.receipts[delivery.id] = delivery.receipt

    def batch(self) -> tuple[list[str], list[list[Any]]]:
        ids = list(self.receipts)
        return ids, [[self.receipts[i], self.lease_s] for i in ids]

    def extended(self, ids: list[str], results: list[Any]) -> None:
        for message_id, result in zip(ids, results):
            if message_id not in self.receipts:
                continue
            if isinstance(result, LaminaError):
                log.warning("lease of %s lost: %s", message_id, result)
                del self.receipts[message_id]
                self.lost.add(message_id)
            else:
                self.receipts[message_id] = result.receipt

    def take(self, delivery: Delivery) -> bytes | None:
        return self.receipts.pop(delivery.id, None)


class LeaseKeeper:
    """Extends the leases of held deliveries from a background thread (blocking Client).

    Every method is thread-safe; receipts are used under one lock, so an extension and a
    delete never race with each other's receipts. Leaving the ``with`` block stops extending:
    messages still held come back when their leases run out.
    """

    def __init__(self, client: LeaseClient, queue: str, *, tag: str | None = None,
                 lease_s: float = 30.0) -> None:
        self.client, self.queue, self.tag = client, queue, tag
        self._leases = _Leases(lease_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> set[str]:
        """Ids of messages whose lease could not be extended."""
        return self._leases.lost

    def __enter__(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name=f"lease-keeper-{self.queue}",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def hold(self, deliveries: list[Delivery]) -> None:
        """Keep these leases alive until completed, released or forgotten."""
        with self._lock:
            self._leases.hold(deliveries)

    def receipt(self, delivery: Delivery) -> bytes | None:
        """The current receipt of a held delivery (it changes with every extension)."""
        with self._lock:
            return self._leases.receipts.get(delivery.id)

    def complete(self, delivery: Delivery) -> None:
        """Delete a held message (its work succeeded) and stop keeping it."""
        error = self.complete_all([delivery])[0]
        if error is not None:
            raise error

    def complete_all(self, deliveries: list[Delivery]) -> list[LaminaError | None]:
        """Delete messages (their work succeeded) with one request and stop keeping them;
        -> per delivery None or the error."""
        receipts = self._take_all(deliveries)
        return self.client.delete(self.queue, receipts, tag=self.tag) if receipts else []

    def complete_and_receive(self, deliveries: list[Delivery], *, max: int | None = None,
                             wait: float | None = None, visibility_timeout: float | None = None
                             ) -> tuple[list[LaminaError | None], list[Delivery]]:
        """``complete_all`` and the next receive in one round trip
        (``Client.delete_and_receive``); the messages received are held."""
        receipts = self._take_all(deliveries)
        results, received = self.client.delete_and_receive(
            self.queue, receipts, tag=self.tag, max=max, wait=wait,
            visibility_timeout=visibility_timeout)
        self.hold(received)
        return results, received

    def _take_all(self, deliveries: list[Delivery]) -> list[bytes]:
        """The current receipts of ``deliveries``, no longer extended. Under the lock: an
        extension in flight has renewed them by then, and none after it includes them."""
        with self._lock:
            return [self._leases.take(d) or d.receipt for d in deliveries]

    def release(self, delivery: Delivery, *, timeout_s: float = 0) -> None:
        """Stop keeping a message and let it come back ``timeout_s`` from now (0: at once)."""
        with self._lock:
            receipt = self._leases.take(delivery)
            if receipt is not None:
                self.client.change_visibility(self.queue, [(receipt, timeout_s)], tag=self.tag)

    def forget(self, delivery: Delivery) -> None:
        """Stop keeping a message; it comes back when its current lease runs out."""
        with self._lock:
            self._leases.take(delivery)

    def extend_now(self) -> None:
        """Extend every held lease by ``lease_s`` from now (the background thread's job)."""
        with self._lock:
            ids, entries = self._leases.batch()
            if not entries:
                return
            try:
                results = self.client.change_visibility(self.queue, entries, tag=self.tag)
            except LaminaError as exc:
                log.warning("cannot extend leases: %s", exc)
                return
            self._leases.extended(ids, results)

    def _run(self) -> None:
        while not self._stop.wait(self._leases.lease_s * EXTEND_FRACTION):
            self.extend_now()


class AsyncLeaseKeeper:
    """The trio twin of :class:`LeaseKeeper`: ``async with`` it; methods are awaited."""

    def __init__(self, client: AsyncLeaseClient, queue: str, *, tag: str | None = None,
                 lease_s: float = 30.0) -> None:
        self.client, self.queue, self.tag = client, queue, tag
        self._leases = _Leases(lease_s)
        self._lock = trio.Lock()
        self._nursery_manager: Any = None
        self._nursery: trio.Nursery | None = None

    @property
    def lost(self) -> set[str]:
        return self._leases.lost

    async def __aenter__(self) -> AsyncLeaseKeeper:
        # The extension task lives in a nursery owned by this ``async with`` block. It is
        # entered and left by hand so that an exception of the block's body propagates as
        # itself, not wrapped in an ExceptionGroup (the task never raises).
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._nursery.start_soon(self._run)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        await self._nursery_manager.__aexit__(None, None, None)

    def hold(self, deliveries: list[Delivery]) -> None:
        self._leases.hold(deliveries)

    def receipt(self, delivery: Delivery) -> bytes | None:
        return self._leases.receipts.get(delivery.id)

    async def complete(self, delivery: Delivery) -> None:
        error = (await self.complete_all([delivery]))[0]
        if error is not None:
            raise error

    async def complete_all(self, deliveries: list[Delivery]) -> list[LaminaError | None]:
        receipts = await self._take_all(deliveries)
        return await self.client.delete(self.queue, receipts, tag=self.tag) if receipts else []

    async def complete_and_receive(self, deliveries: list[Delivery], *, max: int | None = None,
                                   wait: float | None = None,
                                   visibility_timeout: float | None = None
                                   ) -> tuple[list[LaminaError | None], list[Delivery]]:
        receipts = await self._take_all(deliveries)
        results, received = await self.client.delete_and_receive(
            self.queue, receipts, tag=self.tag, max=max, wait=wait,
            visibility_timeout=visibility_timeout)
        self.hold(received)
        return results, received

    async def _take_all(self, deliveries: list[Delivery]) -> list[bytes]:
        async with self._lock:
            return [self._leases.take(d) or d.receipt for d in deliveries]

    async def release(self, delivery: Delivery, *, timeout_s: float = 0) -> None:
        async with self._lock:
            receipt = self._leases.take(delivery)
            if receipt is not None:
                await self.client.change_visibility(self.queue, [(receipt, timeout_s)],
                                                    tag=self.tag)

    def forget(self, delivery: Delivery) -> None:
        self._leases.take(delivery)

    async def extend_now(self) -> None:
        async with self._lock:
            ids, entries = self._leases.batch()
            if not entries:
                return
            try:
                results = await self.client.change_visibility(self.queue, entries, tag=self.tag)
            except LaminaError as exc:
                log.warning("cannot extend leases: %s", exc)
                return
            self._leases.extended(ids, results)

    async def _run(self) -> None:
        while True:
            await trio.sleep(self._leases.lease_s * EXTEND_FRACTION)
            try:
                await self.extend_now()
            except Exception:  # never let the keeper take its owner down
                log.exception("lease keeper failed to extend")


# --- Worker loops --------------------------------------------------------------------------------


def process_sync(client: LeaseClient, queue: str, handler: Callable[[Delivery], Any], *,
                 tag: str | None, max: int, wait: float, lease_s: float, limit: int | None,
                 stop: threading.Event | None, release_on_error: bool) -> int:
    """Receive (leasing for ``lease_s``), run ``handler`` on each message while its lease is
    kept, and delete the messages handled with the next receive (one round trip per batch;
    they stay held meanwhile). A handler that raises is logged; its message is no longer
    extended and comes back after its lease (at once with ``release_on_error``). Stops after
    ``limit`` handled messages or when ``stop`` is set (checked between receives, so it may
    take one ``wait``). -> handled and deleted messages."""
    handled = 0
    with LeaseKeeper(client, queue, tag=tag, lease_s=lease_s) as keeper:
        done: list[Delivery] = []  # handled: deleted with the next receive
        while True:
            count = _next_count(max, limit, handled + len(done))
            if count == 0 or (stop is not None and stop.is_set()):
                break
            results, deliveries = keeper.complete_and_receive(
                done, max=count, wait=wait, visibility_timeout=lease_s)
            handled += _deleted(done, results)
            done = []
            for delivery in deliveries:
                try:
                    handler(delivery)
                except Exception:
                    log.exception("handler failed on %s", delivery.id)
                    if release_on_error:
                        keeper.release(delivery)
                    else:
                        keeper.forget(delivery)
                    continue
                done.append(delivery)
        if done:
            handled += _deleted(done, keeper.complete_all(done))
    return handled


async def process_async(client: AsyncLeaseClient, queue: str,
                        handler: Callable[[Delivery], Awaitable[Any]], *, tag: str | None,
                        max: int, wait: float, lease_s: float, limit: int | None,
                        stop: trio.Event | None, release_on_error: bool) -> int:
    """The async twin of :func:`process_sync` (``handler`` is awaited)."""
    handled = 0
    async with AsyncLeaseKeeper(client, queue, tag=tag, lease_s=lease_s) as keeper:
        done: list[Delivery] = []
        while True:
            count = _next_count(max, limit, handled + len(done))
            if count == 0 or (stop is not None and stop.is_set()):
                break
            results, deliveries = await keeper.complete_and_receive(
                done, max=count, wait=wait, visibility_timeout=lease_s)
            handled += _deleted(done, results)
            done = []
            for delivery in deliveries:
                try:
                    await handler(delivery)
                except Exception:
                    log.exception("handler failed on %s", delivery.id)
                    if release_on_error:
                        await keeper.release(delivery)
                    else:
                        keeper.forget(delivery)
                    continue
                done.append(delivery)
        if done:
            handled += _deleted(done, await keeper.complete_all(done))
    return handled


def _next_count(max: int, limit: int | None, counted: int) -> int:
    """How many to receive next: ``max``, or what is left of ``limit`` (0: stop)."""
    return max if limit is None else min(max, limit - counted)


def _deleted(done: list[Delivery], results: list[LaminaError | None]) -> int:
    """How many of ``done`` were deleted; a failed delete is logged (may be handled twice)."""
    for delivery, error in zip(done, results):
        if error is not None:
            log.warning("could not delete %s after handling it: %s", delivery.id, error)
    return results.count(None)
