"""One accepted connection: its protocol state, its reader task and its writer task.

    socket ──reader──> ServerConnection ──Work──> server inbox ──> applier (engine, group commit)
                                            └──> applied in place while the applier idles ──┐
    socket <──writer── Outbox: bounded channel of frames <── answer() <─┘   (and waiter timeouts)
       ^────── written at once by answer() while the writer is idle (plain TCP) ──┘

The answers' side, with the unsent cap and the writer task, is ``outbox.py``.

On plain TCP the reader reads the socket's fd itself and the answers of a small request are
written before the reader waits again: one task step per request (see ``_read_socket``). A
read holding a few requests after auth (the usual read of a client awaiting its answers) is
applied and answered in one synchronous call (inplace.py): no Work, no coroutine. While
other connections are reading too, a drained connection waits in the read hub
(readhub.py), which runs its reads (``read_step``) with theirs after one trio wait, and wakes
its task for whatever needs it (rules 2, 3, 5 and 6 hold: the task does that part as before).

Rules of a connection (each one lives in this file):

1. The greeting is sent first; the reader never parses anything before it is queued.
2. Requests go to the applier (``ports.Applier``) in the order they were read, so they take
   effect in arrival order (``apply_now`` may apply them in the reader's task: server.py rule 6),
   refused ones too (groups.Refusal). Only requests before authentication and waiting
   receives that time out are answered here; none of them touches the engine.
3. Backpressure, never dropping: the reader stops reading while ``max_inflight`` requests are
   unanswered, while its answers fill its outbox (outbox.py rule 2), (pre-auth) while a
   request is unanswered, and while the frame it is reading waits for the server's memory
   budget (budget.py rule 2). A request whose answer may be large is handed to the applier
   only once its bound fits this connection's ``4 x max_frame`` and the budget (budget.py
   rule 3), so unsent bytes never pass the cap. The frame channel is bounded above what those
   rules let in, so queuing a frame never blocks the applier.
4. Pre-auth (PROTOCOL §3): any op but ``auth`` is ``Unauthorized``; a failed ``auth`` is
   answered ``Unauthorized`` with one message for every cause and the connection closes;
   ``auth`` must succeed within ``auth_timeout_s`` of connecting or the connection closes.
5. Idle: no bytes and nothing unanswered (a waiting receive is not idle) for
   ``idle_timeout_s`` closes the connection; so does a writer that could send nothing of its
   answers for that long (a client that does not read); never sooner after its last answer.
6. Ending: after EOF, a protocol violation, a failed auth or a server shutdown, nothing more is
   read; waiting receives end with ``[]``; every request already read is answered; then (for a
   violation) the final ProtocolError frame; then the socket closes.
7. A failure of this connection (a reset, a bug) ends this connection only.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, cast

import trio

from lamina.wire.protocol import RejectedRequest, Request, ServerConnection, UnknownRequestId

from .budget import (BOUNDED_ANSWER_OPS, SMALL_BYTES, MemoryBudget, answer_bound_bytes,
                     unencodable)
from .dispatch import Answer
from .groups import refused
from .inplace import REQUEST_SLICE, answered_now, lone_answered_now
from .outbox import Outbox
from .ports import Applier, ConnectionLimits, Work
from .preauth import pre_auth_answer
from .readhub import SHARE_WINDOW_S, ReadHub
from .waiters import Waiter

__all__ = ["Connection", "Work"]

log = logging.getLogger("lamina.server")

#: Bytes asked of the socket per read.
RECEIVE_CHUNK_BYTES = 64 * 1024
#: The smallest request frame (``[1, "", {}]`` plus its prefix): a bound on how many requests
#: one read can complete, for sizing the frame channel (rule 3).
MIN_REQUEST_FRAME_BYTES = 8


class Connection:
    """State and tasks of one client connection (rules 1-7 in the module docstring)."""

    def __init__(self, applier: Applier, limits: ConnectionLimits, stream: trio.abc.Stream,
                 peer: str, *, budget: MemoryBudget,
                 on_read: Callable[[], None] | None, hub: ReadHub | None = None) -> None:
        """``applier`` applies this connection's requests; ``budget`` is the server's memory
        budget (budget.py); ``on_read`` is called when bytes came (busy polling; None: off)."""
        self.applier = applier
        self.limits = limits
        self.stream = stream
        self.peer = peer
        self.proto = ServerConnection(auth_required=limits.auth_required,
                                      max_frame_bytes=limits.max_frame_bytes)
        self.key_id: str | None = None
        self.waiters: set[Waiter] = set()
        self.budget = budget
        self._on_read = on_read
        self._hub = hub
        self._drained = False  # the hub's last read_step: the socket is empty (and below)
        self._eof = False
        self._unhandled: list[Any] | None = None  # events for _handle, and their bytes
        self._unhandled_bytes = 0
        self._sharing = False  # another connection read shortly before the last read
        self._hub_key = id(self)
        self.outbox = Outbox(
            stream, peer, max_unsent_bytes=4 * limits.max_frame_bytes,
            idle_timeout_s=limits.idle_timeout_s, budget=budget, at_once=limits.answers_at_once,
            max_inflight=limits.max_inflight,
            read_frames=RECEIVE_CHUNK_BYTES // MIN_REQUEST_FRAME_BYTES + 16,  # + greeting, error
            on_failure=self._died, on_progress=self.wake)
        # Plain TCP only: a TLS stream must encrypt through SSLStream.
        self._socket_fd = self.outbox.socket_fd
        self._input_granted = 0  # budget.py rule 2: the frame being read, granted
        self._input_wanted = 0   # ... or waiting for room
        self._resume: trio.Event | None = None
        self._all_answered: trio.Event | None = None
        self._read_scope: trio.CancelScope | None = None
        self._last_read = 0.0  # time.perf_counter(), plain TCP only (rule 5)
        self._busy_at_deadline = False  # the last idle deadline found something unanswered
        self._authenticated = trio.Event()
        # Made here, not in its task: _finish may cancel it before that task first runs.
        self._auth_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        #: No more requests will be read (rule 6): new waits end at once.
        self.reading_done = False
        self._stop_reading = False
        self._closing = False  # a failed auth: read nothing more

    @property
    def dead(self) -> bool:
        """The socket failed or the connection is torn down: answers are discarded."""
        return self.outbox.dead

    @property
    def unsent_bytes(self) -> int:
        """Answer bytes queued and not yet sent (outbox.py)."""
        return self.outbox.unsent_bytes

    # -- lifetime -----------------------------------------------------------------------------

    async def run(self, inbox: trio.MemorySendChannel[Any]) -> None:
        """Serve the connection until it ends (rule 6). ``inbox`` is this reader's clone."""
        try:
            await self._run(inbox)
        finally:
            # The socket closes after this returns and its fd number may be reused at once:
            # nothing may be read or written through the raw fd any more.
            self._socket_fd = None
            self.outbox.close()
            self.budget.forget(self)
            self.budget.give_back(self._input_granted)
            self._input_granted = 0
            for waiter in self.waiters:  # waiters rule 4 (a connection torn down mid-wait)
                self.applier.drop_wait(waiter)
            self.waiters.clear()

    async def _run(self, inbox: trio.MemorySendChannel[Any]) -> None:
        limits = self.limits
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.outbox.run_writer)
            self.outbox.queue_frame(self.proto.greeting(
                version=limits.version, idle_timeout_s=limits.idle_timeout_s,
                features=list(limits.features), max_inflight=limits.max_inflight,
                max_waiting=limits.max_waiting))
            if self.proto.pre_auth:
                nursery.start_soon(self._auth_deadline)
            try:
                async with inbox:
                    await self._reader(inbox)
            finally:
                self.reading_done = True
            await self._finish()

    def stop_reading(self) -> None:
        """Server shutdown: read nothing more; what was read is still applied and answered."""
        self._stop_reading = True
        if self._read_scope is not None:
            self._read_scope.cancel()
        self.wake()

    def abort(self) -> None:
        """Tear the connection down now (its requests already read are still applied)."""
        self.outbox.dead = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _finish(self) -> None:
        self._auth_scope.cancel()
        for waiter in list(self.waiters):
            self.applier.end_wait(waiter)
        while self.proto.outstanding_count and not self.dead:
            self._all_answered = trio.Event()
            await self._all_answered.wait()
        if self.proto.protocol_error is not None and not self.dead:
            self.outbox.queue_frame(self.proto.protocol_error_frame())
        self.outbox.end()

    async def _auth_deadline(self) -> None:
        with self._auth_scope:
            with trio.move_on_after(self.limits.auth_timeout_s):
                await self._authenticated.wait()
                return
            log.info("auth deadline passed; closing", extra={"event": "auth_timeout",
                                                              "peer": self.peer})
            self.abort()

    # -- reading ------------------------------------------------------------------------------

    def _may_read(self) -> bool:
        return (self.proto.outstanding_count < self.limits.max_inflight
                and not self.outbox.full(self.proto.outstanding_count) and not self._input_wanted)

    async def _wait_until_may_read(self) -> None:
        """Rule 3: park while this connection is over its limits (shutdown wakes it too).
        Not shielded: the idle deadline may end the wait (rule 5)."""
        while not self._may_read() and not (self._stop_reading or self.dead):
            self._resume = trio.Event()
            wanted = self._input_wanted
            if wanted:
                if self.budget.fits(wanted):
                    self._take_input(wanted)
                    continue
                self.budget.wait_for_room(self)
            await self._resume.wait()
        self._resume = None

    def _track_input(self) -> None:
        """budget.py rule 2, after each read: the frame being read, if large, holds a grant of
        its whole length; reading waits until it has one."""
        wanted = self.proto.front_frame_bytes
        if wanted <= SMALL_BYTES:
            wanted = 0
        if wanted == self._input_granted:  # the same frame (or one as long, just begun)
            if wanted:
                self.proto.collect_front_frame()
            return
        if self._input_granted:
            self.budget.give_back(self._input_granted)
            self._input_granted = 0
        if wanted:
            if self.budget.fits(wanted):
                self._take_input(wanted)
            else:
                self._input_wanted = wanted

    def _take_input(self, nbytes: int) -> None:
        self.budget.take(nbytes)
        self._input_granted = nbytes
        self._input_wanted = 0
        self.proto.collect_front_frame()  # granted: its memory is allocated once

    def wake(self) -> None:
        """Look again at what this connection waits for (budget room, drained answers)."""
        if self._resume is not None:
            self._resume.set()

    async def _reader(self, inbox: trio.MemorySendChannel[Any]) -> None:
        if self._socket_fd is not None:
            await self._read_socket(inbox)
        else:
            await self._read_stream(inbox)

    async def _read_stream(self, inbox: trio.MemorySendChannel[Any]) -> None:
        """Any stream (TLS): one ``receive_some`` per read, each under the idle deadline."""
        idle_s = self.limits.idle_timeout_s
        proto = self.proto
        while not (self._stop_reading or self._closing):
            data = None
            with trio.CancelScope(deadline=trio.current_time() + idle_s) as scope:
                self._read_scope = scope
                if self._stop_reading:
                    scope.cancel()
                await self._wait_until_may_read()
                if self._stop_reading or self.dead:
                    return
                try:
                    data = await self.stream.receive_some(RECEIVE_CHUNK_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
            self._read_scope = None
            if scope.cancelled_caught:
                if self._stop_reading:
                    return
                if not self._still_busy():
                    self._log_idle()
                    return
                continue
            if not data:
                return
            if self._on_read is not None:
                self._on_read()
            # A TLS stream may give a bytearray: the decoder reads any bytes-like.
            await self._handle(proto.receive_data(cast(bytes, data)), inbox, len(data),
                               time.perf_counter())
            if proto.protocol_error is not None:
                self._log_protocol_error()
                return
            self._track_input()

    async def _read_socket(self, inbox: trio.MemorySendChannel[Any]) -> None:
        """Plain TCP: read the socket's fd directly (``_socket_reads``).

        A cancel scope costs more than a small request, so one scope spans many reads: its
        deadline is the idle deadline as of its creation (rule 5). When it passes although bytes
        came meanwhile, or while something is unanswered, a new scope takes over. Inside it
        only the wait for bytes may be cancelled (by that deadline or by ``stop_reading``);
        everything done with bytes already read is shielded.
        """
        idle_s = self.limits.idle_timeout_s
        self._last_read = time.perf_counter()
        while not (self._stop_reading or self._closing):
            now = trio.current_time()
            # _last_read is read from time.perf_counter (one clock read a request serves it and
            # the request's start); the scope's deadline is on trio's clock.
            deadline = self._last_read + (now - time.perf_counter()) + idle_s
            with trio.CancelScope(deadline=deadline if deadline > now else now + idle_s
                                  ) as scope:
                self._read_scope = scope
                if self._stop_reading:
                    scope.cancel()
                await self._socket_reads(inbox)
            self._read_scope = None
            if not scope.cancelled_caught or self._stop_reading:
                return  # EOF, a protocol error, a failed auth, or shutdown
            if not self._still_busy() and time.perf_counter() - self._last_read >= idle_s:
                self._log_idle()
                return

    async def _socket_reads(self, inbox: trio.MemorySendChannel[Any]) -> None:
        """Read and handle until EOF, a protocol error, a failed auth or shutdown; the caller's
        scope may cancel the wait for bytes (see ``_read_socket``). While reads of others come
        close to this one's, the read hub (readhub.py) waits and reads (``read_step``)."""
        fd = self._socket_fd
        assert fd is not None
        proto, hub, applier, outbox = self.proto, self._hub, self.applier, self.outbox
        read, clock = os.read, time.perf_counter
        wait_readable = trio.lowlevel.wait_readable
        on_read = self._on_read
        drained = False  # the last read emptied the socket: wait before reading again
        max_inflight, max_frame = self.limits.max_inflight, self.limits.max_frame_bytes
        unanswered = proto.outstanding_ids  # (the codec's one set, changed in place)
        while not (self._stop_reading or self._closing):
            if (outbox.unsent_bytes or outbox.reserved_bytes or self._input_wanted or unanswered
                    and len(unanswered) >= max_inflight) and not self._may_read():
                await self._wait_until_may_read()
                if self._stop_reading or self.dead:
                    return
            if drained and self._sharing and hub is not None and hub.open:
                self._eof = False
                await hub.wait(fd, self)  # the hub ran read_step until one needed this task
                if self._eof:
                    return
                drained, events = self._drained, self._unhandled
                if events is not None:
                    self._unhandled = None
                    await self._handle(events, inbox, self._unhandled_bytes, self._last_read)
            else:
                if drained:
                    await wait_readable(fd)
                try:
                    data = read(fd, RECEIVE_CHUNK_BYTES)
                except BlockingIOError:
                    drained = True
                    continue
                except OSError:  # reset by the peer: the same as EOF here
                    data = b""
                if not data:
                    return
                self._last_read = now = clock()
                if hub is not None:
                    self._note_read(hub, now)
                if on_read is not None:
                    on_read()
                drained = len(data) < RECEIVE_CHUNK_BYTES
                got = proto.receive_request(data)
                if not isinstance(got, list):  # one request after auth, nothing buffered (so
                    # no check below)
                    if not lone_answered_now(applier, self, outbox, got, now, max_frame):
                        await self._handle([got], inbox, len(data), now)
                    if not drained:
                        await trio.lowlevel.checkpoint()
                    continue
                if not (got and not proto.pre_auth and answered_now(
                        applier, self, outbox, got, now, max_frame)):
                    await self._handle(got, inbox, len(data), now)
            if proto.protocol_error is not None:
                self._log_protocol_error()
                return
            if self._input_granted or proto.buffering:
                self._track_input()
            if not drained:
                await trio.lowlevel.checkpoint()  # more bytes are waiting: let others run

    def _note_read(self, hub: ReadHub, now: float) -> None:  # readhub.py rule 1
        self._sharing = (hub.last_reader != self._hub_key and now - hub.last_read_s
                         < SHARE_WINDOW_S and not self.proto.pre_auth)
        hub.last_reader, hub.last_read_s = self._hub_key, now

    def read_step(self) -> bool:
        """The read hub's read: one read as ``_socket_reads`` reads; what needs the task is left
        in ``_unhandled`` (for ``_handle``) and ``_eof``. True: done, the socket drained,
        nothing holds reading back, and it pays to wait in the hub (readhub.py rules 1, 2)."""
        try:
            data = os.read(self._socket_fd, RECEIVE_CHUNK_BYTES)  # type: ignore[arg-type]
        except BlockingIOError:
            self._drained = True
            return True
        except OSError:  # reset by the peer: the same as EOF here
            data = b""
        if not data:
            self._eof = True
            return False
        self._last_read = now = time.perf_counter()
        proto = self.proto
        self._note_read(self._hub, now)  # type: ignore[arg-type]  # (the hub runs this)
        if self._on_read is not None:
            self._on_read()
        drained = self._drained = len(data) < RECEIVE_CHUNK_BYTES
        events = proto.receive_data(data)
        if events and (proto.pre_auth or not answered_now(
                self.applier, self, self.outbox, events, now, self.limits.max_frame_bytes)):
            self._unhandled, self._unhandled_bytes = events, len(data)
            return False
        if proto.protocol_error is not None:
            return False
        if self._input_granted or proto.buffering:
            self._track_input()
        return drained and self._sharing and self._may_read() and not (
            self._stop_reading or self._closing)

    def _still_busy(self) -> bool:
        """Rule 5 at an idle deadline: something is unanswered now or was at the one before."""
        busy = self.proto.outstanding_count > 0
        was_busy, self._busy_at_deadline = self._busy_at_deadline, busy
        return busy or was_busy

    def _log_idle(self) -> None:
        log.info("idle connection closed", extra={"event": "idle_timeout", "peer": self.peer})

    def _log_protocol_error(self) -> None:
        assert self.proto.protocol_error is not None
        log.info("protocol error: %s", self.proto.protocol_error.message,
                 extra={"event": "protocol_error", "peer": self.peer})

    def _requests_of(self, events: list[Any]) -> list[Request]:
        """The requests among ``events`` that go to the engine; the others (pre-auth,
        rejected) are answered here (rules 2, 4)."""
        proto = self.proto
        if not proto.pre_auth:
            for event in events:
                if type(event) is not Request:
                    break
            else:
                return events  # the usual case: nothing to sort out
        requests: list[Request] = []
        while True:
            was_pre_auth = proto.pre_auth
            for event in events:
                if type(event) is not Request and type(event) is not RejectedRequest:
                    continue  # the violation that ends the events
                if proto.pre_auth:
                    self._pre_auth_request(event)
                else:  # a refused request is answered in its turn (groups.Refusal)
                    requests.append(refused(event) if isinstance(event, RejectedRequest) else event)
            # protocol.py rule 4: pre-auth, bytes after a request stay unparsed until it is
            # answered (done above); parse them now, under the limits now in force.
            if not (was_pre_auth and events) or self._closing or proto.protocol_error is not None:
                return requests
            events = proto.receive_data(b"")

    async def _handle(self, events: list[Any], inbox: trio.MemorySendChannel[Any],
                      nbytes: int, started: float) -> None:
        """Hand the requests of one read to the engine: in place when the server allows it
        (``Applier.apply_now``), else through the inbox. Waits are shielded: these requests
        were read, so they are applied and answered even if reading is cancelled."""
        requests = self._requests_of(events)
        if not requests:
            return
        applier = self.applier
        if len(requests) <= REQUEST_SLICE and self.outbox.reserve_all(
                requests, self.limits.max_frame_bytes):
            work = Work(self, requests, nbytes, started)
            if not (applier.apply_now(work) or applier.try_enqueue(inbox, work)):
                with trio.CancelScope(shield=True):
                    await applier.enqueue(inbox, work)
            return
        with trio.CancelScope(shield=True):
            await self._handle_slices(requests, inbox, nbytes)

    async def _handle_slices(self, requests: list[Request], inbox: trio.MemorySendChannel[Any],
                             nbytes: int) -> None:
        # Rule 3: slices of at most REQUEST_SLICE requests (others get in between); a request
        # whose answer may be large waits, with what came before it handed over, until its
        # bound fits (the answers it waits for are encoded by the applier, or sent).
        max_frame = self.limits.max_frame_bytes
        share = nbytes // len(requests)
        start = 0
        for index, request in enumerate(requests):
            if request.op in BOUNDED_ANSWER_OPS:
                bound = answer_bound_bytes(request, max_frame)
                if not self.outbox.reserve(request.id, bound):
                    if index > start:
                        await self._submit(requests[start:index], share, inbox)
                        start = index
                    while not self.outbox.reserve(request.id, bound):
                        if self.dead:
                            return  # nobody will take the answers: the rest is not applied
                        self._resume = trio.Event()
                        self.budget.wait_for_room(self)
                        await self._resume.wait()
                    self._resume = None
            if index + 1 - start == REQUEST_SLICE:
                await self._submit(requests[start:index + 1], share, inbox)
                start = index + 1
        if start < len(requests):
            await self._submit(requests[start:], share, inbox)

    async def _submit(self, requests: list[Request], share: int,
                      inbox: trio.MemorySendChannel[Any]) -> None:
        applier = self.applier
        work = Work(self, requests, share * len(requests), time.perf_counter())
        if applier.apply_now(work):
            # Applied in this task: others get in between slices, as between those sent on.
            await trio.lowlevel.checkpoint()
        elif not applier.try_enqueue(inbox, work):
            await applier.enqueue(inbox, work)

    def _pre_auth_request(self, request: Request | RejectedRequest) -> None:
        """Rule 4 (preauth.py). Runs here, not in the applier: it needs the key ring, not the
        engine."""
        reply = pre_auth_answer(request, self.applier.key, self.proto.nonce)
        if reply.key_id is not None:
            self.proto.authenticated()
            self.key_id = reply.key_id
            self._authenticated.set()
            log.info("authenticated", extra={"event": "auth", "peer": self.peer,
                                             "key": reply.key_id})
        elif reply.failed_auth:
            log.warning("failed auth", extra={"event": "auth_failed", "peer": self.peer})
            self._closing = True
        self.answer(request.id, reply.answer)

    # -- answering and writing ----------------------------------------------------------------

    def answer(self, request_id: int, answer: Answer) -> None:
        """Encode and queue the answer to ``request_id`` (never blocks; rule 3)."""
        frame = self.encode_answer(request_id, answer)
        if frame is not None:
            self.outbox.queue_frame(frame)
            if self._all_answered is not None or self._resume is not None:
                self._answers_sent()

    def send_frames(self, frames: list[bytes]) -> None:
        """Queue answer frames from :meth:`encode_answer`, in order (outbox.py)."""
        self.outbox.send_frames(frames)
        self._answers_sent()

    def _answers_sent(self) -> None:
        if self._all_answered is not None and self.proto.outstanding_count == 0:
            self._all_answered.set()
        if self._resume is not None:
            self._resume.set()

    def encode_answer(self, request_id: int, answer: Answer) -> bytes | None:
        """The frame answering ``request_id`` (no longer outstanding once this returns); queue
        it with :meth:`send_frames`. None if ``request_id`` is not awaiting an answer."""
        if self.outbox.reserved_bytes:
            self.outbox.release(request_id)  # the frame's own size counts once queued
        try:
            return self.proto.respond_answer(request_id, answer)
        except UnknownRequestId as exc:
            log.error("answer to an unknown request: %s", exc)
            return None
        except Exception as exc:  # over max_frame, our misuse of the codec, or not encodable
            return self.proto.respond_error(request_id, unencodable(request_id, answer, exc))

    def _died(self) -> None:
        self.outbox.dead = True
        if self._all_answered is not None:
            self._all_answered.set()
        self.wake()
        self.abort()

    # -- waiting receives ----------------------------------------------------------------------

    def start_wait(self, waiter: Waiter) -> bool:
        """Count ``waiter`` as this connection's (its timeout is the server's, waiters rule
        5); False if the connection is ending or has ``max_waiting`` waits already."""
        if (self._nursery is None or self.reading_done or self.dead
                or len(self.waiters) >= self.limits.max_waiting):
            return False
        self.waiters.add(waiter)
        # A wait may last long and must not hold back later requests (PROTOCOL §2): its answer
        # is counted when it comes, bounded by max_waiting answers of max_frame.
        self.outbox.release(waiter.request_id)
        return True

    def forget_wait(self, waiter: Waiter) -> None:
        """The wait is answered or gone (waiters rule 3)."""
        self.waiters.discard(waiter)
