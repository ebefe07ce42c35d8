"""A blocking Redis client for the comparator, with the care of Lamina's own ``Client``: one
socket (``TCP_NODELAY``), commands encoded by ``hiredis.pack_command``, answers parsed by the
``hiredis`` C parser, and a batch of commands written with one ``sendall`` and answered in one
round trip (:meth:`RespConnection.pipeline`). Like ``Client`` it sleeps on its socket unless a
busy-poll window is given (``poll_us``: poll this long for each answer before sleeping).

Used in the bench's client processes only; hiredis is imported when a connection is made, so a
machine without it gets a clear error naming what to install.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from ..loadgen import BenchError

__all__ = ["RespConnection", "RespError", "import_hiredis"]

_READ_BYTES = 256 * 1024


class RespError(BenchError):
    """Redis answered a command with an error."""


def import_hiredis() -> Any:
    try:
        import hiredis
    except ImportError:
        raise BenchError("the Redis comparator needs the hiredis parser: pip install "
                         "'lamina[dev]' or pip install hiredis") from None
    return hiredis


class RespConnection:
    """One connection to a Redis server; :meth:`call` and :meth:`pipeline` return the
    answers (raising :class:`RespError` on an error answer)."""

    def __init__(self, address: tuple[str, int], *, timeout_s: float = 30.0,
                 poll_us: int = 0) -> None:
        hiredis = import_hiredis()
        self._pack = hiredis.pack_command
        self._reply_error = hiredis.ReplyError
        self._reader = hiredis.Reader()
        self._poll_s = poll_us / 1e6
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def encode(self, *args: Any) -> bytes:
        """One command in the wire format (for callers that write frames themselves)."""
        return self._pack(args)

    def call(self, *args: Any) -> Any:
        """One command, one round trip."""
        self.sock.sendall(self._pack(args))
        return self.read_answer()

    def pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Several commands in one write; their answers in order (one round trip)."""
        pack = self._pack
        self.sock.sendall(b"".join([pack(command) for command in commands]))
        return [self.read_answer() for _ in commands]

    def read_answer(self) -> Any:
        """The next answer, reading from the socket as needed."""
        reader = self._reader
        answer = reader.gets()
        while answer is False:
            reader.feed(self._receive())
            answer = reader.gets()
        if isinstance(answer, self._reply_error):
            raise RespError(f"redis answered: {answer}")
        return answer

    def feed(self, data: bytes) -> None:
        """Bytes read by the caller (a paced writer that reads when its socket is readable)."""
        self._reader.feed(data)

    def answers(self) -> list[Any]:
        """The answers complete in what was fed so far."""
        out = []
        while (answer := self._reader.gets()) is not False:
            if isinstance(answer, self._reply_error):
                raise RespError(f"redis answered: {answer}")
            out.append(answer)
        return out

    def _receive(self) -> bytes:
        if self._poll_s:
            end = time.perf_counter() + self._poll_s
            while True:
                try:
                    data = self.sock.recv(_READ_BYTES, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    if time.perf_counter() >= end:
                        data = self.sock.recv(_READ_BYTES)
                        break
        else:
            data = self.sock.recv(_READ_BYTES)
        if not data:
            raise BenchError("the Redis server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RespConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
