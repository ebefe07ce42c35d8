"""One connection's answers on their way to its socket: the unsent cap, and the writer task.

    Connection.encode_answer ──> Outbox.send_frames ──> os.write / os.writev now (plain TCP,
                                                          │                   writer idle)
                                                          └──> bounded channel ──> writer task
                                                                 ──> stream.send_all, in pieces

Rules of the outbox (connection.py rules 3 and 5, as they apply to answers):

1. Frames go out in the order queued. The fast path writes to the socket's fd only while
   nothing is queued (the writer is idle), so nothing can be overtaken.
2. ``unsent_bytes + reserved_bytes <= max_unsent_bytes`` (4 x max_frame, DESIGN §4), and
   ``queued_frames`` never passes the frame channel's capacity (the reader asks :meth:`full`
   before each read: many small answers fill the channel long before the byte cap): a request
   whose answer may be large is handed to the applier only once :meth:`reserve` took the
   bound of its answer (always possible when this outbox holds nothing); the bound turns into
   the frame's real size when the answer is encoded (:meth:`release`, then queuing).
3. Every byte held here, unsent or reserved, is counted in the server's MemoryBudget too.
4. No copy of a large frame: frames under WRITE_COALESCE_BYTES are joined into one write, a
   larger one is sent as it is, in memoryview pieces of that size.
5. The client must take each piece within ``idle_timeout_s``; if it does not, the connection
   is torn down (``on_failure``): a client that does not read cannot hold memory for longer.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import trio

from .budget import BOUNDED_ANSWER_OPS, MemoryBudget, answer_bound_bytes
from lamina.wire.protocol import Request

__all__ = ["WRITE_COALESCE_BYTES", "Outbox"]

log = logging.getLogger("lamina.server")

#: Frames smaller than this are joined into one ``send_all`` while the writer catches up;
#: larger ones are sent as they are, in pieces of this size (rule 4).
WRITE_COALESCE_BYTES = 256 * 1024
#: Buffers one ``os.writev`` may take (POSIX guarantees at least 16; Linux takes 1024).
_IOV_MAX = 1024

Frame = bytes | memoryview


def _ignore() -> None:
    pass


class Outbox:
    """Rules 1-5 in the module docstring. ``on_failure`` tears the connection down (the
    socket failed, or the client took nothing for the idle timeout); ``on_progress`` tells
    the reader that bytes went out or a reservation ended (it may be waiting for room)."""

    def __init__(self, stream: trio.abc.Stream, peer: str, *, max_unsent_bytes: int,
                 idle_timeout_s: float, max_inflight: int, read_frames: int,
                 budget: MemoryBudget, at_once: bool,
                 on_failure: Callable[[], None], on_progress: Callable[[], None]) -> None:
        """``read_frames``: the most answers one read of the reader can bring (requests in
        it); the frame channel holds ``max_inflight`` more."""
        self.stream = stream
        self.peer = peer
        self.max_unsent_bytes = max_unsent_bytes
        self.idle_timeout_s = idle_timeout_s
        self.budget = budget
        self._on_failure = on_failure
        self._on_progress = on_progress
        # Plain TCP only: a TLS stream must encrypt through SSLStream.
        self.socket_fd = (stream.socket.fileno() if isinstance(stream, trio.SocketStream)
                          else None)
        #: Bytes queued for the writer and not yet sent; 0 means the writer is idle.
        self.unsent_bytes = 0
        #: Bounds of the answers to come for requests handed over (rule 2), by request id.
        self.reserved_bytes = 0
        self._reservations: dict[int, int] = {}
        #: A request applied in its reader's call is answered in it (no --fsync).
        self._at_once = at_once
        #: The connection is torn down: frames are discarded.
        self.dead = False
        #: Frames queued for the writer and not yet taken by it (at most ``capacity``).
        self.queued_frames = 0
        self._read_frames = read_frames
        self._capacity = max_inflight + read_frames
        self._frames_in, self._frames_out = trio.open_memory_channel[Frame](self._capacity)

    # -- rule 2: reservations ------------------------------------------------------------------

    def full(self, outstanding: int) -> bool:
        """Rule 2, for the reader: no room for another read, whose requests' answers join the
        ``outstanding`` ones to come: bytes held past the cap, or too few free frames."""
        return (self.unsent_bytes + self.reserved_bytes > self.max_unsent_bytes
                or self.queued_frames + outstanding + self._read_frames > self._capacity)

    def reserve(self, request_id: int, bound: int) -> bool:
        """Count ``bound`` bytes for the answer to ``request_id`` if they fit the cap (always
        when nothing is held) and the server's budget; -> whether they did."""
        held = self.unsent_bytes + self.reserved_bytes
        if (held and held + bound > self.max_unsent_bytes) or not self.budget.fits(bound):
            return False
        self.reserved_bytes += bound
        self.budget.take(bound)
        self._reservations[request_id] = bound
        return True

    def needs_reservation(self) -> bool:
        """Rule 2 for a lone read: False without --fsync when a reservation would fit (nothing
        is held, the budget has room for the cap, which no bound passes) and be given back,
        unseen, before the reader's call returns (where the answer is written, or its wait
        begun, which gives it back at once)."""
        return (not self._at_once or bool(self.unsent_bytes or self.reserved_bytes)
                or not self.budget.fits(self.max_unsent_bytes))

    def reserve_all(self, requests: list[Request], max_frame: int) -> bool:
        """Reserve the bound of every large answer ``requests`` may get, or none (-> False)."""
        reserved: list[int] = []
        for request in requests:
            if request.op in BOUNDED_ANSWER_OPS:
                if not self.reserve(request.id, answer_bound_bytes(request, max_frame)):
                    for request_id in reserved:
                        self.release(request_id)
                    return False
                reserved.append(request.id)
        return True

    def release(self, request_id: int) -> None:
        """The answer to ``request_id`` is encoded (or will come much later: a waiting
        receive); its own size counts once queued."""
        if self._reservations:
            bound = self._reservations.pop(request_id, 0)
            if bound:
                self.reserved_bytes -= bound
                self.budget.give_back(bound)

    def close(self) -> None:
        """The connection ended: discard everything and give every byte back to the budget.
        The socket closes after this and its fd number may be reused at once: nothing is
        written through the raw fd any more."""
        self.socket_fd = None
        self.dead = True
        # The callbacks are the connection's: dropping them frees the connection (and what
        # its reader buffered) as soon as it is gone, not at the next full garbage collection.
        self._on_failure = self._on_progress = _ignore
        self._frames_in.close()
        while True:  # freed now, not when the cyclic collector finds this connection
            try:
                self._frames_out.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        self.budget.give_back(self.unsent_bytes + self.reserved_bytes)
        self.unsent_bytes = self.reserved_bytes = self.queued_frames = 0
        self._reservations.clear()

    # -- queuing -------------------------------------------------------------------------------

    def send_frames(self, frames: list[bytes]) -> None:
        """Queue ``frames`` in order (one ``writev`` while the writer is idle, never joined
        into one more copy)."""
        if len(frames) == 1:
            self.queue_frame(frames[0])
        else:
            self._queue_frames(frames)

    def queue_frame(self, frame: Frame) -> None:
        if self.dead:
            return
        if self.socket_fd is not None and self.unsent_bytes == 0:
            # Fast path: nothing is queued and the writer is idle, so no frame can be
            # overtaken; write what the socket takes now and queue only the rest. Saves a
            # task switch per answer on the round-trip path.
            try:
                written = os.write(self.socket_fd, frame)
            except BlockingIOError:
                written = 0
            except OSError:
                self._on_failure()
                return
            if written == len(frame):
                return
            frame = memoryview(frame)[written:]
        self._to_writer(frame)

    def _queue_frames(self, frames: list[bytes]) -> None:
        if self.dead:
            return
        first = 0
        if self.socket_fd is not None and self.unsent_bytes == 0:  # as in queue_frame
            try:
                written = os.writev(self.socket_fd, frames[:_IOV_MAX])
            except BlockingIOError:
                written = 0
            except OSError:
                self._on_failure()
                return
            while first < len(frames) and written >= len(frames[first]):
                written -= len(frames[first])
                first += 1
            if written:
                self._to_writer(memoryview(frames[first])[written:])
                first += 1
        for frame in frames[first:]:
            self._to_writer(frame)

    def _to_writer(self, frame: Frame) -> None:
        if self.dead:
            return
        try:
            self._frames_in.send_nowait(frame)
        except trio.WouldBlock:  # cannot happen while the reader's limits hold; never drop
            log.error("frame channel full; closing", extra={"peer": self.peer})
            self._on_failure()
            return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.dead = True
            return
        self.queued_frames += 1
        self.unsent_bytes += len(frame)
        self.budget.take(len(frame))

    def end(self) -> None:
        """Nothing more will be queued: the writer ends once it sent what is queued."""
        self._frames_in.close()

    # -- the writer task -----------------------------------------------------------------------

    async def run_writer(self) -> None:
        frames = self._frames_out
        carried: Frame | None = None
        try:
            while True:
                if carried is None:
                    try:
                        frame = await frames.receive()
                    except trio.EndOfChannel:
                        return
                    self.queued_frames -= 1
                else:
                    frame, carried = carried, None
                size = len(frame)
                if size < WRITE_COALESCE_BYTES:  # rule 4: join small frames, never a large one
                    pending = [frame]
                    while True:
                        try:
                            more = frames.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                        self.queued_frames -= 1
                        if size + len(more) > WRITE_COALESCE_BYTES:
                            carried = more
                            break
                        pending.append(more)
                        size += len(more)
                    if len(pending) > 1:
                        frame = b"".join(pending)
                if not await self._send(frame):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._on_failure()

    async def _send(self, frame: Frame) -> bool:
        """Rule 5: send ``frame`` in pieces, each taken within the idle timeout; -> False when
        the client took nothing for that long (the connection is then torn down)."""
        view = memoryview(frame)
        for offset in range(0, len(view), WRITE_COALESCE_BYTES):
            piece = view[offset:offset + WRITE_COALESCE_BYTES]
            with trio.move_on_after(self.idle_timeout_s):
                await self.stream.send_all(piece)
                self.unsent_bytes -= len(piece)
                self.budget.give_back(len(piece))
                self._on_progress()
                continue
            log.info("client took no answer for the idle timeout; closing",
                     extra={"event": "write_timeout", "peer": self.peer,
                            "unsent_bytes": self.unsent_bytes})
            self._on_failure()
            return False
        return True
