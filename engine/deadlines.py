"""The engine's timers: when messages become Active without a request (lease deadlines,
delay ends: a server wakes waiting receives then), when dead-letter moves fall due, and when
a topic head's lease runs out while rewound messages of its topic wait behind it.

Each is a lazy min-heap: an entry whose registration was superseded is dropped when met
(``QueueState.next_delay_wake_ms``, ``TagState.next_wake_ms`` and
``QueueState.next_expiry_ms`` say which entry is current). The engine pops what is due.
"""

from __future__ import annotations

from heapq import heappush

from . import keys
from .state import QueueState, TagState
from .store import Store


class Deadlines:
    """The three heaps, owned by the engine; registering keeps one current entry per tag
    (lease wake-ups), per queue (delay wake-ups, dead-letter checks)."""

    __slots__ = ("wake_heap", "expiry_heap", "lapse_heap")

    def __init__(self) -> None:
        # (due_ms, queue, tag or 0 = all): lease deadlines and delay ends.
        self.wake_heap: list[tuple[int, int, int]] = []
        # (due_ms, queue): the earliest lease deadline of each queue with a redrive policy,
        # so that every operation applies dead-letter moves due anywhere first.
        self.expiry_heap: list[tuple[int, int]] = []
        # (due_ms, queue, tag, seq): leases of topic heads that rewound (or redriven) messages
        # of their topic wait behind; when one runs out, those go first (topics.py).
        self.lapse_heap: list[tuple[int, int, int, int]] = []

    def clear(self) -> None:
        self.wake_heap.clear()
        self.expiry_heap.clear()
        self.lapse_heap.clear()

    def schedule_delay_wake(self, store: Store, q: QueueState, now: int) -> None:
        """Register the next delay end of ``q`` after ``now`` (one heap entry per queue)."""
        lower, upper = keys.delay_key(q.id, now + 1, 0), keys.queue_bounds(q.id)[1]
        it = Store.scan(store.delays, lower, upper)
        if it.valid():
            due = keys.delay_key_decode(it.key())[1]
            q.next_delay_wake_ms = due
            heappush(self.wake_heap, (due, q.id, 0))
        else:
            it.check_status()  # RocksDB's error, not the end of the delays
            q.next_delay_wake_ms = -1

    def delay_ends_at(self, q: QueueState, visible_ms: int) -> None:
        """A message of ``q`` becomes visible at ``visible_ms``: wake then, unless earlier."""
        if q.next_delay_wake_ms < 0 or visible_ms < q.next_delay_wake_ms:
            q.next_delay_wake_ms = visible_ms
            heappush(self.wake_heap, (visible_ms, q.id, 0))

    def watch_lease_due(self, q: QueueState, t: TagState, due: int) -> None:
        """A LEASED row due at ``due``: the receive walk's lower bound, the tag's wake-up and,
        with a redrive policy, the dead-letter check must not miss it."""
        if due < t.min_due_ms:
            t.min_due_ms = due
        if due < t.next_wake_ms or t.next_wake_ms < 0:
            self.register_wake(q, t, due)
        if q.attributes["redrive"] is not None and (q.next_expiry_ms < 0
                                                    or due < q.next_expiry_ms):
            q.next_expiry_ms = due
            heappush(self.expiry_heap, (due, q.id))

    def schedule_expiry_check(self, q: QueueState, now: int) -> None:
        """Register the first lease deadline after ``now`` of a queue with a redrive policy."""
        q.next_expiry_ms = -1
        if q.attributes["redrive"] is None:
            return
        for t in q.tags.values():
            due = t.due_index.first_due_after(now)
            if due is not None:
                if q.next_expiry_ms < 0 or due < q.next_expiry_ms:
                    q.next_expiry_ms = due
        if q.next_expiry_ms >= 0:
            heappush(self.expiry_heap, (q.next_expiry_ms, q.id))

    def register_wake(self, q: QueueState, t: TagState, due: int) -> None:
        """Keep one wake-up per tag registered: the earliest lease deadline known. The heap
        holds at most the registrations made since the last ``process_deadlines``."""
        if t.next_wake_ms < 0 or due < t.next_wake_ms:
            t.next_wake_ms = due
            heappush(self.wake_heap, (due, q.id, t.id))

    def reschedule_tag_wake(self, q: QueueState, t: TagState, now: int) -> None:
        """After the tag's wake-up fired: register the first lease deadline after ``now``."""
        t.next_wake_ms = -1
        due = t.due_index.first_due_after(now)
        if due is not None:
            self.register_wake(q, t, due)

    def watch_lapse(self, q: QueueState, t: TagState, head: int, due: int) -> None:
        """Check the lease of topic head ``head`` when it runs out at ``due``."""
        heappush(self.lapse_heap, (due, q.id, t.id, head))
