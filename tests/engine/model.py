"""A plain in-memory reference model of the engine's message semantics (DESIGN.md §2), for the
model-based tests (``test_model.py``: the core; ``test_model_readers.py``: tags, topics,
dead-letter queues, rewind, peek).

Written from DESIGN.md, not from the engine's code, and deliberately naive: lists, linear scans
and recomputation from scratch. Where DESIGN.md leaves a choice open the model takes one and
says so (search for "open:"); the model tolerates no other answer from the engine.

Vocabulary (DESIGN.md §2): per tag a message is Active, Inflight, Delayed, Parked or Ended;
Expired for everyone. ``TagMsg.status`` is what the tag did to it (never-delivered, leased,
deleted, dead-lettered); the *category* (active / inflight / delayed / parked / ended) follows
from the status, the clock and the other messages of its topic.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import cbor2
from hypothesis import HealthCheck, settings

from lamina.engine import InvalidArgument, LaminaError, MessageTooLarge

DEFAULTS = {
    "visibility_timeout": 30, "polling_wait": 0, "max_message_size": 262144,
    "retention": 345600, "delay": 0, "max_messages": 100_000_000, "rewind": 0,
    "redrive": None,
}
MAX_DELAY_S = 30 * 86400
MAX_VISIBILITY_S = 43200
DEFAULT_PRIORITY = 8

def machine_settings(examples: int, steps: int) -> settings:
    """Settings of a model state machine; ``LAMINA_MODEL_EXAMPLES`` and
    ``LAMINA_MODEL_STEPS`` override the number of examples and of steps per example (README
    "Tests")."""
    return settings(
        max_examples=int(os.environ.get("LAMINA_MODEL_EXAMPLES", examples)),
        stateful_step_count=int(os.environ.get("LAMINA_MODEL_STEPS", steps)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


# -- entries -----------------------------------------------------------------------------------


def floor_ms(seconds: int | float) -> int:
    """DESIGN.md §2: a duration in seconds becomes milliseconds by ``floor(s * 1000)``."""
    return math.floor(seconds * 1000)


def is_number(value: object) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def is_int(value: object) -> bool:
    return type(value) is int  # booleans are never integers


class Invalid(Exception):
    """The model's verdict that an entry is refused, with the error class expected."""

    def __init__(self, error: type[LaminaError]):
        super().__init__(error.__name__)
        self.error = error


def body_bytes(body: object) -> bytes:
    if type(body) is bytes:
        data = body
    elif type(body) is str:
        data = body.encode("utf-8")
    else:
        raise Invalid(InvalidArgument)
    if not data:
        raise Invalid(InvalidArgument)
    return data


def check_attributes(attributes: object) -> dict[str, Any]:
    """DESIGN.md §2: up to 64 attributes, names 1-128 bytes (``DLQ.`` reserved), values
    text / bytes / int (CBOR range) / finite float / bool."""
    if not isinstance(attributes, dict) or len(attributes) > 64:
        raise Invalid(InvalidArgument)
    for name, value in attributes.items():
        if type(name) is not str or not 1 <= len(name.encode()) <= 128:
            raise Invalid(InvalidArgument)
        if name.startswith("DLQ."):
            raise Invalid(InvalidArgument)
        if type(value) in (str, bytes, bool):
            continue
        if type(value) is int and -(1 << 64) <= value <= (1 << 64) - 1:
            continue
        if type(value) is float and math.isfinite(value):
            continue
        raise Invalid(InvalidArgument)
    return attributes


@dataclass
class Parsed:
    body: bytes | str
    data: bytes
    attributes: dict[str, Any] | None
    priority: int
    delay_ms: int
    topic: str | None = None


