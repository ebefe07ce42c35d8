"""Dead-letter queue operations (DESIGN.md §2): ``dead`` and ``redrive``. The moves
themselves (``DeadLetters``) are in deadmoves.py.

When moves happen: ``dead`` at once; ``change_visibility 0`` at once; an expired lease whose
``dequeue_count`` reached ``max_receives`` at its deadline — applied by every operation on the
queue before anything else (``DeadLetters.apply_expiries``) and by the server's timer task.
"""

from __future__ import annotations

from builtins import max as max_
from itertools import islice
from typing import Generator, Sequence

import cbor2

from . import keys
from .core import EngineCore
from .floors import copy_alive
from .messaging import MessagingOps
from .errors import InvalidArgument, LaminaError, NoDeadLetterQueue
from .peekstate import peek_state
from .records import PREFIX, PREFIX_SIZE, parse_message_id
from .results import Redriven
from .state import DEAD_MARK, ENDED_AHEAD, ENDED_DEAD, LEASED, Lease, QueueState, TagState
from .store import Store
from .validation import check_batch, check_bool, check_int, check_time_ms


#: Records of a DLQ a redrive looks at per chunk (one operation; the server lets other
#: requests run between chunks).
#: ``Lease.due_ms`` of an ENDED_DEAD row whose copy ended for good (no queue has id 0).
SEALED = 0
REDRIVE_CHUNK = 512  # tens of ms; smaller chunks cost more per message (per-operation work)


