"""Queue administration: create, delete, list, get (with stats), set attributes, purge."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import cbor2

from . import keys
from .core import EngineCore
from .floors import holds_delayed, tag_floor
from .grants import PERMISSIONS
from .peekstate import peek_state
from .errors import (
    InvalidArgument,
    InvalidRedrivePolicy,
    QueueAlreadyExists,
    TooManyQueues,
)
from .records import PREFIX, PREFIX_SIZE
from .results import QueueInfo, QueuePage, TagInfo
from .scope import in_scope
from .state import DEFAULT_TAG, LEASED, QueueState, TagState
from .store import COLUMN_FAMILIES, Store
from .tagging import TagOps
from .validation import (
    check_int,
    check_queue_name,
    default_queue_attributes,
    merge_queue_attributes,
)

MAX_LIST_LIMIT = 1000


class AdminOps:
    """Operations on queues as a whole."""

    def __init__(self, core: EngineCore, tags: TagOps) -> None:
        self._core = core
        self._tags = tags

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None, *,
                     caller: str | None = None,
                     created: Callable[[int], object] | None = None) -> QueueInfo:
        """Create a queue (and its ``default`` tag). Idempotent for an equal definition.
        ``created(queue_id)`` runs when the queue is new, and what it writes goes in the
        same batch as the queue."""
        with self._core._operation() as now:
            check_queue_name(queue)
            self._core._grants.check(caller, "manage", queue)
            new = queue.lower() not in self._core._queue_names
            info = self._create_queue(queue, attributes, caller, now)
            if created is not None and new:
                created(self._core._queue_names[queue.lower()])
            return info

    def _create_queue(self, queue: str, attributes: Mapping[str, Any] | None,
                      caller: str | None, now: int) -> QueueInfo:
        resolved = merge_queue_attributes(default_queue_attributes(), attributes)
        existing_id = self._core._queue_names.get(queue.lower())
        if existing_id is not None:
            existing = self._core._queues[existing_id]
            if existing.name == queue and existing.attributes == resolved:
                return QueueInfo(existing.name, dict(existing.attributes), existing.created)
            raise QueueAlreadyExists(f"queue: {existing.name!r} exists with other "
                                     "attributes or another letter case", field="queue")
        self._check_redrive(queue, resolved["redrive"], caller)
        if len(self._core._queues) >= self._core.max_queues:
            raise TooManyQueues(f"queue: the server holds max_queues {self._core.max_queues}")
        queue_id = self._core._next_queue_id
        self._core._next_queue_id += 1
        q = QueueState(queue_id, queue, resolved, now)
        store = self._core._store
        store.put(store.meta_h, keys.queue_name_key(queue), keys.u32(queue_id))
        store.put(store.meta_h, keys.queue_def_key(queue_id), cbor2.dumps(q.definition()))
        self._core._persist_watermarks(q)
        self._core._queues[queue_id] = q
        self._core._queue_names[queue.lower()] = queue_id
        self._tags._add_tag(q, DEFAULT_TAG, 0, 0, None, now)
        if caller is not None:  # the creator gets all five permissions on its queue
            self._core._grants.store_grant(caller, queue.lower(), PERMISSIONS)
        return QueueInfo(queue, dict(resolved), now)

    def copy_queue(self, queue: str, source: str, *, caller: str | None = None) -> QueueInfo:
        """A new queue with ``source``'s attributes (redrive included) and tags (filters kept,
        starting now): no messages, no grants."""
        with self._core._operation() as now:
            check_queue_name(queue)
            self._core._grants.check(caller, "manage", queue)
            self._core._grants.check(caller, "peek", source, "source")
            src = self._core._queue(source, "source")
            if queue.lower() in self._core._queue_names:
                raise QueueAlreadyExists(f"queue: {queue!r} exists", field="queue")
            info = self._create_queue(queue, src.attributes, caller, now)
            q = self._core._queue(queue)
            for t in sorted(src.tags.values(), key=lambda t: t.name.lower()):
                if t.name.lower() != DEFAULT_TAG:
                    self._tags._add_tag(q, t.name, now, q.next_seq, t.filter, now)
            return info

    def _check_redrive(self, queue: str, redrive: dict[str, Any] | None,
                       caller: str | None) -> None:
        """DESIGN.md §2 dead-letter rules for ``queue`` naming ``redrive`` (and ``send`` on the
        dead-letter queue for the caller)."""
        if redrive is None:
            return
        self._core._grants.check(caller, "send", redrive["dlq"], "attributes.redrive.dlq")
        dlq_id = self._core._queue_names.get(redrive["dlq"].lower())
        if dlq_id is None:
            raise InvalidRedrivePolicy(f"attributes.redrive.dlq: no queue named "
                                       f"{redrive['dlq']!r}", field="attributes.redrive.dlq")
        dlq = self._core._queues[dlq_id]
        if dlq.name.lower() == queue.lower():
            raise InvalidRedrivePolicy("attributes.redrive.dlq: a queue cannot be its own "
                                       "dead-letter queue", field="attributes.redrive.dlq")
        if dlq.attributes["redrive"] is not None:
            raise InvalidRedrivePolicy("attributes.redrive.dlq: a queue with a redrive policy "
                                       "cannot be a dead-letter queue",
                                       field="attributes.redrive.dlq")
        for other in self._core._queues.values():
            policy = other.attributes["redrive"]
            if policy is not None and policy["dlq"].lower() == queue.lower():
                raise InvalidRedrivePolicy("attributes.redrive: a dead-letter queue cannot "
                                           "have a redrive policy", field="attributes.redrive")

    def delete_queue(self, queue: str, *, caller: str | None = None) -> None:
        """Remove a queue, its tags and all its data; policies naming it as DLQ are removed."""
        with self._core._operation():
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            store = self._core._store
            lower, upper = keys.queue_bounds(q.id)
            for family in COLUMN_FAMILIES:
                if family != "meta":
                    store.delete_range(getattr(store, f"{family}_h"), lower, upper)
            store.delete(store.meta_h, keys.queue_name_key(q.name))
            store.delete(store.meta_h, keys.queue_def_key(q.id))
            store.delete(store.meta_h, keys.watermarks_key(q.id))
            store.delete_range(store.meta_h, *keys.tag_def_bounds(q.id))
            store.delete_range(store.meta_h, *keys.topic_names_bounds(q.id))
            store.delete_range(store.meta_h, *keys.parked_topics_bounds(q.id))
            del self._core._queues[q.id]
            del self._core._queue_names[q.name.lower()]
            self._core._grants.drop_on(q.name)
            self._core._counters.forget(q.id)
            self._core._topics.forget(q.id)
            for other in self._core._queues.values():
                policy = other.attributes["redrive"]
                if policy is not None and policy["dlq"].lower() == q.name.lower():
                    other.attributes = {**other.attributes, "redrive": None}
                    store.put(store.meta_h, keys.queue_def_key(other.id),
                              cbor2.dumps(other.definition()))

    def list_queues(self, prefix: str | None = None, after: str | None = None,
                    limit: int = MAX_LIST_LIMIT, *, caller: str | None = None) -> QueuePage:
        """Queue names ordered by lower-cased name; ``next`` is the ``after`` of the next page."""
        with self._core._operation():
            if prefix is not None and (not isinstance(prefix, str) or len(prefix) > 64):
                raise InvalidArgument("prefix", "must be text of at most 64 characters")
            if after is not None and (not isinstance(after, str) or len(after) > 64):
                raise InvalidArgument("after", "must be text of at most 64 characters")
            limit = check_int(limit, "limit", 1, MAX_LIST_LIMIT)
            lower = keys.queue_name_prefix(prefix or "")
            if after is not None and keys.queue_name_key(after) + b"\x00" > lower:
                lower = keys.queue_name_key(after) + b"\x00"
            upper = keys.QUEUE_NAME_UPPER
            prefix_key = keys.queue_name_prefix(prefix or "")
            names: list[str] = []
            more = False
            for name_key, value in Store.items(self._core._store.meta, lower, upper):
                if not name_key.startswith(prefix_key):
                    break
                name = self._core._queues[keys.read_u32(value)].name
                if not self._core._grants.may(caller, "peek", name):
                    continue
                if len(names) == limit:
                    more = True
                    break
                names.append(name)
            return QueuePage(names, names[-1] if more else None)

    def get_queue(self, queue: str, *, caller: str | None = None) -> QueueInfo:
        """Attributes, creation time and the stats of DESIGN.md §8."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "peek", queue)
            q = self._core._queue(queue)
            self._core._advance(q, now)
            self._core._settle(q, now)
            return QueueInfo(q.name, dict(q.attributes), q.created, self._stats(q, now))

    def set_queue_attributes(self, queue: str, attributes: Mapping[str, Any], *,
                             caller: str | None = None,
                             changed: Callable[[int], object] | None = None) -> dict[str, Any]:
        """Change the given attributes (all rules hold afterwards, else nothing changes).
        ``changed(queue_id)`` runs once they are, and what it writes goes in their batch."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            if not isinstance(attributes, Mapping):
                raise InvalidArgument("attributes", "must be a map")
            merged = merge_queue_attributes(q.attributes, attributes)
            if merged["redrive"] != q.attributes["redrive"]:
                self._check_redrive(q.name, merged["redrive"], caller)
            self._core._advance(q, now)
            q.attributes = merged
            q.quiet_until_ms = -1  # a shorter retention or a redrive policy: told again
            q.oldest_live_ms = -1 if q.expired_seq >= q.next_seq else q.oldest_live_ms
            store = self._core._store
            store.put(store.meta_h, keys.queue_def_key(q.id), cbor2.dumps(q.definition()))
            q.oldest_live_ms = self._core._oldest_live_ms(q)
            self._core._deadlines.schedule_expiry_check(q, 0)
            self._core._advance(q, now)
            self._core._settle(q, now)
            if changed is not None:
                changed(q.id)
            return dict(merged)

    def purge_queue(self, queue: str, *, caller: str | None = None) -> int:
        """Every message produced so far is gone for every tag; -> how many were retained."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            self._core._advance(q, now)
            self._core._settle(q, now)
            purged = q.next_seq - q.gone_seq
            q.purge_seq = q.next_seq
            if purged:
                self._core._raise_gone(q, q.next_seq)
            self._core._persist_watermarks(q)
            return purged

    # -- stats --------------------------------------------------------------------------------

    def stats(self, queue: str, tag: str | None = None, days: int = 7, *,
              caller: str | None = None) -> list[dict[str, Any]]:
        """Daily counters, newest first (days without activity omitted); without ``tag`` the
        queue's totals (sent counted once, the rest summed over tags)."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "peek", queue)
            q = self._core._queue(queue)
            t = self._core._tag(q, tag) if tag is not None else None
            count = check_int(days, "days", 1, 31)
            self._core._advance(q, now)
            self._core._settle(q, now)
            return self._core._counters.days(q, t, count)

    def _stats(self, q: QueueState, now: int) -> dict[str, Any]:
        live = [s for s in q.segments if s.last_seq >= q.gone_seq]
        rewind_from = self._core._first_seq_at(q, now - q.attributes["rewind"] * 1000)
        stats: dict[str, Any] = {
            "messages": q.next_seq - q.gone_seq,
            "bytes": sum(s.size_bytes for s in live),
            "segments": len(live),
            "oldest": self._core._production_ms(q, q.gone_seq) if q.gone_seq < q.next_seq else None,
            "newest": q.last_time_ms if q.gone_seq < q.next_seq else None,
            "rewindable": (q.next_seq - max(q.gone_seq, rewind_from)
                           if q.attributes["rewind"] else 0),
            "tags": {},
        }
        for t in sorted(q.tags.values(), key=lambda t: t.name.lower()):
            stats["tags"][t.name] = self._tag_stats(q, t, now)
        return stats

    def list_tags(self, queue: str, *, caller: str | None = None) -> list[TagInfo]:
        """Every tag of ``queue`` (ordered by lower-cased name) with its stats."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "peek", queue)
            q = self._core._queue(queue)
            self._core._advance(q, now)
            self._core._settle(q, now)
            return [TagInfo(t.name, t.start_ms, t.filter, t.created, self._tag_stats(q, t, now))
                    for t in sorted(q.tags.values(), key=lambda t: t.name.lower())]

    def _tag_stats(self, q: QueueState, t: TagState, now: int) -> dict[str, Any]:
        """Per-tag figures of DESIGN.md §8. ``inflight`` and ``delayed`` are exact; so are
        ``active`` and ``parked`` for unfiltered tags: counted without walking the backlog on
        a one-lane queue without topics (``_count_plain_lane``), else by walking the records
        the cursors have yet to reach (the cost grows with the backlog). A filtered tag's
        ``active`` / ``parked`` are refreshed at most every 10 s and flagged approximate."""
        store = self._core._store
        gone = q.gone_seq
        counts = {"active": 0, "inflight": 0, "delayed": 0, "parked": 0}
        for seq, lease in t.leases.items():
            if lease.state == LEASED and seq >= gone and lease.due_ms > now:
                counts["inflight"] += 1
        lower = keys.delay_key(q.id, t.delay_vt, t.delay_seq + 1)
        for key, lane_byte in Store.items(store.delays, lower, keys.queue_bounds(q.id)[1]):
            _, visible, seq = keys.delay_key_decode(key)
            if visible > now and seq >= gone and seq not in t.leases and not \
                    t.rewind_handled(visible, seq):
                value = store.log.get(keys.log_key(q.id, lane_byte[0], seq))
                if value is not None and in_scope(t, seq, PREFIX.unpack_from(value)[0],
                                                        value[PREFIX_SIZE:]):
                    counts["delayed"] += 1
        cached = t.stats_cache
        if t.filter is not None and cached is not None and now - cached[0] < 10_000:
            counts["active"], counts["parked"] = cached[1], cached[2]
        else:
            self._count_active(q, t, now, counts)
            if t.filter is not None:
                t.stats_cache = (now, counts["active"], counts["parked"])
        core = self._core
        floor = max(min(tag_floor(core._store, core._queues, core._now, q, t, dead_letters=False),
                        self._tag_delayed_floor(q, t)), gone)
        return {
            **counts,
            "lag": self._core._production_ms(q, floor) if floor < q.next_seq else None,
            "approximate": t.filter is not None,
        }

    def _tag_delayed_floor(self, q: QueueState, t: TagState) -> int:
        """The lowest seq of a delayed message the tag has yet to take from the delay index
        (for ``lag``; a walk of the queue's delayed messages by seq)."""
        lower = keys.delayseq_key(q.id, max(q.gone_seq, t.start_seq))
        upper = keys.queue_bounds(q.id)[1]
        for key, value in Store.items(self._core._store.delayseq, lower, upper):
            seq, visible = keys.delayseq_key_decode(key)[1], keys.read_u64(value)
            if holds_delayed(self._core._store, q, t, seq, visible):
                return seq
        return q.next_seq

    def _count_plain_lane(self, q: QueueState, t: TagState, lane: int, start: int,
                          counts: dict[str, int]) -> bool:
        """The lane part of ``_count_active`` without walking the backlog, where it can be
        counted: an unfiltered tag whose scope holds all of ``start..tail``, on a queue that
        uses one lane and never had a topic message. There every seq from ``gone_seq`` up is
        a record of that lane, and a record the cursor has yet to reach is Active unless it
        is delayed (a ``delayseq`` row, kept until its segment is collected) or leased. So
        Active = records - delayed - leased non-delayed: a walk of the delayed messages and
        of the tag's leases, not of the backlog. -> False where this does not apply."""
        tail = q.lane_tail[lane]
        if (t.filter is not None or len(q.lanes_used) != 1 or q.next_topic_id != 1
                or self._core._production_ms(q, start) < t.start_ms):
            return False
        leased = {seq for seq in t.leases if start <= seq <= tail}
        delayed = delayed_leased = 0
        lower, upper = keys.delayseq_key(q.id, start), keys.delayseq_key(q.id, tail + 1)
        for key in Store.keys(self._core._store.delayseq, lower, upper):
            delayed += 1
            if keys.delayseq_key_decode(key)[1] in leased:
                delayed_leased += 1
        counts["active"] += (tail - start + 1) - delayed - (len(leased) - delayed_leased)
        return True

    def _count_active(self, q: QueueState, t: TagState, now: int,
                      counts: dict[str, int]) -> None:
        """Count Active and Parked messages of a tag: leases run out, ended delays, what the
        cursors have not reached, and successors parked behind locked topics."""
        store = self._core._store
        gone = q.gone_seq
        seen: set[int] = set()

        def tally(seq: int, value: bytes) -> None:
            state = peek_state(self._core._store, q, t, seq, value, now)[0]
            if state in ("active", "parked"):
                counts[state] += 1
                seen.add(seq)

        for seq, lease in list(t.leases.items()):
            if lease.state == LEASED and seq >= gone and lease.due_ms <= now:
                value = store.log.get(keys.log_key(q.id, lease.lane, seq))
                if value is not None:
                    tally(seq, value)
        lower = keys.delay_key(q.id, t.delay_vt, t.delay_seq + 1)
        for key, lane_byte in Store.items(store.delays, lower, keys.delay_key(q.id, now + 1, 0)):
            seq = keys.delay_key_decode(key)[2]
            if seq >= gone and seq not in t.leases:
                value = store.log.get(keys.log_key(q.id, lane_byte[0], seq))
                if value is not None and in_scope(t, seq, PREFIX.unpack_from(value)[0],
                                                        value[PREFIX_SIZE:]):
                    tally(seq, value)
        unpack = PREFIX.unpack_from
        for lane in q.lanes_used:
            start = max(t.cursors[lane], gone, t.start_seq)
            if start > q.lane_tail[lane]:
                continue
            if self._count_plain_lane(q, t, lane, start, counts):
                continue
            lower, upper = keys.log_lane_bounds(q.id, lane, start)
            for key, value in Store.items(store.log, lower, upper):
                enqueue_ms, visible_ms, _, _ = unpack(value)
                seq = keys.log_seq(key)
                if visible_ms == enqueue_ms and seq not in t.leases and \
                        in_scope(t, seq, enqueue_ms, value[PREFIX_SIZE:]):
                    tally(seq, value)
        for topic, head in list(t.locked.items()):  # successors passed while parked,
            # and rewound messages passed while they wait behind an Inflight head
            lower = keys.topic_key(q.id, topic, max(t.topic_from.get(topic, head + 1), gone))
            for key in Store.keys(store.topics, lower, keys.topic_bounds(q.id, topic)[1]):
                seq = keys.topic_key_decode(key)[2]
                if seq in seen or seq in t.leases:
                    continue
                value = store.log.get(keys.log_key(q.id, 8, seq))
                if value is not None and in_scope(t, seq, unpack(value)[0],
                                                        value[PREFIX_SIZE:]):
                    tally(seq, value)
