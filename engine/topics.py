"""Tag scope (start, filter) and ordered topics (DESIGN.md §2 "Topics", §3).

Per tag, the messages of one topic that the tag receives are delivered one at a time in
production order. The rules, as the engine applies them:

- A topic message may be leased only when every earlier message of its topic in the tag's scope
  is Ended or Expired. Inductively it is enough to look at the nearest one (its predecessor):
  a predecessor was itself leased only after its own predecessor ended.
- While a topic has a head (a message successors wait behind) the tag remembers it in
  ``TagState.locked``; successors met by a cursor or the delay index are *parked*: passed
  without a row, to come back through the ``topics`` index when the head ends.
- When the head ends (delete, dead, delete_by_id, expiry) the topic unlocks, and its
  successor in scope, if any:
    1. Delayed and not yet taken from the delay index: arrives there when due;
    2. not delayed and not yet reached by its lane cursor: the cursor brings it, in
       never-delivered order (docs/STORAGE.md: a row for it would make memory grow with the
       backlog ahead of the cursor);
    3. otherwise it was parked: it becomes Active again now (a LEASED row due now, count 0),
       ordered by that time, and the new head; unless it was delivered and deleted in its
       turn before an earlier message came back out of turn (``topic_ended``): Ended.
  A successor with an Active-again row waited behind the head too: Active from now.
- A rewind (or a redrive) can leave earlier messages of a topic behind its Inflight head
  (``topic_from``): they wait while it is Inflight; if its lease runs out they go first
  (``head_lapsed``), and if it ends the successor search starts from them.
- Topic messages all live in the default lane; queues without topics pay nothing.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any, Iterator, Protocol

import cbor2

from . import keys
from .deadlines import Deadlines
from .errors import InvalidArgument
from .scope import TOPIC_VALUE, ended_in_turn, pending, topic_in_scope
from .state import DEFAULT_LANE, LEASED, Lease, QueueState, TagState
from .store import RangeReader, Store
from .validation import check_attribute_value

TOPIC_CACHE_SIZE = 65536
MAX_FILTER_ATTRIBUTES = 16
#: The most a filter's attributes map takes CBOR-encoded: ``list_tags`` answers every tag of a
#: queue with its filter, and 256 tags with such filters fit the smallest max_frame (2 MiB).
MAX_FILTER_BYTES = 4096


def check_filter(value: object) -> dict[str, Any] | None:
    """A tag filter ``{"attributes": {name: value|null}, "match": "all"|"any"}``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument("filter", "must be a map")
    for name in value:
        if name not in ("attributes", "match"):
            raise InvalidArgument(f"filter.{name}", "unknown filter field")
    attributes = value.get("attributes")
    if not isinstance(attributes, dict) or not 1 <= len(attributes) <= MAX_FILTER_ATTRIBUTES:
        raise InvalidArgument("filter.attributes",
                              f"must be a map of 1-{MAX_FILTER_ATTRIBUTES} attributes")
    for name, item in attributes.items():
        if not isinstance(name, str) or not 1 <= len(name.encode()) <= 128:
            raise InvalidArgument("filter.attributes", "names are 1-128 bytes of text")
        if item is not None:
            check_attribute_value(item, f"filter.attributes.{name}")
    if len(cbor2.dumps(attributes)) > MAX_FILTER_BYTES:
        raise InvalidArgument("filter.attributes",
                              f"must take at most {MAX_FILTER_BYTES} bytes CBOR-encoded")
    match = value.get("match", "all")
    if match not in ("all", "any"):
        raise InvalidArgument("filter.match", 'must be "all" or "any"')
    return {"attributes": dict(attributes), "match": match}


class TopicContext(Protocol):
    """What the topics read of the engine: its store and deadlines, and the lease and tag
    writes they share with the other delivery paths."""

    _store: Store
    _deadlines: Deadlines

    def _save_tag_definition(self, q: QueueState, t: TagState) -> None: ...

    def _lease_saved(self, q: QueueState, t: TagState, seq: int, lease: Lease,
                     old_due: int | None) -> None: ...

    def _notify(self, q: QueueState) -> None: ...


