"""In-memory state of open queues and tags: a cache of RocksDB, rebuilt at open.

Memory grows with queues, tags and leases (in-flight and active-again messages), never with
the backlog: the log, the time index and the delay index stay on disk.

Persisted forms (fixed structs, one encoder and decoder each, next to the class they serve):

    watermarks  next_seq | expired_seq | gone_seq | purge_seq | next topic id      (5 x u64)
    tag cursors lane 1..16 cursors | delay position (visible_ms, seq) | leases |
                expiry position (due_ms, seq) | rewind seq | rewound delay position
                (visible_ms, seq)                                                 (24 x u64)
    lease       state:u8 | lane:u8 | due_ms:u64 | dequeue_count:u32 | first_dequeue_ms:u64 |
                lease number:u64
    segment     last_seq | first_ms | last_ms | count | bytes                     (5 x u64)
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass, field
from typing import Any

from .dueindex import DueIndex

LANES = 16
LANE_RANGE = range(1, LANES + 1)

_WATERMARKS = struct.Struct(">QQQQQ")
_UNSAVED_DAY = struct.Struct(">I")
_UNSAVED_DELETES = struct.Struct(">IQ")  # tag, deletes
_WATERMARKS_ONE_TAG = struct.Struct(">QQQQQIIQ")  # the five, the day, one tag's deletes
# With receives held as well (schema version 5): the day's top bit set, and per tag its
# deletes, receives, bytes out and mark.
_FIGURES_FLAG = 1 << 31
_UNSAVED_FIGURES = struct.Struct(">IQQQQ")  # tag, deletes, received, bytes out, mark
_WATERMARKS_ONE_TAG_FIGURES = struct.Struct(">QQQQQIIQQQQ")
_CURSORS = struct.Struct(">" + "Q" * (LANES + 8))
# How far ahead of the next lease number a tag's row stores its counter (``encode_cursors``):
# the row is written at least once per this many leases of the tag.
LEASE_NUMBERS_AHEAD = 4096
_LEASE = struct.Struct(">BBQIQQ")
_SEGMENT = struct.Struct(">QQQQQ")

# Lease states. A LEASED message is Inflight while now < due and Active again from due on.
LEASED = 1
ENDED_AHEAD = 2  # ended (deleted by id) before any cursor reached it
ENDED_DEAD = 3   # dead-lettered; kept until gone_seq passes so peek can say "dead";
                 # ``due`` holds the DLQ's queue id and ``number`` the seq of the DLQ copy
ENDED_DELETED = 4  # deleted after delivery: on disk only (never loaded into memory), so that
                   # peek shows its dequeue count; dropped with its segment, or by a rewind

#: The open segment's row is written at least every so many messages or record bytes
#: (``Segment``): what reading a queue reads of the log to complete it, per queue at open.
SEGMENT_SAVE_MESSAGES = 256
SEGMENT_SAVE_BYTES = 256 << 10

DAY_MS = 86_400_000  # a day of the daily counters (UTC)

NO_DELAYED = 1 << 63  # QueueState.delayseq_from when no tag holds a delayed message
# The prefix's topic field: 0 no topic; 1 .. 2^31-1 a topic id; DEAD_MARK | tag id marks a
# dead-letter copy and names the tag it died under (so redrive never decodes other records).
DEAD_MARK = 0x80000000
DEFAULT_LANE = 8
DEFAULT_TAG = "default"  # the tag every queue has, and receives use when they name none

class Lease:
    """One tag's lease state for one message (a row of the ``leases`` family)."""

    __slots__ = ("state", "lane", "due_ms", "count", "first_ms", "number", "receipt", "batch")

    def __init__(self, state: int, lane: int, due_ms: int, count: int, first_ms: int,
                 number: int, receipt: bytes | None = None, batch: Any = None):
        self.state = state
        self.lane = lane
        self.due_ms = due_ms
        self.count = count
        self.first_ms = first_ms
        self.number = number
        # The receipt this process issued for lease ``number`` (None: none issued since the
        # engine opened): a receipt equal to it is genuine without computing its MAC. Not
        # stored; whether it is current is still judged by ``number`` and ``due_ms``.
        self.receipt = receipt
        # The ``LeaseBatch`` row (leasebatch.py) that holds this lease, or None: its row in
        # ``leases`` holds it (LEASED leases of a receive's batch have no ``leases`` row).
        self.batch = batch

    def encode(self) -> bytes:
        return _LEASE.pack(self.state, self.lane, self.due_ms, self.count, self.first_ms, self.number)

    #: ``encode`` of a row that is never an object in memory (ENDED_DELETED).
    pack = staticmethod(_LEASE.pack)

    @classmethod
    def decode(cls, value: bytes) -> Lease:
        return cls(*_LEASE.unpack(value))


