"""``lamina serve``: the trio TCP server of DESIGN.md §4 around one engine.

Tasks, all owned by :meth:`Server.serve`'s nursery::

    accept ──> connection (reader + writer, connection.py) ─────────────────────┐ Work
    timer ──> TICK when the engine's next deadline is due ──────────────────────┤
    metrics refresher ──> EngineJob every metrics_interval_s ───────────────────┤
                                                                                 v
    applier: drains the inbox, applies each group inside the one engine.group() it holds
             for its life (the engine never syncs by itself), then hands each answer to its
             connection (rule 6: while it idles, a reader runs that same code
             for its own Work)
    syncer (--fsync): syncs the WAL once for the groups applied meanwhile, then answers
             them (rule 7)
    wait expiry ──> ends waiting receives at their deadlines (waiters.py rule 5)
    read hub ──> one wait for the plain-TCP connections waiting for bytes, running their
                 read steps when several are busy (readhub.py)
    busy poll ──> keeps trio polling the sockets for --busy-poll-us once idle, while requests
                  keep coming (busypoll.py: waking a sleeping CPU costs more than a small
                  request)
    SQS gateway (--sqs-port, sqs/http.py) ──> HTTP connections, each with a Bridge that hands
                  its requests to the applier as a connection does (sqs/bridge.py)

The applier, its syncer and its waiters live in ``applier.py`` (rules 1-4, 6, 7); this file
keeps the server's lifetime: listening, accepting, the timers and shutdown (rule 5).

Rules:

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
   idleness at once, so nothing applied in place overtakes an item already queued. The
   requests of one read (``apply_requests_now``: a client awaiting its answers) are that group
   by themselves, applied and answered without a Work or a group's bookkeeping unless more is
   to do (due deadlines, waits ended, waiters woken by any but the first request of the read,
   or with ``--fsync`` any waiters woken): then it is a group like any other. With
   ``--fsync`` the answers of such a read are handed to the syncer as one applied group
   (rule 7). The waiters a read's first request wakes without ``--fsync`` are answered there
   and then, before it (receives.py rule 3).
7. Group commit (``--fsync``): applied groups wait for the syncer. When it runs it first lets
   the readers with requests ready apply them (SYNC_GATHER_CHECKPOINTS), then syncs the WAL
   once for all those groups and answers them in the order they were applied. The sync runs
   in the trio thread, blocking the loop for its duration: handing it to a worker thread (it
   releases the GIL) kept the loop free, but on the 2-core machine of bench/RESULTS.md the
   handoff took longer than the sync (p50 0.44 ms to start the thread, 0.14 ms to resume,
   for a 0.48 ms sync) and cost CPU, with no larger groups; measured again with the reads
   applied in place, W1 ``--fsync`` went from 56,000-58,000 msg/s to 22,700-30,300 with the
   sync in a worker thread (Python's switch interval 5 ms, 100 µs or 20 µs). A group that wrote nothing is
   answered at once only when no group waits for a sync (it might show what they wrote).
"""

from __future__ import annotations

import logging
import math
import os
import ssl
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import trio

from lamina.engine import Engine, wall_clock_ms

from .accept import Refusals, accept_connections
from .applier import TICK, EngineJob, GroupApplier
from .budget import MemoryBudget
from .busypoll import BusyPoll
from .config import ServerConfig
from .connection import Connection
from .keyring import KeyFileError, KeyRing, load_keys
from .metrics import ServerMetrics
from .ports import ConnectionLimits, Reader
from .readhub import ReadHub
from .waiters import WaitingReceives

__all__ = ["FEATURES", "EngineJob", "Server"]

log = logging.getLogger("lamina.server")

#: Greeting ``features``: what this server implements beyond plain queues.
FEATURES = ("tags", "topics", "dlq", "rewind", "peek", "grants")
#: Timer: how long to wait for the applier after a tick before looking again.
TICK_SETTLE_S = 0.05
#: Waiting receives: their timeouts are checked at least this often (waiters.py rule 5).
WAIT_EXPIRY_TICK_S = 1.0


