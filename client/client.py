"""The blocking Python client of a Lamina server (DESIGN.md §5), :class:`Client`; its trio twin
:class:`~lamina.client.async_client.AsyncClient` has the same methods (``operations.py``)::

    with Client.connect("127.0.0.1", 7766) as client:
        client.create_queue("orders")
        client.send("orders", [b"hello", message("urgent", priority=1)])
        for delivery in client.receive("orders", max=10, wait=5):
            client.delete("orders", [delivery])

    async with AsyncClient.connect("127.0.0.1", 7766) as client:
        await client.send("orders", [b"hello"])

Errors: one tree, the engine's (``lamina.engine.errors``), whose connection subtree
(``LaminaConnectionError`` and its kinds) is drawn in ``lamina.client.errors``.

Both clients pipeline: any number of threads (Client) or tasks (AsyncClient) may call at once
over one connection; answers are matched by id. Neither reconnects on its own.

``Client.connect(..., busy_poll_us=N)`` trades CPU for latency: the thread waiting for an answer
polls the socket for up to N µs before it sleeps, so the answer finds it awake (on a virtual
machine waking a sleeping thread costs tens of µs; the server does the same on its side,
``server/busypoll.py``). For callers that do round trip after round trip; 0 (the default)
sleeps at once.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

from lamina.engine.errors import InvalidArgument, error_from_wire
from lamina.wire.framing import DEFAULT_MAX_FRAME_BYTES
from lamina.wire.protocol import DEFAULT_PORT, MAX_BUSY_POLL_US, ClientConnection, Greeting, Response

from .errors import ConnectFailed, ConnectionClosed, ConnectionLost, ConnectTimeout
from .lease import LeaseKeeper, process_sync
from .operations import Delivery, Operations
from .transport import (
    Answers,
    auth_args,
    encode_request,
    encode_requests,
    tls_context,
)

__all__ = ["Client"]

T = TypeVar("T")
#: Bytes asked of the socket per read. A read into a fresh buffer this large would cost an
#: mmap and munmap each time (glibc maps allocations over 128 KiB): the blocking client reads
#: into one buffer of its own and copies out what came.
_RECEIVE_BYTES = 256 * 1024


class Client(Operations):
    """A blocking client over one TCP (or TLS) connection; thread-safe.

    Use :meth:`connect`. Calls from several threads are pipelined: whichever thread is waiting
    reads the socket and hands the other threads their answers.
    """

    def __init__(self, sock: socket.socket, *, max_frame_bytes: int) -> None:
        self._sock = sock
        self._proto = ClientConnection(max_frame_bytes=max_frame_bytes)
        self._answers = Answers()
        self._send_lock = threading.Lock()
        # _lock guards _proto, _answers, _reading, _sleepers; _state is its Condition. Plain
        # ``with self._lock`` where no one waits: a Condition's enter and exit are Python calls.
        self._lock = threading.Lock()
        self._state = threading.Condition(self._lock)
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
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = tls_context(tls)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=server_hostname or host)
            client = cls(sock, max_frame_bytes=max_frame_bytes)
            client._handshake(key, secret)
        except OSError as exc:
            sock.close()
            kind = ConnectTimeout if isinstance(exc, ConnectTimeout) else ConnectFailed
            raise kind(f"cannot connect to {host}:{port}: {exc}") from exc
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
        args = auth_args(greeting, key, secret)
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
            self._answers.fail(ConnectionClosed, "the client closed the connection")
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
        # _send and raise_for for one request, in line: every call of a caller pays this path.
        with self._send_lock:
            with self._lock:
                if self._answers.failure is not None:
                    raise self._answers.failure
                request_id, frame = encode_request(self._proto, op, args)
            try:
                self._sock.sendall(frame)
            except OSError as exc:
                with self._lock:
                    raise self._answers.fail(ConnectionLost, f"connection lost: {exc}") from None
        response = self._wait_for(request_id)
        if response[1] is not None:
            raise error_from_wire(response[1])
        return decode(response[2])  # type: ignore[arg-type]  # a success has its result map

    def _call_many(self, requests: Sequence[tuple[str, dict[str, Any]]],
                   finish: Callable[[list[Response]], T]) -> T:
        return finish([self._wait_for(request_id) for request_id in self._send(requests)])

    def _send(self, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[int]:
        """Write ``requests`` in one write; -> their ids. If one cannot be encoded, the ones
        before it are still sent and answered, then its error is raised."""
        with self._send_lock:
            with self._lock:
                if self._answers.failure is not None:
                    raise self._answers.failure
                ids, frames, error = encode_requests(self._proto, requests)
            if frames:
                try:
                    self._sock.sendall(frames[0] if len(frames) == 1 else b"".join(frames))
                except OSError as exc:
                    with self._lock:
                        raise self._answers.fail(ConnectionLost, f"connection lost: {exc}") from None
        if error is not None:
            for request_id in ids:
                self._wait_for(request_id)
            raise error
        return ids

    def _wait_for(self, request_id: int) -> Response:
        """Leader/follower: one waiting thread reads at a time and hands the others their
        answers; the others sleep. A thread alone takes the lock twice a call: to become the
        reader, and to parse what it read; a read holding just its own answer (the usual one)
        goes to no one else and leaves nothing behind."""
        answers = self._answers
        lock = self._lock
        with lock:
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
                    self._state.wait()
                finally:
                    self._sleepers -= 1
        reading = True  # this thread is the reader, until it hands that on
        try:
            while True:
                data = self._receive()
                with lock:
                    if not data:
                        raise answers.fail(ConnectionLost, "the server closed the connection")
                    events = self._proto.receive_data(data)
                    if len(events) == 1:
                        event = events[0]
                        if type(event) is Response and event[0] == request_id:
                            self._reading = reading = False
                            if self._sleepers:
                                self._state.notify_all()  # one of them reads next
                            return event
                    answers.take(events)
                    response = answers.responses.pop(request_id, None)
                    if response is not None or answers.failure is not None:
                        self._reading = reading = False
                        if self._sleepers:
                            self._state.notify_all()
                        if response is not None:
                            return response
                        raise answers.failure
                    if self._sleepers and answers.responses:
                        self._state.notify_all()  # their answers came in
        except BaseException:
            with lock:
                if reading:  # not if it handed the reading on (raising the failure)
                    self._reading = False
                    if self._sleepers:
                        self._state.notify_all()
            raise

    def _receive(self) -> bytes:
        try:
            received = self._poll() if self._poll_s else -1
            if received < 0:
                received = self._sock.recv_into(self._receive_buffer)
            return self._receive_view[:received].tobytes()
        except socket.timeout:
            raise ConnectTimeout("timed out waiting for the server") from None
        except OSError as exc:
            with self._state:
                raise self._answers.fail(ConnectionLost, f"connection lost: {exc}") from None

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
                raise self._answers.fail(ConnectionLost, "the server closed the connection")
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