@dataclass(slots=True)
class Segment:
    """A contiguous seq range of one queue's log. Invariant: ``first_seq <= last_seq`` and
    times are production times (monotonic with seq).

    The open (last) segment's row is written when the segment starts, when it is sealed, and
    whenever ``SEGMENT_SAVE_MESSAGES`` messages or ``SEGMENT_SAVE_BYTES`` bytes came since its
    row was last written; in between the row lags, and reading a queue completes it from the
    log rows after its ``last_seq`` (``loading.read_queue``). ``saved_count`` and
    ``saved_bytes`` are what the row holds (not stored: equal to ``count`` and
    ``size_bytes`` when read)."""

    first_seq: int
    last_seq: int
    first_ms: int
    last_ms: int
    count: int
    size_bytes: int
    saved_count: int = field(default=0, compare=False)
    saved_bytes: int = field(default=0, compare=False)

    def encode(self) -> bytes:
        return _SEGMENT.pack(self.last_seq, self.first_ms, self.last_ms, self.count, self.size_bytes)

    def encode_saved(self) -> bytes:
        """``encode``, noting the result as what the row holds (the caller writes it)."""
        self.saved_count = self.count
        self.saved_bytes = self.size_bytes
        return self.encode()

    def row_lags(self) -> bool:
        """Whether the open segment's row should be written now (module docstring)."""
        return (self.saved_count == 0 or self.count - self.saved_count >= SEGMENT_SAVE_MESSAGES
                or self.size_bytes - self.saved_bytes >= SEGMENT_SAVE_BYTES)

    @classmethod
    def decode(cls, first_seq: int, value: bytes) -> Segment:
        segment = cls(first_seq, *_SEGMENT.unpack(value))
        segment.saved_count, segment.saved_bytes = segment.count, segment.size_bytes
        return segment


