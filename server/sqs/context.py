"""What an SQS action runs with: the request's bridge into the server, the gateway's naming,
and the little state the gateway keeps in memory (none of it is needed for durability).

Receipt handles: SQS keeps a message's receipt handle valid across ChangeMessageVisibility;
a Lamina lease gets a new receipt instead and the old one goes stale. :class:`Handles` maps a
handle a client holds to the current receipt of the same lease until that lease is over
(bounded: one entry per changed in-flight lease, dropped when its lease ends). After a server
restart such a handle is stale (``ReceiptHandleIsInvalid``), like a lease that ended.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

from .bridge import Bridge
from .queues import Naming

__all__ = ["Context", "GatewayState", "Handles"]

#: SQS: one PurgeQueue per queue per 60 seconds.
PURGE_INTERVAL_S = 60.0
#: ReceiveRequestAttemptId: a retried FIFO receive gets the same answer while its leases last,
#: for 5 minutes at most.
ATTEMPT_WINDOW_S = 300.0
MAX_ATTEMPTS_KEPT = 10_000
MAX_MOVE_TASKS_KEPT = 1000


class Handles:
    """Handle (the first receipt of a lease) -> (current receipt, lease end ms)."""

    def __init__(self) -> None:
        self._current: dict[bytes, tuple[bytes, int]] = {}
        self._ends: list[tuple[int, bytes]] = []

    def resolve(self, handle: bytes, now_ms: int) -> bytes:
        entry = self._current.get(handle)
        if entry is None or entry[1] <= now_ms:
            return handle
        return entry[0]

    def changed(self, handle: bytes, receipt: bytes | None, end_ms: int, now_ms: int) -> None:
        """The lease of ``handle`` now has ``receipt`` until ``end_ms`` (None: it ended)."""
        self._prune(now_ms)
        if receipt is None:
            self._current.pop(handle, None)
            return
        self._current[handle] = (receipt, end_ms)
        heapq.heappush(self._ends, (end_ms, handle))

    def forget(self, handle: bytes) -> None:
        self._current.pop(handle, None)

    def _prune(self, now_ms: int) -> None:
        ends = self._ends
        while ends and ends[0][0] <= now_ms:
            end, handle = heapq.heappop(ends)
            entry = self._current.get(handle)
            if entry is not None and entry[1] <= now_ms:
                del self._current[handle]
        if len(ends) > 2 * len(self._current) + 1024:
            self._ends = [(end, h) for h, (_, end) in self._current.items()]
            heapq.heapify(self._ends)


@dataclass
class GatewayState:
    """The gateway's memory across requests."""

    naming: Naming
    handles: Handles = field(default_factory=Handles)
    #: Lamina queue name (lower) -> monotonic time of its last purge.
    purges: dict[str, float] = field(default_factory=dict)
    #: (queue lower, attempt id) -> (monotonic expiry, answer).
    attempts: dict[tuple[str, str], tuple[float, Any]] = field(default_factory=dict)
    #: task handle -> task description (ListMessageMoveTasks' fields).
    move_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def purge_allowed(self, queue: str) -> bool:
        now = time.monotonic()
        last = self.purges.get(queue.lower())
        if last is not None and now - last < PURGE_INTERVAL_S:
            return False
        self.purges = {name: t for name, t in self.purges.items()
                       if now - t < PURGE_INTERVAL_S}
        self.purges[queue.lower()] = now
        return True

    def attempt(self, queue: str, attempt_id: str) -> Any:
        entry = self.attempts.get((queue.lower(), attempt_id))
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def remember_attempt(self, queue: str, attempt_id: str, answer: Any,
                         valid_s: float) -> None:
        """Answer a retry of this receive with ``answer`` for ``valid_s`` (while its leases
        last), at most ATTEMPT_WINDOW_S."""
        now = time.monotonic()
        if len(self.attempts) >= MAX_ATTEMPTS_KEPT:
            self.attempts = {key: entry for key, entry in self.attempts.items()
                             if entry[0] >= now}
            while len(self.attempts) >= MAX_ATTEMPTS_KEPT:
                self.attempts.pop(next(iter(self.attempts)))
        self.attempts[(queue.lower(), attempt_id)] = (now + min(valid_s, ATTEMPT_WINDOW_S),
                                                      answer)

    def add_move_task(self, handle: str, task: dict[str, Any]) -> None:
        while len(self.move_tasks) >= MAX_MOVE_TASKS_KEPT:
            self.move_tasks.pop(next(iter(self.move_tasks)))
        self.move_tasks[handle] = task


@dataclass
class Context:
    """One request's view: its bridge (key, grants), the base URL it was addressed with."""

    bridge: Bridge
    state: GatewayState
    base_url: str

    @property
    def naming(self) -> Naming:
        return self.state.naming

    def url(self, sqs_name: str) -> str:
        return self.state.naming.url(sqs_name, self.base_url)
