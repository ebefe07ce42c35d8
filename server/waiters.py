"""Waiting receives (DESIGN.md §2 "Long polling"): who waits on which tag, in arrival order.

A receive with ``wait > 0`` that found nothing becomes a :class:`Waiter`. Rules:

1. Waiters of one (queue, tag) are served in arrival order: a FIFO per tag (an insertion-ordered
   dict, so a waiter that gives up leaves in O(1)).
2. The engine says when messages *may* have become Active (``on_activity`` for a queue,
   ``process_deadlines`` for a queue's tag or all its tags); that marks the tag *due*. Only the
   applier serves due tags, inside a group, so every lease it takes is committed (and synced)
   before its response goes out.
3. A waiter is *claimed* the moment the applier leases messages for it: from then on only the
   applier answers it (once the group is durable); its own timeout no longer applies.
4. A waiter belongs to its owner (a connection or an SQS bridge, :class:`WaitOwner`): when the
   owner ends or dies, its waiters go. Its answer goes out through its ``answer`` callback.
5. Timeouts: one heap of deadlines for every waiter (no task per waiter: spawning one costs
   more than the receive). Entries of waiters served or gone stay in it until they reach the
   top or the heap is rebuilt (when they outnumber the live ones by ``STALE_SLACK``). Each
   ``add`` first drops the entries of waiters gone from the top, so the heap is kept small a
   little at a time: a consumer's long polls, answered one after another with one timeout,
   leave one entry each, and cleaning a second's worth of them at once (thousands, when the
   timeouts come round or the heap is rebuilt) held the server up for a millisecond or more.

Names are compared lower-cased, as the engine does.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

from lamina.engine.state import DEFAULT_TAG

__all__ = ["STALE_SLACK", "WaitOwner", "Waiter", "WaitingReceives", "tag_key"]

TagKey = tuple[str, str]

#: Rule 5: the heap is rebuilt once its entries of waiters gone pass twice the live waiters plus
#: this many; a rebuild's cost grows with it (a few hundred µs per thousand entries here).
STALE_SLACK = 64


def tag_key(queue: str, tag: str | None) -> TagKey:
    return queue.lower(), (tag or DEFAULT_TAG).lower()


class WaitOwner(Protocol):
    """Who a waiter belongs to (rule 4): a connection, or the SQS gateway's bridge."""

    peer: str

    def forget_wait(self, waiter: Waiter) -> None:
        """``waiter`` is answered or gone: no longer count it."""

    def abort(self) -> None:
        """Tear the owner down (a bug while ending one of its waits)."""


@dataclass(eq=False, slots=True)
class Waiter:
    """One waiting receive. ``args``, ``caller`` and ``max_bytes`` are the engine arguments
    of its retries, checked once when it began; ``answer`` queues an answer to
    ``request_id`` at its owner."""

    owner: WaitOwner
    answer: Callable[[int, Any], None]
    request_id: int
    op_started: float
    args: dict[str, Any]
    caller: str | None
    deadline: float  # trio clock
    key: TagKey
    claimed: bool = False
    max_bytes: int | None = None  # the receive's frame budget (dispatch.receive_budget)