class TagState:
    """A reader of a queue: its cursors, delay position, lease counter and open leases.

    Invariants:
    - ``cursors[lane]``: every message of the lane below it has been passed (delivered, or
      stepped over as delayed); when the lane has messages at or above it, the lowest of them
      is exactly ``cursors[lane]`` ("snapped"), so the cursors give an exact floor.
    - ``delay_pos``: every ``delays`` entry ``(visible_ms, seq) <= delay_pos`` has been handled.
    - ``leases`` holds every lease row of the tag but the ENDED_DELETED ones (its durable
      form: the ``leases`` rows, and the entries of the ``leasebatches`` rows that no
      ``leases`` row overrides, leasebatch.py).
    - ``locked`` maps a topic to its head (the message successors wait behind) while the head
      is Inflight or Active again (rebuilt at open from the leases) or found Delayed / not yet
      delivered (found again by one seek when forgotten); ``heads`` is its inverse.
    - ``expiry_pos``: every lease deadline at or below it was checked for a dead-letter
      move.
    """

    __slots__ = (
        "id", "name", "start_ms", "start_seq", "filter", "created", "cursors", "delay_vt",
        "delay_seq", "lease_counter", "leases", "next_wake_ms", "locked", "heads", "expiry_due_ms",
        "expiry_seq", "lease_heap", "dead_heap", "rewind_seq", "rewind_vt", "rewind_dseq",
        "rewind_older",
        "parked_topics",
        "topic_from", "topic_ended", "row_heap", "stats_cache", "min_due_ms", "delay_hint",
        "head_heap", "due_index", "counter_ceiling", "row_behind",
    )

    def __init__(self, tag_id: int, name: str, start_ms: int, start_seq: int,
                 filter: Any, created: int):
        self.id = tag_id
        self.name = name
        self.start_ms = start_ms
        self.start_seq = start_seq
        self.filter = filter
        self.created = created
        self.cursors = [0] * (LANES + 1)
        self.delay_vt = 0
        self.delay_seq = 0
        self.lease_counter = 0
        # The lease counter as its row stores it: a ceiling no lease number issued reaches
        # (``encode_cursors``); ``row_behind``: the row's cursors lag memory's (the log and
        # the lease rows tell where they are at open, ``Lessor.run``).
        self.counter_ceiling = 0
        self.row_behind = False
        self.leases: dict[int, Lease] = {}
        self.next_wake_ms = -1  # the lease deadline registered for wake-ups, -1 none
        self.locked: dict[int, int] = {}
        self.heads: dict[int, int] = {}
        self.expiry_due_ms = 0
        self.expiry_seq = 0
        # Min-heaps (lazy: entries whose row changed are dropped when met) of the seqs of
        # LEASED rows and of ENDED_DEAD rows, for the watermark floor.
        self.lease_heap: list[int] = []
        self.dead_heap: list[int] = []
        self.row_heap: list[int] = []  # every lease row's seq, for dropping rows below gone
        self.head_heap: list[int] = []  # topic heads' seqs (lazy), for heads below gone
        # After a rewind from ``rewind_seq``: delay entries below it up to the old delay
        # position were handled before and are skipped when the delay index is walked again.
        self.rewind_seq = 0
        self.rewind_vt = 0
        self.rewind_dseq = 0
        # Earlier rewinds' (rewind_seq, vt, dseq) whose walk had not caught up when a later
        # rewind came: what they say stays true (``RewindOps._rewind_tag``, rewind.py).
        self.rewind_older: list[tuple[int, int, int]] = []
        # topic -> seq to look for a successor from when its (Inflight) head ends (rewind).
        self.topic_from: dict[int, int] = {}
        # topic -> (limit, delay_vt, delay_seq) from when a message of it came back out of
        # turn (redrive): its successors below ``limit`` that had no row and were passed then
        # (delayed ones: taken by that delay position) were delivered and deleted in their
        # turn, so they are Ended, not parked (``scope.ended_in_turn``).
        self.topic_ended: dict[int, tuple[int, int, int]] = {}
        # Topics with successors a cursor or the delay index passed while they were parked:
        # when a head ends and its next successor is still pending, the topic stays locked on
        # that one, so the passed ones keep waiting behind it (Topics.head_ended, topics.py).
        self.parked_topics: set[int] = set()
        self.stats_cache: tuple[int, int, int] | None = None  # (when, active, parked)
        # Lower bounds of the next lease deadline and of the next delay end past the
        # delay position: a receive walks a source only once they are <= now.
        self.min_due_ms = 0
        self.delay_hint = 0
        # The LEASED leases by (due_ms, seq): the "Active again" order (dueindex.py).
        self.due_index = DueIndex()

    def lock(self, topic: int, head: int) -> None:
        old = self.locked.get(topic)
        if old is not None:
            self.heads.pop(old, None)
        self.locked[topic] = head
        self.heads[head] = topic
        heapq.heappush(self.head_heap, head)

    def delay_taken(self, visible: int, seq: int) -> bool:
        """Whether the delay index has brought delayed message ``seq`` to this tag: its
        position passed it, or a rewind left it as handled (below ``rewind_seq``, up to the
        position the rewind moved back from)."""
        return (visible, seq) <= (self.delay_vt, self.delay_seq) or self.rewind_handled(
            visible, seq)

    def rewind_handled(self, visible: int, seq: int) -> bool:
        """Whether a rewind left delayed message ``seq`` as handled (taken before it and not
        rewound by it)."""
        if seq < self.rewind_seq and (visible, seq) <= (self.rewind_vt, self.rewind_dseq):
            return True
        return any(seq < below and (visible, seq) <= (vt, dseq)
                   for below, vt, dseq in self.rewind_older)

    def rewound_from(self) -> int:
        """The lowest seq a rewind made never-delivered again (the last one's from_seq, or an
        earlier one's whose walk is still behind)."""
        if not self.rewind_older:  # the usual case: no list on a delete's path
            return self.rewind_seq
        return min(self.rewind_seq, *(seq for seq, _, _ in self.rewind_older))

    def unlock(self, topic: int) -> None:
        head = self.locked.pop(topic, None)
        if head is not None:
            self.heads.pop(head, None)

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "start": self.start_ms, "start_seq": self.start_seq,
                "filter": self.filter, "created": self.created,
                # [topic, from, head]: the Inflight head the rewound messages wait behind,
                # relocked on at open (it is not the lowest leased message of its topic).
                "topic_from": sorted([topic, seq, self.locked.get(topic, -1)]
                                     for topic, seq in self.topic_from.items()),
                "topic_ended": sorted([topic, *mark] for topic, mark in self.topic_ended.items()),
                "rewind_older": [list(pair) for pair in self.rewind_older]}

    @classmethod
    def from_definition(cls, tag_id: int, definition: dict[str, Any]
                        ) -> tuple[TagState, dict[int, int]]:
        """The tag ``definition()`` wrote (cursors aside) -> (it, topic -> the Inflight head
        its rewound messages wait behind, for the open to relock on)."""
        t = cls(tag_id, definition["name"], definition["start"], definition["start_seq"],
                definition["filter"], definition["created"])
        waited_on = {}
        for topic, start, *head in definition.get("topic_from", ()):
            t.topic_from[topic] = start
            if head and head[0] >= 0:
                waited_on[topic] = head[0]
        t.topic_ended = {topic: (limit, vt, seq)
                         for topic, limit, vt, seq in definition.get("topic_ended", ())}
        t.rewind_older = [(seq, vt, dseq)
                          for seq, vt, dseq in definition.get("rewind_older", ())]
        return t, waited_on

    def encode_cursors(self, ahead: int = LEASE_NUMBERS_AHEAD) -> bytes:
        """The tag's row (``tags`` family). Its lease counter is stored ``ahead`` of the next
        number: a ceiling that no number issued before the row is written again reaches, so
        a receive that moves cursors only where the log and the lease rows tell them at open
        need not write the row (``Lessor.run``); a clean close writes it exact."""
        ceiling = self.counter_ceiling = self.lease_counter + ahead
        self.row_behind = False
        return _CURSORS.pack(*self.cursors[1:], self.delay_vt, self.delay_seq,
                             ceiling, self.expiry_due_ms, self.expiry_seq,
                             self.rewind_seq, self.rewind_vt, self.rewind_dseq)

    def decode_cursors(self, value: bytes) -> None:
        fields = _CURSORS.unpack(value)
        self.cursors = [0, *fields[:LANES]]
        (self.delay_vt, self.delay_seq, self.lease_counter, self.expiry_due_ms,
         self.expiry_seq, self.rewind_seq, self.rewind_vt, self.rewind_dseq) = fields[LANES:]
        self.counter_ceiling = self.lease_counter