def parse_entry(raw: object, attrs: dict[str, Any]) -> Parsed:
    """A send entry of PROTOCOL.md §4 for a queue with attributes ``attrs``, or ``Invalid``."""
    if type(raw) in (bytes, str):
        parsed = Parsed(raw, body_bytes(raw), None, DEFAULT_PRIORITY,  # type: ignore[arg-type]
                        attrs["delay"] * 1000)
    elif isinstance(raw, dict):
        if any(type(key) is not int or key not in (1, 2, 3, 4, 5) for key in raw):
            raise Invalid(InvalidArgument)
        if 1 not in raw:
            raise Invalid(InvalidArgument)
        data = body_bytes(raw[1])
        attributes = check_attributes(raw[2]) if raw.get(2) is not None else None
        topic = None
        if raw.get(3) is not None:
            topic = raw[3]
            if type(topic) is not str or not 1 <= len(topic.encode()) <= 128:
                raise Invalid(InvalidArgument)
        priority = DEFAULT_PRIORITY
        if raw.get(4) is not None:
            if not is_int(raw[4]) or not 1 <= raw[4] <= 16:
                raise Invalid(InvalidArgument)
            priority = raw[4]
        if topic is not None and priority != DEFAULT_PRIORITY:
            raise Invalid(InvalidArgument)  # a topic or a non-default priority, not both
        delay_ms = attrs["delay"] * 1000
        if raw.get(5) is not None:
            if not is_number(raw[5]) or not 0 <= raw[5] <= MAX_DELAY_S:
                raise Invalid(InvalidArgument)
            delay_ms = floor_ms(raw[5])
            if delay_ms >= attrs["retention"] * 1000:
                raise Invalid(InvalidArgument)
        parsed = Parsed(raw[1], data, attributes, priority, delay_ms, topic)
    else:
        raise Invalid(InvalidArgument)
    size = len(parsed.data) + (len(cbor2.dumps(parsed.attributes))
                               if parsed.attributes is not None else 0)
    if size > attrs["max_message_size"]:
        raise Invalid(MessageTooLarge)
    return parsed


def visibility_entry_ok(entry: object) -> bool:
    """A ``change_visibility`` entry is ``[receipt, seconds]`` with 0 <= seconds <= 43200."""
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    timeout = entry[1]
    return is_number(timeout) and 0 <= timeout <= MAX_VISIBILITY_S


