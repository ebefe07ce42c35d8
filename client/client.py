"""Python clients of a Lamina server (DESIGN.md §5): blocking :class:`Client` and trio
:class:`AsyncClient`, with the same methods (``operations.py``)::

    with Client.connect("127.0.0.1", 7766) as client:
        client.create_queue("orders")
        client.send("orders", [b"hello", message("urgent", priority=1)])
        for delivery in client.receive("orders", max=10, wait=5):
            client.delete("orders", [delivery])

    async with AsyncClient.connect("127.0.0.1", 7766) as client:
        await client.send("orders", [b"hello"])

Errors (one hierarchy, the engine's, ``lamina.engine.errors``):

    LaminaError                       anything Lamina reports; ``.code`` is the wire code
    ├── <one class per PROTOCOL §6 code>   raised for a request the server refused
    │                                      (an unknown code arrives as LaminaError itself)
    └── LaminaConnectionError         also a builtin ``ConnectionError``: could not connect,
                                      TLS failed, the connection was lost or closed, or the
                                      server broke the protocol. A request in flight when it
                                      happened may or may not have taken effect (unlike
                                      ``Unavailable``, which means it did not).

Both clients pipeline: any number of threads (Client) or tasks (AsyncClient) may call at once
over one connection; answers are matched by id. Neither reconnects on its own.

``Client.connect(..., busy_poll_us=N)`` trades CPU for latency: the thread waiting for an answer
polls the socket for up to N µs before it sleeps, so the answer finds it awake (on a virtual
machine waking a sleeping thread costs tens of µs; the server does the same on its side,
``server/busypoll.py``). For callers that do round trip after round trip; 0 (the default)
sleeps at once.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

import trio

from lamina.engine.errors import InvalidArgument, LaminaError, Unauthorized, error_from_wire

from lamina.wire.protocol import MAX_BUSY_POLL_US
from lamina.wire.framing import DEFAULT_MAX_FRAME_BYTES
from .lease import AsyncLeaseKeeper, LeaseKeeper, process_async, process_sync
from .operations import Delivery, Operations, Peeked, ServerInfo, message
from lamina.wire.protocol import (
    ClientConnection,
    Greeting,
    LocalProtocolError,
    ProtocolViolation,
    Response,
    auth_signature,
)

__all__ = ["AsyncClient", "AsyncLeaseKeeper", "Client", "DEFAULT_PORT", "Delivery",
           "LaminaConnectionError", "LeaseKeeper", "Peeked", "ServerInfo", "message"]

T = TypeVar("T")
DEFAULT_PORT = 7766
#: Bytes asked of the socket per read. A read into a fresh buffer this large would cost an
#: mmap and munmap each time (glibc maps allocations over 128 KiB): the blocking client reads
#: into one buffer of its own and copies out what came; the trio client asks for 64 KiB.
_RECEIVE_BYTES = 256 * 1024
_ASYNC_RECEIVE_BYTES = 64 * 1024


class LaminaConnectionError(LaminaError, ConnectionError):
    """The connection failed or ended; see the module docstring."""

    code = "ConnectionError"


def _tls_context(tls: bool | ssl.SSLContext) -> ssl.SSLContext | None:
    if tls is False or tls is None:
        return None
    if isinstance(tls, ssl.SSLContext):
        return tls
    return ssl.create_default_context()


def _encode(proto: ClientConnection, op: str, args: dict[str, Any]) -> tuple[int, bytes]:
    try:
        return proto.encode_request(op, args)
    except LocalProtocolError as exc:
        if "max_frame" in str(exc):  # not sent; the connection is fine
            raise InvalidArgument(op, str(exc)) from None
        raise LaminaConnectionError(str(exc)) from None


def _encode_all(proto: ClientConnection, requests: Sequence[tuple[str, dict[str, Any]]]
                ) -> tuple[list[int], list[bytes], LaminaError | None]:
    """Encode ``requests`` in order up to the first that cannot be: -> (ids, frames, its
    error or None)."""
    ids: list[int] = []
    frames: list[bytes] = []
    for op, args in requests:
        try:
            request_id, frame = _encode(proto, op, args)
        except LaminaError as exc:
            return ids, frames, exc
        ids.append(request_id)
        frames.append(frame)
    return ids, frames, None


def _raise_for(response: Response, decode: Callable[[dict[str, Any]], T]) -> T:
    if response.error is not None:
        raise error_from_wire(response.error)
    assert response.result is not None
    return decode(response.result)


class _Answers:
    """What both clients do with decoded server frames: match answers to requests, and turn
    the end of the connection into one ``LaminaConnectionError`` for everyone waiting."""

    def __init__(self) -> None:
        self.responses: dict[int, Response] = {}
        self.greeting: Greeting | None = None
        self.failure: LaminaConnectionError | None = None

    def take(self, events: list[Any]) -> None:
        for event in events:
            if type(event) is Response:
                if event.id == 0:  # the server's last word about our bytes
                    error = error_from_wire(event.error or {})
                    self.fail(f"the server closed the connection: {error.code}: "
                              f"{error.message}")
                else:
                    self.responses[event.id] = event
            elif type(event) is Greeting:
                self.greeting = event
            elif type(event) is ProtocolViolation:
                self.fail(f"the server broke the protocol: {event.message}")

    def fail(self, reason: str) -> LaminaConnectionError:
        if self.failure is None:
            self.failure = LaminaConnectionError(reason)
        return self.failure


def _auth_args(greeting: Greeting, key: str | None, secret: str | None) -> dict[str, Any] | None:
    if not greeting.auth_required:
        return None
    if key is None or secret is None:
        raise Unauthorized("the server requires authentication: pass key and secret")
    return {"key": key, "signature": auth_signature(secret, greeting.nonce, key)}


# --- Blocking -----------------------------------------------------------------------------------


class Client(Operations):
    """A blocking client over one TCP (or TLS) connection; thread-safe.

    Use :meth:`connect`. Calls from several threads are pipelined: whichever thread is waiting
    reads the socket and hands the other threads their answers.
    """

    def __init__(self, sock: socket.socket, *, max_frame_bytes: int) -> None:
        self._sock = sock
        self._proto = ClientConnection(max_frame_bytes=max_frame_bytes)
        self._answers = _Answers()
        self._send_lock = threading.Lock()
        self._state = threading.Condition()  # guards _proto, _answers, _reading, _sleepers
        self._receive_buffer = bytearray(_RECEIVE_BYTES)  # only the reading thread uses it
        self._receive_view = memoryview(self._receive_buffer)
        self._reading = False  # a thread is reading the socket for everyone
        self._sleepers = 0  # threads waiting on _state for their answer or their turn
        self._closed = False
        self._poll_s = 0.0  # busy_poll_us, in seconds (see connect)

    @classmethod
    def connect(cls, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                key: str | None = None, secret: str | None = None,
                tls: bool | ssl.SSLContext = False, server_hostname: str | None = None,
                timeout: float | None = 10.0,
                max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                busy_poll_us: int = 0) -> Client:
        """Connect, read the greeting and authenticate (when the server requires it) within
        ``timeout`` seconds. ``tls``: True for the system's CAs, or an ``SSLContext``.
        ``busy_poll_us``: poll this long for each answer before sleeping (module docstring)."""
        if type(busy_poll_us) is not int or not 0 <= busy_poll_us <= MAX_BUSY_POLL_US:
            raise InvalidArgument("busy_poll_us", f"must be an integer 0..{MAX_BUSY_POLL_US}")
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise LaminaConnectionError(f"cannot connect to {host}:{port}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = _tls_context(tls)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=server_hostname or host)
            client = cls(sock, max_frame_bytes=max_frame_bytes)
            client._handshake(key, secret)
        except OSError as exc:
            sock.close()
            raise LaminaConnectionError(f"cannot connect to {host}:{port}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        client._poll_s = busy_poll_us / 1e6
        return client

    def _handshake(self, key: str | None, secret: str | None) -> None:
        while self._answers.greeting is None:
            self._read_once()
        greeting = self._answers.greeting
        args = _auth_args(greeting, key, secret)
        if args is not None:
            self._call("auth", args, lambda result: None)

    @property
    def greeting(self) -> Greeting:
        assert self._answers.greeting is not None
        return self._answers.greeting

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._answers.fail("the client closed the connection")
            self._state.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------------

    def _call(self, op: str, args: dict[str, Any], decode: Callable[[dict[str, Any]], T]) -> T:
        (request_id,) = self._send(((op, args),))
        return _raise_for(self._wait_for(request_id), decode)

    def _call_many(self, requests: Sequence[tuple[str, dict[str, Any]]],
                   finish: Callable[[list[Response]], T]) -> T:
        return finish([self._wait_for(request_id) for request_id in self._send(requests)])

    def _send(self, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[int]:
        """Write ``requests`` in one write; -> their ids. If one cannot be encoded, the ones
        before it are still sent and answered, then its error is raised."""
        with self._send_lock:
            with self._state:
                if self._answers.failure is not None:
                    raise self._answers.failure
                ids, frames, error = _encode_all(self._proto, requests)
            if frames:
                try:
                    self._sock.sendall(frames[0] if len(frames) == 1 else b"".join(frames))
                except OSError as exc:
                    with self._state:
                        raise self._answers.fail(f"connection lost: {exc}") from None
        if error is not None:
            for request_id in ids:
                self._wait_for(request_id)
            raise error
        return ids

    def _wait_for(self, request_id: int) -> Response:
        """Leader/follower: one waiting thread reads at a time and hands the others their
        answers; the others sleep. A lone thread takes one lock per read."""
        answers = self._answers
        state = self._state
        with state:
            while True:
                response = answers.responses.pop(request_id, None)
                if response is not None:
                    return response
                if answers.failure is not None:
                    raise answers.failure
                if not self._reading:
                    self._reading = True
                    break
                self._sleepers += 1
                try:
                    state.wait()
                finally:
                    self._sleepers -= 1
        try:
            while True:
                data = self._receive()
                with state:
                    if not data:
                        raise answers.fail("the server closed the connection")
                    answers.take(self._proto.receive_data(data))
                    response = answers.responses.pop(request_id, None)
                    if response is not None or answers.failure is not None:
                        self._reading = False
                        if self._sleepers:
                            state.notify_all()
                        if response is not None:
                            return response
                        raise answers.failure  # type: ignore[misc]
                    if self._sleepers and answers.responses:
                        state.notify_all()  # their answers came in
        except BaseException:
            with state:
                self._reading = False
                if self._sleepers:
                    state.notify_all()
            raise

    def _receive(self) -> bytes:
        try:
            received = self._poll() if self._poll_s else -1
            if received < 0:
                received = self._sock.recv_into(self._receive_buffer)
            return self._receive_view[:received].tobytes()
        except socket.timeout:
            raise LaminaConnectionError("timed out waiting for the server") from None
        except OSError as exc:
            with self._state:
                raise self._answers.fail(f"connection lost: {exc}") from None

    def _poll(self) -> int:
        """Bytes received within the poll window, or -1 if none came (``busy_poll_us``)."""
        sock, buffer = self._sock, self._receive_buffer
        end = time.perf_counter() + self._poll_s
        tls = isinstance(sock, ssl.SSLSocket)
        if tls:  # an SSL socket takes no flags: it is non-blocking for the window instead
            sock.setblocking(False)
        flags = 0 if tls else socket.MSG_DONTWAIT
        try:
            while True:
                try:
                    return sock.recv_into(buffer, len(buffer), flags)
                except (BlockingIOError, ssl.SSLWantReadError):
                    if time.perf_counter() >= end:
                        return -1
        finally:
            if tls:
                sock.setblocking(True)

    def _read_once(self) -> None:
        data = self._receive()
        with self._state:
            if not data:
                raise self._answers.fail("the server closed the connection")
            self._answers.take(self._proto.receive_data(data))

    # -- lease keeping ------------------------------------------------------------------------

    def lease_keeper(self, queue: str, *, tag: str | None = None,
                     lease_s: float = 30.0) -> LeaseKeeper:
        """A :class:`LeaseKeeper` for deliveries of ``queue`` (use it as a context manager)."""
        return LeaseKeeper(self, queue, tag=tag, lease_s=lease_s)

    def process(self, queue: str, handler: Callable[[Delivery], Any], *,
                tag: str | None = None, max: int = 1, wait: float = 20.0,
                lease_s: float = 30.0, limit: int | None = None,
                stop: threading.Event | None = None, release_on_error: bool = False) -> int:
        """Receive and handle messages until ``limit`` are done or ``stop`` is set; -> how
        many were handled and deleted. See :func:`lamina.client.lease.process_sync`."""
        return process_sync(self, queue, handler, tag=tag, max=max, wait=wait,
                            lease_s=lease_s, limit=limit, stop=stop,
                            release_on_error=release_on_error)


# --- trio ----------------------------------------------------------------------------------------


class _Pending:
    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: Response | None = None


class _AsyncConnection:
    """What ``AsyncClient.connect`` returns: an async context manager owning the client's
    reader task. Its nursery is entered and left by hand so that an exception of the block's
    body propagates as itself, not wrapped in an ExceptionGroup (the reader never raises)."""

    def __init__(self, client_class: type[AsyncClient], host: str, port: int,
                 **options: Any) -> None:
        self._client_class, self._host, self._port = client_class, host, port
        self._options = options
        self._nursery_manager: Any = None
        self._nursery: trio.Nursery | None = None
        self._stream: trio.abc.Stream | None = None

    async def __aenter__(self) -> AsyncClient:
        host, port, options = self._host, self._port, self._options
        timeout = options["timeout"]
        try:
            with trio.fail_after(timeout):
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                self._stream = stream
                context = _tls_context(options["tls"])
                if context is not None:
                    stream = self._stream = trio.SSLStream(
                        stream, context, server_hostname=options["server_hostname"] or host)
                    await stream.do_handshake()
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            await self._close()
            raise LaminaConnectionError(f"cannot connect to {host}:{port}: {exc}") from exc
        client = self._client_class(stream, max_frame_bytes=options["max_frame_bytes"])
        self._nursery_manager = trio.open_nursery()
        self._nursery = nursery = await self._nursery_manager.__aenter__()
        nursery.start_soon(client._read_loop)
        try:
            with trio.fail_after(timeout):
                await client._handshake(options["key"], options["secret"])
        except BaseException as exc:
            await self.__aexit__(None, None, None)
            if isinstance(exc, trio.TooSlowError):
                raise LaminaConnectionError(
                    f"no greeting from {host}:{port} within {timeout} s") from None
            raise
        return client

    async def __aexit__(self, *exc: object) -> None:
        if self._nursery_manager is not None:
            manager, self._nursery_manager = self._nursery_manager, None
            self._nursery.cancel_scope.cancel()
            await manager.__aexit__(None, None, None)
            await self._close()
        else:
            await self._close()

    async def _close(self) -> None:
        if self._stream is not None:
            await trio.aclose_forcefully(self._stream)


class AsyncClient(Operations):
    """A trio client over one connection; any number of tasks may call it at once (requests
    are pipelined, answers matched by id, so a long poll never blocks other calls).

    Use ``async with AsyncClient.connect(...) as client``; its reader task lives there.
    """

    def __init__(self, stream: trio.abc.Stream, *, max_frame_bytes: int) -> None:
        self._stream = stream
        self._proto = ClientConnection(max_frame_bytes=max_frame_bytes)
        self._answers = _Answers()
        self._pending: dict[int, _Pending] = {}
        self._send_lock = trio.StrictFIFOLock()
        self._greeted = trio.Event()
        #: Plain TCP: the socket's fd, read and written directly (no task switch per call)
        #: until the connection fails or closes.
        self._fd: int | None = (stream.socket.fileno() if isinstance(stream, trio.SocketStream)
                                else None)

    @classmethod
    def connect(cls, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                key: str | None = None, secret: str | None = None,
                tls: bool | ssl.SSLContext = False, server_hostname: str | None = None,
                timeout: float = 10.0,
                max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> _AsyncConnection:
        """``async with AsyncClient.connect(...) as client``: connect, read the greeting and
        authenticate within ``timeout`` seconds; the connection closes with the block."""
        return _AsyncConnection(cls, host, port, key=key, secret=secret, tls=tls,
                                server_hostname=server_hostname, timeout=timeout,
                                max_frame_bytes=max_frame_bytes)

    async def _handshake(self, key: str | None, secret: str | None) -> None:
        await self._greeted.wait()
        if self._answers.failure is not None:
            raise self._answers.failure
        greeting = self._answers.greeting
        assert greeting is not None
        args = _auth_args(greeting, key, secret)
        if args is not None:
            await self._call("auth", args, lambda result: None)

    @property
    def greeting(self) -> Greeting:
        assert self._answers.greeting is not None
        return self._answers.greeting

    async def _call(self, op: str, args: dict[str, Any],
                    decode: Callable[[dict[str, Any]], T]) -> T:
        (response,) = await self._exchange(((op, args),))
        return _raise_for(response, decode)

    async def _call_many(self, requests: Sequence[tuple[str, dict[str, Any]]],
                         finish: Callable[[list[Response]], T]) -> T:
        return finish(await self._exchange(requests))

    async def _exchange(self, requests: Sequence[tuple[str, dict[str, Any]]]
                        ) -> list[Response]:
        """Write ``requests`` in one write and wait for their answers (see ``Client._send``
        for a request that cannot be encoded)."""
        if self._answers.failure is not None:
            raise self._answers.failure
        ids, frames, error = _encode_all(self._proto, requests)
        waits = [_Pending() for _ in ids]
        self._pending.update(zip(ids, waits))
        try:
            if frames:
                await self._write(frames[0] if len(frames) == 1 else b"".join(frames))
            for pending in waits:
                await pending.event.wait()
        finally:
            for request_id in ids:
                self._pending.pop(request_id, None)
        if error is not None:
            raise error
        responses: list[Response] = []
        for pending in waits:
            if pending.response is None:
                raise self._answers.failure or LaminaConnectionError("connection closed")
            responses.append(pending.response)
        return responses

    async def _write(self, data: bytes) -> None:
        fd = self._fd
        if fd is not None and not self._send_lock.locked():
            # Plain TCP and nobody sending: write at once, without a task switch. Only what
            # the socket did not take is sent under the lock (taken before any checkpoint, so
            # no other frame can come between the two parts).
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise self._fail(f"connection lost: {exc}") from None
            if sent < len(data):
                self._send_lock.acquire_nowait()
                try:
                    await self._send_shielded(data[sent:])
                finally:
                    self._send_lock.release()
        else:
            async with self._send_lock:
                await self._send_shielded(data)

    async def _send_shielded(self, data: bytes) -> None:
        # A frame cut short by a cancellation would corrupt the stream for everyone.
        with trio.CancelScope(shield=True):
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise self._fail(f"connection lost: {exc}") from None

    async def _read_loop(self) -> None:
        answers = self._answers
        drained = False  # plain TCP: the last read emptied the socket
        try:
            while answers.failure is None:
                fd = self._fd
                try:
                    if fd is None:
                        data = await self._stream.receive_some(_ASYNC_RECEIVE_BYTES)
                    else:
                        if drained:
                            await trio.lowlevel.wait_readable(fd)
                        else:
                            await trio.lowlevel.checkpoint()  # more may be waiting: be fair
                        try:
                            data = os.read(fd, _ASYNC_RECEIVE_BYTES)
                        except BlockingIOError:
                            drained = True
                            continue
                        drained = len(data) < _ASYNC_RECEIVE_BYTES
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._fail(f"connection lost: {exc}")
                    return
                if not data:
                    self._fail("the server closed the connection")
                    return
                answers.take(self._proto.receive_data(data))
                if answers.greeting is not None:
                    self._greeted.set()
                for request_id in list(answers.responses):
                    response = answers.responses.pop(request_id)
                    pending = self._pending.get(request_id)
                    if pending is not None:  # else its caller was cancelled: drop it
                        pending.response = response
                        pending.event.set()
                if answers.failure is not None:
                    self._fail(answers.failure.message)
        except Exception as exc:  # a bug here must still wake every caller
            self._fail(f"client failure: {exc!r}")
        finally:
            if answers.failure is None:
                self._fail("the client closed the connection")

    def _fail(self, reason: str) -> LaminaConnectionError:
        failure = self._answers.fail(reason)
        self._fd = None  # the socket closes soon after: its fd number may be reused
        self._greeted.set()
        for pending in self._pending.values():
            pending.event.set()
        return failure

    # -- lease keeping ------------------------------------------------------------------------

    def lease_keeper(self, queue: str, *, tag: str | None = None,
                     lease_s: float = 30.0) -> AsyncLeaseKeeper:
        """An :class:`AsyncLeaseKeeper` for deliveries of ``queue`` (``async with`` it)."""
        return AsyncLeaseKeeper(self, queue, tag=tag, lease_s=lease_s)

    async def process(self, queue: str, handler: Callable[[Delivery], Any], *,
                      tag: str | None = None, max: int = 1, wait: float = 20.0,
                      lease_s: float = 30.0, limit: int | None = None,
                      stop: trio.Event | None = None, release_on_error: bool = False) -> int:
        """The async twin of :meth:`Client.process`; ``handler`` is an async function."""
        return await process_async(self, queue, handler, tag=tag, max=max, wait=wait,
                                   lease_s=lease_s, limit=limit, stop=stop,
                                   release_on_error=release_on_error)
