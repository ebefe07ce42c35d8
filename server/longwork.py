"""Long work in chunks (DESIGN.md §3): an op whose engine call answers a ``Continuation`` (a
redrive of many dead letters) runs one chunk per group on the applier, so the requests of
other connections are applied between its chunks instead of waiting for all of it.

Rules:

1. Requests of one connection take effect in the order received (PROTOCOL.md §2): while a
   connection has long work running, its later requests (the rest of the same read too) wait
   in its backlog, and are applied right after the long work's answer, in order.
2. A chunk is a group of its own, run once the answers of the group before it are on their
   way: the next chunk of one long work (round robin when several run). Its answer, once
   there, goes out with that group's (so, with ``--fsync``, after the WAL sync that covers
   every chunk).
3. At shutdown, long work already started runs to its end and is answered like every request
   already read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .dispatch import Answer, Continuation, continue_operation
from .ports import Requester, Work

if TYPE_CHECKING:
    from lamina.engine import Engine

__all__ = ["LongWork"]


@dataclass(slots=True)
class _Running:
    request_id: int
    op: str
    started: float
    continuation: Continuation
    backlog: list[Work] = field(default_factory=list)


class LongWork:
    """The long work of every connection, and the requests waiting behind it."""

    def __init__(self) -> None:
        self._running: dict[Requester, _Running] = {}
        self._turns: deque[Requester] = deque()

    def __bool__(self) -> bool:
        """Whether a chunk is waiting to run."""
        return bool(self._turns)

    def start(self, connection: Requester, request_id: int, op: str, started: float,
              continuation: Continuation) -> None:
        self._running[connection] = _Running(request_id, op, started, continuation)
        self._turns.append(connection)

    def defer(self, work: Work, index: int) -> bool:
        """Rule 1: keep ``work.requests[index:]`` behind its connection's long work, if it has
        any (-> True: not to be applied now)."""
        running = self._running.get(work.connection)
        if running is None:
            return False
        running.backlog.append(Work(work.connection, work.requests[index:], 0, work.started))
        return True

    def step(self, engine: Engine, answered: Callable[[Requester, int, Answer, str, float],
                                                      None],
             apply_work: Callable[[Work], None]) -> None:
        """Rule 2: run the next chunk of the long work whose turn it is; once it answers, hand
        the answer to ``answered`` and apply its connection's backlog (``apply_work``)."""
        connection = self._turns.popleft()
        running = self._running[connection]
        answer = continue_operation(running.op, running.continuation, engine)
        if isinstance(answer, Continuation):
            running.continuation = answer
            self._turns.append(connection)
            return
        del self._running[connection]
        answered(connection, running.request_id, answer, running.op, running.started)
        for work in running.backlog:
            apply_work(work)