class WaitingReceives:
    """Every waiter of the server, by tag, plus the set of tags that are due (rule 2)."""

    def __init__(self) -> None:
        self._by_tag: dict[TagKey, dict[Waiter, None]] = {}
        self._tags_of_queue: dict[str, set[str]] = {}
        self._due: set[TagKey] = set()
        self._due_queues: set[str] = set()
        #: Some tag with waiters is due (rule 2): the applier serves it in this group.
        self.any_due = False
        self._live = 0
        #: Rule 5: (deadline, tie-breaker, waiter), earliest first.
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return self._live

    @property
    def deadline_entries(self) -> int:
        """Entries in the heap of deadlines, those of waiters gone included (rule 5)."""
        return len(self._deadlines)

    def add(self, waiter: Waiter) -> None:
        key = waiter.key
        fifo = self._by_tag.get(key)
        if fifo is None:  # the usual: its tag's only waiter (no container made for nothing)
            self._by_tag[key] = {waiter: None}
            queue, tag = key
            tags = self._tags_of_queue.get(queue)
            if tags is None:
                self._tags_of_queue[queue] = {tag}
            else:
                tags.add(tag)
        else:
            fifo[waiter] = None
        self._live += 1
        deadlines = self._deadlines
        while deadlines and not self.has(deadlines[0][2]):  # rule 5: a little at a time
            heapq.heappop(deadlines)
        if len(deadlines) > 2 * self._live + STALE_SLACK:
            self._deadlines = deadlines = [entry for entry in deadlines if self.has(entry[2])]
            heapq.heapify(deadlines)
        heapq.heappush(deadlines, (waiter.deadline, next(self._order), waiter))

    def has(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` is still waiting here."""
        fifo = self._by_tag.get(waiter.key)
        return fifo is not None and waiter in fifo

    def remove(self, waiter: Waiter) -> bool:
        """Forget ``waiter``; False if it was not registered (already served or gone)."""
        fifo = self._by_tag.get(waiter.key)
        if fifo is None or waiter not in fifo:
            return False
        del fifo[waiter]
        self._live -= 1
        if not fifo:
            del self._by_tag[waiter.key]
            queue, tag = waiter.key
            tags = self._tags_of_queue[queue]
            tags.discard(tag)
            if not tags:
                del self._tags_of_queue[queue]
        return True

    # -- what may have become Active --------------------------------------------------------

    def mark_due(self, queue: str, tag: str | None = None) -> None:
        """Messages may be Active in ``queue`` (for ``tag``, or any tag when None)."""
        queue = queue.lower()
        if queue not in self._tags_of_queue:
            return
        if tag is None:
            self._due_queues.add(queue)
        else:
            self._due.add((queue, tag.lower()))
        self.any_due = True


    def take_due(self) -> list[TagKey]:
        """The due tags that have waiters, in a stable order; clears the marks."""
        if not self.any_due:
            return []
        queues = self._due_queues
        if len(queues) == 1 and not self._due:  # the usual: a send to one queue
            queue = queues.pop()
            self.any_due = False
            return sorted((queue, tag) for tag in self._tags_of_queue.get(queue, ()))
        due = set(self._due)
        for queue in self._due_queues:
            due.update((queue, tag) for tag in self._tags_of_queue.get(queue, ()))
        self._due.clear()
        self._due_queues.clear()
        self.any_due = False
        return sorted(key for key in due if key in self._by_tag)

    def waiting_on(self, key: TagKey) -> list[Waiter]:
        """The waiters of one tag, oldest first (a copy: serving removes from it)."""
        return list(self._by_tag.get(key, ()))

    # -- ending waits -----------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiter still waiting (trio clock), or None."""
        deadlines = self._deadlines
        while deadlines and not self.has(deadlines[0][2]):
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def expired(self, now: float) -> list[Waiter]:
        """The waiters still waiting whose deadline is ``now`` or earlier, oldest first
        (they stay registered: ending a wait is the connection's job)."""
        deadlines = self._deadlines
        due = []
        while deadlines and deadlines[0][0] <= now:
            waiter = heapq.heappop(deadlines)[2]
            if self.has(waiter):
                due.append(waiter)
        return due

    def on_queue(self, queue: str) -> list[Waiter]:
        """Every waiter on any tag of ``queue``."""
        queue = queue.lower()
        return [w for tag in sorted(self._tags_of_queue.get(queue, ()))
                for w in self._by_tag[(queue, tag)]]

    def on_tag(self, queue: str, tag: str) -> list[Waiter]:
        return list(self._by_tag.get(tag_key(queue, tag), ()))

    def __iter__(self) -> Iterator[Waiter]:
        return iter([w for fifo in self._by_tag.values() for w in fifo])
