"""The engine's spine: opening and loading the store, the operation frame (clock, watermarks,
commit), and the per-queue bookkeeping every operation shares.

Rules every operation follows (the reasons are in DESIGN.md §3):

1. An operation validates everything it can before it changes anything, in memory or in the
   batch; a ``LaminaError`` raised after a change is a bug.
2. Any unexpected exception discards the pending batch and rebuilds the in-memory state from
   RocksDB (which never saw the batch), then surfaces as ``InternalError``: a bug never leaves
   memory and disk disagreeing.
3. An operation on a queue first brings its watermarks to ``now`` (``_advance``) and, when it
   may have ended messages, raises ``gone_seq`` as far as its definition allows (``_settle``).
4. Reads that iterate a column family first flush the pending batch, so an operation sees
   everything applied before it, even inside a group.
"""

from __future__ import annotations

import heapq
import logging
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import AbstractSet, Any, Callable, Iterator, cast

import cbor2

from . import keys
from .appending import Appender
from .clock import CLOCK_AHEAD_MS, Clock, EngineClock, wall_clock_ms
from .counters import EXPIRED, Counters, migrate_tag_rows
from .deadlines import Deadlines
from .deadmoves import DeadLetters
from .errors import (
    InvalidArgument,
    QueueNotFound,
    TagNotFound,
    Unavailable,
)
from .floors import delayed_floor, tag_floor
from .frame import OperationFrame, WriteFailed
from .grants import Grants
from .loading import headed_topic, lease_rows, read_queue, tag_definitions
from .receipts import ReceiptCodec, load_or_create_key
from .reclaim import collect
from .records import PREFIX
from .recovery import StoreRecovery
from .state import (
    DEFAULT_TAG,
    ENDED_AHEAD,
    ENDED_DEAD,
    ENDED_DELETED,
    LEASED,
    Lease,
    QueueState,
    TagState,
)
from .scope import not_ended_between, skip_settled
from .store import Store, raise_open_error
from .timeindex import first_seq_at
from .storememory import MemoryBounds
from .topics import Topics

from .validation import check_name

log = logging.getLogger("lamina.engine")

SCHEMA_VERSION = 5
#: Schema versions this engine migrates on open (docs/STORAGE.md "Schema versions").
MIGRATES_FROM = (1, 2, 3, 4)
SEGMENT_MAX_MESSAGES = 65536
SEGMENT_MAX_BYTES = 64 << 20
SEGMENT_MAX_AGE_MS = 3600_000


