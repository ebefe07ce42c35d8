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
4. A waiter lives in its connection's task tree: when the connection dies, its waiters go.

Names are compared lower-cased, as the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import trio

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Waiter", "WaitingReceives", "tag_key"]

DEFAULT_TAG = "default"

TagKey = tuple[str, str]


def tag_key(queue: str, tag: str | None) -> TagKey:
    return queue.lower(), (tag or DEFAULT_TAG).lower()


@dataclass(eq=False, slots=True)
class Waiter:
    """One waiting receive. ``args`` are the engine arguments of its retries."""

    connection: Connection
    request_id: int
    op_started: float
    args: dict[str, Any]
    caller: str | None
    deadline: float  # trio clock
    key: TagKey
    claimed: bool = False
    answered: trio.Event = field(default_factory=trio.Event)


class WaitingReceives:
    """Every waiter of the server, by tag, plus the set of tags that are due (rule 2)."""

    def __init__(self) -> None:
        self._by_tag: dict[TagKey, dict[Waiter, None]] = {}
        self._tags_of_queue: dict[str, set[str]] = {}
        self._due: set[TagKey] = set()
        self._due_queues: set[str] = set()

    def __len__(self) -> int:
        return sum(len(fifo) for fifo in self._by_tag.values())

    def add(self, waiter: Waiter) -> None:
        queue, tag = waiter.key
        self._by_tag.setdefault(waiter.key, {})[waiter] = None
        self._tags_of_queue.setdefault(queue, set()).add(tag)

    def remove(self, waiter: Waiter) -> bool:
        """Forget ``waiter``; False if it was not registered (already served or gone)."""
        fifo = self._by_tag.get(waiter.key)
        if fifo is None or waiter not in fifo:
            return False
        del fifo[waiter]
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

    @property
    def any_due(self) -> bool:
        return bool(self._due or self._due_queues)

    def take_due(self) -> list[TagKey]:
        """The due tags that have waiters, in a stable order; clears the marks."""
        due = set(self._due)
        for queue in self._due_queues:
            due.update((queue, tag) for tag in self._tags_of_queue.get(queue, ()))
        self._due.clear()
        self._due_queues.clear()
        return sorted(key for key in due if key in self._by_tag)

    def waiting_on(self, key: TagKey) -> list[Waiter]:
        """The waiters of one tag, oldest first (a copy: serving removes from it)."""
        return list(self._by_tag.get(key, ()))

    # -- ending waits -----------------------------------------------------------------------

    def on_queue(self, queue: str) -> list[Waiter]:
        """Every waiter on any tag of ``queue``."""
        queue = queue.lower()
        return [w for tag in sorted(self._tags_of_queue.get(queue, ()))
                for w in self._by_tag[(queue, tag)]]

    def on_tag(self, queue: str, tag: str) -> list[Waiter]:
        return list(self._by_tag.get(tag_key(queue, tag), ()))

    def __iter__(self) -> Iterator[Waiter]:
        return iter([w for fifo in self._by_tag.values() for w in fifo])