def typed(value: Any) -> Any:
    """A comparable form that tells ``True`` from ``1`` and ``1.0``, bytes from text."""
    if isinstance(value, dict):
        return {typed(k): typed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def error_name(result: object) -> str:
    return type(result).__name__ if isinstance(result, LaminaError) else "ok"


def filter_matches(flt: dict[str, Any] | None, attributes: dict[str, Any] | None) -> bool:
    """DESIGN.md §2 "Tags": a value matches only an equal value of the same CBOR type;
    ``null`` means "has this attribute"; ``match`` all (default) or any."""
    if flt is None:
        return True
    attributes = attributes or {}
    hits = []
    for name, wanted in flt["attributes"].items():
        if name not in attributes:
            hits.append(False)
        elif wanted is None:
            hits.append(True)
        else:
            have = attributes[name]
            hits.append(type(have) is type(wanted) and have == wanted)
    return all(hits) if flt.get("match", "all") == "all" else any(hits)


# -- state ------------------------------------------------------------------------------------

# What a tag did to a message (TagMsg.status).
NEW, LEASED, DELETED, DEAD = "never-delivered", "leased", "deleted", "dead"
SEALED = "sealed"  # a DEAD message's copy: it ended before a rewind of the DLQ revived it
# Categories (DESIGN.md §2 words; peek's states).
ACTIVE, INFLIGHT, DELAYED, PARKED, ENDED = "active", "inflight", "delayed", "parked", "ended"


@dataclass(eq=False)
class TagMsg:
    """One message as one tag sees it."""

    status: str = NEW
    due: int = 0                # LEASED: when the lease ends (Inflight while now < due)
    lease: int = -1             # LEASED: the model's number of the current lease
    count: int = 0              # dequeue_count
    first: int | None = None    # first_dequeue_time
    # Delivery order. ``base``: when the message became Active again leaving its topic aside
    # (a lease ended, its delay ended, a redrive), None for a never-delivered message without
    # a delay (taken by (priority, seq)). ``unpark``: when it last became Active because it
    # was Parked and its topic let it go; that time orders it then (DESIGN.md §2 "Delivery
    # order": "the end of the topic predecessor that parked them").
    base: int | None = None
    unpark: int | None = None
    cat: str | None = None      # the category last computed (None: not computed yet)
    taken: bool = False         # delivered since it last became never-delivered
    copy: Any = None            # DEAD: (dlq, copy ModelMessage), the PendingCopy or SEALED

    def key(self, m: ModelMessage, reached: bool = True) -> tuple[int, int, int]:
        """(group, time or priority, seq): Active again (group 0) before never-delivered.
        ``reached=False``: the order of a message its topic let go that no receive had
        passed (see ``Model.orders``)."""
        if self.unpark is not None and reached:
            return (0, self.unpark, m.seq)
        if self.base is None:
            return (1, m.priority, m.seq)
        return (0, self.base, m.seq)


@dataclass(eq=False)
class ModelMessage:
    seq: int
    id: str
    body: bytes | str
    data: bytes
    attributes: dict[str, Any] | None
    priority: int
    topic: str | None
    enqueue: int
    visible: int
    dead: list[Any] | None = None
    dead_tag: ModelTag | None = None                        # a copy: the tag it died under
    per: dict[int, TagMsg] = field(default_factory=dict)   # tag uid -> its view

    @property
    def sent_delayed(self) -> bool:
        return self.visible > self.enqueue


@dataclass(eq=False)
class ModelTag:
    uid: int                      # never reused, like the engine's tag ids
    name: str
    start_ms: int                 # the tag sees messages produced at or after it ...
    start_seq: int                # ... and (for "now") sent after it was created
    filter: dict[str, Any] | None
    created: int
    gone_at_creation: int = 0     # the queue's gone_seq when the tag was created

    def scope(self, m: ModelMessage) -> bool:
        return (m.seq >= self.start_seq and m.enqueue >= self.start_ms
                and filter_matches(self.filter, m.attributes))


@dataclass(eq=False)
class PendingCopy:
    """A dead-letter move the model made; the engine's copy (id, enqueue_time, its place in the
    DLQ) is learned by peeking the DLQ right after."""

    source: ModelQueue
    dlq: ModelQueue
    tag: ModelTag
    original: ModelMessage
    count: int
    dead_time: int
    entry: TagMsg
    optional: bool = False      # open: the engine may or may not make this move (apply_moves)


class ModelQueue:
    def __init__(self, name: str, attributes: dict[str, Any], created: int):
        self.name = name
        self.attrs = attributes
        self.created = created
        self.messages: list[ModelMessage] = []   # index == seq
        self.tags: dict[str, ModelTag] = {}      # lower-cased name -> tag
        self.gone = 0          # gone_seq as the model believes the engine has it (see gone_bounds)
        self.gone_high = 0     # how far DESIGN.md lets it be at the last settle
        self.purge = 0
        self.last_id = ""
        self.expired_floor = 0  # expired_seq when retention was last set (it never falls)

    @property
    def next_seq(self) -> int:
        return len(self.messages)

    @property
    def retention_ms(self) -> int:
        return self.attrs["retention"] * 1000

    def tag(self, name: str | None) -> ModelTag | None:
        return self.tags.get("default" if name is None else name.lower())

    def sorted_tags(self) -> list[ModelTag]:
        return [self.tags[k] for k in sorted(self.tags)]

    def expired_seq(self, now: int) -> int:
        """Messages with ``enqueue_time < now - retention`` are Expired (a prefix of seqs);
        raising ``retention`` brings nothing back (``expired_floor``)."""
        horizon = now - self.retention_ms
        for m in self.messages:
            if m.enqueue >= horizon:
                return max(m.seq, self.expired_floor)
        return self.next_seq

    def set_retention(self, retention_s: int, now: int) -> None:
        """``set_queue_attributes`` of ``retention``: what expired stays Expired."""
        self.expired_floor = self.expired_seq(now)
        self.attrs = {**self.attrs, "retention": retention_s}

    def first_seq_at(self, time: int) -> int:
        return next((m.seq for m in self.messages if m.enqueue >= time), self.next_seq)

    def low(self, now: int) -> int:
        """Below this seq nothing exists for message operations at ``now``."""
        return max(self.gone, self.purge, self.expired_seq(now))

    def by_id(self, message_id: object) -> ModelMessage | None:
        return next((m for m in self.messages if m.id == message_id), None)


class Model:
    """Every queue of one engine, and the clock as the model last saw it."""

    def __init__(self, now: int):
        self.now = now
        self.queues: dict[str, ModelQueue] = {}
        self.pending: list[PendingCopy] = []
        self.next_uid = 0
        self.lease_counter = 0

    # -- queues and tags -------------------------------------------------------------------

    def add_queue(self, name: str, attributes: dict[str, Any]) -> ModelQueue:
        q = ModelQueue(name, attributes, self.now)
        self.queues[name] = q
        self.add_tag(q, "default", 0, 0, None)
        return q

    def add_tag(self, q: ModelQueue, name: str, start_ms: int, start_seq: int,
                flt: dict[str, Any] | None) -> ModelTag:
        self.next_uid += 1
        t = ModelTag(self.next_uid, name, start_ms, start_seq, flt, self.now)
        q.tags[name.lower()] = t
        self.recompute(self.now)
        return t

    def dlq_of(self, q: ModelQueue) -> ModelQueue | None:
        policy = q.attrs["redrive"]
        return None if policy is None else self.queues.get(policy["dlq"])

    def view(self, t: ModelTag, m: ModelMessage) -> TagMsg:
        x = m.per.get(t.uid)
        if x is None:
            x = m.per[t.uid] = self.never_delivered(m)
        return x

    @staticmethod
    def never_delivered(m: ModelMessage) -> TagMsg:
        """A message as a tag sees it right after its send (or after a rewind)."""
        if m.sent_delayed:  # Active, once its delay ends, again from visible_time
            return TagMsg(NEW, base=m.visible)
        return TagMsg(NEW)

    # -- categories ------------------------------------------------------------------------

    def categories(self, q: ModelQueue, t: ModelTag, now: int
                   ) -> list[tuple[ModelMessage, TagMsg, str]]:
        """Every message the tag receives that exists at ``now``, in seq order, with its
        category: the topic rule of DESIGN.md §2 applied on top of status and clock."""
        out: list[tuple[ModelMessage, TagMsg, str]] = []
        topics: dict[str, list[int]] = {}
        for m in q.messages[q.low(now):]:
            if not t.scope(m):
                continue
            x = self.view(t, m)
            if x.status in (DELETED, DEAD):
                cat = ENDED
            elif x.status == LEASED and x.due > now:
                cat = INFLIGHT
            elif x.status == NEW and m.visible > now:
                cat = DELAYED
            else:
                cat = ACTIVE
            if m.topic is not None and cat != ENDED:
                topics.setdefault(m.topic, []).append(len(out))
            out.append((m, x, cat))
        for indexes in topics.values():
            # One at a time in production order: the first message not Ended is the head;
            # a rewound (or redriven) one waits behind an Inflight message of its topic.
            inflight = [i for i in indexes if out[i][2] == INFLIGHT]
            head = inflight[0] if inflight else indexes[0]
            for i in indexes:
                m, x, cat = out[i]
                if i != head and cat == ACTIVE:
                    out[i] = (m, x, PARKED)
        return out

    def recompute(self, now: int) -> None:
        """Bring every category to ``now``, noting when a message became Active (again)."""
        for q in self.queues.values():
            for t in q.tags.values():
                for m, x, cat in self.categories(q, t, now):
                    if x.cat == INFLIGHT and cat != INFLIGHT:    # the lease ended
                        x.base, x.unpark = x.due, None
                    elif x.cat == PARKED and cat == ACTIVE:      # its topic let it go
                        x.unpark = now
                    x.cat = cat

    # -- time --------------------------------------------------------------------------------

    def sweep(self, to: int) -> None:
        """Apply what happens between the last operation and ``to``, in time order: lease
        ends (and dead-letter moves at them), delay ends, retention expiry."""
        while True:
            times = self.event_times(self.now, to)
            if not times:
                break
            at = times[0]
            self.apply_moves(at)
            self.now = at
            self.recompute(at)
        self.now = to
        self.recompute(to)

    def event_times(self, after: int, to: int) -> list[int]:
        times = set()
        for q in self.queues.values():
            low = q.low(after)
            for m in q.messages[q.purge:]:  # leases of expired messages too (apply_moves)
                for x in m.per.values():
                    if x.status == LEASED and after < x.due <= to:
                        times.add(x.due)
                if m.seq < low:
                    continue
                expiry = m.enqueue + q.retention_ms + 1
                if after < expiry <= to:
                    times.add(expiry)
                if after < m.visible <= to:
                    times.add(m.visible)
        return sorted(times)

    def apply_moves(self, at: int) -> None:
        """Leases ending at ``at`` with ``dequeue_count`` at ``max_receives`` move to the DLQ.
        open: a lease that ends in the very ms its message expires may move or not (the
        engine does not).

        A message that expired before its lease ended is not moved (it is gone for everyone;
        ``test_expired_message_is_not_dead_lettered``)."""
        for q in self.queues.values():
            if self.dlq_of(q) is None:
                continue
            max_receives = q.attrs["redrive"]["max_receives"]
            expired_before, expired_now = q.expired_seq(at - 1), q.expired_seq(at)
            for t in q.tags.values():
                for m in q.messages[q.purge:]:
                    x = m.per.get(t.uid)
                    if (x is not None and x.status == LEASED and x.due == at
                            and x.count >= max_receives and t.scope(m)):
                        if m.seq >= expired_now:
                            self.move(q, t, m, at)
                        elif m.seq >= expired_before:
                            self.move(q, t, m, at, optional=True)

    # -- changes -----------------------------------------------------------------------------

    def lease(self, t: ModelTag, m: ModelMessage, now: int, visibility_ms: int) -> TagMsg:
        x = self.view(t, m)
        self.lease_counter += 1
        x.taken = True
        x.status, x.due, x.lease = LEASED, now + visibility_ms, self.lease_counter
        x.count += 1
        if x.first is None:
            x.first = now
        x.cat, x.unpark = INFLIGHT, None
        return x

    def end_lease_now(self, q: ModelQueue, t: ModelTag, m: ModelMessage, now: int) -> None:
        """``change_visibility`` 0: Active again at once, or dead-lettered as at expiry."""
        x = self.view(t, m)
        x.due, x.lease = now, -1
        policy = q.attrs["redrive"]
        if policy is not None and x.count >= policy["max_receives"] and self.dlq_of(q):
            self.move(q, t, m, now)
        else:
            x.base, x.unpark, x.cat = now, None, None

    def delete(self, t: ModelTag, m: ModelMessage) -> None:
        x = self.view(t, m)
        x.status, x.lease, x.cat = DELETED, -1, ENDED

    def move(self, q: ModelQueue, t: ModelTag, m: ModelMessage, dead_time: int,
             optional: bool = False) -> None:
        x = self.view(t, m)
        dlq = self.dlq_of(q)
        assert dlq is not None
        pending = PendingCopy(q, dlq, t, m, x.count, dead_time, x, optional)
        x.status, x.lease, x.cat, x.copy = DEAD, -1, ENDED, pending
        self.pending.append(pending)

    def resolve(self, dlq: ModelQueue, records: list[Any]) -> list[str]:
        """The engine's records of the copies it appended to ``dlq`` (in its seq order) for
        the pending moves into it -> problems found (empty when they agree).

        open: DESIGN.md does not say a copy's ``enqueue_time``; the model accepts any time
        from the move (``dead_time``) to the operation that applied it (the engine's)."""
        problems = []
        waiting = [p for p in self.pending if p.dlq is dlq]
        self.pending = [p for p in self.pending if p not in waiting]
        last_dead = None
        for record in records:
            dead = record.dead
            match = next((p for p in waiting if dead is not None and [
                p.source.name, p.tag.name, p.dead_time, p.original.id, p.count] == dead), None)
            if match is None:
                problems.append(f"unexpected DLQ record {record!r}; expected one of "
                                f"{[self.expected_dead(p) for p in waiting]}")
                continue
            waiting.remove(match)
            m = match.original
            attributes = {**(m.attributes or {}), "DLQ.sourceQueue": match.source.name}
            want = (typed(m.body), typed(attributes), None, m.priority, record.enqueue_time,
                    hashlib.md5(m.data).digest())
            got = (typed(record.body), typed(record.attributes), record.topic, record.priority,
                   record.visible_time, record.md5)
            if got != want:
                problems.append(f"DLQ copy of {m.id}: got {got}, want {want}")
            if not match.dead_time <= record.enqueue_time <= self.now:
                problems.append(f"DLQ copy of {m.id} enqueued at {record.enqueue_time}, "
                                f"outside [{match.dead_time}, {self.now}]")
            if last_dead is not None and match.dead_time < last_dead:
                # "moved — at that moment": copies follow the moves' order, across tags too
                # (test_dead_letters_follow_the_moves_order)
                problems.append(f"DLQ copies out of move order: dead_time {match.dead_time} "
                                f"after {last_dead}")
            last_dead = match.dead_time
            copy = ModelMessage(dlq.next_seq, record.id, m.body, m.data, attributes,
                                m.priority, None, record.enqueue_time, record.enqueue_time,
                                list(dead), match.tag)
            if dlq.messages and copy.enqueue < dlq.messages[-1].enqueue:
                problems.append(f"DLQ copy {record.id} produced at {copy.enqueue}, before the "
                                f"DLQ's newest message")
            dlq.messages.append(copy)
            dlq.last_id = record.id
            match.entry.copy = (dlq, copy)
        for p in waiting:
            if not p.optional:
                problems.append(f"missing DLQ copy {self.expected_dead(p)}")
        self.recompute(self.now)
        return problems

    @staticmethod
    def expected_dead(p: PendingCopy) -> list[Any]:
        return [p.source.name, p.tag.name, p.dead_time, p.original.id, p.count]

    def rewind(self, q: ModelQueue, time: int, tags: list[ModelTag], now: int) -> None:
        """DESIGN.md §2 "Rewind": from max(time, start) on, every message the tag receives
        that is not Inflight becomes never-delivered again with dequeue_count 0. A dead
        letter whose copy in ``q`` has ended stays Ended (decided, finding 19): the copy
        made deliverable again is an ordinary DLQ message, a redrive skips it as gone."""
        for src in self.queues.values():
            for x in (x for m in src.messages for x in m.per.values() if x.status == DEAD):
                if isinstance(x.copy, tuple) and x.copy[0] is q and self.copy_ended(x.copy):
                    x.copy = SEALED
        for t in tags:
            since = max(time, t.start_ms)
            for m, x, cat in self.categories(q, t, now):
                if m.enqueue >= since and cat != INFLIGHT:
                    m.per[t.uid] = self.never_delivered(m)
        self.recompute(now)

    def copy_ended(self, copy: Any) -> bool:
        """Whether a DLQ copy is Ended for the DLQ's ``default`` tag or gone."""
        if copy is SEALED:
            return True
        if isinstance(copy, PendingCopy):
            return False  # a move whose copy the model has not seen yet: it is new
        dlq, copy = copy
        if copy.seq < dlq.gone:
            return True
        return self.view(dlq.tags["default"], copy).status in (DELETED, DEAD)

    def redrive_candidates(self, dlq: ModelQueue, now: int
                           ) -> list[tuple[ModelMessage, tuple[Any, ...] | None]]:
        """Copies ``redrive`` takes, each with its target (queue, tag, original) or None
        when it is skipped."""
        out = []
        default = dlq.tags["default"]
        for m in dlq.messages[dlq.low(now):]:
            if m.dead is None:
                continue
            if self.view(default, m).status in (DELETED, DEAD):
                continue
            if any(self.view(t, m).status == LEASED and self.view(t, m).due > now
                   for t in dlq.tags.values() if t.scope(m)):
                continue
            out.append((m, self.redrive_target(m, now)))
        return out

    def redrive_target(self, copy: ModelMessage, now: int) -> tuple[Any, ...] | None:
        source_name, tag_name, _, original_id, _ = copy.dead
        src = self.queues.get(source_name)
        if src is None:
            return None
        original = src.by_id(original_id)
        if original is None or original.seq < src.low(now):
            return None
        # the tag it died under: the same tag, not a re-created one of the same name
        t = src.tag(tag_name)
        if t is None or t is not copy.dead_tag:
            return None
        x = self.view(t, original)
        if x.status == LEASED and x.due > now or x.status == DEAD and x.copy is SEALED:
            return None
        return src, t, original

    def redrive_one(self, dlq: ModelQueue, copy: ModelMessage, target: tuple[Any, ...],
                    now: int) -> None:
        for t in dlq.tags.values():
            if t.scope(copy):
                self.view(t, copy).status = DELETED
                self.view(t, copy).cat = ENDED
        _, t, original = target
        original.per[t.uid] = TagMsg(NEW, base=now)

    def purge(self, q: ModelQueue, now: int) -> None:
        q.purge = q.gone = q.gone_high = q.next_seq

    # -- watermarks --------------------------------------------------------------------------

    def gone_bounds(self, q: ModelQueue, now: int) -> tuple[int, int]:
        """(low, high) for ``gone_seq`` at ``now``. ``high`` is DESIGN.md §2 "Watermarks":
        everything below is Expired, or below the last purge, or Ended for every tag and
        produced before ``now - rewind`` (a dead-lettered message only once its DLQ copy is
        Ended for the DLQ's default tag or gone).
        Both bounds are that value today (the engine must reach it after every operation);
        they never fall below ``q.gone``, the value the engine was last seen at (watermarks
        only increase)."""
        high = self.gone_formula(q, now)
        return max(q.gone, high), max(q.gone, high)

    def gone_formula(self, q: ModelQueue, now: int) -> int:
        expired = q.expired_seq(now)
        start = max(q.gone, q.purge, expired)
        floor = q.next_seq
        for m in q.messages[start:]:
            if not all(self.ended_for_gone(t, m) for t in q.tags.values()):
                floor = m.seq
                break
        bound = q.first_seq_at(now - q.attrs["rewind"] * 1000)
        return max(q.gone, expired, q.purge, min(floor, bound))

    def ended_for_gone(self, t: ModelTag, m: ModelMessage) -> bool:
        if not t.scope(m):
            return True
        x = self.view(t, m)
        return x.status == DELETED or (x.status == DEAD and self.copy_ended(x.copy))

    def settle(self, now: int) -> None:
        """Raise every queue's ``gone_seq`` as far as it surely goes at ``now`` (DLQs first:
        a source's watermark looks at its copies) and note how far it may go."""
        for q in sorted(self.queues.values(), key=lambda q: q.attrs["redrive"] is not None):
            q.gone, q.gone_high = self.gone_bounds(q, now)

    def learn_gone(self, q: ModelQueue, engine_gone: int, now: int) -> str | None:
        """The engine's ``gone_seq`` (from its stats) -> a problem, or None when it lies
        within the bounds; the model takes it as the truth from then on."""
        low, high = self.gone_bounds(q, now)
        if engine_gone < 0:
            return (f"{q.name} retains {q.next_seq - engine_gone} messages; the model knows "
                    f"of {q.next_seq} ever sent (an unexpected dead-letter copy?)")
        if not low <= engine_gone <= high:
            return (f"gone_seq of {q.name} is {engine_gone}, want "
                    + (f"{high}" if low == high else f"within [{low}, {high}]"))
        q.gone, q.gone_high = engine_gone, high
        return None

    def gone_seq(self, q: ModelQueue, now: int) -> int:
        """The model's belief of ``gone_seq`` at ``now`` (the low bound)."""
        q.gone, q.gone_high = self.gone_bounds(q, now)
        return q.gone

    # -- what a receive, a peek, the stats see ---------------------------------------------

    def orders(self, q: ModelQueue, t: ModelTag, now: int, count: int
               ) -> list[list[ModelMessage]]:
        """What ``receive(max=count)`` may return now (DESIGN.md §2 "Delivery order"): Active
        again by (time it became Active, seq), then never-delivered by (priority, seq); at
        most one per topic (the topic rule leaves one Active per topic).

        The first list is DESIGN.md's answer. The others allow the engine's documented
        deviation (docs/STORAGE.md): a message its topic let go that no receive had passed
        while it was Parked keeps the order of the source that brings it (never-delivered by
        priority, or its delay's end), ``test_unparked_successor_not_yet_reached``. The
        model does not track what receives passed, so it accepts either order for each such
        message."""
        active = [(m, x) for m, x, cat in self.categories(q, t, now) if cat == ACTIVE]
        unparked = [m for m, x in active if x.unpark is not None][:6]
        results: list[list[ModelMessage]] = []
        for choice in itertools.product((True, False), repeat=len(unparked)):
            unreached = {m.seq for m, reached in zip(unparked, choice) if not reached}
            order = [m for m, _ in sorted(active, key=lambda e: e[1].key(
                e[0], reached=e[0].seq not in unreached))]
            if order[:count] not in results:
                results.append(order[:count])
        return results

    def peek_state(self, x: TagMsg, cat: str) -> str:
        if x.status == DELETED:
            return "deleted"
        if x.status == DEAD:
            return "dead"
        return cat

    def tag_stats(self, q: ModelQueue, t: ModelTag, now: int) -> dict[str, Any]:
        """DESIGN.md §8 per tag; ``lag`` is the production time of the oldest message not
        Ended for the tag (a dead letter is Ended even while its DLQ copy is alive:
        ``test_lag_skips_dead_lettered_messages``)."""
        counts = {ACTIVE: 0, INFLIGHT: 0, DELAYED: 0, PARKED: 0}
        lag = None
        for m, x, cat in self.categories(q, t, now):
            if cat in counts:
                counts[cat] += 1
            if lag is None and x.status not in (DELETED, DEAD):
                lag = m.enqueue
        return {"active": counts[ACTIVE], "inflight": counts[INFLIGHT],
                "delayed": counts[DELAYED], "parked": counts[PARKED], "lag": lag}

    def stats(self, q: ModelQueue, now: int) -> dict[str, Any]:
        """The figures of ``get_queue`` with ``gone_seq`` at ``q.gone`` (learn it first)."""
        gone = q.gone
        retained = q.messages[gone:]
        rewind_ms = q.attrs["rewind"] * 1000
        return {
            "messages": q.next_seq - gone,
            "oldest": retained[0].enqueue if retained else None,
            "newest": retained[-1].enqueue if retained else None,
            # open: DESIGN.md §8 names "rewindable" without defining it; taken as the
            # retained messages produced inside the rewind window
            "rewindable": (q.next_seq - max(gone, q.first_seq_at(now - rewind_ms))
                           if rewind_ms else 0),
            "tags": {t.name: self.tag_stats(q, t, now) for t in q.sorted_tags()},
        }

    def is_current(self, q: ModelQueue, t: ModelTag, seq: int, lease: int, now: int) -> bool:
        x = q.messages[seq].per.get(t.uid)
        if x is None or x.status != LEASED or x.lease != lease or now >= x.due:
            return False
        return q.tag(t.name) is t and seq >= q.low(now)


def ids_of(items: Iterable[Any]) -> list[str]:
    return [item.id if hasattr(item, "id") else item.message.id for item in items]