class DeadLetterOps:
    """``dead`` and ``redrive``; uses ``_tag_operation`` and ``_by_receipt`` (messaging)."""

    def __init__(self, core: EngineCore, messaging: MessagingOps) -> None:
        self._core = core
        self._messaging = messaging

    def dead(self, queue: str, receipts: Sequence[object], tag: str | None = None, *,
             caller: str | None = None) -> list[LaminaError | None]:
        """Dead-letter received messages at once, by their current receipts."""
        with self._core._operation() as now:
            q, t = self._messaging._tag_operation(caller, queue, tag, now)
            receipts = check_batch(receipts, "receipts")
            if self._core._dead_letters.dlq_of(q) is None:
                raise NoDeadLetterQueue(f"queue: {q.name!r} has no redrive policy",
                                        field="queue")
            move = self._core._dead_letters.move
            results = self._messaging._by_receipt(q, t, receipts, now,
                                                  lambda seq, lease: move(q, t, seq, lease, now))
            self._core._settle(q, now)
            return results

    def redrive(self, queue: str, source: str | None = None, since: int | None = None,
                until: int | None = None, max: int = 1000, dry_run: bool = False, *,
                caller: str | None = None) -> Redriven:
        """Send dead letters of the DLQ ``queue`` back to the tag they died under (all
        chunks of ``redrive_steps`` at once)."""
        steps = self.redrive_steps(queue, source, since, until, max, dry_run, caller=caller)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def redrive_steps(self, queue: str, source: str | None = None, since: int | None = None,
                      until: int | None = None, max: int = 1000, dry_run: bool = False, *,
                      caller: str | None = None, chunk: int | None = None
                      ) -> Generator[None, None, Redriven]:
        """``redrive`` as long work in chunks (DESIGN.md §3): each chunk is one operation that
        looks at up to ``chunk`` records of the DLQ (default ``REDRIVE_CHUNK``); the generator
        yields between chunks (other operations may run then) and returns the result. Each
        message moves atomically; the copies considered are those the DLQ held when the
        redrive began (a later dead letter waits for the next redrive), in lane then seq
        order."""
        chunk = chunk or REDRIVE_CHUNK
        moved = skipped = 0
        lane_index = next_seq = 0
        first = True
        while True:
            with self._core._operation() as now:
                if first:
                    self._core._grants.check(caller, "manage", queue)
                    dlq = self._core._queue(queue)
                    if source is not None and not isinstance(source, str):
                        # a filter, not a lookup: text that names no queue matches nothing
                        raise InvalidArgument("source", "must be a queue name (text)")
                    if since is not None:
                        check_time_ms(since, "since")
                    if until is not None:
                        check_time_ms(until, "until")
                    limit = check_int(max, "max", 1, 100_000)
                    check_bool(dry_run, "dry_run")
                    dlq_id, end, lanes = dlq.id, dlq.next_seq, list(dlq.lanes_used)
                    first = False
                found = self._core._queues.get(dlq_id)
                if found is None:  # deleted meanwhile: what was done stands
                    return Redriven(moved, skipped)
                dlq = found
                self._core._advance(dlq, now)
                default = self._core._tag(dlq, None)
                seen = 0
                while lane_index < len(lanes) and seen < chunk and moved + skipped < limit:
                    lane = lanes[lane_index]
                    lower = keys.log_key(dlq.id, lane, max_(next_seq, dlq.gone_seq))
                    batch = list(islice(Store.items(self._core._store.log, lower,
                                                    keys.log_key(dlq.id, lane, end)),
                                        chunk - seen))
                    if not batch:
                        lane_index, next_seq = lane_index + 1, 0
                        continue
                    for key, value in batch:
                        if moved + skipped >= limit:
                            break
                        seen += 1
                        seq = next_seq = keys.log_seq(key)
                        next_seq += 1
                        if not PREFIX.unpack_from(value)[2] & DEAD_MARK or self._held_by_dlq(
                                dlq, default, seq, value, now):
                            continue
                        outcome = self._redrive_one(dlq, seq, lane, value, source, since,
                                                    until, dry_run, now)
                        moved += outcome is True
                        skipped += outcome is False
                if not dry_run:
                    self._core._settle(dlq, now)
                if lane_index >= len(lanes) or moved + skipped >= limit:
                    return Redriven(moved, skipped)
            yield

    def _redrive_one(self, dlq: QueueState, seq: int, lane: int, value: bytes,
                     source: str | None, since: int | None, until: int | None,
                     dry_run: bool, now: int) -> bool | None:
        """Redrive one dead-letter copy -> True moved, False skipped (its original is gone),
        None not selected by ``source`` / ``since`` / ``until``."""
        fields = cbor2.loads(value[PREFIX_SIZE:])
        source_name, _, dead_time, original_id, _ = fields[8]
        if source is not None and source_name.lower() != source.lower():
            return None
        if (since is not None and dead_time < since) or \
                (until is not None and dead_time > until):
            return None
        target = self._redrive_target(original_id, PREFIX.unpack_from(value)[2] & ~DEAD_MARK,
                                      now)
        if target is None:
            return False
        if not dry_run:
            src, t, original = target
            for dlq_tag in dlq.tags.values():
                self._end_for(dlq, dlq_tag, seq, lane)
            old = t.leases.get(original)
            original_lane = old.lane if old else lane
            self._core._lease_saved(src, t, original, Lease(LEASED, original_lane, now, 0, 0, 0),
                              old.due_ms if old is not None and old.state == LEASED else None)
            stored = self._core._store.log.get(keys.log_key(src.id, original_lane, original))
            topic_id = PREFIX.unpack_from(stored)[2] if stored else 0
            if 0 < topic_id < DEAD_MARK:
                self._core._topics.rejoined(src, t, topic_id, original, now)
            self._core._notify(src)
            self._core._settle(src, now)
        return True

    def _seal_dead_letters(self, dlq: QueueState) -> None:
        """Before a rewind of ``dlq``: dead letters whose copy has ended stay Ended although
        the rewind makes the copy deliverable again (it is then an ordinary DLQ message; a
        redrive of it skips it as gone). Their ENDED_DEAD rows stop naming the copy."""
        core = self._core
        store = core._store
        for source_id in list(core._dead_sources.get(dlq.id, ())):
            src = core._queues.get(source_id)
            if src is None:
                continue
            for t in src.tags.values():
                for seq, lease in t.leases.items():
                    if lease.state == ENDED_DEAD and lease.due_ms == dlq.id and \
                            not copy_alive(core._store, core._queues, core._now, lease):
                        lease.due_ms = SEALED
                        store.put(store.leases_h, keys.lease_key(src.id, t.id, seq),
                                  lease.encode())

    def _held_by_dlq(self, dlq: QueueState, default: TagState, seq: int, value: bytes,
                     now: int) -> bool:
        """Ended for the DLQ's default tag, or Inflight for any DLQ tag."""
        for t in dlq.tags.values():
            lease = t.leases.get(seq)
            if lease is not None and lease.state == LEASED and lease.due_ms > now:
                return True
        state = peek_state(self._core._store, dlq, default, seq, value, now)[0]
        return state in ("deleted", "dead")

    def _redrive_target(self, original_id: str, tag_id: int,
                        now: int) -> tuple[QueueState, TagState, int] | None:
        parsed = parse_message_id(original_id)
        if parsed is None:
            return None
        queue_id, seq, _ = parsed
        src = self._core._queues.get(queue_id)
        if src is None or seq < src.gone_seq:
            return None
        self._core._advance(src, now)
        t = src.tags.get(tag_id)
        if t is None or seq < src.gone_seq:
            return None
        lease = t.leases.get(seq)
        if lease is not None and (lease.state == LEASED and lease.due_ms > now or
                                  lease.state == ENDED_DEAD and lease.due_ms == SEALED):
            return None  # Inflight, or Ended for good: its copy ended before a rewind
        return src, t, seq

    def _end_for(self, q: QueueState, t: TagState, seq: int, lane: int) -> None:
        """End ``seq`` for ``t`` whatever its state (an ENDED_AHEAD row, dropped with
        ``gone_seq``); a lease goes stale, a topic head passes its topic on."""
        old = t.leases.get(seq)
        if old is not None and old.state != LEASED:
            return
        self._core._lease_saved(q, t, seq, Lease(ENDED_AHEAD, lane, 0, old.count if old else 0,
                                           old.first_ms if old else 0, 0),
                          old.due_ms if old is not None else None)
        if seq in t.heads:
            self._core._topics.head_ended(q, t, seq, self._core._now)
        elif t.topic_from:
            value = self._core._store.log.get(keys.log_key(q.id, lane, seq))
            topic_id = PREFIX.unpack_from(value)[2] if value is not None else 0
            if t.topic_from.get(topic_id) == seq:
                self._core._topics.from_ended(q, t, topic_id, seq)
        self._core._cursor_off(q, t, seq, lane)
