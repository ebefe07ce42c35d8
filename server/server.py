"""``lamina serve``: the trio TCP server of DESIGN.md §4 around one engine.

Tasks, all owned by :meth:`Server.serve`'s nursery::

    accept ──> connection (reader + writer, connection.py) ─────────────────────┐ Work
    timer ──> TICK when the engine's next deadline is due ──────────────────────┤
    metrics refresher ──> EngineJob every metrics_interval_s ───────────────────┤
                                                                                 v
    applier: drains the inbox, applies everything in one engine.group(), then hands each
             answer to its connection (rule 6: while it idles, a reader runs that same code
             for its own Work)
    syncer (--fsync): syncs the WAL once for the groups applied meanwhile, then answers
             them (rule 7)
    wait expiry ──> ends waiting receives at their deadlines (waiters.py rule 5)
    busy poll ──> keeps trio polling the sockets for --busy-poll-us once idle, while requests
                  keep coming (busypoll.py: waking a sleeping CPU costs more than a small
                  request)
    SQS gateway (--sqs-port, sqs/http.py) ──> HTTP connections, each with a Bridge that hands
                  its requests to the applier as a connection does (sqs/bridge.py)

Rules (each one lives in this file):

1. The applier is the only task that calls the engine (it is not thread-safe; rule 6 is the
   applier's code run in another task while the applier idles), and everything
   it calls runs inside a group commit. So requests take effect in the order they were read
   (across connections too), and a group's answers are queued only after the group is written
   (and, with ``--fsync``, synced: rule 7): never an answer before its write is in the WAL.
   So no client learns of a message (by a receive or peek) before its send is durable either:
   such an answer waits for a sync that began after the send was written.
2. A group holds at most GROUP_MAX_REQUESTS requests or about GROUP_MAX_BYTES of them.
3. Waiting receives are served in the group where their tag became due (``waiters.py``),
   right after the request or deadline that made it due, before any later request: arrival
   order among waiters, and a waiter is never overtaken by a later receive.
4. An exception in one request answers that request ``InternalError``; one in a connection ends
   that connection. A failed group write answers its requests ``InternalError`` (the engine
   writes each operation of a group as it goes, so some may have taken effect: not
   ``Unavailable``, which promises no effect).
5. Shutdown (``request_stop``): stop accepting and reading, apply and commit everything read,
   answer it (waiting receives with ``[]``), let writers drain (``shutdown_grace_s``), close
   the engine.
6. The fast path (``apply_now``): a reader whose requests would be the applier's whole next
   group (the applier waits on an empty inbox) applies them itself, synchronously, with the
   same code as the applier (with ``--fsync`` its answers then wait for the syncer like any
   group's). Nothing else can run meanwhile, so rules 1-4 and 7 hold unchanged; it saves the
   task switches through the inbox, which cost more than a small request's engine call. Every
   send to the inbox goes through ``try_enqueue`` / ``enqueue``, which end the applier's
   idleness at once, so nothing applied in place overtakes an item already queued.
7. Group commit (``--fsync``): applied groups wait for the syncer. When it runs it first lets
   the readers with requests ready apply them (SYNC_GATHER_CHECKPOINTS), then syncs the WAL
   once for all those groups and answers them in the order they were applied. The sync runs
   in the trio thread, blocking the loop for its duration: handing it to a worker thread (it
   releases the GIL) kept the loop free, but on the 2-core machine of bench/RESULTS.md the
   handoff took longer than the sync (p50 0.44 ms to start the thread, 0.14 ms to resume,
   for a 0.48 ms sync) and cost CPU, with no larger groups. A group that wrote nothing is
   answered at once only when no group waits for a sync (it might show what they wrote).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import ssl
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import trio

from lamina.engine import Engine, wall_clock_ms
from lamina.engine.errors import (
    InternalError,
    InvalidArgument,
    LaminaError,
    QueueNotFound,
    TagNotFound,
    Unauthorized,
)

from .accept import accept_connections
from .budget import MemoryBudget
from .busypoll import BusyPoll
from .config import ServerConfig
from .connection import Connection, Work
from .dispatch import (
    Answer,
    Continuation,
    MapAnswer,
    ReceiveAnswer,
    apply_operation,
    check_request,
    receive_call,
    wait_seconds,
)
from .keyring import KeyFileError, KeyRing, load_keys
from .longwork import LongWork
from .metrics import ServerMetrics
from .protocol import Request
from .waiters import Waiter, WaitingReceives, tag_key

__all__ = ["FEATURES", "EngineJob", "Server"]

log = logging.getLogger("lamina.server")

#: Greeting ``features``: what this server implements beyond plain queues.
FEATURES = ("tags", "topics", "dlq", "rewind", "peek", "grants")
#: Rule 2: one group commit holds at most this many requests, or about this many bytes.
GROUP_MAX_REQUESTS = 1000
GROUP_MAX_BYTES = 4 * 1024 * 1024
#: Inbox items (each the requests of one read, a tick or a job): readers wait when it is full.
INBOX_CAPACITY = 1024
#: Timer: how long to wait for the applier after a tick before looking again.
TICK_SETTLE_S = 0.05
#: Waiting receives: their timeouts are checked at least this often (waiters.py rule 5).
WAIT_EXPIRY_TICK_S = 1.0
#: Rule 7: checkpoints before a WAL sync: one for trio to poll the sockets, one for the
#: readers with requests ready to apply them, so that they share the sync.
SYNC_GATHER_CHECKPOINTS = 2
_NO_GROUP = contextlib.nullcontext()


def _package_version() -> str:
    try:
        return metadata.version("lamina")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class _Tick:
    """Inbox item: a deadline is due (the applier checks deadlines in every group anyway)."""


TICK = _Tick()


@dataclass(eq=False)
class EngineJob:
    """Inbox item: run ``fn(engine)`` inside a group, on the applier (rule 1)."""

    fn: Callable[[Engine], Any]
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


class _Reply(NamedTuple):
    connection: Connection
    request_id: int
    answer: Answer
    op: str
    started: float


@dataclass(slots=True)
class _AppliedGroup:
    """A group applied and not yet answered: its replies, the jobs it ran, and the failure
    that replaces every answer (its write or its WAL sync failed)."""

    items: Sequence[Any]
    replies: list[_Reply]
    jobs: list[EngineJob]
    failure: LaminaError | None
    count: int
    started: float  # time.perf_counter() when it began to apply


class Server:
    """One Lamina server. ``await nursery.start(server.serve)`` runs it until
    :meth:`request_stop`; ``server.port`` is then the bound port (useful with port 0).

    ``engine`` (tests pass one, e.g. with a ``FakeClock``) is opened from ``config`` when
    omitted; ``keys`` overrides the keys file; either turns authentication on.
    """

    def __init__(self, config: ServerConfig, *, engine: Engine | None = None,
                 keys: KeyRing | None = None, clock: Callable[[], int] | None = None) -> None:
        self.config = config
        self.engine: Engine = engine  # type: ignore[assignment]  # opened in serve() if None
        self._owns_engine = engine is None
        self.clock = clock or wall_clock_ms
        if keys is None and config.keys is not None:
            keys = load_keys(config.keys)
        self.auth_required = keys is not None
        self.keys = keys or KeyRing()
        self.version = _package_version()
        self.features = list(FEATURES)
        self.metrics = ServerMetrics()
        self.waiting = WaitingReceives()
        self.long_work = LongWork()  # long work running in chunks (longwork.py)
        self.busy_poll = BusyPoll(config.busy_poll_us / 1e6)
        #: Memory of all connections' buffers (budget.py).
        self.budget = MemoryBudget(config.max_buffered)
        self.connections: set[Connection] = set()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.sqs: Any = None  # the SQS gateway (sqs/http.py) when --sqs-port is given
        self.sqs_port: int | None = None
        self.stopping = False
        #: WAL syncs done (``--fsync``): one per group commit that wrote something.
        self.syncs = 0
        self.groups = 0
        self._started = time.monotonic()
        self._deadline_ms: int | None = None
        self._timer_wake = trio.Event()
        self._tick_pending = False
        self._stop = trio.Event()
        self._applier_done = trio.Event()
        self._pool_closed = trio.Event()
        self._pool_done = trio.Event()
        self._pool_scope: trio.CancelScope | None = None
        self._inbox_send: trio.MemorySendChannel[Any] | None = None
        #: When ``_expire_waits`` looks next (trio clock), and how to make it look sooner.
        self._wait_expiry_target = -math.inf
        self._wait_expiry_wake = trio.Event()
        #: Rule 6: the applier waits on an empty inbox (cleared by every send to it).
        self._applier_idle = False
        #: Rule 7: groups applied and waiting for the next WAL sync, oldest first.
        self._awaiting_sync: list[_AppliedGroup] = []
        self._sync_failed = False  # the last sync failed: the next one may not be skipped
        self._sync_wake = trio.Event()
        self._applying_done = False  # the applier has applied its last group
        self._ssl_context: ssl.SSLContext | None = None

    # -- lifetime -----------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen, serve until :meth:`request_stop`, then shut down gracefully (rule 5)."""
        config = self.config
        if self.engine is None:
            self.engine = Engine.open(config.data, fsync=config.fsync,
                                      receipt_key=config.receipt_key,
                                      max_queues=config.max_queues)
        try:
            self.engine.on_activity = self.waiting.mark_due
            self._deadline_ms = self.engine.next_deadline()
            if config.tls:
                self._ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                self._ssl_context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
            listeners = await trio.open_tcp_listeners(config.port, host=config.host)
            self.port = listeners[0].socket.getsockname()[1]
            if config.metrics_port is not None:
                self.metrics_port = self.metrics.serve_http(config.metrics_host,
                                                            config.metrics_port)
            self._inbox_send, inbox = trio.open_memory_channel[Any](INBOX_CAPACITY)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._applier, inbox)
                pool = await nursery.start(self._connection_pool)
                async with trio.open_nursery() as services:
                    services.start_soon(self._accept, listeners, pool)
                    if config.sqs_port is not None:
                        from .sqs import SqsGateway  # loaded only when served
                        self.sqs = SqsGateway(self, config.sqs_port, config.sqs_account,
                                              config.sqs_region)
                        self.sqs_port = await services.start(self.sqs.serve, pool)
                    services.start_soon(self._timer, self._inbox_send.clone())
                    services.start_soon(self._expire_waits)
                    services.start_soon(self.busy_poll.run)
                    if config.metrics_port is not None:
                        services.start_soon(self._refresh_metrics)
                    log.info("listening", extra={
                        "event": "start", "host": config.host, "port": self.port,
                        "data": str(self.engine.path), "fsync": self.engine.fsync,
                        "auth": self.auth_required, "tls": config.tls,
                        "metrics_port": self.metrics_port, "sqs_port": self.sqs_port,
                        "version": self.version})
                    task_status.started(self)
                    await self._stop.wait()
                    self.stopping = True
                    log.info("shutting down", extra={"event": "stopping",
                                                      "connections": len(self.connections)})
                    services.cancel_scope.cancel()
                for listener in listeners:
                    await trio.aclose_forcefully(listener)
                await self._shut_down()
        finally:
            self.metrics.stop_http()
            if self._owns_engine:
                self.engine.close()
            log.info("stopped", extra={"event": "stop", "groups": self.groups,
                                        "syncs": self.syncs})

    def request_stop(self) -> None:
        """Begin a graceful shutdown (SIGTERM / SIGINT)."""
        self._stop.set()

    async def _shut_down(self) -> None:
        for connection in list(self.connections):
            connection.stop_reading()
        assert self._inbox_send is not None
        self._inbox_send.close()
        await self._applier_done.wait()  # everything read is applied, committed and answered
        self._pool_closed.set()
        with trio.move_on_after(self.config.shutdown_grace_s):
            await self._pool_done.wait()
        if not self._pool_done.is_set() and self._pool_scope is not None:
            log.warning("clients did not take their last answers in time; closing",
                        extra={"event": "shutdown_grace_expired"})
            self._pool_scope.cancel()

    def reload_keys(self) -> None:
        """SIGHUP: re-read the keys file; on any problem keep the keys in force."""
        if self.config.keys is None:
            log.info("SIGHUP without --keys: nothing to reload", extra={"event": "reload"})
            return
        try:
            self.keys = load_keys(self.config.keys)
        except KeyFileError as exc:
            log.error("keys file not reloaded: %s", exc, extra={"event": "reload_failed"})
            return
        log.info("keys reloaded", extra={"event": "reload", "keys": len(self.keys)})

    # -- connections -----------------------------------------------------------------------------

    async def _connection_pool(self, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        """Owns every connection task; stays open until shutdown says so."""
        with trio.CancelScope() as self._pool_scope:
            async with trio.open_nursery() as pool:
                task_status.started(pool)
                await self._pool_closed.wait()
        self._pool_done.set()

    async def _accept(self, listeners: list[trio.SocketListener], pool: trio.Nursery) -> None:
        await accept_connections(listeners, self._handle_stream, pool)

    async def _handle_stream(self, stream: trio.SocketStream) -> None:
        """One connection, isolated: nothing it raises reaches another (rule 4)."""
        try:
            peer = "%s:%s" % stream.socket.getpeername()[:2]
        except OSError:
            peer = "?"
        if self.stopping or len(self.connections) >= self.config.max_connections:
            log.warning("connection refused: %s", "shutting down" if self.stopping
                        else "at max_connections", extra={"event": "refused", "peer": peer})
            await trio.aclose_forcefully(stream)
            return
        connection = None
        try:
            assert self._inbox_send is not None
            inbox = self._inbox_send.clone()
        except trio.ClosedResourceError:
            await trio.aclose_forcefully(stream)
            return
        wrapped: trio.abc.Stream = stream
        try:
            if self._ssl_context is not None:
                wrapped = trio.SSLStream(stream, self._ssl_context, server_side=True)
                with trio.fail_after(self.config.auth_timeout_s):
                    await wrapped.do_handshake()
            connection = Connection(self, wrapped, peer)
            self.connections.add(connection)
            self.metrics.connections.inc()
            self.metrics.accepted.inc()
            if self.stopping:
                connection.stop_reading()
            await connection.run(inbox)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
            log.info("connection lost: %s", exc or type(exc).__name__,
                     extra={"event": "disconnect", "peer": peer})
        except Exception:
            log.exception("connection failed", extra={"event": "connection_error", "peer": peer})
        finally:
            inbox.close()
            if connection is not None:
                self.connections.discard(connection)
                self.metrics.connections.dec()
            await trio.aclose_forcefully(wrapped)

    def caller_of(self, connection: Connection) -> str | None:
        """The engine's ``caller`` for a request: None without auth and for admin keys."""
        if not self.auth_required:
            return None
        key = self.keys.get(connection.key_id)
        if key is None:
            raise Unauthorized("the key of this connection is no longer valid")
        return None if key.admin else key.key_id

    # -- the timer -----------------------------------------------------------------------------

    async def _timer(self, ticks: trio.MemorySendChannel[Any]) -> None:
        """Sleeps until the engine's next deadline, then nudges the applier."""
        async with ticks:
            while True:
                self._timer_wake = wake = trio.Event()
                target = self._deadline_ms
                if target is None:
                    await wake.wait()
                    continue
                delay_s = (target - self.clock()) / 1000
                if delay_s > 0:
                    with trio.move_on_after(delay_s + 0.0005):
                        await wake.wait()
                    continue
                if not self._tick_pending:
                    self._tick_pending = True
                    # When the inbox is full the applier is busy: it checks deadlines in
                    # every group.
                    self.try_enqueue(ticks, TICK)
                with trio.move_on_after(TICK_SETTLE_S):
                    await wake.wait()

    async def _expire_waits(self) -> None:
        """Ends waiting receives at their deadlines (waiters rule 5). Looks at least every
        WAIT_EXPIRY_TICK_S, so registering a longer wait never has to wake it."""
        while True:
            self._wait_expiry_wake = wake = trio.Event()
            now = trio.current_time()
            for waiter in self.waiting.expired(now):
                try:
                    waiter.connection.end_wait(waiter)
                except Exception:  # a bug: it ends that connection only (rule 4)
                    log.exception("ending a wait failed", extra={"event": "connection_error",
                                                                  "peer": waiter.connection.peer})
                    self.waiting.remove(waiter)
                    waiter.connection.abort()
            deadline = self.waiting.next_deadline()
            target = now + WAIT_EXPIRY_TICK_S
            if deadline is not None and deadline < target:
                target = deadline
            self._wait_expiry_target = target
            with trio.move_on_at(target):
                await wake.wait()

    def _set_deadline(self) -> None:
        deadline = self.engine.next_deadline()
        if deadline != self._deadline_ms:
            self._deadline_ms = deadline
            self._timer_wake.set()

    def _run_due_deadlines(self) -> None:
        target = self._deadline_ms
        if target is None or target > self.clock():
            return
        self._tick_pending = False
        try:
            due = self.engine.process_deadlines()
        except LaminaError as exc:  # e.g. the engine is closed: no request fails for it
            log.error("processing deadlines failed: %s", exc, extra={"event": "deadlines"})
            due = []
        for queue, tag in due:
            self.waiting.mark_due(queue, tag)
        self._deadline_ms = self.engine.next_deadline()

    # -- the applier ---------------------------------------------------------------------------

    async def run_engine_job(self, fn: Callable[[Engine], Any]) -> Any:
        """Run ``fn(engine)`` on the applier, inside a group; -> its result (or raise)."""
        assert self._inbox_send is not None
        job = EngineJob(fn)
        await self.enqueue(self._inbox_send, job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def inbox_clone(self) -> trio.MemorySendChannel[Any]:
        """A sender into the applier's inbox, for another front end (the SQS gateway)."""
        assert self._inbox_send is not None
        return self._inbox_send.clone()

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (None without TLS)."""
        return self._ssl_context

    def try_enqueue(self, inbox: trio.MemorySendChannel[Any], item: Any) -> bool:
        """Queue ``item`` for the applier unless the inbox is full (-> False)."""
        self._applier_idle = False  # rule 6: nothing may now overtake ``item``
        try:
            inbox.send_nowait(item)
        except trio.WouldBlock:
            return False
        return True

    async def enqueue(self, inbox: trio.MemorySendChannel[Any], item: Any) -> None:
        """Queue ``item`` for the applier, waiting while the inbox is full."""
        self._applier_idle = False  # rule 6
        await inbox.send(item)

    def apply_now(self, work: Work) -> bool:
        """Rule 6: apply ``work`` in the calling task when nothing is queued before it (its
        answers go out as the applier's would); -> False when it must go through the inbox."""
        if not self._applier_idle:
            return False
        self._commit_group((work,), len(work.requests))
        return True

    async def _applier(self, inbox: trio.MemoryReceiveChannel[Any]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                if self.engine.fsync:
                    nursery.start_soon(self._syncer)
                try:
                    await self._apply_inbox(inbox)
                finally:
                    self._applier_idle = False
                    self._applying_done = True
                    self._sync_wake.set()
        finally:
            self._applier_done.set()

    async def _apply_inbox(self, inbox: trio.MemoryReceiveChannel[Any]) -> None:
        async with inbox:
            while True:
                items: list[Any] = []
                try:
                    items.append(inbox.receive_nowait())
                except trio.WouldBlock:
                    if not self.long_work:  # else its next chunk makes this group
                        self._applier_idle = True
                        try:
                            items.append(await inbox.receive())
                        except trio.EndOfChannel:
                            return
                        finally:
                            self._applier_idle = False
                except trio.EndOfChannel:
                    if not self.long_work:  # long work runs to its end (longwork.py rule 3)
                        return
                count, nbytes = _weight(items[0]) if items else (0, 0)
                while items and count < GROUP_MAX_REQUESTS and nbytes < GROUP_MAX_BYTES:
                    try:
                        item = inbox.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    items.append(item)
                    more, size = _weight(item)
                    count, nbytes = count + more, nbytes + size
                if items:
                    self._commit_group(items, count)
                if self.long_work:  # its next chunk, a group of its own (longwork.py rule 2)
                    await trio.lowlevel.checkpoint()  # the answers above go out first
                    self._commit_group((), 0)
                if self.engine.fsync or self.long_work:
                    # Let the syncer run between groups, and readers between chunks.
                    await trio.lowlevel.checkpoint()

    def _commit_group(self, items: Sequence[Any], count: int) -> None:
        """Apply ``items`` in one group; answer it now, or once a WAL sync covers it (rules
        1, 3, 4, 7)."""
        started = time.perf_counter()
        replies, jobs, failure = self._apply_group(items)
        group = _AppliedGroup(items, replies, jobs, failure, count, started)
        if self.engine.fsync and (self._awaiting_sync or self._sync_needed()):
            self._awaiting_sync.append(group)
            self._sync_wake.set()
        else:
            self._answer_group(group)

    def _sync_needed(self) -> bool:
        """Whether anything written is not yet synced (the engine says; a failed sync leaves
        that unknown, so the next one is never skipped)."""
        return self._sync_failed or getattr(self.engine, "_unsynced", True)

    async def _syncer(self) -> None:
        """Rule 7: once groups wait for a sync, let the readers with requests ready apply
        them too, then sync the WAL once for all of them and answer them, oldest first."""
        engine = self.engine
        while True:
            while not self._awaiting_sync:
                if self._applying_done:
                    return
                self._sync_wake = trio.Event()
                await self._sync_wake.wait()
            for _ in range(SYNC_GATHER_CHECKPOINTS):
                await trio.lowlevel.checkpoint()
            groups, self._awaiting_sync = self._awaiting_sync, []
            failure: LaminaError | None = None
            if self._sync_needed():
                self._sync_failed = False
                try:
                    engine.sync_wal()  # in this thread, on purpose: rule 7
                    self.syncs += 1
                    self.metrics.wal_syncs.inc()
                except Exception as exc:
                    self._sync_failed = True
                    log.exception("WAL sync failed", extra={"event": "sync_failed"})
                    failure = InternalError(f"WAL sync failed ({exc}); this request is "
                                            "written but may not survive a power loss")
            for group in groups:
                if group.failure is None:
                    group.failure = failure
                self._answer_group(group)

    def _apply_group(self, items: Sequence[Any]
                     ) -> tuple[list[_Reply], list[EngineJob], LaminaError | None]:
        """Apply ``items`` in one engine group (rules 1, 3, 4); -> the replies to send, the
        jobs run, and the failure that replaces every answer if the group's write failed."""
        replies: list[_Reply] = []
        jobs: list[EngineJob] = []
        failure: LaminaError | None = None
        engine = self.engine
        waiting = self.waiting
        try:
            # Without --fsync a group defers nothing (engine.group only spares each operation
            # its own WAL sync), so its context manager, a tenth of a small request's cost,
            # is skipped.
            with engine.group() if engine.fsync else _NO_GROUP:
                # A chunk of long work is a group of its own (longwork.py rule 2): the groups
                # of requests around it, or a TICK, apply the deadlines.
                chunk = not items and bool(self.long_work)
                if not chunk:
                    self._run_due_deadlines()
                if waiting.any_due:
                    self._serve_waiters(replies)
                for item in items:
                    if type(item) is Work:
                        self._apply_work(item, replies)
                    elif type(item) is EngineJob:
                        jobs.append(item)
                        try:
                            item.result = item.fn(engine)
                        except Exception as exc:
                            item.error = exc
                if chunk:
                    self.long_work.step(
                        engine, lambda *reply: replies.append(_Reply(*reply)),
                        lambda work: self._apply_work(work, replies))
                else:
                    self._run_due_deadlines()
                if waiting.any_due:
                    self._serve_waiters(replies)
        except LaminaError as exc:  # the group's write failed (rule 4)
            log.error("group commit failed: %s", exc, extra={"event": "commit_failed"})
            failure = InternalError(f"storage write failed ({exc.message}); this request "
                                    "may or may not have taken effect")
        except Exception as exc:  # a bug outside any one request
            log.exception("group failed", extra={"event": "group_error"})
            failure = InternalError(f"group commit failed: {type(exc).__name__}: {exc}")
        return replies, jobs, failure

    def _answer_group(self, group: _AppliedGroup) -> None:
        """Queue every answer of a durable group; the answers of one connection go out in
        one write."""
        self.groups += 1
        now = time.perf_counter()
        observe = self.metrics.observe
        failure = group.failure
        frames: dict[Connection, list[bytes]] = {}
        replies: list[Any] = group.replies
        for index, reply in enumerate(replies):
            # Dropped once encoded: a receive's or peek's records (up to max_frame) are not
            # held beside their frame (budget.py counts the frames).
            replies[index] = None
            answer = reply.answer
            if isinstance(answer, LaminaError):
                outcome = answer.code
            elif failure is not None:
                answer, outcome = failure, failure.code
            else:
                outcome = "ok"
            connection = reply.connection
            frame = connection.encode_answer(reply.request_id, answer)
            if frame is not None:
                pending = frames.get(connection)
                if pending is None:
                    frames[connection] = [frame]
                else:
                    pending.append(frame)
            observe(reply.op, outcome, now - reply.started)
        for connection, pending in frames.items():
            connection.send_frames(pending)
        for job in group.jobs:
            job.done.set()
        self._set_deadline()
        self.metrics.observe_group(group.count, now - group.started)

    def _apply_work(self, work: Work, replies: list[_Reply]) -> None:
        waiting, long_work = self.waiting, self.long_work
        for index, request in enumerate(work.requests):
            if long_work and long_work.defer(work, index):
                return  # behind this connection's long work (longwork.py rule 1)
            self._apply_request(work, request, replies)
            if waiting.any_due:
                self._serve_waiters(replies)

    def _apply_request(self, work: Work, request: Request, replies: list[_Reply]) -> None:
        connection, op, args = work.connection, request.op, request.args
        answer: Answer | None
        try:
            operation = check_request(op, args)
            caller = self.caller_of(connection)
            queue = args.get("queue")
            if op == "receive":
                answer = self._receive(connection, request, caller, work.started)
                if answer is None:
                    return  # waiting
            elif op == "ping":
                answer = MapAnswer({"time": self.clock()})
            elif op == "server_info":
                answer = MapAnswer(self._server_info())
            elif op == "auth":
                raise InvalidArgument("key", "this connection is already authenticated"
                                      if self.auth_required
                                      else "this server does not use authentication")
            else:
                answer = apply_operation(operation, self.engine, args, caller, request.id,
                                         self.config.max_frame)
                if type(answer) is Continuation:  # long work: its next chunks come later
                    self.long_work.start(connection, request.id, op, work.started, answer)
                    if self._applier_idle and self._inbox_send is not None:
                        self.try_enqueue(self._inbox_send, TICK)  # wake it for them
                    return
                if op in ("delete_queue", "delete_tag") and not isinstance(answer, LaminaError):
                    self._end_waits_on_deleted(op, args, replies)
        except LaminaError as exc:
            answer = exc.with_traceback(None)
        except Exception as exc:  # a bug in this request alone (rule 4)
            log.exception("internal error in %s", op, extra={"event": "internal_error"})
            answer = InternalError(f"{op} failed: {type(exc).__name__}: {exc}")
        else:
            # Only a queue that passed the engine's name and permission checks is counted, so
            # a client cannot grow the tally with names of its own (metrics.count_traffic).
            if type(queue) is str and not isinstance(answer, LaminaError):
                self.metrics.count_traffic(queue)
        replies.append(_Reply(connection, request.id, answer, op, work.started))

    # -- receives and waiters ------------------------------------------------------------------

    def _receive(self, connection: Connection, request: Request, caller: str | None,
                 started: float) -> ReceiveAnswer | None:
        """One attempt; if it found nothing and may wait, register a waiter (-> None)."""
        args = request.args
        wait_s = wait_seconds(args)
        answer = receive_call(self.engine, args, caller, request.id, self.config.max_frame)
        if answer.deliveries:
            return answer
        if wait_s is None:
            wait_s = self._polling_wait(args["queue"])
        if (wait_s <= 0 or self.stopping or connection.reading_done
                or len(connection.waiters) >= self.config.max_waiting):
            return answer
        deadline = trio.current_time() + wait_s
        waiter = Waiter(connection, request.id, started, args, caller, deadline,
                        tag_key(args["queue"], args.get("tag")))
        if not connection.start_wait(waiter):
            return answer
        self.waiting.add(waiter)
        if deadline < self._wait_expiry_target:
            self._wait_expiry_wake.set()
        return None

    def _polling_wait(self, queue: str) -> float:
        """The queue's ``polling_wait`` (the default ``wait``)."""
        return self.engine.queue_attributes(queue)["polling_wait"]

    def _serve_waiters(self, replies: list[_Reply]) -> None:
        """Waiters rule 2: retry the waiters of due tags, oldest first, until one finds
        nothing (a bounded number of rounds: a retry may itself mark a tag due)."""
        max_frame = self.config.max_frame
        for _ in range(3):
            due = self.waiting.take_due()
            if not due:
                return
            for key in due:
                for waiter in self.waiting.waiting_on(key):
                    answer: Answer
                    try:
                        answer = receive_call(self.engine, dict(waiter.args), waiter.caller,
                                              waiter.request_id, max_frame)
                    except LaminaError as exc:
                        answer = exc.with_traceback(None)
                    except Exception as exc:
                        log.exception("internal error in a waiting receive")
                        answer = InternalError(f"receive failed: {type(exc).__name__}: {exc}")
                    if isinstance(answer, ReceiveAnswer) and not answer.deliveries:
                        break
                    self._claim(waiter, answer, replies)

    def _claim(self, waiter: Waiter, answer: Answer, replies: list[_Reply]) -> None:
        self.waiting.remove(waiter)
        waiter.claimed = True
        waiter.connection.waiters.discard(waiter)
        replies.append(_Reply(waiter.connection, waiter.request_id, answer, "receive",
                              waiter.op_started))

    def _end_waits_on_deleted(self, op: str, args: dict[str, Any],
                              replies: list[_Reply]) -> None:
        """DESIGN §2: delete_queue / delete_tag end their waits with QueueNotFound /
        TagNotFound."""
        queue = args["queue"]
        if op == "delete_queue":
            waiters = self.waiting.on_queue(queue)
            error: LaminaError = QueueNotFound(f"queue: {queue!r} was deleted", field="queue")
        else:
            waiters = self.waiting.on_tag(queue, args["tag"])
            error = TagNotFound(f"tag: {args['tag']!r} was deleted", field="tag")
        for waiter in waiters:
            self._claim(waiter, error, replies)

    # -- server_info and metrics ---------------------------------------------------------------

    def _server_info(self) -> dict[str, Any]:
        return {"version": self.version, "uptime": round(time.monotonic() - self._started, 3),
                "queues": self.engine.queue_count, "connections": len(self.connections),
                "data_bytes": _directory_bytes(Path(self.engine.path))}

    async def _refresh_metrics(self) -> None:
        while True:
            await trio.sleep(self.config.metrics_interval_s)
            self.metrics.waiting.set(len(self.waiting))
            await self.run_engine_job(self.metrics.refresh_queues)


def _weight(item: Any) -> tuple[int, int]:
    if type(item) is Work:
        return len(item.requests), item.nbytes
    return 1, 0


def _directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # compaction removed it meanwhile
    return total
