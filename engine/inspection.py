"""peek (three modes) and delete_by_id: looking at messages by position or id.

``peek`` never changes anything. A message's state for a tag (PROTOCOL.md §4 "Peeked"):

    lease row LEASED, due > now          inflight
    lease row LEASED, due <= now         active (or parked, behind another head of its topic)
    lease row ENDED_AHEAD / ENDED_DEAD   deleted / dead
    no row, delayed, not yet taken from the delay index
                          visible > now  delayed
                          otherwise      active / parked
    no row, not delayed, cursor not there yet       active / parked
    no row, passed                                   parked if its topic is locked behind an
                                                     earlier head, or it was rewound behind
                                                     an Inflight later one; else deleted
"""

from __future__ import annotations

from typing import Any, Sequence

from . import keys
from .core import EngineCore
from .counters import DELETED
from .deadletter import DeadLetterOps
from .errors import InvalidArgument, LaminaError, MessageNotFound
from .lessor import Lessor
from .peekstate import peek_state
from .records import PREFIX, PREFIX_SIZE, parse_message_id
from .results import PeekPage, Peeked
from .scope import in_scope
from .state import QueueState, TagState
from .store import Store
from .validation import check_batch, check_int, check_time_ms

class InspectionOps:
    """peek and delete_by_id; the default peek asks a dry ``Lessor`` (lessor.py)."""

    def __init__(self, core: EngineCore, dead_letter_ops: DeadLetterOps) -> None:
        self._core = core
        self._dead_letter_ops = dead_letter_ops

    def _lookup_id(self, q: QueueState, t: TagState, message_id: object,
                   field: str) -> tuple[int, int, bytes | None]:
        """-> (seq, lane, log value or None when below gone_seq) of an id of this queue in the
        tag's scope (any id below gone_seq), else ``MessageNotFound``."""
        if not isinstance(message_id, str):
            raise InvalidArgument(field, "must be a message id (text)")
        parsed = parse_message_id(message_id)
        if parsed is None or parsed[0] != q.id or parsed[1] >= q.next_seq:
            raise MessageNotFound(f"{field}: no message {message_id!r} in queue {q.name!r}",
                                  field=field)
        _, seq, lane = parsed
        if seq < q.gone_seq:  # gone: null whatever the tag (its record may be collected)
            return seq, lane, None
        if seq < t.start_seq:
            raise MessageNotFound(f"{field}: message {message_id!r} is before the start of tag "
                                  f"{t.name!r}", field=field)
        value = self._core._store.log.get(keys.log_key(q.id, lane, seq))
        if value is None or not in_scope(t, seq, PREFIX.unpack_from(value)[0],
                                                value[PREFIX_SIZE:]):
            raise MessageNotFound(f"{field}: no message {message_id!r} for tag {t.name!r}",
                                  field=field)
        return seq, lane, value

    def peek(self, queue: str, tag: str | None = None, max: int = 1, start: int | None = None,
             after: str | None = None, ids: Sequence[str] | None = None, *,
             max_bytes: int | None = None, caller: str | None = None) -> PeekPage:
        """Look without changing anything: what ``receive(max)`` would return now (no
        ``start``/``ids``); messages produced from ``start`` on with their states, paged by
        ``after``; or the messages with ``ids``, one entry per id."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "peek", queue)
            q = self._core._queue(queue)
            t = self._core._tag(q, tag)
            count = check_int(max, "max", 1, 1000)
            if ids is not None and (start is not None or after is not None):
                raise InvalidArgument("ids", "takes neither start nor after")
            if after is not None and start is None:
                raise InvalidArgument("after", "needs start")
            self._core._advance(q, now)
            self._core._settle(q, now)
            if ids is not None:
                return PeekPage(self._peek_ids(q, t, check_batch(ids, "ids"), now, max_bytes),
                                None)
            if start is not None:
                return self._peek_from(q, t, check_time_ms(start, "start"), after, count, now,
                                       max_bytes)
            lessor = Lessor(self._core, q, t, now, 1000, count, max_bytes, dry_run=True)
            return PeekPage(lessor.peeked(), None)

    def _peek_ids(self, q: QueueState, t: TagState, ids: list[Any], now: int,
                  max_bytes: int | None) -> list[Any]:
        out: list[Any] = []
        room = max_bytes
        for index, message_id in enumerate(ids):
            try:
                seq, _, value = self._lookup_id(q, t, message_id, f"ids[{index}]")
                if value is None:
                    raise MessageNotFound(f"ids[{index}]: message {message_id!r} is gone",
                                          field=f"ids[{index}]")
            except LaminaError as exc:
                out.append(exc.with_traceback(None))
                continue
            state = peek_state(self._core._store, q, t, seq, value, now)
            if room is not None:
                room -= len(value) + 64
                if room < 0 and out:
                    break
            out.append(Peeked(value[PREFIX_SIZE:], *state))
        return out

    def _peek_from(self, q: QueueState, t: TagState, start_ms: int, after: object, count: int,
                   now: int, max_bytes: int | None) -> PeekPage:
        first = max(self._core._first_seq_at(q, start_ms), q.gone_seq, t.start_seq)
        if after is not None:
            parsed = parse_message_id(after)
            if parsed is None or parsed[0] != q.id:
                raise InvalidArgument("after", "must be a next value from a previous page")
            first = max(first, parsed[1] + 1)
        # Production order across lanes: merge the lanes by seq.
        heads: list[tuple[int, int, bytes, Any]] = []
        for lane in q.lanes_used:
            lower, upper = keys.log_lane_bounds(q.id, lane, first)
            it = Store.scan(self._core._store.log, lower, upper)
            if it.valid():
                heads.append((keys.log_seq(it.key()), lane, it.value(), it))
            else:
                it.check_status()  # RocksDB's error, not an empty lane
        out: list[Peeked] = []
        room = max_bytes
        last_id = None
        while heads and len(out) < count:
            heads.sort(key=lambda head: head[0])
            seq, lane, value, it = heads.pop(0)
            it.next()
            if it.valid():
                heads.append((keys.log_seq(it.key()), lane, it.value(), it))
            else:
                it.check_status()
            enqueue_ms = PREFIX.unpack_from(value)[0]
            if enqueue_ms < start_ms or not in_scope(t, seq, enqueue_ms,
                                                           value[PREFIX_SIZE:]):
                last_id = self._id_of(q, seq, lane)
                continue
            if room is not None:
                room -= len(value) + 64
                if room < 0 and out:
                    heads.append((seq, lane, value, None))
                    break
            state = peek_state(self._core._store, q, t, seq, value, now)
            out.append(Peeked(value[PREFIX_SIZE:], *state))
            last_id = self._id_of(q, seq, lane)
        more = bool(heads)
        return PeekPage(out, last_id if more and last_id is not None else None)

    @staticmethod
    def _id_of(q: QueueState, seq: int, lane: int) -> str:
        from .records import message_id
        return message_id(q.id, seq, lane)

    def delete_by_id(self, queue: str, ids: Sequence[str], tag: str | None = None, *,
                     caller: str | None = None) -> list[LaminaError | None]:
        """End messages for ``tag`` by id whatever their state (idempotent; a lease on one
        goes stale, a parked one is unlinked)."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            t = self._core._tag(q, tag)
            ids = check_batch(ids, "ids")
            self._core._advance(q, now)
            # an id gone by now answers null (gone_seq can rise with time)
            self._core._settle(q, now)
            results: list[LaminaError | None] = []
            for index, message_id in enumerate(ids):
                try:
                    seq, lane, value = self._lookup_id(q, t, message_id, f"ids[{index}]")
                except LaminaError as exc:
                    results.append(exc.with_traceback(None))
                    continue
                if value is not None:
                    state = peek_state(self._core._store, q, t, seq, value, now)[0]
                    if state not in ("deleted", "dead"):
                        self._dead_letter_ops._end_for(q, t, seq, lane)
                        self._core._counters.count(q.id, t.id, DELETED)
                        self._core._notify(q)
                results.append(None)
            self._core._settle(q, now)
            return results
