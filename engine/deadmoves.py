"""Dead-letter moves (DESIGN.md §2): at lease end, by ``dead`` and by ``change_visibility 0``.

A move is atomic with the operation that causes it: the source lease becomes ENDED_DEAD (the
row stays until ``gone_seq`` passes, naming the DLQ copy) and a new message is appended to the
DLQ with ``dead = [source_queue, source_tag, dead_time, original_id, original_dequeue_count]``,
the user attributes plus ``DLQ.sourceQueue``, the same priority, no delay and no topic. Moves
ignore the DLQ's ``max_messages`` and ``max_message_size``. ``DeadLetters`` is owned by the
engine core; the ``dead`` and ``redrive`` operations are in deadletter.py.
"""

from __future__ import annotations

from typing import Any, Protocol

import cbor2

from . import keys
from .appending import Appender, _Entry
from .counters import DEAD, Counters
from .records import PREFIX, PREFIX_SIZE, cbor_head, parse_message_id
from .state import DEAD_MARK, ENDED_DEAD, LEASED, Lease, QueueState, TagState
from .store import Store
from .topics import Topics


class DeadLetterContext(Protocol):
    """What the moves read of the engine: its store, queues and components, the DLQ -> source
    queues map, and the lease write and settling they share with the other paths."""

    _store: Store
    _queues: dict[int, QueueState]
    _queue_names: dict[str, int]
    _dead_sources: dict[int, set[int]]
    _now: int
    _appender: Appender
    _counters: Counters
    _topics: Topics

    def _lease_saved(self, q: QueueState, t: TagState, seq: int, lease: Lease,
                     old_due: int | None) -> None: ...

    def _notify(self, q: QueueState) -> None: ...

    def _settle_queue(self, q: QueueState, now: int) -> None: ...


class DeadLetters:
    """Moves to a queue's DLQ (``move``, ``apply_expiries``) and the settling of the source
    queues once copies end (``settle_sources``); owned by the engine core."""

    def __init__(self, context: DeadLetterContext) -> None:
        self._context = context

    def dlq_of(self, q: QueueState) -> QueueState | None:
        policy = q.attributes["redrive"]
        if policy is None:
            return None
        dlq_id = self._context._queue_names.get(policy["dlq"].lower())
        return None if dlq_id is None else self._context._queues[dlq_id]

    def move(self, q: QueueState, t: TagState, seq: int, lease: Lease,
                     dead_time: int) -> None:
        """Dead-letter ``seq`` for tag ``t`` now (``dead_time`` = when its lease ended)."""
        dlq = self.dlq_of(q)
        assert dlq is not None
        value = self._context._store.log.get(keys.log_key(q.id, lease.lane, seq))
        assert value is not None, "a leased message above gone_seq is in the log"
        fields = cbor2.loads(value[PREFIX_SIZE:])
        attributes = dict(fields[2] or {})
        attributes["DLQ.sourceQueue"] = q.name
        body = fields[1]
        body_bytes = body.encode() if isinstance(body, str) else body
        dead = [q.name, t.name, dead_time, fields[0], lease.count]
        copy = self._dead_letter_entry(body, body_bytes, attributes, fields[4], dead, t.id)
        (sent,) = self._context._appender.append(dlq, [copy], self._context._now)
        dlq_seq = parse_message_id(sent.id)[1]  # type: ignore[union-attr, index]
        old_due = lease.due_ms
        self._context._dead_sources.setdefault(dlq.id, set()).add(q.id)
        self._context._lease_saved(q, t, seq, Lease(ENDED_DEAD, lease.lane, dlq.id, lease.count,
                                           lease.first_ms, dlq_seq), old_due)
        if seq in t.heads:  # its successor is Active again from the moment it died
            self._context._topics.head_ended(q, t, seq, dead_time)
        self._context._counters.count(q.id, t.id, DEAD)
        self._context._notify(dlq)

    def apply_expiries(self, q: QueueState, now: int) -> None:
        """Dead-letter every lease that ran out by ``now`` having reached ``max_receives``."""
        if self.dlq_of(q) is None:
            return
        max_receives = q.attributes["redrive"]["max_receives"]
        store = self._context._store
        moves: list[tuple[int, int, int, TagState, Lease]] = []
        for t in list(q.tags.values()):
            moved = False
            for due, seq in t.due_index.between((t.expiry_due_ms, t.expiry_seq + 1), now):
                lease = t.leases.get(seq)
                if (lease is not None and lease.state == LEASED and lease.due_ms == due
                        and lease.count >= max_receives and seq >= q.gone_seq
                        and not self._expired_by(q, lease, seq, due)):
                    moves.append((due, seq, t.id, t, lease))
                t.expiry_due_ms, t.expiry_seq = due, seq
                moved = True
            if moved:
                store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())
        # Across tags in the order the leases ended: each move happened "at that moment".
        moves.sort(key=lambda move: move[:3])
        for due, seq, _, t, lease in moves:
            self.move(q, t, seq, lease, due)

    def _expired_by(self, q: QueueState, lease: Lease, seq: int, time_ms: int) -> bool:
        """Whether the message expired (older than retention) before ``time_ms``: then its
        lease ending moves nothing (it does not exist any more)."""
        value = self._context._store.log.get(keys.log_key(q.id, lease.lane, seq))
        return value is None or \
            PREFIX.unpack_from(value)[0] < time_ms - q.attributes["retention"] * 1000

    def settle_sources(self, dlq: QueueState, sources: set[int], now: int) -> None:
        """Once a dead letter's DLQ copy ends (deleted or expired in the DLQ), the original
        counts as Ended: its queue's ``gone_seq`` may pass it in the same operation."""
        for source_id in list(sources):
            src = self._context._queues.get(source_id)
            if src is None or not any(t.dead_heap for t in src.tags.values()):
                sources.discard(source_id)
            elif src is not dlq:
                self._context._settle_queue(src, now)  # not _settle: no chains of queues

    @staticmethod
    def _dead_letter_entry(body: Any, body_bytes: bytes, attributes: dict[str, Any],
                           priority: int, dead: list[Any], tag_id: int) -> _Entry:
        """A prepared send entry for the DLQ copy: it bypasses send validation."""
        body_cbor = (cbor_head(3, len(body_bytes)) if isinstance(body, str)
                     else cbor_head(2, len(body_bytes))) + body_bytes
        entry = _Entry(body_cbor, body_bytes, cbor2.dumps(attributes), None, priority, 0)
        entry.dead_cbor = cbor2.dumps(dead)
        entry.mark = DEAD_MARK | tag_id
        return entry
