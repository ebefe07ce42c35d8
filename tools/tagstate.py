"""A message's state for one tag, derived from the stored rows alone (no ``Engine``).

``Engine.open`` takes the LOCK and writes, so the inspection tools cannot ask the engine.
They rebuild the tag's in-memory state from the stored rows as the engine does at open
(``Snapshot.load_leases``: lease rows, cursors, delay position, topic heads from the LEASED
rows) and ask the engine's own derivation (``lamina.engine.peekstate``) what ``peek`` would
answer.

States (PROTOCOL.md §4 "Peeked"): ``active``, ``inflight``, ``delayed``, ``parked``,
``deleted``, ``dead``; and, for messages ``peek`` would not show at all:

    gone          below the queue's gone_seq (Ended for every tag, or purged)
    expired       older than the queue's retention at ``now`` (the engine's next operation
                  raises gone_seq over it)
    out_of_scope  before the tag's start or not matching its filter (Ended for the tag)

Not emulated: a dead-letter move or topic hand-over that is due but not yet applied by the
engine (its next operation on the queue applies them first); such a message shows the state its
rows hold now (an expired lease with ``max_receives`` reached shows ``active``).
"""

from __future__ import annotations

from lamina.engine.peekstate import PeekState, peek_state
from lamina.engine.records import PREFIX, PREFIX_SIZE
from lamina.engine.scope import in_scope
from lamina.engine.state import QueueState, TagState

from .snapshot import Snapshot

__all__ = ["TagStates"]


class TagStates:
    """``state(seq, value)`` of messages of one queue for one tag at ``now``."""

    def __init__(self, snapshot: Snapshot, q: QueueState, t: TagState, now: int):
        snapshot.load_leases(q, t)
        self.snapshot = snapshot
        self.q = q
        self.t = t
        self.now = now
        self.retained_from = snapshot.retained_from(q, now)

    def state(self, seq: int, value: bytes) -> PeekState:
        """-> (state, dequeue_count, first_dequeue_time, next_visible_time) of the message
        ``seq`` whose log value is ``value``."""
        q, t = self.q, self.t
        if seq < q.gone_seq:
            return "gone", 0, None, None
        if seq < self.retained_from:
            return "expired", 0, None, None
        if not in_scope(t, seq, PREFIX.unpack_from(value)[0], value[PREFIX_SIZE:]):
            return "out_of_scope", 0, None, None
        try:
            return peek_state(self.snapshot.store, q, t, seq, value, self.now)
        except Exception as exc:  # RocksDB could not read a file: ``SnapshotReadError``
            self.snapshot.raise_read_error(exc)
