"""The applier's receives (applier.py): one attempt, the wait that follows when it found
nothing, and the retries of waiters whose tags became due (waiters.py rules 2, 3).

    receive ──attempt──> deliveries: answered
               └──nothing, may wait──> Waiter (its engine arguments checked and kept)
    a request marks a tag due ──> retries, oldest first ──> answers: in the group's replies,
                                                             or written at once (a lone request)

Rules:

1. A waiter keeps the engine arguments its receive was checked with (``wait`` taken out) and
   its frame budget: a retry calls the engine with them as they are, no copy, no new budget.
2. Waiters of a tag are retried oldest first until one finds nothing; a retry may itself make
   a tag due, so the rounds are bounded (``SERVE_ROUNDS``) and whatever stays due is served by
   the next group's edge.
3. A claimed waiter (waiters.py rule 3) is answered either through a group's replies (answered
   once the group is durable) or, on the lone path without ``--fsync`` where every engine
   operation is written when it returns, at once: the woken receives before the request that
   woke them (PROTOCOL.md's order).
"""

from __future__ import annotations

import time
from typing import Any, Callable, cast

import trio

from lamina.engine import Engine
from lamina.engine.errors import LaminaError, QueueNotFound, TagNotFound
from lamina.wire.protocol import Request

from .bugs import internal_error
from .dispatch import Answer, ReceiveAnswer, receive_budget, wait_seconds
from .groups import Reply, outcome
from .metrics import ServerMetrics
from .ports import Requester
from .waiters import Waiter, WaitingReceives, tag_key

__all__ = ["NO_MESSAGES", "Receives", "SERVE_ROUNDS"]

#: Rule 2: rounds of retries in one serving.
SERVE_ROUNDS = 3
NO_MESSAGES = ReceiveAnswer([])


class Receives:
    """Receives and their waiters for the applier: ``attempt`` a receive, ``serve`` the due
    waiters, ``end_waits_on_deleted``. ``engine`` is set by the applier's ``attach``."""

    def __init__(self, waiting: WaitingReceives, metrics: ServerMetrics, max_frame_bytes: int,
                 on_wait_added: Callable[[float], None]) -> None:
        self.engine: Engine = None  # type: ignore[assignment]  # the applier's attach() sets it
        self.waiting = waiting
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self._on_wait_added = on_wait_added
        #: No new wait starts (shutdown).
        self.stopping = False

    def attempt(self, connection: Requester, request: Request, caller: str | None,
                started: float) -> ReceiveAnswer | None:
        """One attempt; if it found nothing and may wait, register a waiter (-> None)."""
        args = request.args
        wait_s = wait_seconds(args)
        budget = receive_budget(request.id, args.get("max", 1), self.max_frame_bytes)
        answer = ReceiveAnswer(self.engine.receive_columns(**args, max_bytes=budget,
                                                           caller=caller))
        if answer.deliveries:
            return answer
        if wait_s is None:
            wait_s = self.engine.queue_attributes(args["queue"])["polling_wait"]
        if wait_s <= 0 or self.stopping:
            return answer
        deadline = trio.current_time() + wait_s
        waiter = Waiter(connection, connection.answer, request.id, started, args, caller,
                        deadline, tag_key(args["queue"], args.get("tag")), max_bytes=budget)
        if not connection.start_wait(waiter):  # ending, or at its max_waiting
            return answer
        self.waiting.add(waiter)
        self._on_wait_added(deadline)
        return None

    def serve(self, replies: list[Reply] | None) -> None:
        """Rule 2: retry the waiters of due tags; their answers go to ``replies``, or (None)
        out at once (rule 3)."""
        waiting = self.waiting
        receive = self.engine.receive_columns
        for _ in range(SERVE_ROUNDS):
            due = waiting.take_due()
            if not due:
                return
            for key in due:
                for waiter in waiting.waiting_on(key):
                    answer: Answer
                    try:  # rule 1
                        answer = ReceiveAnswer(receive(**waiter.args, max_bytes=waiter.max_bytes,
                                                       caller=waiter.caller))
                    except LaminaError as exc:
                        answer = exc.with_traceback(None)
                    except Exception as exc:
                        answer = internal_error("receive", exc)
                    if type(answer) is ReceiveAnswer and not answer.deliveries:
                        break
                    self.claim(waiter, answer, replies)

    def claim(self, waiter: Waiter, answer: Answer, replies: list[Reply] | None) -> None:
        """Answer ``waiter`` for the applier (waiters.py rule 3; this module's rule 3)."""
        self.waiting.remove(waiter)
        waiter.claimed = True
        waiter.owner.forget_wait(waiter)
        if replies is None:
            waiter.answer(waiter.request_id, answer)
            self.metrics.observe("receive", outcome(answer),
                                 time.perf_counter() - waiter.op_started)
        else:
            # Every waiter's owner is the Requester of its receive (``attempt``).
            replies.append(Reply(cast(Requester, waiter.owner), waiter.request_id, answer,
                                 "receive", waiter.op_started))

    def end_waits_on_deleted(self, op: str, args: dict[str, Any],
                             replies: list[Reply]) -> None:
        """DESIGN §2: delete_queue / delete_tag end their waits with QueueNotFound /
        TagNotFound."""
        queue = args["queue"]
        if op == "delete_queue":
            waiters = self.waiting.on_queue(queue)
            error: LaminaError = QueueNotFound(f"queue: {queue!r} was deleted", field="queue")
        else:
            waiters = self.waiting.on_tag(queue, args["tag"])
            error = TagNotFound(f"tag: {args['tag']!r} was deleted", field="tag")
        for waiter in waiters:
            self.claim(waiter, error, replies)