class Topics:
    """Scope checks and the topic gate, shared by every delivery path; owned by the engine.
    Holds the bounded cache of topic ids (``reset`` after a reload, ``forget`` a queue)."""

    def __init__(self, context: TopicContext) -> None:
        self._context = context
        self._ids: OrderedDict[tuple[int, str], int] = OrderedDict()

    def reset(self) -> None:
        """Forget the cached topic ids (the store is read again on use)."""
        self._ids = OrderedDict()

    def forget(self, queue_id: int) -> None:
        """Drop the cached topic ids of a deleted queue."""
        for cached in [k for k in self._ids if k[0] == queue_id]:
            del self._ids[cached]


    def id(self, q: QueueState, topic: str) -> int:
        """The id of ``topic`` in ``q``, assigned on first use (a bounded cache in memory:
        memory does not grow with the number of topics)."""
        cache = self._ids
        cache_key = (q.id, topic)
        topic_id = cache.get(cache_key)
        if topic_id is not None:
            cache.move_to_end(cache_key)
            return topic_id
        store = self._context._store
        stored = store.meta.get(keys.topic_name_key(q.id, topic))
        if stored is None:
            topic_id = q.next_topic_id
            q.next_topic_id += 1
            store.put(store.meta_h, keys.topic_name_key(q.id, topic), keys.u32(topic_id))
        else:
            topic_id = keys.read_u32(stored)
        cache[cache_key] = topic_id
        if len(cache) > TOPIC_CACHE_SIZE:
            cache.popitem(last=False)
        return topic_id

    def reader(self, q: QueueState) -> RangeReader:
        """Walks of ``q``'s topics index share one iterator (the gate and the successor search
        run once per topic message received or ended)."""
        return self._context._store.reader(self._context._store.topics, *keys.queue_bounds(q.id))

    def index(self, q: QueueState, topic_id: int, seq: int, enqueue_ms: int,
                     visible_ms: int) -> None:
        store = self._context._store
        store.batch.put(keys.topic_key(q.id, topic_id, seq),
                        TOPIC_VALUE.pack(enqueue_ms, visible_ms), store.topics_h)

    def messages(self, q: QueueState, t: TagState, topic_id: int, first: int,
                        end: int | None = None) -> Iterator[tuple[int, int, int]]:
        """(seq, enqueue ms, visible ms) of the messages of ``topic_id`` in the tag's scope
        from seq ``first`` (not below ``gone_seq``) up to ``end`` (exclusive; None: all)."""
        lower = keys.topic_key(q.id, topic_id, max(first, q.gone_seq))
        upper = (keys.topic_bounds(q.id, topic_id)[1] if end is None
                 else keys.topic_key(q.id, topic_id, end))
        for key, value in self.reader(q).forward(lower, upper):
            seq = keys.topic_key_decode(key)[2]
            enqueue_ms, visible_ms = TOPIC_VALUE.unpack(value)
            if topic_in_scope(self._context._store, q, t, seq, enqueue_ms):
                yield seq, enqueue_ms, visible_ms

    def parked(self, q: QueueState, t: TagState, topic_id: int) -> None:
        """A cursor or the delay index passed a successor of ``topic_id`` while parked."""
        t.parked_topics.add(topic_id)
        store = self._context._store
        store.put(store.meta_h, keys.parked_topic_key(q.id, t.id, topic_id), b"")

    def unparked(self, q: QueueState, t: TagState, topic_id: int) -> None:
        if topic_id in t.parked_topics:
            t.parked_topics.discard(topic_id)
            store = self._context._store
            store.delete(store.meta_h, keys.parked_topic_key(q.id, t.id, topic_id))

    def relock_parked(self, q: QueueState, t: TagState, topic_id: int) -> None:
        """At open: lock a topic with passed successors on its earliest message that is not
        Ended and not passed (Inflight, Active again, or pending), as it was before; the
        passed ones wait behind it. Nothing left: the marker goes."""
        for seq, enqueue_ms, visible_ms in self.messages(q, t, topic_id, t.start_seq):
            lease = t.leases.get(seq)
            if (lease is not None and lease.state == LEASED) or (
                    lease is None and pending(t, seq, enqueue_ms, visible_ms)):
                t.lock(topic_id, seq)
                return
        self.unparked(q, t, topic_id)

    def rejoined(self, q: QueueState, t: TagState, topic_id: int, seq: int,
                        now: int) -> None:
        """``seq`` of ``topic_id`` is Active again out of turn (redriven): it goes before a
        later head that is not Inflight; behind an Inflight one it waits, and the successor
        search of that head starts from it (as after a rewind)."""
        head = t.locked.get(topic_id)
        if (head is None or head > seq) and topic_id not in t.parked_topics:
            self._mark_ended_in_turn(q, t, topic_id, head)
        if head is None:  # the earliest message of its topic not Ended: its head
            t.lock(topic_id, seq)
            return
        if head <= seq:
            return
        lease = t.leases.get(head)
        if lease is not None and lease.state == LEASED and lease.due_ms > now:
            t.topic_from[topic_id] = min(t.topic_from.get(topic_id, seq), seq)
            self._context._save_tag_definition(q, t)
            self.watch_lapse(q, t, topic_id)
        else:
            t.unlock(topic_id)
            t.lock(topic_id, seq)

    def _mark_ended_in_turn(self, q: QueueState, t: TagState, topic_id: int,
                            head: int | None) -> None:
        """A message of ``topic_id`` comes back out of turn while no successor of it is
        parked (``parked_topics`` marks every topic that may have some). Its successors
        without a row that a cursor (or the delay index) passed were delivered and deleted in
        their turn: mark them Ended for the successor searches after it ends. Parked ones
        may follow later, after the head: the mark stops there."""
        cursor = t.cursors[DEFAULT_LANE]
        limit = cursor if head is None else min(cursor, head)
        old = t.topic_ended.get(topic_id)
        if old is not None:
            limit = max(limit, old[0])
        t.topic_ended[topic_id] = (limit, t.delay_vt, t.delay_seq)
        self._context._save_tag_definition(q, t)

    def from_ended(self, q: QueueState, t: TagState, topic_id: int, seq: int) -> None:
        """``seq``, the first message of ``topic_id`` waiting behind its Inflight head
        (``topic_from``), is Ended: the wait starts at the next one not Ended (it holds the
        tag's floor); with none left nothing waits."""
        head = t.locked.get(topic_id)
        start = None
        if head is not None:
            for later, _, _ in self.messages(q, t, topic_id, seq + 1, head):
                lease = t.leases.get(later)
                if lease is None or lease.state == LEASED:
                    start = later
                    break
        if start is None:
            t.topic_from.pop(topic_id, None)
        else:
            t.topic_from[topic_id] = start
        self._context._save_tag_definition(q, t)

    def watch_lapse(self, q: QueueState, t: TagState, topic_id: int) -> None:
        """Rewound (or redriven) messages of ``topic_id`` wait behind its Inflight head: have
        the head's lease deadline checked (``apply_due_lapses``)."""
        head = t.locked.get(topic_id)
        lease = t.leases.get(head) if head is not None else None
        if head is not None and lease is not None and lease.state == LEASED:
            self._context._deadlines.watch_lapse(q, t, head, lease.due_ms)

    def apply_due_lapses(self, queues: dict[int, QueueState], now: int) -> None:
        """Topic heads whose lease ran out by ``now`` while rewound messages of their topic
        waited behind them: those go first now (``head_lapsed``), in deadline order."""
        heap = self._context._deadlines.lapse_heap
        while heap and heap[0][0] <= now:
            due, queue_id, tag_id, seq = heapq.heappop(heap)
            q = queues.get(queue_id)
            t = q.tags.get(tag_id) if q is not None else None
            if q is None or t is None:
                continue
            lease, topic_id = t.leases.get(seq), t.heads.get(seq)
            if (lease is not None and lease.state == LEASED and lease.due_ms == due
                    and topic_id is not None and topic_id in t.topic_from):
                self.head_lapsed(q, t, seq, topic_id, due)

    def head_lapsed(self, q: QueueState, t: TagState, head: int, topic_id: int,
                           at: int) -> None:
        """The lease of ``head`` ran out at ``at`` while rewound messages of its topic waited
        behind it (``topic_from``): it is no longer Inflight, so production order holds
        again (DESIGN.md §2: a rewound message waits behind an *Inflight* message of its
        topic). The earliest of them not Ended becomes the head; ``head`` (Active again) waits
        behind it like any successor. A passed one is Active again from ``at``."""
        start = t.topic_from.pop(topic_id)
        self._context._save_tag_definition(q, t)
        for earlier, enqueue_ms, visible_ms in self.messages(q, t, topic_id, start, head):
            lease = t.leases.get(earlier)
            if lease is not None and lease.state != LEASED:
                continue  # Ended
            if lease is None and not pending(t, earlier, enqueue_ms, visible_ms) \
                    and ended_in_turn(t, topic_id, earlier, enqueue_ms, visible_ms):
                continue
            t.unlock(topic_id)
            t.lock(topic_id, earlier)
            if lease is None and not pending(t, earlier, enqueue_ms, visible_ms):
                # Passed by its cursor (or the delay index) while it waited: Active again.
                self._context._lease_saved(q, t, earlier,
                                           Lease(LEASED, DEFAULT_LANE, at, 0, 0, 0), None)
                self._context._notify(q)
            elif lease is None and topic_id not in t.parked_topics:
                # A cursor brings it; until then the lock lives in memory only: the marker
                # has it relocked on it at open (``relock_parked``), not on ``head``.
                self.parked(q, t, topic_id)
            return

    def head_ended(self, q: QueueState, t: TagState, seq: int, now: int) -> None:
        """``seq`` was the head of a topic and is Ended or Expired: pass the topic on."""
        topic_id = t.heads.get(seq)
        if topic_id is None:
            return
        t.unlock(topic_id)
        start = seq + 1
        if topic_id in t.topic_from:  # rewound messages wait from there (rewind.py)
            start = min(start, t.topic_from.pop(topic_id))
            self._context._save_tag_definition(q, t)
        for successor, enqueue_ms, visible_ms in self.messages(q, t, topic_id, start):
            if successor == seq:
                continue
            lease = t.leases.get(successor)
            if lease is not None:
                if lease.state == LEASED:
                    t.lock(topic_id, successor)
                    if lease.due_ms < now:
                        # Active again, but it waited behind this head (a redriven or rewound
                        # message came back before it): Active from the head's end, like a
                        # parked successor (DESIGN.md §2 "Delivery order").
                        old_due, lease.due_ms = lease.due_ms, now
                        self._context._lease_saved(q, t, successor, lease, old_due)
                        self._context._notify(q)
                    return
                continue  # ended ahead of its turn
            if pending(t, successor, enqueue_ms, visible_ms):
                # A cursor or the delay index brings it; the gate lets it through then (its
                # predecessor has ended). Nothing to remember meanwhile (memory stays with
                # what is in flight, not with the backlog or the number of topics) unless
                # later successors were passed while parked: they wait behind this one.
                if topic_id in t.parked_topics:
                    t.lock(topic_id, successor)
                return
            if ended_in_turn(t, topic_id, successor, enqueue_ms, visible_ms):
                continue  # delivered and deleted before an earlier one came back
            # Parked (passed by a cursor or the delay index): Active again from now, ordered
            # by this time (DESIGN.md §2 "Delivery order"), never delivered (count 0).
            t.lock(topic_id, successor)
            self._context._lease_saved(q, t, successor,
                                       Lease(LEASED, DEFAULT_LANE, now, 0, 0, 0), None)
            self._context._notify(q)
            return
        self.unparked(q, t, topic_id)  # nothing left behind its head
        if t.topic_ended.pop(topic_id, None) is not None:
            self._context._save_tag_definition(q, t)
