"""The append path: a batch of messages becomes log records, index rows, segment entries and
counts (DESIGN.md §3 ``send``; dead-letter copies come the same way, as prepared entries).

``Appender`` is owned by the engine core; ``parse_send_entry`` (sendentry.py) checks one
send entry.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

import cbor2

from . import keys
from .counters import BYTES_IN, SENT, Counters
from .deadlines import Deadlines
from .errors import LaminaError, QueueFull
from .records import (CBOR_NULL, ID_LENGTH, PREFIX, RECORD_HEAD, body_md5,
                      cbor_head, cbor_uint, encode_record, md5_for, message_id,
                      parse_message_id)
from .results import Sent, SentColumns
from .scope import filter_matches
from .sendentry import _Entry, parse_send_entry
from .state import DAY_MS, QueueState, Segment, TagState
from .store import Store
from .timeindex import EVERY_MESSAGES as TIME_EVERY_MESSAGES
from .timeindex import EVERY_MS as TIME_EVERY_MS
from .topics import Topics
from .validation import DEFAULT_PRIORITY

#: A send of this many messages or more, all plain, takes ``Appender._append_plain``: its
#: fixed cost (about 1 µs more than the loop's) is repaid from about 4 messages on (measured,
#: the server's ``send_columns``: 1 µs more for 2 messages, even for 3, 0.6 less for 4, 1.7
#: less for 6, 7 less for 16).
PLAIN_RUN_FROM = 4
_NO_SEQS: frozenset[int] = frozenset()
#: A plain message's record tail (``_plain_parts``): attributes and topic null, priority 8,
#: enqueue and visible time (epoch ms, 8-byte CBOR heads), the digest's bytes head.
_PLAIN_TAIL = struct.Struct(">HBBQBQB")
MD5_BYTES = 16
#: A log key from the lane's packed prefix (``keys.log_lane_prefix``) and the seq.
_LANE_KEY = struct.Struct(">%dsQ" % len(keys.log_lane_prefix(0, 0)))


def _count_queue_sends(q: QueueState, now: int, count: int, bytes_in: int) -> None:
    """The queue's daily ``sent`` / ``bytes_in``, held unsaved (counters.py)."""
    sends = q.unsaved_sends.get(now // DAY_MS)
    if sends is None:
        q.unsaved_sends[now // DAY_MS] = [count, bytes_in]
    else:
        sends[0] += count
        sends[1] += bytes_in


def _note_appended(store: Store, q: QueueState, now: int, first_seq: int) -> None:
    """The time index and the oldest live message once messages from ``first_seq`` were
    appended at ``now`` (timeindex.py: the first messages of a millisecond are noted, and
    indexed when the last index entry is old or far enough behind)."""
    if now > q.last_time_ms:
        q.last_time_seq = first_seq
        if (now - q.indexed_ms >= TIME_EVERY_MS
                or first_seq - q.indexed_seq >= TIME_EVERY_MESSAGES):
            store.put(store.time_h, keys.time_key(q.id, now, first_seq), b"")
            q.indexed_ms, q.indexed_seq = now, first_seq
        q.last_time_ms = now
    if q.oldest_live_ms < 0:  # nothing was live: the oldest live message is new
        q.oldest_live_ms = now


class AppendContext(Protocol):
    """What appending reads of the engine: its store, components, segment limits and the
    operation's ``now``; it persists watermarks and tells of activity through it."""

    _store: Store
    _counters: Counters
    _deadlines: Deadlines
    _topics: Topics
    _now: int
    segment_max_messages: int
    segment_max_bytes: int
    segment_max_age_ms: int

    def _persist_watermarks(self, q: QueueState) -> None: ...

    def _notify(self, q: QueueState) -> None: ...


class Appender:
    """Appends messages to a queue's log (``append``), owned by the engine core."""

    def __init__(self, context: AppendContext) -> None:
        self._context = context
        # (now, log prefix, record tail) of a plain message (``append``) at the last ``now``:
        # sends in the same millisecond share them.
        self._plain: tuple[int, bytes, bytes] = (-1, b"", b"")
        # The body size of the last lone plain message (``_append_lone``) and its CBOR head.
        self._lone_size, self._lone_head = -1, b""

    def append(self, q: QueueState, messages: list[Any], now: int
               ) -> list[Sent | LaminaError] | SentColumns:
        """Assign seqs and write records. The hot path: everything that is the same for the
        whole batch (time fields, the prefix of plain messages) is encoded once. A batch of
        plain messages comes back as ``SentColumns`` (``_append_plain``), any other as a list
        of its entries' results."""
        count = len(messages)
        if count == 1:
            lone = self._append_lone(q, messages, now)
            if lone is not None:
                return lone
        elif count >= PLAIN_RUN_FROM:
            run = self._append_run(q, messages, now)
            if run is not None:
                return run
        context = self._context
        store = context._store
        store.log_appended()
        batch_put = store.batch.put
        log_h = store.log_h
        qid = q.id
        entries: list[Sent | LaminaError] = []
        append = entries.append
        results: list[Sent | LaminaError] | SentColumns = entries
        capacity = q.attributes["max_messages"] - (q.next_seq - q.gone_seq)
        max_size = q.attributes["max_message_size"]
        plain_ok = q.attributes["delay"] == 0
        tails = q.lane_tail
        first_in_lane: dict[int, int] = {}
        old_tails: dict[int, int] = {}
        first_ready: dict[int, int] = {}  # first non-delayed new seq per lane
        delayed_seqs: set[int] = set()
        segment = q.segments[-1] if q.segments else None
        max_count, max_bytes = context.segment_max_messages, context.segment_max_bytes
        if segment is not None and (segment.count >= max_count
                                    or segment.size_bytes >= max_bytes
                                    or now - segment.first_ms >= context.segment_max_age_ms):
            self._seal(q, segment)
            segment = None
        segment_end_ms = (segment.first_ms if segment else now) + context.segment_max_age_ms
        prefix_pack, log_key = PREFIX.pack, keys.log_key
        id_prefix = f"{qid:08x}"
        # A plain message (a non-empty bytes body, default priority, no delay): record tail and
        # log prefix are the same for all of them.
        plain_prefix, plain_tail = self._plain_parts(now)
        written = bytes_in = refused = 0
        next_topic_id = q.next_topic_id
        first_seq = q.next_seq  # that of the first message appended, if any
        plain_run = (self._plain_run(messages, max_size)
                     if plain_ok and PLAIN_RUN_FROM <= len(messages) <= capacity else None)
        if plain_run is not None:  # every message plain: written and counted as one run
            results, segment, written, bytes_in = self._append_plain(
                q, messages, plain_run, now, segment, plain_prefix, plain_tail)
            lane = DEFAULT_PRIORITY
            if tails[lane] < 0:
                q.lanes_used.append(lane)
                q.lanes_used.sort()
            first_in_lane[lane] = first_ready[lane] = first_seq
            old_tails[lane] = tails[lane]
            tails[lane] = q.next_seq - 1
        for index, raw in enumerate(messages if plain_run is None else ()):
            if capacity <= 0 and type(raw) is not _Entry:
                append(QueueFull(f"messages[{index}]: queue {q.name!r} retains max_messages "
                                 f"{q.attributes['max_messages']}"))
                refused += 1
                continue
            if type(raw) is bytes and plain_ok and 0 < len(raw) <= max_size:
                body, delay_ms, lane = raw, 0, DEFAULT_PRIORITY
                seq = q.next_seq
                msg_id = f"{id_prefix}{seq:016x}7"
                md5 = body_md5(raw)
                record = b"".join((RECORD_HEAD, msg_id.encode(), cbor_head(2, len(raw)),
                                   raw, plain_tail, md5, CBOR_NULL))
                value = plain_prefix + record
            else:
                if type(raw) is _Entry:
                    entry = raw
                else:
                    try:
                        entry = parse_send_entry(raw, index, q)
                    except LaminaError as exc:
                        append(exc.with_traceback(None))  # frames would pin the store
                        refused += 1
                        continue
                body, delay_ms, lane = entry.body, entry.delay_ms, entry.priority
                seq = q.next_seq
                msg_id = message_id(qid, seq, lane)
                md5 = body_md5(body)
                visible = now + delay_ms
                record = encode_record(msg_id, entry.body_cbor, entry.attributes_cbor,
                                       entry.topic, lane, now, visible, md5, entry.dead_cbor)
                topic_id = entry.mark
                if entry.topic is not None:
                    topics = context._topics
                    topic_id = topics.id(q, entry.topic)
                    topics.index(q, topic_id, seq, now, visible)
                    written += 1
                value = prefix_pack(now, visible, topic_id, lane) + record
            capacity -= 1
            q.next_seq = seq + 1
            batch_put(log_key(qid, lane, seq), value, log_h)
            written += 1
            if lane not in first_in_lane:
                if tails[lane] < 0:
                    q.lanes_used.append(lane)
                    q.lanes_used.sort()
                first_in_lane[lane] = seq
                old_tails[lane] = tails[lane]
            tails[lane] = seq
            if delay_ms:
                self._index_delay(q, seq, lane, now + delay_ms)
                delayed_seqs.add(seq)
                written += 2
            elif lane not in first_ready:
                first_ready[lane] = seq
            if (segment is None or segment.count >= max_count or segment.size_bytes >= max_bytes
                    or now >= segment_end_ms):
                written += self._open_segment(q, segment, seq, now)
                segment = q.segments[-1]
                segment_end_ms = now + context.segment_max_age_ms
            segment.last_seq = seq
            segment.last_ms = now
            segment.count += 1
            segment.size_bytes += len(record)
            bytes_in += len(body)
            append(Sent(msg_id, now, md5))
        store.pending += written
        if first_in_lane:
            self._finish(q, results, messages, first_in_lane, old_tails, first_ready,
                         delayed_seqs, first_seq, segment, next_topic_id,
                         len(results) - refused, bytes_in, now)
        return results

    def _finish(self, q: QueueState, results: list[Sent | LaminaError] | SentColumns,
                messages: list[Any], first_in_lane: dict[int, int], old_tails: dict[int, int],
                first_ready: dict[int, int], delayed_seqs: AbstractSet[int], first_seq: int,
                segment: Segment | None, next_topic_id: int, sent_count: int, bytes_in: int,
                now: int) -> None:
        """What ``append`` does once messages were appended (``first_in_lane``: the first new
        seq of each lane written, ``old_tails`` the lanes' tails before): counts, the time
        index, tag cursors, the open segment's row, watermarks, waiters."""
        context = self._context
        store = context._store
        qid = q.id
        tails = q.lane_tail
        self._count_sent(q, results, messages, sent_count, bytes_in)
        put = store.put
        _note_appended(store, q, now, first_seq)
        # A cursor past the old tail of its lane (exhausted) snaps onto the lane's first
        # new non-delayed message, or past the new tail (TagState invariant). The move is
        # persisted, so reopening never walks a run of delayed messages.
        # A filtered tag (or one whose start is ahead) snaps onto the first new message
        # of its scope instead.
        for t in q.tags.values():
            cursors = t.cursors
            moved = False
            scoped = t.filter is not None or t.start_ms > now
            for lane in first_in_lane:
                if cursors[lane] > old_tails[lane]:
                    cursors[lane] = (self._first_in_scope(t, lane, results, messages, now,
                                                          tails[lane], delayed_seqs)
                                     if scoped
                                     else first_ready.get(lane, tails[lane] + 1))
                    moved = True
            if moved:
                put(store.tags_h, keys.tag_key(qid, t.id), t.encode_cursors())
        # Neither the watermarks (only next_seq changed, which the log tells) nor, mostly,
        # the open segment's row and the queue's counters are written: reading the queue
        # derives them from the log (``loading.read_queue``). A key of the queue is noted
        # as written all the same, so that a failed write rebuilds it (recovery.py).
        assert segment is not None  # a message was appended
        segment_key = keys.segment_key(qid, segment.first_seq)
        if segment.row_lags():
            put(store.segments_h, segment_key, segment.encode_saved())
            context._counters.save_sends(q)  # the sends up to its last_seq: counters.py
        else:
            store.written.append(segment_key)
        if q.next_topic_id != next_topic_id:
            context._persist_watermarks(q)
        context._notify(q)

    def _plain_parts(self, now: int) -> tuple[bytes, bytes]:
        """-> (log prefix, record tail) of a plain message sent at ``now``, kept in
        ``_plain`` for the sends of the same millisecond (which find them there)."""
        plain_prefix = PREFIX.pack(now, now, 0, DEFAULT_PRIORITY)
        if now >= 1 << 32:  # an epoch time in ms: a CBOR head of 9 bytes (cbor_uint's)
            plain_tail = _PLAIN_TAIL.pack(0xF6F6, 8, 0x1B, now, 0x1B, now, 0x50)
        else:
            now_cbor = cbor_uint(now)
            plain_tail = b"\xf6\xf6\x08" + now_cbor + now_cbor + b"\x50"
        self._plain = (now, plain_prefix, plain_tail)
        return plain_prefix, plain_tail

    def _append_lone(self, q: QueueState, messages: list[Any], now: int) -> SentColumns | None:
        """``append`` of one plain message (the commonest send: a client awaiting each
        answer) that the queue has room for and that fits in the open segment: the same
        record, rows, counts and answer as ``append``'s loop, without its per-batch setup;
        None when the send is not that (``append`` goes on)."""
        raw = messages[0]
        if type(raw) is not bytes:
            return None
        size, attributes = len(raw), q.attributes
        if (not 0 < size <= attributes["max_message_size"] or attributes["delay"]
                or not q.segments or q.next_seq - q.gone_seq >= attributes["max_messages"]):
            return None
        segment = self._segment_taking(q, now)
        if segment is None:
            return None
        store = self._context._store
        store.log_appended()
        plain_now, plain_prefix, plain_tail = self._plain
        if plain_now != now:
            plain_prefix, plain_tail = self._plain_parts(now)
        qid, seq = q.id, q.next_seq
        msg_id = b"%08x%016x7" % (qid, seq)  # PROTOCOL.md's id: queue, seq, lane - 1
        md5 = body_md5(raw)
        if size != self._lone_size:  # a producer's bodies are mostly of one size
            self._lone_size, self._lone_head = size, cbor_head(2, size)
        record = b"".join((RECORD_HEAD, msg_id, self._lone_head, raw, plain_tail, md5,
                           CBOR_NULL))
        key = keys.log_key(qid, DEFAULT_PRIORITY, seq)
        store.batch.put(key, plain_prefix + record, store.log_h)
        store.pending += 1
        q.next_seq = seq + 1
        segment.last_seq = seq
        segment.last_ms = now
        segment.count += 1
        segment.size_bytes += len(record)
        results = SentColumns(now, [msg_id], [md5])
        self._finish_plain(q, results, messages, seq, 1, size, segment, now, key)
        return results

    def _segment_taking(self, q: QueueState, now: int) -> Segment | None:
        """The queue's open segment when it takes messages at ``now``; None when ``append``
        must seal it and open the next (full, or as old as a segment may grow)."""
        segment = q.segments[-1]
        context = self._context
        if (segment.count >= context.segment_max_messages
                or segment.size_bytes >= context.segment_max_bytes
                or now - segment.first_ms >= context.segment_max_age_ms):
            return None
        return segment

    def _append_run(self, q: QueueState, messages: list[Any], now: int) -> SentColumns | None:
        """``append`` of a run of plain messages (``PLAIN_RUN_FROM`` or more) that the queue
        has room for, starting in an open segment that takes more: ``_append_plain`` without
        the general path's per-batch setup (its containers for lanes, delays and refusals);
        None when the send is not that (``append`` goes on)."""
        count = len(messages)
        attributes = q.attributes
        if (attributes["delay"] or not q.segments
                or q.next_seq - q.gone_seq + count > attributes["max_messages"]):
            return None
        segment = self._segment_taking(q, now)
        if segment is None:
            return None
        context = self._context
        sizes = self._plain_run(messages, attributes["max_message_size"])
        if sizes is None:
            return None
        store = context._store
        store.log_appended()
        plain_now, plain_prefix, plain_tail = self._plain
        if plain_now != now:
            plain_prefix, plain_tail = self._plain_parts(now)
        first = q.next_seq
        results, segment, written, bytes_in = self._append_plain(
            q, messages, sizes, now, segment, plain_prefix, plain_tail)
        store.pending += written
        self._finish_plain(q, results, messages, first, count, bytes_in, segment, now,
                           keys.log_key(q.id, DEFAULT_PRIORITY, first))
        return results

    def _finish_plain(self, q: QueueState, results: SentColumns, messages: list[Any],
                      first: int, count: int, bytes_in: int, segment: Segment, now: int,
                      key: bytes) -> None:
        """``_finish`` for ``count`` plain messages appended from ``first`` on, all in the
        default lane and none delayed, by ``_append_lone`` or ``_append_run`` (``key``: a key
        of the queue written in the batch): the same counts, rows and cursors."""
        store = self._context._store
        lane = DEFAULT_PRIORITY
        tails = q.lane_tail
        old_tail = tails[lane]
        if old_tail < 0:
            q.lanes_used.append(lane)
            q.lanes_used.sort()
        tails[lane] = q.next_seq - 1
        _count_queue_sends(q, now, count, bytes_in)
        _note_appended(store, q, now, first)
        for t in q.tags.values():
            cursors = t.cursors
            if t.filter is not None or t.start_ms > now:  # scoped: as ``_finish`` does
                self._count_tag_sends(q, t, results, messages, count, bytes_in)
                if cursors[lane] > old_tail:
                    cursors[lane] = self._first_in_scope(t, lane, results, messages, now,
                                                         tails[lane], _NO_SEQS)
                    store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())
            elif cursors[lane] > old_tail:  # exhausted: onto the first new message
                cursors[lane] = first
                store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())
        if segment.row_lags():
            store.put(store.segments_h, keys.segment_key(q.id, segment.first_seq),
                      segment.encode_saved())
            self._context._counters.save_sends(q)  # the sends up to its last_seq
        else:  # noted as written all the same: ``_finish``
            store.written.append(key)
        self._context._notify(q)

    @staticmethod
    def _plain_run(messages: list[Any], max_size: int) -> list[int] | None:
        """The body sizes when every message is plain (a bytes body of 1 to ``max_size``
        bytes), else None."""
        sizes = [len(raw) if type(raw) is bytes else 0 for raw in messages]
        return sizes if 0 < min(sizes) and max(sizes) <= max_size else None

    def _append_plain(self, q: QueueState, messages: list[bytes], sizes: list[int], now: int,
                      segment: Segment | None, plain_prefix: bytes, plain_tail: bytes
                      ) -> tuple[SentColumns, Segment, int, int]:
        """``append``'s loop for a batch of plain messages, all accepted, in one lane: the
        same rows and results as message by message, without its branches per message (entry
        kind, lane, delay, topic, segment): keys from one packed lane prefix, one body head
        for bodies of one size, the segment counted once when the batch fits in it, the id
        and digest columns kept for the answer, no ``Sent`` built (``SentColumns``).
        -> (results, open segment, rows written, body bytes)."""
        context = self._context
        store = context._store
        qid = q.id
        first = q.next_seq
        written = count = len(messages)
        q.next_seq = end = first + count
        ids: list[bytes] = []
        digests: list[bytes] = []
        add_id, add_digest = ids.append, digests.append
        md5_of = md5_for(max(sizes))
        id_format = b"%08x%%016x7" % qid  # PROTOCOL.md's id: queue, seq, lane - 1
        lead = plain_prefix + RECORD_HEAD
        key_prefix, key_pack = keys.log_lane_prefix(qid, DEFAULT_PRIORITY), _LANE_KEY.pack
        batch_put, log_h = store.batch.put, store.log_h
        size = sizes[0]
        if size != self._lone_size:  # a producer's bodies are mostly of one size
            self._lone_size, self._lone_head = size, cbor_head(2, size)
        head = self._lone_head
        uniform = sizes.count(size) == count
        for seq, raw in zip(range(first, end), messages):
            md5 = md5_of(raw).digest()
            msg_id = id_format % seq
            batch_put(key_pack(key_prefix, seq),
                      b"".join((lead, msg_id, head if uniform else cbor_head(2, len(raw)), raw,
                                plain_tail, md5, CBOR_NULL)), log_h)
            add_id(msg_id)
            add_digest(md5)
        bytes_in = sum(sizes)
        # A record's bytes besides its body and the body's head (``Message``'s fields).
        fixed = len(RECORD_HEAD) + ID_LENGTH + len(plain_tail) + MD5_BYTES + len(CBOR_NULL)
        if uniform:
            total = count * (fixed + len(head)) + bytes_in  # the records' bytes
        else:
            total = count * fixed + bytes_in + sum([len(cbor_head(2, size)) for size in sizes])
        last_size = fixed + len(head if uniform else cbor_head(2, sizes[-1])) + sizes[-1]
        if (segment is not None and segment.count + count <= context.segment_max_messages
                and segment.size_bytes + total - last_size < context.segment_max_bytes):
            segment.last_seq = end - 1
            segment.last_ms = now
            segment.count += count
            segment.size_bytes += total
        else:  # the batch starts a segment or fills one: message by message
            for seq, size in zip(range(first, end), sizes):
                if (segment is None or segment.count >= context.segment_max_messages
                        or segment.size_bytes >= context.segment_max_bytes):
                    written += self._open_segment(q, segment, seq, now)
                    segment = q.segments[-1]
                segment.last_seq = seq
                segment.last_ms = now
                segment.count += 1
                segment.size_bytes += fixed + len(cbor_head(2, size)) + size
        assert segment is not None  # a message was appended
        return SentColumns(now, ids, digests), segment, written, bytes_in

    def _open_segment(self, q: QueueState, full: Segment | None, seq: int, now: int) -> int:
        """Start the queue's next segment at ``seq`` (after ``full``, whose row is written
        final, in the batch). -> rows written."""
        q.segments.append(Segment(seq, seq, now, now, 0, 0))
        if full is None:
            return 0
        store = self._context._store
        store.batch.put(keys.segment_key(q.id, full.first_seq), full.encode_saved(),
                        store.segments_h)
        return 1

    @staticmethod
    def _sent_attributes(raw: Any) -> tuple[dict[str, Any] | None, int, int]:
        """-> (attributes, body size, lane) of an accepted send entry."""
        if type(raw) is _Entry:
            attributes = cbor2.loads(raw.attributes_cbor) if raw.attributes_cbor else None
            return attributes, len(raw.body), raw.priority
        if isinstance(raw, dict):
            body = raw[1]
            lane = raw.get(4) or DEFAULT_PRIORITY
            return raw.get(2), len(body.encode() if isinstance(body, str) else body), lane
        return None, len(raw.encode() if isinstance(raw, str) else raw), DEFAULT_PRIORITY

    def _first_in_scope(self, t: TagState, lane: int, results: Iterable[Any],
                        messages: list[Any], now: int, tail: int, delayed_seqs: AbstractSet[int]
                        ) -> int:
        """The first message of this send in ``lane`` that a filtered tag receives and that
        is not delayed (its cursor's new position), else past the tail."""
        for raw, sent in zip(messages, results):
            if not isinstance(sent, Sent):
                continue
            attributes, _, entry_lane = self._sent_attributes(raw)
            seq = parse_message_id(sent.id)[1]  # type: ignore[index]
            if entry_lane == lane and seq not in delayed_seqs and now >= t.start_ms and (
                    t.filter is None or filter_matches(t.filter, attributes)):
                return seq
        return tail + 1

    def _count_sent(self, q: QueueState, results: Iterable[Any], messages: list[Any],
                    sent_count: int, bytes_in: int) -> None:
        """Daily ``sent`` / ``bytes_in``: once for the queue, and per tag as
        ``_count_tag_sends`` says."""
        now = self._context._now
        _count_queue_sends(q, now, sent_count, bytes_in)
        for t in q.tags.values():
            if t.filter is not None or t.start_ms > now:
                self._count_tag_sends(q, t, results, messages, sent_count, bytes_in)

    def _count_tag_sends(self, q: QueueState, t: TagState, results: Iterable[Any],
                         messages: list[Any], sent_count: int, bytes_in: int) -> None:
        """A tag's daily ``sent`` / ``bytes_in``: a filtered tag counts the messages it
        receives (decoding the attributes of each); a tag without a filter counts only what
        it does not receive, the sends before its start (counters.py)."""
        counters, now = self._context._counters, self._context._now
        if t.filter is None:
            if t.start_ms > now:
                counters.count(q.id, t.id, SENT, sent_count, BYTES_IN, bytes_in)
            return
        count = size = 0
        for raw, sent in zip(messages, results):
            if type(sent) is not Sent:
                continue
            attributes, body_size, _ = self._sent_attributes(raw)
            if t.start_ms <= now and filter_matches(t.filter, attributes):
                count += 1
                size += body_size
        if count:
            counters.count(q.id, t.id, SENT, count, BYTES_IN, size)

    def _index_delay(self, q: QueueState, seq: int, lane: int, visible: int) -> None:
        """Enter a delayed message in the queue-level delay indexes (two rows, no pending
        count: the caller counts them)."""
        store = self._context._store
        store.batch.put(keys.delay_key(q.id, visible, seq), bytes((lane,)), store.delays_h)
        store.batch.put(keys.delayseq_key(q.id, seq), keys.u64(visible), store.delayseq_h)
        if q.delayseq_from > seq:
            q.delayseq_from = seq
        self._context._deadlines.delay_ends_at(q, visible)
        for t in q.tags.values():
            if visible < t.delay_hint:
                t.delay_hint = visible

    def _seal(self, q: QueueState, segment: Segment) -> None:
        """A full open segment is sealed (the send starts a new one): its row, if it lags,
        is written final, with the queue's sends up to it (counters.py) — the send may yet
        refuse every message and start no segment."""
        if segment.saved_count != segment.count:
            store = self._context._store
            store.put(store.segments_h, keys.segment_key(q.id, segment.first_seq),
                      segment.encode_saved())
            self._context._counters.save_sends(q)