def _package_version() -> str:
    try:
        return metadata.version("lamina")
    except metadata.PackageNotFoundError:
        return "0+unknown"


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
        self.version = _package_version()
        self.features = list(FEATURES)
        self.metrics = ServerMetrics()
        self.applier = GroupApplier(
            max_frame_bytes=config.max_frame, clock=self.clock, metrics=self.metrics,
            keys=keys or KeyRing(), auth_required=self.auth_required,
            server_info=self._server_info, on_deadline_changed=self._wake_timer,
            on_wait_added=self._wait_added)
        self.limits = ConnectionLimits(
            max_frame_bytes=config.max_frame, max_inflight=config.max_inflight,
            max_waiting=config.max_waiting, idle_timeout_s=config.idle_timeout_s,
            auth_timeout_s=config.auth_timeout_s, auth_required=self.auth_required,
            version=self.version, features=FEATURES, answers_at_once=not config.fsync)
        self.busy_poll = BusyPoll(config.busy_poll_us / 1e6)
        #: One wait for the plain-TCP connections waiting for bytes (readhub.py); made when
        #: the server starts serving.
        self.read_hub: ReadHub | None = None
        #: Memory of all connections' buffers (budget.py).
        self.budget = MemoryBudget(config.max_buffered)
        self.connections: set[Reader] = set()  # connections and SQS bridges
        # lamina_connections counts both ports, as server_info and --max-connections do.
        self.metrics.connections.set_function(lambda: len(self.connections))
        #: Connections closed unserved, logged a line at most every 10 s (both ports).
        self.refusals = Refusals()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.sqs: Any = None  # the SQS gateway (sqs/http.py) when --sqs-port is given
        self.sqs_port: int | None = None
        self.stopping = False
        self._started = time.monotonic()
        self._timer_wake = trio.Event()
        self._stop = trio.Event()
        self._pool_closed = trio.Event()
        self._pool_done = trio.Event()
        self._pool_scope: trio.CancelScope | None = None
        #: When ``_expire_waits`` looks next (trio clock), and how to make it look sooner.
        self._wait_expiry_target = -math.inf
        self._wait_expiry_wake = trio.Event()
        self._ssl_context: ssl.SSLContext | None = None

    @property
    def keys(self) -> KeyRing:
        """The API keys in force."""
        return self.applier.keys

    @property
    def waiting(self) -> WaitingReceives:
        return self.applier.waiting

    @property
    def syncs(self) -> int:
        """WAL syncs done (``--fsync``): one per group commit that wrote something."""
        return self.applier.syncs

    @property
    def groups(self) -> int:
        return self.applier.groups

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (None without TLS)."""
        return self._ssl_context

    def inbox_clone(self) -> trio.MemorySendChannel[Any]:
        """A sender into the applier's inbox, for another front end (the SQS gateway)."""
        return self.applier.inbox_clone()

    async def run_engine_job(self, fn: Callable[[Engine], Any]) -> Any:
        """Run ``fn(engine)`` on the applier, inside a group; -> its result (or raise)."""
        return await self.applier.run_job(fn)

    # -- lifetime -----------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen, serve until :meth:`request_stop`, then shut down gracefully (rule 5)."""
        config = self.config
        if self.engine is None:
            self.engine = Engine.open(config.data, fsync=config.fsync,
                                      receipt_key=config.receipt_key,
                                      max_queues=config.max_queues, memory=config.memory)
        try:
            self.applier.attach(self.engine)
            if config.tls:
                self._ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                self._ssl_context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
            listeners = await trio.open_tcp_listeners(config.port, host=config.host)
            self.port = listeners[0].socket.getsockname()[1]
            if config.metrics_port is not None:
                self.metrics_port = self.metrics.serve_http(config.metrics_host,
                                                            config.metrics_port)
            self.applier.open_inbox()
            self.read_hub = ReadHub()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.applier.run)
                pool = await nursery.start(self._connection_pool)
                async with trio.open_nursery() as services:
                    services.start_soon(self._accept, listeners, pool)
                    if config.sqs_port is not None:
                        from .sqs import SqsGateway  # loaded only when served
                        self.sqs = SqsGateway(self, config.sqs_port, config.sqs_account,
                                              config.sqs_region)
                        self.sqs_port = await services.start(self.sqs.serve, pool)
                    services.start_soon(self._timer, self.applier.inbox_clone())
                    services.start_soon(self._expire_waits)
                    services.start_soon(self.busy_poll.run)
                    services.start_soon(self.read_hub.run)
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
                    self.stopping = self.applier.stopping = True
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
            poll, hub = self.busy_poll, self.read_hub
            log.info("stopped", extra={"event": "stop", "groups": self.applier.groups,
                                        "syncs": self.applier.syncs,
                                        "busy_poll_windows": poll.windows,
                                        "busy_poll_caught": poll.caught,
                                        "busy_poll_cpu_s": round(poll.cpu_s, 6),
                                        "busy_poll_wasted_cpu_s": round(poll.wasted_cpu_s, 6),
                                        "busy_poll_window_us": round(
                                            poll.window_now_s * 1e6, 1),
                                        "read_hub_passes": hub.passes if hub else 0,
                                        "read_hub_steps": hub.steps if hub else 0})

    def request_stop(self) -> None:
        """Begin a graceful shutdown (SIGTERM / SIGINT)."""
        self._stop.set()

    async def _shut_down(self) -> None:
        for connection in list(self.connections):
            connection.stop_reading()
        self.applier.close_inbox()
        await self.applier.done.wait()  # everything read is applied, committed and answered
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
            self.applier.keys = load_keys(self.config.keys)
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
            self.refusals.refuse("shutting down" if self.stopping else "at max_connections", peer)
            await trio.aclose_forcefully(stream)
            return
        connection = None
        try:
            inbox = self.applier.inbox_clone()
        except trio.ClosedResourceError:
            await trio.aclose_forcefully(stream)
            return
        wrapped: trio.abc.Stream = stream
        try:
            if self._ssl_context is not None:
                wrapped = trio.SSLStream(stream, self._ssl_context, server_side=True)
                with trio.fail_after(self.config.auth_timeout_s):
                    await wrapped.do_handshake()
            connection = Connection(self.applier, self.limits, wrapped, peer,
                                    budget=self.budget, on_read=self.busy_poll.reader_kick()
                                    if self.busy_poll.window_s else None, hub=self.read_hub)
            self.connections.add(connection)
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
            await trio.aclose_forcefully(wrapped)

    # -- the timer -----------------------------------------------------------------------------

    async def _timer(self, ticks: trio.MemorySendChannel[Any]) -> None:
        """Sleeps until the engine's next deadline, then nudges the applier."""
        async with ticks:
            while True:
                self._timer_wake = wake = trio.Event()
                target = self.applier.deadline_ms
                if target is None:
                    await wake.wait()
                    continue
                delay_s = (target - self.clock()) / 1000
                if delay_s > 0:
                    with trio.move_on_after(delay_s + 0.0005):
                        await wake.wait()
                    continue
                if not self.applier.tick_pending:
                    self.applier.tick_pending = True
                    # When the inbox is full the applier is busy: it checks deadlines in
                    # every group.
                    self.applier.try_enqueue(ticks, TICK)
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
                    self.applier.end_wait(waiter)
                except Exception:  # a bug: it ends that connection only (rule 4)
                    log.exception("ending a wait failed", extra={"event": "connection_error",
                                                                  "peer": waiter.owner.peer})
                    self.waiting.remove(waiter)
                    waiter.owner.abort()
            deadline = self.waiting.next_deadline()
            target = now + WAIT_EXPIRY_TICK_S
            if deadline is not None and deadline < target:
                target = deadline
            self._wait_expiry_target = target
            with trio.move_on_at(target):
                await wake.wait()

    def _wake_timer(self) -> None:
        """The engine's next deadline moved (the applier says)."""
        self._timer_wake.set()

    def _wait_added(self, deadline: float) -> None:
        """A wait began: look at its deadline in time."""
        if deadline < self._wait_expiry_target:
            self._wait_expiry_wake.set()

    # -- server_info and metrics ---------------------------------------------------------------

    def _server_info(self) -> dict[str, Any]:
        return {"version": self.version, "uptime": round(time.monotonic() - self._started, 3),
                "queues": self.engine.queue_count, "connections": len(self.connections),
                "data_bytes": _directory_bytes(Path(self.engine.path))}

    async def _refresh_metrics(self) -> None:
        while True:
            await trio.sleep(self.config.metrics_interval_s)
            self.metrics.waiting.set(len(self.waiting))
            await self.applier.run_job(self.metrics.refresh_queues)


def _directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # compaction removed it meanwhile
    return total
