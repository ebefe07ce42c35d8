"""What flows through the applier (applier.py): the items of its inbox besides a ``Work``
(ports.py), and a group once applied, with the replies it owes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import logging

import trio

from lamina.engine import Engine
from lamina.engine.errors import InternalError, LaminaError
from lamina.wire.protocol import RejectedRequest, Request

from .bugs import internal_error
from .dispatch import Answer
from .ports import Requester, Work

__all__ = ["TICK", "AppliedGroup", "EngineJob", "Refusal", "Reply", "group_failure",
           "item_weight", "outcome", "refused"]

log = logging.getLogger("lamina.server")


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


class Refusal(dict[str, Any]):
    """The arguments of a request the codec refused after auth (a value no request may carry:
    a tag, NaN): nothing to apply, its error answered in its turn among the requests of its
    read (PROTOCOL §2: only a receive's wait answers out of order)."""

    __slots__ = ("error",)

    def __init__(self, error: LaminaError) -> None:
        super().__init__()
        self.error = error


def refused(rejected: RejectedRequest) -> Request:
    """``rejected`` as a request for the applier, its arguments a :class:`Refusal`."""
    return Request(rejected.id, rejected.op, Refusal(rejected.error))


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


def group_failure(exc: Exception) -> LaminaError:
    """The answer of every request of a group that failed outside any one request."""
    if isinstance(exc, LaminaError):  # the group's write failed (server.py rule 4)
        log.error("group commit failed: %s", exc, extra={"event": "commit_failed"})
        return InternalError(f"storage write failed ({exc.message}); this request "
                             "may or may not have taken effect")
    return internal_error("group commit", exc)  # a bug outside any one request


def outcome(answer: Answer) -> str:
    """The outcome a request's answer counts as in the metrics: "ok" or its error code."""
    return answer.code if isinstance(answer, LaminaError) else "ok"
