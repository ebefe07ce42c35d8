"""The trio client of a Lamina server, :class:`AsyncClient`: the methods of the blocking
:class:`~lamina.client.client.Client` (``operations.py``), awaited::

    async with AsyncClient.connect("127.0.0.1", 7766) as client:
        await client.send("orders", [b"hello"])

Any number of tasks may call one client at once: requests are pipelined and answers matched by
id, so a long poll never blocks other calls. Errors as for the blocking client (``errors.py``).
"""

from __future__ import annotations

import os
import ssl
from typing import Any, Callable, Sequence, TypeVar

import trio

from lamina.wire.framing import DEFAULT_MAX_FRAME_BYTES
from lamina.wire.protocol import DEFAULT_PORT, ClientConnection, Greeting, Response

from .errors import (
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    ConnectTimeout,
    LaminaConnectionError,
)
from .lease import AsyncLeaseKeeper, process_async
from .operations import Delivery, Operations
from .transport import (
    Answers,
    auth_args,
    encode_requests,
    raise_for,
    tls_context,
)

__all__ = ["AsyncClient"]

T = TypeVar("T")
#: Bytes asked of the stream per read.
_ASYNC_RECEIVE_BYTES = 64 * 1024


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
                context = tls_context(options["tls"])
                if context is not None:
                    stream = self._stream = trio.SSLStream(
                        stream, context, server_hostname=options["server_hostname"] or host)
                    await stream.do_handshake()
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            await self._close()
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from exc
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
                raise ConnectTimeout(
                    f"no greeting from {host}:{port} within {timeout} s") from None
            raise
        return client

    async def __aexit__(self, *exc: object) -> None:
        if self._nursery_manager is not None:
            manager, self._nursery_manager = self._nursery_manager, None
            assert self._nursery is not None  # entered with the manager
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
        self._answers = Answers()
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
        args = auth_args(greeting, key, secret)
        if args is not None:
            await self._call("auth", args, lambda result: None)

    @property
    def greeting(self) -> Greeting:
        assert self._answers.greeting is not None
        return self._answers.greeting

    # Operations declares each method's result type once for both clients; here every method
    # returns an awaitable of it, which the type system cannot say of an inherited method.
    async def _call(self, op: str, args: dict[str, Any],  # type: ignore[override]
                    decode: Callable[[dict[str, Any]], T]) -> T:
        (response,) = await self._exchange(((op, args),))
        return raise_for(response, decode)

    async def _call_many(  # type: ignore[override]
            self, requests: Sequence[tuple[str, dict[str, Any]]],
            finish: Callable[[list[Response]], T]) -> T:
        return finish(await self._exchange(requests))

    async def _exchange(self, requests: Sequence[tuple[str, dict[str, Any]]]
                        ) -> list[Response]:
        """Write ``requests`` in one write and wait for their answers (see ``Client._send``
        for a request that cannot be encoded)."""
        if self._answers.failure is not None:
            raise self._answers.failure
        ids, frames, error = encode_requests(self._proto, requests)
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
                raise self._answers.failure or ConnectionClosed("connection closed")
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
                raise self._fail(ConnectionLost, f"connection lost: {exc}") from None
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
                raise self._fail(ConnectionLost, f"connection lost: {exc}") from None

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
                    self._fail(ConnectionLost, f"connection lost: {exc}")
                    return
                if not data:
                    self._fail(ConnectionLost, "the server closed the connection")
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
                    self._fail(type(answers.failure), answers.failure.message)
        except Exception as exc:  # a bug here must still wake every caller
            self._fail(LaminaConnectionError, f"client failure: {exc!r}")
        finally:
            if answers.failure is None:
                self._fail(ConnectionClosed, "the client closed the connection")

    def _fail(self, kind: type[LaminaConnectionError], reason: str) -> LaminaConnectionError:
        failure = self._answers.fail(kind, reason)
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
