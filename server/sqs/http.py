"""The SQS endpoint: HTTP/1.1 (httptools' parser, on trio; TLS with the server's certificate
when it has one) in the server process, turned on by ``lamina serve --sqs-port PORT``.

Each HTTP connection gets a :class:`~.bridge.Bridge` (it counts as one of the server's
connections, and ends like one at shutdown); each request is read whole (headers at most
``MAX_HEADER_BYTES``, body at most ``MAX_BODY_BYTES``: SQS's 1 MiB payload in its most
verbose encoding), its signature checked when the server has keys, decoded by its protocol
(AWS JSON 1.0 when it carries ``X-Amz-Target``, else Query), run, and answered in that
protocol's shape. Requests of one connection run one at a time, in order (HTTP/1.1): the
next is read once the answer before it is written. Bodies and answers count against the
server's memory budget as a binary connection's frames do (budget.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import uuid
import ssl
from typing import Any, Awaitable, Protocol

import trio

from lamina.engine.errors import LaminaError

from . import jsonproto, queryproto
from .actions import ACTIONS
from ..accept import Refusals, accept_connections
from ..budget import MAX_ANSWERED_MESSAGE_BYTES, SMALL_BYTES, MemoryBudget
from ..busypoll import BusyPoll
from ..config import ServerConfig
from ..keyring import KeyRing
from ..metrics import ServerMetrics
from ..ports import Applier, Reader
from .bridge import Bridge
from .context import Context, GatewayState
from .errors import SqsError, from_lamina
from .http1 import CONTINUE, HttpError, HttpRequest, RequestParser, render_response
from .queues import Naming
from .sigv4 import verify


__all__ = ["SqsGateway", "MAX_BODY_BYTES", "MAX_HEADER_BYTES"]

log = logging.getLogger("lamina.server")

MAX_HEADER_BYTES = 16 * 1024
#: A 1 MiB batch as JSON with every character escaped (``\\u00XX``) stays under this.
MAX_BODY_BYTES = 8 * 1024 * 1024
RECEIVE_CHUNK_BYTES = 64 * 1024
#: A request must arrive whole within this long of its first bytes (a trickling client
#: does not hold a connection for idle timeout after idle timeout).
REQUEST_READ_S = 60.0

Response = tuple[int, list[tuple[str, str]], bytes]


class Host(Protocol):
    """What the gateway needs of the server it runs in (server.py's ``Server``)."""

    config: ServerConfig
    stopping: bool
    auth_required: bool
    busy_poll: BusyPoll
    #: Every open connection and bridge (counted against ``max_connections``).
    connections: set[Reader]
    #: Memory of all connections' buffers, request bodies and answers here included
    #: (budget.py).
    budget: MemoryBudget
    #: Connections closed unserved, logged now and then (accept.py).
    refusals: Refusals
    #: /metrics: the gateway's connections and requests count there too.
    metrics: ServerMetrics

    @property
    def applier(self) -> Applier: ...

    @property
    def keys(self) -> KeyRing: ...

    @property
    def ssl_context(self) -> ssl.SSLContext | None: ...

    def inbox_clone(self) -> trio.MemorySendChannel[Any]: ...


class SqsGateway:
    """The SQS endpoint of one server."""

    def __init__(self, server: Host, port: int, account: str, region: str) -> None:
        self.server = server
        self.requested_port = port
        self.port: int | None = None
        config = server.config
        self.scheme = "https" if config.tls else "http"
        self.state = GatewayState(Naming(account, region, ""))
        # Request ids shaped like SQS's (a UUID): random per server, then a counter.
        self._request_id_prefix = str(uuid.uuid4())[:24]
        self._request_numbers = itertools.count()
        self._host = config.host

    async def serve(self, pool: trio.Nursery,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen; handlers run in ``pool`` (the server's connection pool)."""
        listeners = await trio.open_tcp_listeners(self.requested_port, host=self._host)
        self.port = listeners[0].socket.getsockname()[1]
        host = self._host if ":" not in self._host else f"[{self._host}]"
        self.state.naming = Naming(self.state.naming.account, self.state.naming.region,
                                   f"{self.scheme}://{host}:{self.port}")
        task_status.started(self.port)
        try:
            await accept_connections(listeners, self._handle_stream, pool)
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    async def _handle_stream(self, stream: trio.SocketStream) -> None:
        server = self.server
        try:
            peer = "%s:%s" % stream.socket.getpeername()[:2]
        except OSError:
            peer = "?"
        if server.stopping or len(server.connections) >= server.config.max_connections:
            server.refusals.refuse("shutting down" if server.stopping else "at max_connections",
                                   peer)
            await trio.aclose_forcefully(stream)
            return
        wrapped: trio.abc.Stream = stream
        bridge: Bridge | None = None
        try:
            context = server.ssl_context
            if context is not None:
                wrapped = trio.SSLStream(stream, context, server_side=True)
                with trio.fail_after(server.config.auth_timeout_s):
                    await wrapped.do_handshake()
            bridge = Bridge(server.applier, server.inbox_clone(), peer)
            bridge.socket = stream.socket
            server.connections.add(bridge)
            server.metrics.accepted.inc()
            await self._serve_connection(wrapped, bridge)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        except Exception:
            log.exception("SQS connection failed", extra={"event": "connection_error",
                                                          "peer": peer})
        finally:
            if bridge is not None:
                server.connections.discard(bridge)
                bridge.close()
            await trio.aclose_forcefully(wrapped)

    async def _serve_connection(self, trio_stream: trio.abc.Stream, bridge: Bridge) -> None:
        parser = RequestParser(MAX_HEADER_BYTES, MAX_BODY_BYTES)
        stream = _Wire(trio_stream, self.server.config.idle_timeout_s)
        budget = self.server.budget
        grant = _Grant(budget)  # the body of the request being read
        answer = _Grant(budget)  # its answer, until the socket took it
        try:
            while not bridge.reading_done:
                try:
                    request = await self._read_request(stream, parser, bridge, grant)
                except HttpError as exc:
                    error = (_too_large(exc.message, exc.status) if exc.status in (413, 431)
                             else (exc.status, [("Content-Type", "text/plain")],
                                   exc.message.encode()))
                    await self._send(stream, error, answer, close=True)
                    return
                if request is None:
                    return
                response = await self.respond(bridge, request, grant, answer)
                request.body = b""  # done with: freed with its grant
                grant.release()
                close = bridge.reading_done or not request.keep_alive
                await self._send(stream, response, answer, close=close,
                                 head_only=request.method == "HEAD")
                if close:
                    return
        finally:
            grant.close()
            answer.close()

    async def _read_request(self, stream: _Wire, parser: RequestParser, bridge: Bridge,
                            grant: _Grant) -> HttpRequest | None:
        """-> the next request; None when the connection is to close (the client closed it,
        or was idle or too slow to send a request, or the server is shutting down)."""
        request = parser.next_request()
        if request is not None:
            return request  # pipelined behind the one answered before
        idle_s = stream.idle_s
        deadline = math.inf  # set by the request's first bytes
        while True:
            if parser.continue_wanted:
                parser.continue_sent()
                await stream.send_all(CONTINUE)
            idle = not parser.in_request
            with trio.move_on_at(min(trio.current_time() + idle_s, deadline)) as timer:
                if idle:
                    bridge.idle_scope = timer
                try:
                    # budget.py rule 2: a large body's whole bound is granted before it is read
                    await grant.hold(parser.body_bound_bytes)
                    data = await stream.receive()
                finally:
                    bridge.idle_scope = None
            if timer.cancelled_caught or not data:
                return None
            if deadline == math.inf:
                deadline = trio.current_time() + REQUEST_READ_S
            if idle:
                # A request's first bytes: with several clients the next request is often
                # close behind. Not the rest of a request (an SDK may write its headers and
                # body apart): polling after those caught nothing.
                self.server.busy_poll.kick()
            parser.feed(data)
            request = parser.next_request()
            if request is not None:
                return request

    async def _send(self, stream: _Wire, response: Response, answer: _Grant, close: bool,
                    head_only: bool = False) -> None:
        """Write one answer; until the socket took it, a large one holds its size in
        ``answer`` (budget.py rules 1, 4), and nothing more of its connection is read."""
        status, headers, body = response
        data = render_response(status, headers, body, close=close, head_only=head_only)
        answer.hold_now(len(data))
        await stream.send_all(data)
        answer.release()

    # -- one request ---------------------------------------------------------------------------

    async def respond(self, bridge: Bridge, request: HttpRequest, body_grant: _Grant,
                      answer: _Grant) -> Response:
        """Run one request; -> its answer in its protocol's shape. A request whose answer
        may be large runs once ``answer`` holds its bound (budget.py rule 3), given for
        ``body_grant``'s bytes, so no two connections hold bodies and wait on one another."""
        request_id = f"{self._request_id_prefix}{next(self._request_numbers):012x}"
        method = request.method
        target = request.target
        headers = request.headers
        body = request.body
        is_json = "x-amz-target" in headers
        action = "?"
        outcome = "ok"
        try:
            if method not in ("POST", "GET"):
                raise SqsError("InvalidAction", f"HTTP {method[:10]} is not an SQS request "
                               "(POST, or GET for the Query protocol).")
            server = self.server
            bridge.key_id = None
            if server.auth_required:
                bridge.key_id = verify(method, target, headers, body,
                                       self.state.naming.region, self._secret_of)
            if is_json:
                action, params = jsonproto.parse_request(headers["x-amz-target"], body)
            else:
                path, _, query = target.partition("?")
                action, params = queryproto.parse_request(
                    body if method == "POST" else query.encode("latin-1"), path)
            run = ACTIONS.get(action)
            if run is None:
                raise SqsError("InvalidAction", f"The action {action[:80]!r} is not valid "
                               "for this endpoint.")
            host = headers.get("host")
            base_url = f"{self.scheme}://{host}" if host else self.state.naming.base_url
            context = Context(bridge, self.state, base_url)
            if action == "ReceiveMessage":
                bound = body_grant.granted_bytes + _receive_bound_bytes(params)
                body_grant.release()
                with trio.CancelScope() as waiting:  # ended by a shutdown (stop_reading)
                    bridge.idle_scope = waiting
                    try:
                        if not bridge.reading_done:
                            await answer.hold(bound)
                    finally:
                        bridge.idle_scope = None
                # A receive that waits gives its bound back (its answer is counted when it
                # comes, as a binary connection's is: waiters are bounded by max_waiting).
                bridge.on_wait = answer.release
            if action == "ReceiveMessage" and params.get("WaitTimeSeconds") not in (0, "0"):
                result = await _unless_hung_up(run(context, params), bridge)
            else:
                result = await run(context, params)
            response = (jsonproto.render_result(result) if is_json
                        else queryproto.render_result(action, result, request_id))
        except (SqsError, LaminaError) as exc:
            error = exc if isinstance(exc, SqsError) else from_lamina(exc)
            outcome = error.code
            response = (jsonproto.render_error(error) if is_json
                        else queryproto.render_error(error, request_id))
        except Exception as exc:  # a bug in this request alone
            log.exception("internal error in SQS %s", action,
                          extra={"event": "internal_error"})
            error = SqsError("InternalFailure", f"{action} failed: {type(exc).__name__}: {exc}")
            outcome = error.code
            response = (jsonproto.render_error(error) if is_json
                        else queryproto.render_error(error, request_id))
        self.server.metrics.observe_sqs(action if action in ACTIONS else "unknown", outcome)
        bridge.on_wait = None
        status, response_headers, response_body = response
        return status, [*response_headers, ("x-amzn-RequestId", request_id)], response_body

    def _secret_of(self, key_id: str) -> str | None:
        key = self.server.keys.get(key_id)
        return key.secret if key is not None else None


async def _unless_hung_up(call: Awaitable[Any], bridge: Bridge) -> Any:
    """Run ``call`` (a receive that may wait); if the client closes or resets the connection
    meanwhile, its waits end now with nothing (as a binary connection's do at EOF), so no
    message is leased to a client that is gone. Bytes that come instead (a pipelined
    request) end the watch: they are read after the answer."""
    sock = bridge.socket
    if sock is None:
        return await call
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_end_waits_at_hang_up, sock, bridge)
        try:
            result = await call
        except Exception as exc:  # raised as it is, not in a group
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


async def _end_waits_at_hang_up(sock: trio.socket.SocketType, bridge: Bridge) -> None:
    try:
        hung_up = not await sock.recv(1, socket.MSG_PEEK)
    except OSError:  # reset by the peer
        hung_up = True
    if hung_up:
        bridge.stop_reading()  # its waits end with nothing; no further request is read


class _Grant:
    """One HTTP connection's grant of the memory budget (budget.py rules 1-5) for the body of
    the request it is reading (from when its head is in until its answer is made; until the
    budget has room, nothing more is read) or for its answer (its bound while it is made, then
    its size until the socket took it). Nothing at or under SMALL_BYTES is counted."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.granted_bytes = 0
        self._room: trio.Event | None = None

    def wake(self) -> None:
        if self._room is not None:
            self._room.set()

    async def hold(self, bound_bytes: int) -> None:
        """Hold ``bound_bytes`` (nothing when small), waiting for room."""
        if bound_bytes <= SMALL_BYTES or bound_bytes == self.granted_bytes:
            return
        self.release()
        budget = self.budget
        try:
            while not budget.fits(bound_bytes):
                self._room = trio.Event()
                budget.wait_for_room(self)
                await self._room.wait()
        finally:
            self._room = None
            budget.forget(self)
        budget.take(bound_bytes)
        self.granted_bytes = bound_bytes

    def hold_now(self, nbytes: int) -> None:
        """Hold ``nbytes`` already in memory (taken unasked), in place of what was held."""
        if nbytes <= SMALL_BYTES and not self.granted_bytes:
            return
        self.release()
        if nbytes > SMALL_BYTES:
            self.budget.take(nbytes)
            self.granted_bytes = nbytes

    def release(self) -> None:
        if self.granted_bytes:
            self.budget.give_back(self.granted_bytes)
            self.granted_bytes = 0

    def close(self) -> None:
        self.budget.forget(self)
        self.release()


class _Wire:
    """One HTTP connection's bytes in and out. Plain TCP reads and writes the socket's
    descriptor directly: trio's stream costs a context manager and a scheduler round per call,
    more than the system call itself, and a request needs two of them. TLS goes through the
    stream. Either way a wait for bytes is the caller's to bound; an answer the client does
    not take within the idle timeout closes the connection."""

    def __init__(self, stream: trio.abc.Stream, idle_s: float) -> None:
        self.stream = stream
        self.idle_s = idle_s
        self._fd = (stream.socket.fileno() if isinstance(stream, trio.SocketStream)
                    else None)

    async def receive(self) -> bytes:
        """The next bytes the client sent (b"": it closed or reset the connection)."""
        fd = self._fd
        if fd is None:
            return bytes(await self.stream.receive_some(RECEIVE_CHUNK_BYTES))
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, RECEIVE_CHUNK_BYTES)
            except BlockingIOError:
                continue
            except OSError:  # reset by the peer: the same as EOF here
                return b""

    async def send_all(self, data: bytes) -> None:
        fd = self._fd
        if fd is not None:
            try:
                written = os.write(fd, data)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                raise trio.BrokenResourceError from exc
            if written == len(data):
                return
            rest: bytes | memoryview = memoryview(data)[written:]  # no copy of a large answer
        else:
            rest = data
        with trio.fail_after(self.idle_s):  # TooSlowError ends the connection
            await self.stream.send_all(rest)


def _receive_bound_bytes(params: dict[str, Any]) -> int:
    """The bound of a ReceiveMessage answer (budget.py rule 3): as the binary protocol's
    receive, its messages' largest size; its real size, once made, is what it holds."""
    count = params.get("MaxNumberOfMessages", 1)
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if type(count) is not int or not 1 <= count <= 10:
        count = 1  # refused by the action: the answer is an error
    return count * MAX_ANSWERED_MESSAGE_BYTES


def _too_large(message: str, status: int) -> Response:
    _, headers, body = jsonproto.render_error(SqsError("RequestEntityTooLarge", message))
    return status, headers, body
