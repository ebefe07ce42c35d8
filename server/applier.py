"""The applier: the one task that calls the engine (server.py rule 1), with its inbox, group
commit, WAL syncer (--fsync), waiting receives and long work.

    connection / bridge ──Work──> inbox ──> group: deadlines, waiters, requests, EngineJobs
                        └──apply_now (rule 6)──┘          │
                                         syncer (rule 7) ─┴─> answers to each Requester

The rules it keeps are server.py's rules 1-4, 6 and 7. It knows the server's other parts only
through narrow interfaces (ports.py): a request's origin is a ``Requester``; the server's
lifetime (server.py) gives it callbacks for its timers and for ``server_info``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import trio

from lamina.engine import Engine
from lamina.engine.errors import (
    InternalError,
    InvalidArgument,
    LaminaError,
    QueueNotFound,
    TagNotFound,
    Unauthorized,
)

from lamina.wire.protocol import Request

from .bugs import internal_error
from .dispatch import Answer, Continuation, MapAnswer, check_request
from .groups import (TICK, AppliedGroup, EngineJob, Refusal, Reply, group_failure, item_weight,
                     outcome)
from .keyring import KeyRing, ServerKey
from .longwork import LongWork
from .metrics import ServerMetrics
from .ports import Requester, Work
from .receives import NO_MESSAGES, Receives
from .waiters import Waiter, WaitingReceives

__all__ = ["EngineJob", "GroupApplier", "TICK"]

log = logging.getLogger("lamina.server")

#: Rule 2: one group commit holds at most this many requests, or about this many bytes.
GROUP_MAX_REQUESTS = 1000
GROUP_MAX_BYTES = 4 * 1024 * 1024
#: Inbox items (each the requests of one read, a tick or a job): readers wait when it is full.
INBOX_CAPACITY = 1024
#: Rule 7: checkpoints before a WAL sync: one for trio to poll the sockets, one for the
#: readers with requests ready to apply them, so that they share the sync.
SYNC_GATHER_CHECKPOINTS = 2
#: Ops answered without an engine call: the engine's next deadline cannot have moved.
_NO_ENGINE_OPS = frozenset({"ping", "server_info", "auth"})


class GroupApplier:
    """Applies every request of the server in group commits (the ``Applier`` of ports.py).

    ``attach(engine)`` before ``open_inbox()`` and the task ``run()``; ``server_info`` gives
    ``server_info``'s answer, ``on_deadline_changed`` is called when the engine's next
    deadline (``deadline_ms``) moved, ``on_wait_added`` with each new wait's deadline.
    """

    def __init__(self, *, max_frame_bytes: int, clock: Callable[[], int],
                 metrics: ServerMetrics, keys: KeyRing, auth_required: bool,
                 server_info: Callable[[], dict[str, Any]],
                 on_deadline_changed: Callable[[], None],
                 on_wait_added: Callable[[float], None]) -> None:
        self.engine: Engine = None  # type: ignore[assignment]  # attach() sets it
        self.max_frame_bytes = max_frame_bytes
        self.clock = clock
        self.metrics = metrics
        #: The API keys in force (the server replaces them on reload).
        self.keys = keys
        self.auth_required = auth_required
        self._server_info = server_info
        self._on_deadline_changed = on_deadline_changed
        self.waiting = WaitingReceives()
        self.receives = Receives(self.waiting, metrics, max_frame_bytes, on_wait_added)
        self.long_work = LongWork()  # long work running in chunks (longwork.py)
        #: WAL syncs done (``--fsync``): one per group commit that wrote something.
        self.syncs = 0
        self._groups = 0  # but the lone requests answered (``groups``)
        #: The engine's next deadline (the server's timer sleeps until it), and whether a TICK
        #: for it is queued.
        self.deadline_ms: int | None = None
        self.tick_pending = False
        self.done = trio.Event()  # everything read is applied, committed and answered
        self._inbox_send: trio.MemorySendChannel[Any] | None = None
        self._inbox: trio.MemoryReceiveChannel[Any] | None = None
        #: Rule 6: the applier waits on an empty inbox (cleared by every send to it).
        self._applier_idle = False
        #: Rule 7: groups applied and waiting for the next WAL sync, oldest first.
        self._awaiting_sync: list[AppliedGroup] = []
        self._sync_failed = False  # the last sync failed: the next one may not be skipped
        self._sync_wake = trio.Event()
        self._applying_done = False  # the applier has applied its last group

    @property
    def groups(self) -> int:
        """Group commits applied; a lone request answered alone is one, counted (for its
        path's sake) only by the metrics."""
        return self._groups + self.metrics.lone_group_count

    @property
    def stopping(self) -> bool:
        """No new wait starts (shutdown)."""
        return self.receives.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.receives.stopping = value

    def attach(self, engine: Engine) -> None:
        self.engine = self.receives.engine = engine
        engine.on_activity = self.waiting.mark_due
        self.deadline_ms = engine.next_deadline()

    def open_inbox(self) -> None:
        self._inbox_send, self._inbox = trio.open_memory_channel[Any](INBOX_CAPACITY)

    def close_inbox(self) -> None:
        """Shutdown: once every clone is closed too, the applier applies what is left and
        ends (``done``)."""
        assert self._inbox_send is not None
        self._inbox_send.close()

    def caller_of(self, requester: Requester) -> str | None:
        """The engine's ``caller`` for a request: None without auth and for admin keys."""
        if not self.auth_required:
            return None
        key = self.keys.get(requester.key_id)
        if key is None:
            raise Unauthorized("the key of this connection is no longer valid")
        return None if key.admin else key.key_id

    def key(self, key_id: object) -> ServerKey | None:
        return self.keys.get(key_id)

    def end_wait(self, waiter: Waiter) -> None:
        """End a wait with ``[]`` unless the applier has claimed it (waiters rule 3)."""
        waiter.owner.forget_wait(waiter)
        if not waiter.claimed and self.waiting.remove(waiter):
            waiter.claimed = True
            waiter.answer(waiter.request_id, NO_MESSAGES)
            self.metrics.observe("receive", "ok", time.perf_counter() - waiter.op_started)

    def drop_wait(self, waiter: Waiter) -> None:
        self.waiting.remove(waiter)

    def _set_deadline(self) -> None:
        deadline = self.engine.next_deadline()
        if deadline != self.deadline_ms:
            self.deadline_ms = deadline
            self._on_deadline_changed()

    def _run_due_deadlines(self) -> None:
        target = self.deadline_ms
        if target is None or target > self.clock():
            return
        self.tick_pending = False
        try:
            due = self.engine.process_deadlines()
        except LaminaError as exc:  # e.g. the engine is closed: no request fails for it
            log.error("processing deadlines failed: %s", exc, extra={"event": "deadlines"})
            due = []
        for queue, tag in due:
            self.waiting.mark_due(queue, tag)
        self.deadline_ms = self.engine.next_deadline()

    async def run_job(self, fn: Callable[[Engine], Any]) -> Any:
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

    def apply_requests_now(self, requester: Requester, requests: list[Request],
                           started: float) -> bool:
        """``apply_now`` of the requests of one read (a client awaiting their answers), one
        group, applied and answered here without a Work or a group's bookkeeping unless more
        is to do (due deadlines, a wait ended, or more than the lone wait begun or the
        waiters woken that this path answers itself: a group as any; with --fsync any waiters
        woken). With --fsync the answers are settled for the syncer (rule 7)."""
        if len(requests) == 1:
            return self.apply_lone_now(requester, requests[0], started)
        if not self._applier_idle:
            return False
        if self.waiting.any_due or self._deadline_passed():
            self._commit_group((Work(requester, requests, 0, started),), len(requests))
            return True
        replies: list[Reply] = []  # waits ended by a request, which make it a group
        answers: list[Answer] = []
        fsync = self.engine.fsync
        for request in requests:
            answer = self._answer_of(requester, request, started, replies)
            if answer is not None and self.waiting.any_due and not (answers or replies or fsync):
                # The first request of the read woke waiters (the answers of requests before
                # it would go out before theirs; due deadlines run first: a group for both).
                if not self._deadline_passed():
                    answer = self._answer_woken(answer)
            if answer is None or replies or self.waiting.any_due:
                self._finish_as_group(requester, requests, answers, answer, replies, started)
                return True
            answers.append(answer)
        if self._deadline_passed():
            self._finish_as_group(requester, requests, answers, None, [], started, done=True)
            return True
        if fsync:  # the answers wait for the WAL sync (rule 7)
            owed = [Reply(requester, request.id, answer, request.op, started)
                    for request, answer in zip(requests, answers)]
            self._settle(AppliedGroup((), owed, [], None, len(requests), started))
            return True
        self._groups += 1
        metrics = self.metrics
        frames = [requester.encode_answer(request.id, answer)
                  for request, answer in zip(requests, answers)]
        requester.send_frames([frame for frame in frames if frame is not None])
        seconds = time.perf_counter() - started
        for request, answer in zip(requests, answers):
            metrics.observe(request.op, outcome(answer), seconds)
        metrics.observe_group(len(requests), seconds)
        self._set_deadline()
        return True

    def apply_lone_now(self, requester: Requester, request: Request, started: float) -> bool:
        """``apply_requests_now`` of a read of one request (the commonest: a client awaiting
        each answer), the same steps without the loop over the read's requests."""
        if not self._applier_idle:
            return False
        waiting = self.waiting
        deadline = self.deadline_ms  # _deadline_passed, in line (twice a request)
        if waiting.any_due or (deadline is not None and deadline <= self.clock()):
            self._commit_group((Work(requester, [request], 0, started),), 1)
            return True
        replies: list[Reply] = []  # waits ended by the request, which make it a group
        answer = self._answer_of(requester, request, started, replies)
        if answer is None:  # a lone wait began (or long work)
            if not (replies or waiting.any_due):
                if not self._deadline_passed():
                    self._groups += 1
                    self._set_deadline()
                    self.metrics.observe_group(1, time.perf_counter() - started)
                    return True
            self._finish_as_group(requester, [request], [], None, replies, started)
            return True
        if replies or waiting.any_due:
            if not (replies or self.engine.fsync):  # it woke waiters: answered first, here
                if not self._deadline_passed():
                    answer = self._answer_woken(answer)
            if replies or waiting.any_due:
                self._finish_as_group(requester, [request], [], answer, replies, started)
                return True
        deadline = self.deadline_ms
        if deadline is not None and deadline <= self.clock():
            self._finish_as_group(requester, [request], [answer], None, [], started, done=True)
            return True
        op = request.op
        if self.engine.fsync:  # the answer waits for the WAL sync (rule 7)
            self._settle(AppliedGroup((), [Reply(requester, request.id, answer, op, started)], [],
                                      None, 1, started))
            return True
        requester.answer(request.id, answer)  # a group of one, counted by the metrics
        if isinstance(answer, LaminaError):
            self.metrics.observe_alone(op, answer.code, time.perf_counter() - started)
        else:
            self.metrics.observe_lone(op, time.perf_counter() - started)
        if op not in _NO_ENGINE_OPS:  # else only due deadlines moved it (none)
            self._set_deadline()
        return True

    def _deadline_passed(self) -> bool:
        """Whether the engine's next deadline (moved by each operation) is due now."""
        deadline = self.deadline_ms
        return deadline is not None and deadline <= self.clock()

    def _answer_woken(self, answer: Answer) -> Answer:
        """Without --fsync, the first request of a read answered now made waiters' tags due
        (a send to a queue a receive waits on): serve them, answering the receives it woke at
        once, before it (receives.py rule 3); -> its answer (a group's failure if serving
        failed outside any one receive)."""
        receives = self.receives
        try:
            receives.serve(None)
            if self.waiting.any_due:  # a retry made more due: the group's edge would serve it
                receives.serve(None)
        except Exception as exc:
            return group_failure(exc)
        return answer

    def _finish_as_group(self, requester: Requester, requests: list[Request],
                         answers: list[Answer], answer: Answer | None, ended: list[Reply],
                         started: float, done: bool = False) -> None:
        """The rest of ``apply_requests_now``'s group as ``_apply_group`` does it: the first
        ``len(answers)`` requests are answered, the next one (unless ``done``) answered
        ``answer`` (None: not yet) after ending the waits of ``ended``."""
        replies = [Reply(requester, request.id, given, request.op, started)
                   for request, given in zip(requests, answers)] + ended
        applied = len(requests) if done else len(answers) + 1
        failure: LaminaError | None = None
        try:
            if self.waiting.any_due:  # woken waits are answered first (``_apply_work``)
                self.receives.serve(replies)
            if answer is not None:
                last = requests[len(answers)]
                replies.append(Reply(requester, last.id, answer, last.op, started))
            if applied < len(requests):
                self._apply_work(Work(requester, requests[applied:], 0, started), replies)
            self._group_edge(replies)
        except Exception as exc:
            failure = group_failure(exc)
        self._settle(AppliedGroup((), replies, [], failure, len(requests), started))

    async def run(self) -> None:
        """The applier's task: until the inbox is closed and empty (rule 5 of server.py)."""
        inbox = self._inbox
        assert inbox is not None
        try:
            # One engine group for the applier's life: the engine never syncs an operation
            # by itself; with --fsync the syncer syncs what the groups wrote (rule 7).
            with self.engine.group():
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
            self.done.set()

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
                count, nbytes = item_weight(items[0]) if items else (0, 0)
                while items and count < GROUP_MAX_REQUESTS and nbytes < GROUP_MAX_BYTES:
                    try:
                        item = inbox.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    items.append(item)
                    more, size = item_weight(item)
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
        self._settle(AppliedGroup(items, replies, jobs, failure, count, started))

    def _settle(self, group: AppliedGroup) -> None:
        """Answer an applied group now, or once a WAL sync covers it (rule 7)."""
        if self.engine.fsync and (self._awaiting_sync or self._sync_needed()):
            self._awaiting_sync.append(group)
            self._sync_wake.set()
        else:
            self._answer_group(group)

    def _sync_needed(self) -> bool:
        """Whether anything written is not yet synced (the engine says; a failed sync leaves
        that unknown, so the next one is never skipped)."""
        return self._sync_failed or self.engine.needs_sync

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
                     ) -> tuple[list[Reply], list[EngineJob], LaminaError | None]:
        """Apply ``items`` in one engine group (rules 1, 3, 4); -> the replies to send, the
        jobs run, and the failure that replaces every answer if the group's write failed."""
        replies: list[Reply] = []
        jobs: list[EngineJob] = []
        failure: LaminaError | None = None
        engine = self.engine
        waiting = self.waiting
        try:
            # A chunk of long work is a group of its own (longwork.py rule 2): the groups
            # of requests around it, or a TICK, apply the deadlines.
            chunk = not items and bool(self.long_work)
            if not chunk:
                self._group_edge(replies)
            elif waiting.any_due:
                self.receives.serve(replies)
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
                    engine, lambda *reply: replies.append(Reply(*reply)),
                    lambda work: self._apply_work(work, replies))
                if waiting.any_due:
                    self.receives.serve(replies)
            else:
                self._group_edge(replies)
        except Exception as exc:
            failure = group_failure(exc)
        return replies, jobs, failure

    def _group_edge(self, replies: list[Reply]) -> None:
        """At a group's start and end: the engine's due deadlines, then the waiters of the tags
        they (or the group) made due (rule 3)."""
        if self.deadline_ms is not None:
            self._run_due_deadlines()
        if self.waiting.any_due:
            self.receives.serve(replies)

    def _answer_group(self, group: AppliedGroup) -> None:
        """Queue every answer of a durable group; the answers of one connection go out in
        one write."""
        self._groups += 1
        now = time.perf_counter()
        observe = self.metrics.observe
        failure = group.failure
        frames: dict[Requester, list[Any]] = {}
        replies: list[Any] = group.replies
        for index, reply in enumerate(replies):
            # Dropped once encoded: a receive's or peek's records (up to max_frame) are not
            # held beside their frame (budget.py counts the frames).
            replies[index] = None
            answer: Answer = reply.answer
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

    def _apply_work(self, work: Work, replies: list[Reply]) -> None:
        waiting, long_work = self.waiting, self.long_work
        connection, started = work.connection, work.started
        for index, request in enumerate(work.requests):
            if long_work and long_work.defer(work, index):
                return  # behind this connection's long work (longwork.py rule 1)
            args = request.args
            answer = (args.error if type(args) is Refusal
                      else self._answer_of(connection, request, started, replies))
            # Receives it woke are answered before it: they waited longest, and each answer
            # written wakes its client, a cost on the path of the answers written after it.
            if waiting.any_due:
                self.receives.serve(replies)
            if answer is not None:
                replies.append(Reply(connection, request.id, answer, request.op, started))

    def _answer_of(self, connection: Requester, request: Request, started: float,
                   replies: list[Reply]) -> Answer | None:
        """Apply one request; -> its answer, or None when it is answered later (a waiting
        receive, long work). The answers of waits it ends go to ``replies``."""
        op, args = request.op, request.args
        answer: Answer
        try:
            operation = check_request(op, args)
            caller = self.caller_of(connection) if self.auth_required else None
            queue = args.get("queue")
            run = operation.run
            if op == "receive":
                received = self.receives.attempt(connection, request, caller, started)
                if received is None:
                    return None  # waiting
                answer = received
            elif run is None:  # answered by the server itself
                if op == "ping":
                    answer = MapAnswer({"time": self.clock()})
                elif op == "server_info":
                    answer = MapAnswer(self._server_info())
                else:
                    raise InvalidArgument("key", "this connection is already authenticated"
                                          if self.auth_required
                                          else "this server does not use authentication")
            else:  # dispatch.apply_operation in line: its failures are those caught below
                result = run(self.engine, args, caller, request.id, self.max_frame_bytes)
                if isinstance(result, Continuation):  # long work: its next chunks come later
                    self.long_work.start(connection, request.id, op, started, result)
                    if self._applier_idle and self._inbox_send is not None:
                        self.try_enqueue(self._inbox_send, TICK)  # wake it for them
                    return None
                answer = result
                if op in ("delete_queue", "delete_tag") and not isinstance(answer, LaminaError):
                    self.receives.end_waits_on_deleted(op, args, replies)
        except LaminaError as exc:
            answer = exc.with_traceback(None)
        except Exception as exc:  # a bug in this request alone (rule 4)
            answer = internal_error(op, exc)
        else:
            # Only a queue that passed the engine's name and permission checks is counted, so
            # a client cannot grow the tally with names of its own (metrics.count_traffic).
            if type(queue) is str and not isinstance(answer, LaminaError):
                self.metrics.count_traffic(queue)
        return answer
