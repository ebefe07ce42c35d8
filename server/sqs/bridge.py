"""The gateway's way into the server: the same request path as a binary-protocol connection.

A :class:`Bridge` stands in for a ``Connection`` (one per HTTP connection): a gateway request
becomes a ``Work`` of one ``Request`` handed to the server exactly as a reader hands the
requests it decoded (applied in place while the applier idles, else through the inbox), so it
is applied inside a group commit, answered only once durable (``--fsync``), checked against
the key's grants (``Applier.caller_of`` reads ``key_id``), and a receive with a wait becomes a
real waiter the applier serves when a message arrives. The answer comes back through
``encode_answer`` / ``send_frames`` as it would for a connection, here handed to the waiting
HTTP request instead of being written to a socket.

Operations the binary protocol has no op for (queue extras, deduplicated sends, a queue's
creation with its extras) run as ``EngineJob`` s on the same applier: same group commit, same
durability, the caller passed explicitly.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any, Callable

import trio

from lamina.engine.errors import LaminaError, Unavailable

from lamina.wire.protocol import Request

from ..applier import EngineJob
from ..bugs import internal_error
from ..dispatch import Answer
from ..ports import Applier, Work
from ..waiters import Waiter
from .errors import SqsError

if TYPE_CHECKING:
    from lamina.engine import Engine

__all__ = ["Bridge"]


class _Pending:
    __slots__ = ("done", "answer")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Answer | None = None


class Bridge:
    """One HTTP connection's stand-in for a binary ``Connection`` on the server's path."""

    def __init__(self, applier: Applier, inbox: trio.MemorySendChannel[Any], peer: str) -> None:
        """``inbox``: this bridge's own sender into the applier's inbox (closed with it)."""
        self.applier = applier
        self.peer = peer
        #: The key that signed the current request (None: unsigned); ``caller_of`` reads it.
        self.key_id: str | None = None
        self.waiters: set[Waiter] = set()
        self.reading_done = False
        self.dead = False
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._inbox = inbox
        self._inbox_closed = False
        self._calls = 0  # calls in flight: the inbox stays open for them at shutdown
        #: Cancelled by ``stop_reading`` while the HTTP connection waits for a request.
        self.idle_scope: trio.CancelScope | None = None
        #: The connection's TCP socket (under TLS too), watched for the client hanging up
        #: while a receive may wait (http.py); None: not watched.
        self.socket: trio.socket.SocketType | None = None
        #: Called once when the current request's receive begins to wait (http.py gives its
        #: answer's memory budget back then); None: nothing to call.
        self.on_wait: Callable[[], None] | None = None

    def close(self) -> None:
        self.dead = True
        for waiter in list(self.waiters):
            self.applier.drop_wait(waiter)
        self.waiters.clear()
        self._close_inbox()

    def _close_inbox(self) -> None:
        """The applier ends once every sender into its inbox is closed (shutdown)."""
        if not self._inbox_closed:
            self._inbox_closed = True
            self._inbox.close()

    # -- what the server calls, as on a Connection ---------------------------------------------

    def encode_answer(self, request_id: int, answer: Answer) -> tuple[int, Answer]:
        return request_id, answer

    def send_frames(self, frames: list[tuple[int, Answer]]) -> None:
        for request_id, answer in frames:
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending.answer = answer
                pending.done.set()

    def answer(self, request_id: int, answer: Answer) -> None:
        self.send_frames([(request_id, answer)])

    def start_wait(self, waiter: Waiter) -> bool:
        if self.reading_done or self.dead:
            return False
        self.waiters.add(waiter)
        on_wait = self.on_wait
        if on_wait is not None:
            self.on_wait = None
            on_wait()
        return True

    def forget_wait(self, waiter: Waiter) -> None:
        """The wait is answered or gone (waiters rule 3)."""
        self.waiters.discard(waiter)

    def stop_reading(self) -> None:
        """Server shutdown: waits end now, no further request is read."""
        self.reading_done = True
        for waiter in list(self.waiters):
            self.applier.end_wait(waiter)
        if self.idle_scope is not None:
            self.idle_scope.cancel()
        if self._calls == 0:
            self._close_inbox()

    def abort(self) -> None:
        self.stop_reading()

    # -- what the gateway calls ----------------------------------------------------------------

    def _enter(self) -> None:
        if self._inbox_closed:
            raise Unavailable("the server is shutting down")
        self._calls += 1

    def _leave(self) -> None:
        self._calls -= 1
        if self.reading_done and self._calls == 0:
            self._close_inbox()

    async def call(self, op: str, args: dict[str, Any], nbytes: int = 0) -> Any:
        """Apply one binary-protocol op; -> its answer (a LaminaError is raised)."""
        request_id = next(self._ids)
        pending = _Pending()
        request = Request(request_id, op, args)
        started = time.perf_counter()
        applier = self.applier
        self._enter()
        try:
            self._pending[request_id] = pending
            # Applied in place and answered already (no fsync to wait for): no wait, no
            # checkpoint. Otherwise, once handed over, a request is applied and answered.
            applied = applier.apply_requests_now(self, [request], started)
            if pending.answer is None:
                with trio.CancelScope(shield=True):
                    if not applied:
                        work = Work(self, [request], nbytes, started)
                        if not applier.try_enqueue(self._inbox, work):
                            await applier.enqueue(self._inbox, work)
                    await pending.done.wait()
        finally:
            self._leave()
        answer = pending.answer
        if isinstance(answer, LaminaError):
            raise answer
        return answer

    async def job(self, fn: Callable[[Engine, str | None], Any]) -> Any:
        """Run ``fn(engine, caller)`` on the applier, in a group (grants: ``caller``)."""
        caller = self.applier.caller_of(self)
        job = EngineJob(lambda engine: fn(engine, caller))
        self._enter()
        try:
            with trio.CancelScope(shield=True):
                await self.applier.enqueue(self._inbox, job)
                await job.done.wait()
        finally:
            self._leave()
        if job.error is not None:
            if isinstance(job.error, (LaminaError, SqsError)):
                raise job.error
            raise internal_error("the request", job.error)
        return job.result
