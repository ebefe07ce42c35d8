"""What flows through the applier (applier.py): the items of its inbox besides a ``Work``
(ports.py), and a group once applied, with the replies it owes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import trio

from lamina.engine import Engine
from lamina.engine.errors import LaminaError

from .dispatch import Answer
from .ports import Requester, Work

__all__ = ["TICK", "AppliedGroup", "EngineJob", "Reply", "item_weight"]


class _Tick:
    """Inbox item: a deadline is due (the applier checks deadlines in every group anyway)."""


TICK = _Tick()


@dataclass(eq=False)
class EngineJob:
    """Inbox item: run ``fn(engine)`` inside a group, on the applier (rule 1)."""

    fn: Callable[[Engine], Any]
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


class Reply(NamedTuple):
    """An answer a group owes: to whom, for which request, and what for its metrics."""

    connection: Requester
    request_id: int
    answer: Answer
    op: str
    started: float


@dataclass(slots=True)
class AppliedGroup:
    """A group applied and not yet answered: its replies, the jobs it ran, and the failure
    that replaces every answer (its write or its WAL sync failed)."""

    items: Sequence[Any]
    replies: list[Reply]
    jobs: list[EngineJob]
    failure: LaminaError | None
    count: int
    started: float  # time.perf_counter() when it began to apply


def item_weight(item: Any) -> tuple[int, int]:
    """An inbox item's requests and bytes, for the group limits (server.py rule 2)."""
    if type(item) is Work:
        return len(item.requests), item.nbytes
    return 1, 0