class EngineCore(StoreRecovery):
    """State and mechanics shared by the operation groups. Not thread-safe: one caller at a
    time (the server runs every operation on its event loop thread).

    It owns the components every operation shares: ``Counters``, ``Deadlines``, ``Grants``,
    ``Topics`` (topics.py), ``Appender`` (appending.py) and ``DeadLetters`` (deadmoves.py)."""

    def __init__(self, path: Path, *, clock: Clock | None, fsync: bool,
                 receipt_key: Path | None, max_queues: int, segment_max_messages: int,
                 segment_max_bytes: int, segment_max_age_ms: int, memory: MemoryBounds):
        self.path = path
        self.memory = memory
        self.fsync = fsync
        self.max_queues = max_queues
        self.segment_max_messages = segment_max_messages
        self.segment_max_bytes = segment_max_bytes
        self.segment_max_age_ms = segment_max_age_ms
        path.mkdir(parents=True, exist_ok=True)
        self._receipts = ReceiptCodec(load_or_create_key(receipt_key or path / "receipt.key"))
        try:
            self._store = Store(path / "db", memory=memory)
        except Exception as exc:
            raise_open_error(path, exc)
        self._source = clock or wall_clock_ms
        self._clock = EngineClock(self._source)
        self._now = 0
        # Called with a queue's name whenever messages may have become Active in it outside a
        # lease deadline (send, dead-letter move, rewind, redrive, a topic passed on, ...):
        # a server wakes waiting receives with it.
        self.on_activity: Callable[[str], None] | None = None
        self._group_depth = 0
        self._frame = OperationFrame(self)
        self._unsynced = False
        self._closed = False
        self._persisted_clock = -1
        self._counters = Counters(self)
        self._deadlines = Deadlines()
        self._grants = Grants(self)
        self._topics = Topics(self)
        self._appender = Appender(self)
        self._dead_letters = DeadLetters(self)
        self._init_recovery()
        try:
            self._load()
        except BaseException as exc:  # its frames' iterators would hold the lock past close
            traceback.clear_frames(exc.__traceback__)
            self._close_store()
            raise_open_error(path, exc)

    # -- loading ----------------------------------------------------------------------------

    def _load(self) -> None:
        """(Re)build every in-memory structure from RocksDB."""
        store = self._store
        meta = store.meta
        version = meta.get(keys.META_VERSION)
        found = SCHEMA_VERSION if version is None else keys.read_u32(version)
        if found != SCHEMA_VERSION and found not in MIGRATES_FROM:
            raise RuntimeError(f"{self.path}: schema version {found}, "
                               f"this Lamina reads {SCHEMA_VERSION}")
        if version is None or found != SCHEMA_VERSION:
            # Version 1 kept lease deadlines in a ``timers`` family as well; they are rebuilt
            # from the lease rows now, so migrating is dropping that family. Version 3 adds
            # the ``leasebatches`` family (created empty by the open: version 2 lease rows are
            # read as they are) and writes fewer rows per send (docs/STORAGE.md): the counter
            # rows of tags without a filter change meaning; watermarks and segment rows are
            # read as they are. Version 4 reads a ``leases`` row below ``gone_seq`` as
            # deleted and a sparse time index, and adds a mark to the counter rows of tags
            # (docs/STORAGE.md, counters.py): version 3's rows are valid as they are, so
            # migrating from it is writing the version. Version 5 lets the watermarks row
            # hold receive figures as well, in a layout of its own (flagged in the row):
            # version 4's rows are read as they are.
            store.drop_legacy_families()
            if version is not None and found < 3:
                migrate_tag_rows(store)
            store.put(store.meta_h, keys.META_VERSION, keys.u32(SCHEMA_VERSION))
            store.flush()
        clock = meta.get(keys.META_CLOCK)
        self._persisted_clock = keys.read_u64(clock) if clock else 0
        # The row holds a ceiling of the clock (``_write_pending``); rebuilding after a failed
        # write keeps the clock memory has.
        self._clock = EngineClock(self._source, self._clock.last_ms or self._persisted_clock,
                                  CLOCK_AHEAD_MS)
        ids = meta.get(keys.META_IDS)
        self._next_queue_id, self._next_tag_id = (
            (keys.read_u32(ids), keys.read_u32(ids, 4)) if ids else (1, 1))
        self._queues: dict[int, QueueState] = {}
        self._queue_names: dict[str, int] = {}
        self._grants.reset()
        self._topics.reset()
        self._counters.reset()
        self._deadlines.clear()
        # DLQ id -> ids of queues that may hold dead letters with a copy there (no entry is
        # ever wrong to have: stale ones are dropped when met).
        self._dead_sources: dict[int, set[int]] = {}
        for key, value in Store.items(meta, keys.QUEUE_DEF_LOWER, keys.QUEUE_DEF_UPPER):
            self._load_queue(keys.queue_def_id(key), cbor2.loads(value))

    def _load_queue(self, queue_id: int, definition: dict[str, Any]) -> QueueState:
        store = self._store
        q = read_queue(store, queue_id, definition,
                       cast(bytes, store.meta[keys.watermarks_key(queue_id)]))
        self._queues[queue_id] = q
        self._queue_names[q.name.lower()] = queue_id
        q.oldest_live_ms = self._oldest_live_ms(q)
        for tag_id, tag_definition in tag_definitions(store, queue_id):
            self._load_tag(q, tag_id, tag_definition)
        self._deadlines.schedule_delay_wake(self._store, q, self._clock.last_ms)
        self._deadlines.schedule_expiry_check(q, 0)
        return q

    def _load_tag(self, q: QueueState, tag_id: int, definition: dict[str, Any]) -> TagState:
        store = self._store
        t, waited_on = TagState.from_definition(tag_id, definition)
        t.decode_cursors(cast(bytes, store.tags[keys.tag_key(q.id, tag_id)]))
        # The row's cursors may lag (``Lessor.run``): deleted messages they have to pass
        # again are known by their rows.
        behind = min((t.cursors[lane] for lane in q.lanes_used), default=q.next_seq)
        deleted: set[int] = set()
        for seq, lease in lease_rows(store, q.id, tag_id, q.gone_seq):
            if lease.state == ENDED_DELETED:
                if seq >= behind:
                    deleted.add(seq)
                continue  # on disk only, for peek
            t.leases[seq] = lease
            t.row_heap.append(seq)  # rows come in seq order: a sorted list is a heap
            if lease.state == ENDED_DEAD:
                t.dead_heap.append(seq)
                self._dead_sources.setdefault(lease.due_ms, set()).add(q.id)
            if lease.state == LEASED:
                t.lease_heap.append(seq)
                t.due_index.add(lease.due_ms, seq)
                self._deadlines.register_wake(q, t, lease.due_ms)
                topic_id = headed_topic(store, q, t, seq, lease)
                if topic_id:
                    t.lock(topic_id, seq)
        q.tags[tag_id] = t
        q.tag_names[t.name.lower()] = tag_id
        for lane in q.lanes_used:
            if t.cursors[lane] < q.gone_seq and t.cursors[lane] <= q.lane_tail[lane]:
                t.cursors[lane] = q.gone_seq  # as ``_raise_gone`` moves it
            self._snap_cursor(q, t, lane, deleted)
        for key in list(Store.keys(store.meta, *keys.parked_topics_bounds(q.id, tag_id))):
            t.parked_topics.add(keys.parked_topic_decode(key))
        for topic_id in list(t.parked_topics):
            self._topics.relock_parked(q, t, topic_id)
        for topic_id, head in waited_on.items():
            head_lease = t.leases.get(head)
            if head_lease is not None and head_lease.state == LEASED:
                t.lock(topic_id, head)  # rewound messages of its topic wait behind it
        for topic_id in t.topic_from:
            self._topics.watch_lapse(q, t, topic_id)
        self._counters.tag_loaded(q, t)
        return t

    # -- the operation frame -------------------------------------------------------------------

    def _operation(self) -> OperationFrame:
        """Frame of every public operation (``with core._operation() as now``): yields
        ``now``; writes what the operation changed as one atomic batch when it returns (and
        syncs the WAL with ``fsync``, unless inside a group: its owner syncs once for all).
        One frame object serves every operation (it holds no state: operations may nest)."""
        return self._frame

    @contextmanager
    def group(self) -> Iterator[None]:
        """Operations inside share one WAL sync (group commit).

        Each operation still takes effect in call order and is written as its own atomic
        batch when it returns (so the next one reads it; writes without sync cost
        microseconds). With ``fsync``, the owner of the group calls ``sync_wal`` once after it
        — a server does so in a worker thread — before acknowledging any of them.
        """
        self._group_depth += 1
        try:
            yield
        finally:
            self._group_depth -= 1

    def _write_pending(self) -> None:
        """Write the pending batch with the engine clock. On failure what the batch would have
        changed is rebuilt from the store, which never saw it (recovery.py), and
        ``WriteFailed`` is raised."""
        store, counters = self._store, self._counters
        if counters.dirty or counters.unsaved:
            counters.write(store.pending)
        else:  # ``Counters.write`` would do just this
            counters.held_batch = -1
        if not store.pending:
            return
        ceiling = self._persisted_clock
        if self._clock.last_ms > ceiling:
            # The row holds a ceiling of the clock, written ahead: an operation in a new
            # millisecond writes it only when it passes it (docs/STORAGE.md "The clock").
            ceiling = self._clock.last_ms + CLOCK_AHEAD_MS
            store.put(store.meta_h, keys.META_CLOCK, keys.u64(ceiling))
        try:
            store.flush()
        except Exception as exc:
            self._write_failed(exc)
            raise WriteFailed(str(exc)) from exc
        self._persisted_clock = ceiling
        self._unsynced = True

    @property
    def needs_sync(self) -> bool:
        """Whether batches were written since the last ``sync_wal`` (a server with ``fsync``
        syncs before acknowledging them)."""
        return self._unsynced

    def sync_wal(self) -> None:
        """Make everything written so far survive power loss (blocking; releases the GIL)."""
        if not self._store_open:
            raise Unavailable(f"storage unavailable: {self._broken}")
        self._unsynced = False
        self._store.sync_wal()

    def _recover(self) -> None:
        self._store.discard()
        self._load()

    def close(self) -> None:
        """Write what is pending and close the store. Idempotent; a store whose writes
        fail is closed all the same (what was acknowledged is in its WAL already)."""
        if self._closed:
            return
        self._closed = True
        if self._store_open:
            try:
                self._counters.save_received()  # the rows exact, nothing held back
                self._save_tag_rows()
                if self._clock.last_ms:  # the clock exact, not its ceiling
                    store = self._store
                    store.put(store.meta_h, keys.META_CLOCK, keys.u64(self._clock.last_ms))
                    self._persisted_clock = self._clock.last_ms
                self._write_pending()
                if self.fsync and self._unsynced:
                    self.sync_wal()
            except Exception as exc:  # the write or the sync failed: nothing to answer
                log.error("closing: the last write failed: %s", exc,
                          extra={"event": "close_write_failed"})
        self._close_store()

    def _save_tag_rows(self) -> None:
        """Closing: put the rows of tags whose cursors ran ahead of them, and every lease
        counter exact (``TagState.encode_cursors``), so the closed directory reads as
        memory stood."""
        store = self._store
        for q in self._queues.values():
            for t in q.tags.values():
                if t.row_behind or t.counter_ceiling != t.lease_counter:
                    store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors(0))

    # -- lookups ----------------------------------------------------------------------------

    def _queue(self, name: object, field: str = "queue") -> QueueState:
        """The queue named ``name``: a lookup judges no name (only create and copy do), so
        text that could never name a queue is ``QueueNotFound`` too."""
        if not isinstance(name, str):
            raise InvalidArgument(field, "must be a queue name (text)")
        queue_id = self._queue_names.get(name.lower())
        if queue_id is None:
            shown = name if len(name) <= 64 else name[:61] + "..."
            raise QueueNotFound(f"{field}: no queue named {shown!r}", field=field)
        return self._queues[queue_id]

    @staticmethod
    def _tag(q: QueueState, name: object) -> TagState:
        if name is None:
            tag_id = q.tag_names.get(DEFAULT_TAG)  # a valid name, in lower case
            if tag_id is not None:
                return q.tags[tag_id]
            name = DEFAULT_TAG
        else:
            check_name(name, "tag")
        t = q.tag_named(name)  # type: ignore[arg-type]
        if t is None:
            raise TagNotFound(f"tag: queue {q.name!r} has no tag {name!r}", field="tag")
        return t

    # -- watermarks ---------------------------------------------------------------------------

    def _first_seq_at(self, q: QueueState, time_ms: int) -> int:
        """The first seq produced at or after ``time_ms`` (``next_seq`` if none): a seek
        each way in the sparse time index and the records between (timeindex.py)."""
        if time_ms > q.last_time_ms:
            return q.next_seq
        return first_seq_at(self._store, q, time_ms)

    def _advance(self, q: QueueState, now: int) -> None:
        """Apply what is due by now before an operation on ``q`` acts: dead-letter moves of
        leases that ran out, then ``expired_seq`` (messages older than ``retention``).

        What this changes is written at once, as its own batch: the operation then reads it
        (an expired topic head passes its topic on with rows a receive must see)."""
        if now <= q.quiet_until_ms:  # nothing due: the tests below find nothing to do
            return
        store = self._store
        pending = store.pending
        attributes = q.attributes
        if attributes["redrive"] is not None:  # else no dead-letter move
            self._dead_letters.apply_expiries(q, now)
        horizon = now - attributes["retention"] * 1000
        oldest = q.oldest_live_ms
        if (oldest < 0 or horizon > oldest) and (
                q.expired_seq < q.next_seq or horizon > q.last_time_ms):
            expired = self._first_seq_at(q, horizon)
            if expired > q.expired_seq:
                q.expired_seq = expired
                if expired > q.gone_seq:
                    self._raise_gone(q, expired, expiry=True)
                self._persist_watermarks(q)
            q.oldest_live_ms = self._oldest_live_ms(q)
            oldest = q.oldest_live_ms
        q.quiet_until_ms = (oldest + attributes["retention"] * 1000  # see QueueState
                            if oldest >= 0 and attributes["redrive"] is None else -1)
        if store.pending > pending:
            self._write_pending()

    def _oldest_live_ms(self, q: QueueState) -> int:
        """Production time of the oldest retained message, -1 when none is (so a send may set
        it; never "not known yet"). Below ``gone_seq`` records may be collected."""
        return self._production_ms(q, max(q.expired_seq, q.gone_seq))

    def _head_gone_at(self, q: QueueState, head: int, expiry: bool) -> int:
        """When a topic head below a new ``gone_seq`` ended: by retention, the ms after it
        became older than ``retention`` (possibly before the operation that applies it: its
        successor is Active again from then); else now (a purge)."""
        now = self._now
        if not expiry:
            return now
        produced = self._production_ms(q, head)
        if produced < 0:
            return now
        return min(now, produced + q.attributes["retention"] * 1000 + 1)

    def _save_tag_definition(self, q: QueueState, t: TagState) -> None:
        store = self._store
        store.put(store.meta_h, keys.tag_def_key(q.id, t.id), cbor2.dumps(t.definition()))

    def _production_ms(self, q: QueueState, seq: int) -> int:
        """Production time of message ``seq`` (-1 when it is not in the log)."""
        if seq >= q.next_seq:
            return -1
        store = self._store
        for lane in q.lanes_used:
            value = store.log.get(keys.log_key(q.id, lane, seq))
            if value is not None:
                return PREFIX.unpack_from(value)[0]
        return -1

    def _settle(self, q: QueueState, now: int) -> None:
        """Raise ``gone_seq`` to the highest value DESIGN.md §2 allows at ``now``; for a DLQ,
        also its sources' (a dead letter whose copy ended counts as Ended at once)."""
        if q.gone_seq < q.next_seq:  # else all gone: nothing can rise (``_settle_queue``)
            self._settle_queue(q, now)
        if self._dead_sources:  # else no DLQ has sources
            sources = self._dead_sources.get(q.id)
            if sources:
                self._dead_letters.settle_sources(q, sources, now)

    def _settle_queue(self, q: QueueState, now: int) -> None:
        gone = q.gone_seq
        if gone >= q.next_seq:  # all gone (a consumer that keeps up): nothing can rise,
            return  # as every watermark below is at most ``next_seq``
        floor = delayed_floor(self._store, q) if q.delayseq_from < q.next_seq else q.next_seq
        lanes, tails = q.lanes_used, q.lane_tail
        for t in q.tags.values():
            # A tag leased at ``gone_seq`` or with a cursor resting there has its floor there
            # (``tag_floor``): nothing can rise (``expired_seq`` and ``purge_seq`` are never
            # above ``gone_seq``), told without the floor's work.
            lease, cursors = t.leases.get(gone), t.cursors
            if lease is not None and lease.state == LEASED:
                return
            for lane in lanes:
                if cursors[lane] <= gone and cursors[lane] <= tails[lane]:
                    return
            held_from = tag_floor(self._store, self._queues, self._now, q, t)
            if held_from < floor:
                floor = held_from
                if floor <= gone:
                    return
        bound = self._first_seq_at(q, now - q.attributes["rewind"] * 1000)
        gone = max(q.gone_seq, q.expired_seq, q.purge_seq, min(floor, bound))
        if gone > q.gone_seq:
            self._raise_gone(q, gone)
            self._persist_watermarks(q)

    def _raise_gone(self, q: QueueState, gone: int, expiry: bool = False) -> None:
        """Move ``gone_seq`` up: drop lease rows below it, pass on topics whose head went,
        move cursors it overtook. With ``expiry``, count what expired while not Ended."""
        if expiry:
            for t in q.tags.values():
                expired = not_ended_between(self._store, q, t, q.gone_seq, gone)
                if expired:
                    self._counters.count(q.id, t.id, EXPIRED, expired)
        q.gone_seq = gone
        store = self._store
        for t in q.tags.values():
            heap, leases = t.row_heap, t.leases
            while heap and heap[0] < gone:
                seq = heapq.heappop(heap)
                lease = leases.pop(seq, None)
                if lease is None:
                    continue
                if lease.batch is None:  # a batch entry below gone_seq means nothing
                    store.delete(store.leases_h, keys.lease_key(q.id, t.id, seq))
                if lease.state == LEASED:
                    t.due_index.discard(lease.due_ms, seq)
            heads = t.head_heap
            while heads and heads[0] < gone:
                head = heapq.heappop(heads)
                if head in t.heads:
                    self._topics.head_ended(q, t, head, self._head_gone_at(q, head, expiry))
            moved = False
            for lane in q.lanes_used:
                if t.cursors[lane] < gone and t.cursors[lane] <= q.lane_tail[lane]:
                    t.cursors[lane] = gone
                    self._snap_cursor(q, t, lane)
                    moved = True
            if moved:
                store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())
        if q.delayseq_from < gone:
            q.delayseq_from = gone
        collect(self._store, q)

    def _snap_cursor(self, q: QueueState, t: TagState, lane: int,
                     deleted: AbstractSet[int] = frozenset()) -> None:
        """Move a cursor onto the lowest message of its lane at or above it that is not
        already settled for the tag, or past the lane's tail (TagState invariant);
        ``deleted``: seqs whose ENDED_DELETED rows are on disk only (at open)."""
        cursor = t.cursors[lane]
        if cursor > q.lane_tail[lane]:
            return
        lower, upper = keys.log_lane_bounds(q.id, lane, cursor)
        it = Store.scan(self._store.log, lower, upper)
        t.cursors[lane] = skip_settled(t, it, q.lane_tail[lane], deleted)

    def _notify(self, q: QueueState) -> None:
        if self.on_activity is not None:
            self.on_activity(q.name)

    def _persist_watermarks(self, q: QueueState) -> None:
        self._store.put(self._store.meta_h, keys.watermarks_key(q.id), q.encode_watermarks())

    # -- wake-ups ---------------------------------------------------------------------------------

    def _lease_dropped(self, q: QueueState, t: TagState, seq: int, lease: Lease) -> None:
        """A LEASED message is Ended for ``t`` (deleted): its rows go, or, when a cursor or the
        delay index would still bring it (it was kept Inflight through a rewind), it stays
        as an ENDED_AHEAD row. A topic it headed passes on."""
        store = self._store
        # A head whose topic was rewound under it: the successor search will walk back over
        # it, so it must stay recognisably Ended.
        revisited = seq in t.heads and t.heads[seq] in t.topic_from
        if revisited or self._still_ahead(q, t, seq, lease.lane):
            self._lease_saved(q, t, seq, Lease(ENDED_AHEAD, lease.lane, 0, lease.count,
                                               lease.first_ms, 0), lease.due_ms)
            self._cursor_off(q, t, seq, lease.lane)
        else:  # the row stays on disk only, for peek's dequeue count (state.py)
            del t.leases[seq]
            store.put(store.leases_h, keys.lease_key(q.id, t.id, seq),
                      Lease.pack(ENDED_DELETED, lease.lane, 0, lease.count, lease.first_ms, 0))
            t.due_index.discard(lease.due_ms, seq)
        if seq in t.heads:
            self._topics.head_ended(q, t, seq, self._now)

    def _cursor_off(self, q: QueueState, t: TagState, seq: int, lane: int) -> None:
        """``seq`` just got an ENDED row: a cursor resting on it moves on to a message it
        still has to pass (TagState invariant; the floors read cursors as they are)."""
        if t.cursors[lane] == seq:
            self._snap_cursor(q, t, lane)
            store = self._store
            store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())

    def _still_ahead(self, q: QueueState, t: TagState, seq: int, lane: int) -> bool:
        """Whether a lane cursor or the delay index has yet to pass ``seq`` for ``t`` (a
        leased message can be there only after a rewind that moved the delay position back,
        which sets ``rewind_vt``; ``rewind_seq`` may be 0)."""
        if seq < t.cursors[lane] and not (t.rewind_vt and seq >= t.rewound_from()):
            return False
        value = self._store.log.get(keys.log_key(q.id, lane, seq))
        if value is None:
            return False
        enqueue_ms, visible_ms, _, _ = PREFIX.unpack_from(value)
        if visible_ms != enqueue_ms:  # delayed: only the delay index brings it
            return not t.delay_taken(visible_ms, seq)
        return seq >= t.cursors[lane]

    def _lease_saved(self, q: QueueState, t: TagState, seq: int, lease: Lease,
                     old_due: int | None) -> None:
        """Write a lease row and keep its deadline (indexed exactly while LEASED) in step.
        ``old_due`` is the due time of the row's previous LEASED state, if it had one."""
        store = self._store
        previous = t.leases.get(seq)
        if previous is None:
            heapq.heappush(t.row_heap, seq)
        if previous is not lease:
            if lease.state == LEASED:
                heapq.heappush(t.lease_heap, seq)
            elif lease.state == ENDED_DEAD:
                heapq.heappush(t.dead_heap, seq)
        t.leases[seq] = lease
        lease.batch = None  # its ``leases`` row overrides its batch entry (leasebatch.py)
        store.put(store.leases_h, keys.lease_key(q.id, t.id, seq), lease.encode())
        if old_due is not None and (lease.state != LEASED or old_due != lease.due_ms):
            t.due_index.discard(old_due, seq)
        if lease.state == LEASED:
            t.due_index.add(lease.due_ms, seq)
            if t.topic_from and t.heads.get(seq) in t.topic_from:
                self._topics.watch_lapse(q, t, t.heads[seq])
            self._deadlines.watch_lease_due(q, t, lease.due_ms)

    def _apply_due_expiries(self, now: int) -> None:
        """Dead-letter moves due by ``now`` in every queue (before any operation acts)."""
        heap = self._deadlines.expiry_heap
        while heap and heap[0][0] <= now:
            due, queue_id = heapq.heappop(heap)
            q = self._queues.get(queue_id)
            if q is not None and due == q.next_expiry_ms:
                self._dead_letters.apply_expiries(q, now)
                self._deadlines.schedule_expiry_check(q, now)

    def _apply_due_lapses(self, now: int) -> None:
        self._topics.apply_due_lapses(self._queues, now)
