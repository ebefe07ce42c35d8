"""Queue administration: create, delete, list, get (with stats), set attributes, purge."""

from __future__ import annotations

from typing import Any, Mapping

import cbor2

from . import keys
from .core import DEFAULT_TAG
from .grants import PERMISSIONS, GrantOps
from .tagging import TagOps
from .errors import (
    InvalidArgument,
    InvalidRedrivePolicy,
    QueueAlreadyExists,
    QueueNotFound,
    TooManyQueues,
)
from .records import PREFIX
from .results import QueueInfo, QueuePage
from .state import LEASED, QueueState, TagState
from .store import COLUMN_FAMILIES, Store
from .validation import (
    check_args,
    check_int,
    check_queue_name,
    default_queue_attributes,
    merge_queue_attributes,
)

MAX_LIST_LIMIT = 1000


class AdminOps(GrantOps, TagOps):
    """Operations on queues as a whole."""

    def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None, *,
                     caller: str | None = None) -> QueueInfo:
        """Create a queue (and its ``default`` tag). Idempotent for an equal definition."""
        with self._operation() as now:
            check_queue_name(queue)
            self._check(caller, "manage", queue)
            resolved = merge_queue_attributes(default_queue_attributes(), attributes)
            existing_id = self._queue_names.get(queue.lower())
            if existing_id is not None:
                existing = self._queues[existing_id]
                if existing.name == queue and existing.attributes == resolved:
                    return QueueInfo(existing.name, dict(existing.attributes), existing.created)
                raise QueueAlreadyExists(f"queue: {existing.name!r} exists with other "
                                         "attributes or another letter case", field="queue")
            self._check_redrive(queue, resolved["redrive"], caller)
            if len(self._queues) >= self.max_queues:
                raise TooManyQueues(f"queue: the server holds max_queues {self.max_queues}")
            queue_id = self._next_queue_id
            self._next_queue_id += 1
            q = QueueState(queue_id, queue, resolved, now)
            store = self._store
            store.put(store.meta_h, keys.queue_name_key(queue), keys.u32(queue_id))
            store.put(store.meta_h, keys.queue_def_key(queue_id), cbor2.dumps(q.definition()))
            self._persist_watermarks(q)
            self._queues[queue_id] = q
            self._queue_names[queue.lower()] = queue_id
            self._add_tag(q, DEFAULT_TAG, 0, 0, None, now)
            if caller is not None:  # the creator gets all five permissions on its queue
                self._store_grant(caller, queue.lower(), PERMISSIONS)
            return QueueInfo(queue, dict(resolved), now)

    def _check_redrive(self, queue: str, redrive: dict[str, Any] | None,
                       caller: str | None) -> None:
        """DESIGN.md §2 dead-letter rules for ``queue`` naming ``redrive`` (and ``send`` on the
        dead-letter queue for the caller)."""
        if redrive is None:
            return
        self._check(caller, "send", redrive["dlq"], "attributes.redrive.dlq")
        dlq_id = self._queue_names.get(redrive["dlq"].lower())
        if dlq_id is None:
            raise InvalidRedrivePolicy(f"attributes.redrive.dlq: no queue named "
                                       f"{redrive['dlq']!r}", field="attributes.redrive.dlq")
        dlq = self._queues[dlq_id]
        if dlq.name.lower() == queue.lower():
            raise InvalidRedrivePolicy("attributes.redrive.dlq: a queue cannot be its own "
                                       "dead-letter queue", field="attributes.redrive.dlq")
        if dlq.attributes["redrive"] is not None:
            raise InvalidRedrivePolicy("attributes.redrive.dlq: a queue with a redrive policy "
                                       "cannot be a dead-letter queue",
                                       field="attributes.redrive.dlq")
        for other in self._queues.values():
            policy = other.attributes["redrive"]
            if policy is not None and policy["dlq"].lower() == queue.lower():
                raise InvalidRedrivePolicy("attributes.redrive: a dead-letter queue cannot "
                                           "have a redrive policy", field="attributes.redrive")

    def delete_queue(self, queue: str, *, caller: str | None = None) -> None:
        """Remove a queue, its tags and all its data; policies naming it as DLQ are removed."""
        with self._operation():
            self._check(caller, "manage", queue)
            q = self._queue(queue)
            store = self._store
            lower, upper = keys.queue_bounds(q.id)
            for family in COLUMN_FAMILIES:
                if family != "meta":
                    store.delete_range(getattr(store, f"{family}_h"), lower, upper)
            store.delete(store.meta_h, keys.queue_name_key(q.name))
            store.delete(store.meta_h, keys.queue_def_key(q.id))
            store.delete(store.meta_h, keys.watermarks_key(q.id))
            store.delete_range(store.meta_h, *keys.tag_def_bounds(q.id))
            del self._queues[q.id]
            del self._queue_names[q.name.lower()]
            self._drop_grants_on(q.name)
            for other in self._queues.values():
                policy = other.attributes["redrive"]
                if policy is not None and policy["dlq"].lower() == q.name.lower():
                    other.attributes = {**other.attributes, "redrive": None}
                    store.put(store.meta_h, keys.queue_def_key(other.id),
                              cbor2.dumps(other.definition()))

    def list_queues(self, prefix: str | None = None, after: str | None = None,
                    limit: int = MAX_LIST_LIMIT, *, caller: str | None = None) -> QueuePage:
        """Queue names ordered by lower-cased name; ``next`` is the ``after`` of the next page."""
        with self._operation():
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
            for name_key, value in Store.items(self._store.meta, lower, upper):
                if not name_key.startswith(prefix_key):
                    break
                name = self._queues[keys.read_u32(value)].name
                if not self._may(caller, "peek", name):
                    continue
                if len(names) == limit:
                    more = True
                    break
                names.append(name)
            return QueuePage(names, names[-1] if more else None)

    def get_queue(self, queue: str, *, caller: str | None = None) -> QueueInfo:
        """Attributes, creation time and the stats of DESIGN.md §8."""
        with self._operation() as now:
            self._check(caller, "peek", queue)
            q = self._queue(queue)
            self._advance(q, now)
            self._settle(q, now)
            return QueueInfo(q.name, dict(q.attributes), q.created, self._stats(q, now))

    def set_queue_attributes(self, queue: str, attributes: Mapping[str, Any], *,
                             caller: str | None = None) -> dict[str, Any]:
        """Change the given attributes (all rules hold afterwards, else nothing changes)."""
        with self._operation() as now:
            self._check(caller, "manage", queue)
            q = self._queue(queue)
            if not isinstance(attributes, Mapping):
                raise InvalidArgument("attributes", "must be a map")
            merged = merge_queue_attributes(q.attributes, attributes)
            if merged["redrive"] != q.attributes["redrive"]:
                self._check_redrive(q.name, merged["redrive"], caller)
            self._advance(q, now)
            q.attributes = merged
            q.oldest_live_ms = -1 if q.expired_seq >= q.next_seq else q.oldest_live_ms
            store = self._store
            store.put(store.meta_h, keys.queue_def_key(q.id), cbor2.dumps(q.definition()))
            q.oldest_live_ms = self._production_ms(q, q.expired_seq)
            self._advance(q, now)
            self._settle(q, now)
            return dict(merged)

    def purge_queue(self, queue: str, *, caller: str | None = None) -> int:
        """Every message produced so far is gone for every tag; -> how many were retained."""
        with self._operation() as now:
            self._check(caller, "manage", queue)
            q = self._queue(queue)
            self._advance(q, now)
            self._settle(q, now)
            purged = q.next_seq - q.gone_seq
            q.purge_seq = q.next_seq
            if purged:
                self._raise_gone(q, q.next_seq)
            self._persist_watermarks(q)
            return purged

    # -- stats --------------------------------------------------------------------------------

    def _stats(self, q: QueueState, now: int) -> dict[str, Any]:
        live = [s for s in q.segments if s.last_seq >= q.gone_seq]
        rewind_from = self._first_seq_at(q, now - q.attributes["rewind"] * 1000)
        stats: dict[str, Any] = {
            "messages": q.next_seq - q.gone_seq,
            "bytes": sum(s.bytes for s in live),
            "segments": len(live),
            "oldest": self._production_ms(q, q.gone_seq) if q.gone_seq < q.next_seq else None,
            "newest": q.last_time_ms if q.gone_seq < q.next_seq else None,
            "rewindable": (q.next_seq - max(q.gone_seq, rewind_from)
                           if q.attributes["rewind"] else 0),
            "tags": {},
        }
        for t in sorted(q.tags.values(), key=lambda t: t.name.lower()):
            stats["tags"][t.name] = self._tag_stats(q, t, now)
        return stats

    def _tag_stats(self, q: QueueState, t: TagState, now: int) -> dict[str, Any]:
        """Exact counts. ``active`` counts never-delivered and delay-ended messages by walking
        the backlog's keys (cost grows with the backlog; get_queue is not a hot path)."""
        store = self._store
        gone = q.gone_seq
        inflight = active = delayed = 0
        for seq, lease in t.leases.items():
            if lease.state == LEASED and seq >= gone:
                if lease.due > now:
                    inflight += 1
                else:
                    active += 1
        lower = keys.delay_key(q.id, t.delay_vt, t.delay_seq + 1)
        upper = keys.queue_bounds(q.id)[1]
        for key in Store.keys(store.delays, lower, upper):
            _, visible, seq = keys.delay_key_decode(key)
            if seq >= gone and seq >= t.start_seq and seq not in t.leases:
                if visible > now:
                    delayed += 1
                else:
                    active += 1
        unpack = PREFIX.unpack_from
        for lane in q.lanes_used:
            start = max(t.cursors[lane], gone, t.start_seq)
            if start > q.lane_tail[lane]:
                continue
            lower, upper = keys.log_lane_bounds(q.id, lane, start)
            for key, value in Store.items(store.log, lower, upper):
                enqueue_ms, visible_ms, _, _ = unpack(value)
                if visible_ms == enqueue_ms and keys.log_seq(key) not in t.leases:
                    active += 1
        floor = max(self._tag_floor(q, t), gone)
        return {
            "active": active,
            "inflight": inflight,
            "delayed": delayed,
            "parked": 0,
            "lag": self._production_ms(q, floor) if floor < q.next_seq else None,
            "approximate": False,
        }
