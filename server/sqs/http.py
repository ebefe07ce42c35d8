"""The SQS endpoint: HTTP/1.1 (h11 on trio, TLS with the server's certificate when it has
one) in the server process, turned on by ``lamina serve --sqs-port PORT``.

Each HTTP connection gets a :class:`~.bridge.Bridge` (it counts as one of the server's
connections, and ends like one at shutdown); each request is read whole (headers at most
``MAX_HEADER_BYTES``, body at most ``MAX_BODY_BYTES``: SQS's 1 MiB payload in its most
verbose encoding), its signature checked when the server has keys, decoded by its protocol
(AWS JSON 1.0 when it carries ``X-Amz-Target``, else Query), run, and answered in that
protocol's shape. Requests of one connection run one at a time, in order (HTTP/1.1).
"""

from __future__ import annotations

import itertools
import logging
import math
import uuid
import ssl
from typing import Any, Protocol

import h11
import trio

from lamina.engine.errors import LaminaError

from . import jsonproto, queryproto
from .actions import ACTIONS
from ..busypoll import BusyPoll
from ..config import ServerConfig
from ..keyring import KeyRing
from ..ports import Applier, Reader
from .bridge import Bridge
from .context import Context, GatewayState
from .errors import SqsError, from_lamina
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
            await trio.serve_listeners(self._handle_stream, listeners, handler_nursery=pool)
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
            server.connections.add(bridge)
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

    async def _serve_connection(self, stream: trio.abc.Stream, bridge: Bridge) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        idle_s = self.server.config.idle_timeout_s
        while not bridge.reading_done:
            try:
                request, headers, body = await self._read_request(stream, connection, bridge,
                                                                  idle_s)
            except _RequestTooLarge as exc:
                if connection.our_state is h11.SEND_RESPONSE:
                    await self._send(stream, connection, _too_large(exc.what), close=True)
                return
            except h11.RemoteProtocolError as exc:
                if connection.their_state is not h11.DONE and connection.our_state in (
                        h11.IDLE, h11.SEND_RESPONSE):
                    await self._send(stream, connection,
                                     (exc.error_status_hint, [("Content-Type", "text/plain")],
                                      str(exc).encode()), close=True)
                return
            if request is None:
                return
            response = await self.respond(bridge, request, headers, body)
            close = bridge.reading_done
            await self._send(stream, connection, response, close=close)
            if close or connection.our_state is h11.MUST_CLOSE:
                return
            connection.start_next_cycle()

    async def _read_request(self, stream: trio.abc.Stream, connection: h11.Connection,
                            bridge: Bridge, idle_s: float
                            ) -> tuple[Any, dict[str, str], bytes]:
        """-> (request, its headers by lower-case name, body); (None, {}, b"") when the
        connection is to close."""
        request = None
        headers: dict[str, str] = {}
        chunks: list[bytes] = []
        size = 0
        deadline = math.inf  # set by the request's first bytes
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                if connection.they_are_waiting_for_100_continue:
                    await stream.send_all(connection.send(
                        h11.InformationalResponse(status_code=100, headers=[])))
                data = b""
                idle = request is None and not connection.trailing_data[0]
                with trio.move_on_at(min(trio.current_time() + idle_s, deadline)) as timer:
                    if idle:
                        bridge.idle_scope = timer
                    try:
                        data = bytes(await stream.receive_some(RECEIVE_CHUNK_BYTES))
                    finally:
                        bridge.idle_scope = None
                if timer.cancelled_caught:
                    return None, {}, b""  # idle, shutting down, or too slow to send a request
                if deadline == math.inf:
                    deadline = trio.current_time() + REQUEST_READ_S
                if request is None:
                    # A request's first bytes: with several clients the next request is
                    # often close behind. Not the rest of a request (an SDK writes its
                    # headers and body apart): polling after those caught nothing.
                    self.server.busy_poll.kick()
                connection.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                request = event
                headers, size_bytes = _header_map(event.headers.raw_items())
                if size_bytes + len(event.target) > MAX_HEADER_BYTES:
                    raise _RequestTooLarge("headers")
                length = headers.get("content-length", "")
                if length.isdigit() and int(length) > MAX_BODY_BYTES:
                    raise _RequestTooLarge("body")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY_BYTES:
                    raise _RequestTooLarge("body")
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return request, headers, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None, {}, b""

    async def _send(self, stream: trio.abc.Stream, connection: h11.Connection,
                    response: Response, close: bool) -> None:
        status, headers, body = response
        headers = [*headers, ("Content-Length", str(len(body)))]
        if close:
            headers.append(("Connection", "close"))
        data = connection.send(h11.Response(status_code=status, headers=headers))
        data += connection.send(h11.Data(data=body)) if body else b""
        data += connection.send(h11.EndOfMessage())
        await stream.send_all(data)

    # -- one request ---------------------------------------------------------------------------

    async def respond(self, bridge: Bridge, request: h11.Request, headers: dict[str, str],
                      body: bytes) -> Response:
        """Run one request; -> its answer in its protocol's shape."""
        request_id = f"{self._request_id_prefix}{next(self._request_numbers):012x}"
        method = request.method.decode("ascii", "replace")
        target = request.target.decode("latin-1")
        is_json = "x-amz-target" in headers
        action = "?"
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
            result = await run(Context(bridge, self.state, base_url), params)
            response = (jsonproto.render_result(result) if is_json
                        else queryproto.render_result(action, result, request_id))
        except (SqsError, LaminaError) as exc:
            error = exc if isinstance(exc, SqsError) else from_lamina(exc)
            response = (jsonproto.render_error(error) if is_json
                        else queryproto.render_error(error, request_id))
        except Exception as exc:  # a bug in this request alone
            log.exception("internal error in SQS %s", action,
                          extra={"event": "internal_error"})
            error = SqsError("InternalFailure", f"{action} failed: {type(exc).__name__}: {exc}")
            response = (jsonproto.render_error(error) if is_json
                        else queryproto.render_error(error, request_id))
        status, response_headers, response_body = response
        return status, [*response_headers, ("x-amzn-RequestId", request_id)], response_body

    def _secret_of(self, key_id: str) -> str | None:
        key = self.server.keys.get(key_id)
        return key.secret if key is not None else None


def _header_map(items: list[tuple[bytes, bytes]]) -> tuple[dict[str, str], int]:
    """Raw header pairs -> (values by lower-case name, repeated ones joined with commas as
    SigV4 canonicalizes them; their size in bytes)."""
    headers: dict[str, str] = {}
    size_bytes = 0
    for raw_name, raw_value in items:
        size_bytes += len(raw_name) + len(raw_value) + 4
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers, size_bytes


class _RequestTooLarge(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _too_large(what: str) -> Response:
    limit = MAX_BODY_BYTES if what == "body" else MAX_HEADER_BYTES
    error = SqsError("RequestEntityTooLarge", f"The request {what} is larger than "
                     f"{limit} bytes.")
    status, headers, body = jsonproto.render_error(error)
    return (status if what == "body" else 431), headers, body
