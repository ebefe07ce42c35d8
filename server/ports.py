"""The narrow interfaces between the server's parts: what a connection (or the SQS gateway's
bridge) may ask of the applier, what the applier may ask of a request's origin, and the limits
a connection runs with.

    connection.py / sqs/bridge.py ──Work──> Applier (applier.py)
                  ^                               │
                  └──── Requester: answers ───────┘

Both sides import this module and nothing of each other, so no import cycle joins them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import trio

from lamina.wire.protocol import Request

from .dispatch import Answer
from .keyring import ServerKey
from .waiters import Waiter, WaitOwner

__all__ = ["Applier", "ConnectionLimits", "Reader", "Requester", "Work"]


class Reader(Protocol):
    """A connection or an SQS bridge as the server's shutdown sees it (server.py rule 5)."""

    def stop_reading(self) -> None:
        """Read no more requests; what was read is still applied and answered."""


class Requester(WaitOwner, Protocol):
    """Where requests come from and their answers go: a connection or an SQS bridge."""

    #: The key that authenticated it (None: no authentication); grants are checked for it.
    key_id: str | None

    def encode_answer(self, request_id: int, answer: Answer) -> Any:
        """The answer to ``request_id`` ready to queue with :meth:`send_frames` (None: drop)."""

    def send_frames(self, frames: list[Any]) -> None:
        """Queue answers from :meth:`encode_answer`, in order."""

    def answer(self, request_id: int, answer: Answer) -> None:
        """Encode and queue one answer."""

    def start_wait(self, waiter: Waiter) -> bool:
        """Count ``waiter`` as its own; False if it may not wait (ending, or at its limit)."""


@dataclass(slots=True)
class Work:
    """Requests of one origin read together, on their way to the applier."""

    connection: Requester
    requests: list[Request]
    nbytes: int
    started: float  # time.perf_counter() when read


class Applier(Protocol):
    """What a connection or a bridge asks of the applier (applier.py): hand it work, apply
    work now when nothing is queued before it, end or drop waits, look a key up."""

    def apply_now(self, work: Work) -> bool:
        """Apply ``work`` in the calling task if nothing is queued before it (-> False:
        queue it)."""

    def apply_requests_now(self, requester: Requester, requests: list[Request],
                           started: float) -> bool:
        """``apply_now`` of ``Work(requester, requests, _, started)``, the requests of one
        read, answered at once when nothing else is due."""

    def apply_lone_now(self, requester: Requester, request: Request, started: float) -> bool:
        """``apply_requests_now`` of a read of one request."""

    def try_enqueue(self, inbox: trio.MemorySendChannel[Any], item: Any) -> bool:
        """Queue ``item`` unless the inbox is full (-> False)."""

    async def enqueue(self, inbox: trio.MemorySendChannel[Any], item: Any) -> None:
        """Queue ``item``, waiting while the inbox is full."""

    def end_wait(self, waiter: Waiter) -> None:
        """End a wait with ``[]`` unless the applier has claimed it."""

    def drop_wait(self, waiter: Waiter) -> None:
        """Forget a wait whose origin is gone (nothing is answered)."""

    def caller_of(self, requester: Requester) -> str | None:
        """The engine's ``caller`` for a request of ``requester``."""

    def key(self, key_id: object) -> ServerKey | None:
        """The API key ``key_id`` in force now, or None."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What a connection runs with (config.py, PROTOCOL §3's greeting)."""

    max_frame_bytes: int
    max_inflight: int
    max_waiting: int
    idle_timeout_s: float
    auth_timeout_s: float
    auth_required: bool
    version: str
    features: tuple[str, ...]
    #: Without --fsync: a request applied in its reader's call is answered within that call
    #: (or begins a wait), so a lone read needs no reservation for its answer (connection.py).
    answers_at_once: bool = False