@dataclass(slots=True)
class QueueState:
    """A queue: definition, watermarks, lane tails, segments and tags."""

    id: int
    name: str
    attributes: dict[str, Any]
    created: int
    next_seq: int = 0
    expired_seq: int = 0
    gone_seq: int = 0
    purge_seq: int = 0
    next_topic_id: int = 1
    # Last seq of each lane (index 1..16), -1 while the lane is empty.
    lane_tail: list[int] = field(default_factory=lambda: [-1] * (LANES + 1))
    lanes_used: list[int] = field(default_factory=list)  # sorted lanes that ever held a message
    last_time_ms: int = -1           # newest production time
    last_time_seq: int = -1          # first seq produced at ``last_time_ms`` (-1: unknown)
    indexed_ms: int = -1             # newest ms with a time-index entry (-1: none)
    indexed_seq: int = -1            # the seq of that entry when known (-1: read the index)
    time_hint: tuple[int, int] = (-1, -1)  # (ms, the first seq produced at or after it)
    # Sends not yet in the queue's counter rows, day -> [messages, body bytes]: those after
    # the ``last_seq`` of the open segment's row (counters.py), rebuilt from the log at open.
    unsaved_sends: dict[int, list[int]] = field(default_factory=dict)
    # Deletes of day ``unsaved_day`` not yet in the tags' counter rows, tag id -> count: held
    # by the watermarks row instead (counters.py), so a delete that raises ``gone_seq`` writes
    # one row for both.
    unsaved_deletes: dict[int, int] = field(default_factory=dict)
    # Receives of day ``unsaved_day`` held back (counters.py) that an in-order delete put
    # into the watermarks row, tag id -> [received, bytes out, mark]: every delivery of the
    # tag numbered below the mark is counted in its rows or here (a tag here has its entry
    # in ``unsaved_deletes``).
    unsaved_received: dict[int, list[int]] = field(default_factory=dict)
    unsaved_day: int = 0
    oldest_live_ms: int = -1         # production time of seq ``expired_seq`` (cache), -1 none
    # ``EngineCore._advance`` has nothing to do on this queue up to this time (ms): the
    # oldest live message is not older than ``retention`` until after it, and there is no
    # redrive policy. -1: not known (the general tests). Anything that could lower it
    # (``oldest_live_ms`` set from -1, a new retention or redrive policy) sets it to -1.
    quiet_until_ms: int = -1
    segments: list[Segment] = field(default_factory=list)  # oldest first; the last one is open
    tags: dict[int, TagState] = field(default_factory=dict)
    tag_names: dict[str, int] = field(default_factory=dict)  # lower-cased name -> tag id
    delayseq_from: int = 0           # no tag holds a delayseq entry below it (NO_DELAYED: none)
    next_delay_wake_ms: int = -1     # earliest pending delay end registered for wake-ups
    next_expiry_ms: int = -1         # earliest lease deadline registered for dead-letter moves

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "attributes": self.attributes, "created": self.created}

    def encode_watermarks(self) -> bytes:
        """Five u64 watermarks; then, with unsaved deletes, their day (u32) and per tag its
        id (u32) and count (u64); with unsaved receives as well, the day's top bit set and
        per tag its id (u32), deletes, receives, bytes out and mark (u64 each)."""
        unsaved = self.unsaved_deletes
        if not unsaved:
            return _WATERMARKS.pack(self.next_seq, self.expired_seq, self.gone_seq,
                                    self.purge_seq, self.next_topic_id)
        received = self.unsaved_received
        if len(unsaved) == 1:  # the usual case: one tag's deletes raise gone_seq
            ((tag, count),) = unsaved.items()
            figures = received.get(tag) if received else None
            if figures is not None and len(received) == 1:
                return _WATERMARKS_ONE_TAG_FIGURES.pack(
                    self.next_seq, self.expired_seq, self.gone_seq, self.purge_seq,
                    self.next_topic_id, self.unsaved_day | _FIGURES_FLAG, tag, count,
                    *figures)
            if not received:
                return _WATERMARKS_ONE_TAG.pack(self.next_seq, self.expired_seq,
                                                self.gone_seq, self.purge_seq,
                                                self.next_topic_id, self.unsaved_day, tag,
                                                count)
        head = _WATERMARKS.pack(self.next_seq, self.expired_seq, self.gone_seq,
                                self.purge_seq, self.next_topic_id)
        if not received:
            pack = _UNSAVED_DELETES.pack
            return b"".join((head, _UNSAVED_DAY.pack(self.unsaved_day),
                             *(pack(tag, count) for tag, count in unsaved.items())))
        pack = _UNSAVED_FIGURES.pack
        none = (0, 0, 0)
        return b"".join((head, _UNSAVED_DAY.pack(self.unsaved_day | _FIGURES_FLAG),
                         *(pack(tag, unsaved.get(tag, 0), *received.get(tag, none))
                           for tag in unsaved.keys() | received.keys())))

    def decode_watermarks(self, value: bytes) -> None:
        (self.next_seq, self.expired_seq, self.gone_seq, self.purge_seq,
         self.next_topic_id) = _WATERMARKS.unpack_from(value)
        self.unsaved_deletes = {}
        self.unsaved_received = {}
        if len(value) > _WATERMARKS.size:
            (day,) = _UNSAVED_DAY.unpack_from(value, _WATERMARKS.size)
            entries = value[_WATERMARKS.size + _UNSAVED_DAY.size:]
            self.unsaved_day = day & ~_FIGURES_FLAG
            if not day & _FIGURES_FLAG:  # schema version 4's layout
                self.unsaved_deletes = dict(_UNSAVED_DELETES.iter_unpack(entries))
                return
            for tag, deletes, received, bytes_out, mark in _UNSAVED_FIGURES.iter_unpack(
                    entries):
                if deletes:
                    self.unsaved_deletes[tag] = deletes
                if received or mark:
                    self.unsaved_received[tag] = [received, bytes_out, mark]

    def tag_named(self, name: str) -> TagState | None:
        tag_id = self.tag_names.get(name.lower())
        return None if tag_id is None else self.tags[tag_id]
