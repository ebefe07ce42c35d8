"""Daily counters per queue and tag (DESIGN.md §8 ``stats``), persistent, kept 31 days.

Rows: ``meta`` ``b"D" | queue | tag | day`` -> 7 x u64 in ``FIELDS`` order; tag 0 holds the
queue's own figures (``sent`` and ``bytes_in`` counted once per message). Today's rows live in
memory while they change and are written with the operation that changed them, except the
queue's sends: those are added to its rows when the open segment's row is written (with it, in
one batch), so the rows hold exactly the messages up to that row's ``last_seq``; the sends
after it are ``QueueState.unsaved_sends``, counted again from the log when the queue is read
(``loading.read_queue``), and every read of the figures adds them.

Likewise a delete that raises the queue's ``gone_seq`` (so writes its watermarks row) does not
write its tag's row: its count goes to ``QueueState.unsaved_deletes``, which the watermarks
row holds, and every read of the figures adds them. They go to the tags' rows (with the
watermarks row written again) when a delete of another day comes; a delete that does not
raise ``gone_seq`` counts in its tag's row as before.

A tag without a filter receives every message sent from its start on, so a send does not
write its row: its ``sent`` / ``bytes_in`` are the queue's (from the day it was created) less
what its own row holds there, the sends of those days it did not receive — those of its day
of creation before it existed, and those before its start (``tag_created``, appending.py).
A filtered tag counts the messages it receives in its own row.

A receive whose leases are all first deliveries made in line (``Lessor.first_in_line``)
and whose batch holds nothing but their lease rows (and perhaps the tag's row) does not
write its row either: its figures are held back in memory (``unsaved``) until the next batch
that writes anything else, which adds them to the rows. Every row of a tag carries, after
its seven figures, the tag's next lease number when it was written (its *mark*): every
delivery numbered below the highest mark of the tag's rows is in the rows, and every one
numbered from it on is a first delivery held back whose lease row (or lease batch entry,
``LEASED``, dequeue count 1, first dequeue time the delivery's) is still on disk as that
receive wrote it — anything that changes or drops such a row writes the held figures in
the same batch. Opening counts them again from those rows and the records' sizes
(``tag_loaded``), so the figures are exact after a kill. A tag holds its figures back only
once a row of it with a mark is on disk (rows of schema version 3 have none: its next
receive writes one).

An in-order delete (one that writes the watermarks row, above) takes the held figures there
instead of to the rows when they are all its tag's and of its day (``hold_in_watermarks``,
schema version 5): ``QueueState.unsaved_received`` holds them with a mark of its own, the
tag's next lease number, so the highest mark above is that of the rows and the watermarks
row together. They go to the rows with the deletes (``save_deletes``).
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Any, Protocol

from . import keys
from .loading import tag_definitions
from .records import PREFIX_SIZE
from .state import DAY_MS, LEASED, QueueState, TagState
from .store import Store

FIELDS = ("sent", "received", "deleted", "dead", "expired", "bytes_in", "bytes_out")
SENT, RECEIVED, DELETED, DEAD, EXPIRED, BYTES_IN, BYTES_OUT = range(7)
_ROW = struct.Struct(">7Q")  # a row of the queue (tag 0), or of a tag before version 4
_MARKED_ROW = struct.Struct(">8Q")  # a tag's row: the figures and its mark
KEEP_DAYS = 31


def day_name(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, tz=timezone.utc).strftime("%Y-%m-%d")


class CounterContext(Protocol):
    """What the counters read of the engine: its store and the operation's ``now``."""

    _store: Store
    _now: int
    _queues: dict[int, QueueState]


class Counters:
    """The daily counters, owned by the engine: ``count`` bumps one, ``write`` puts the rows
    the operation changed, ``days`` reads them back."""

    def __init__(self, context: CounterContext) -> None:
        self._context = context
        self._rows: dict[tuple[int, int, int], list[int]] = {}  # cached rows
        # Their keys, as rows are written, each with its tag (None: the queue's row): tags
        # are made anew only with their ids (``tag_created``) or after ``reset`` (loading).
        self._keys: dict[tuple[int, int, int], tuple[bytes, TagState | None]] = {}
        self.dirty: set[tuple[int, int, int]] = set()  # rows changed by the operation
        # Receives held back (module docstring): (queue, tag, day) -> [received, bytes out].
        self.unsaved: dict[tuple[int, int, int], list[int]] = {}
        self._marked: set[tuple[int, int]] = set()  # (queue, tag) with a marked row stored
        # The pending rows of a receive whose figures are held back (-1: none): a batch of
        # exactly that many rows is that receive's alone (``EngineCore._write_pending``).
        self.held_batch = -1

    def reset(self, keep_unsaved: bool = False) -> None:
        """Forget the cache and what is pending (the store is the truth again); with
        ``keep_unsaved`` the held receives stay (only some queues are read again, and
        ``tag_loaded`` replaces theirs)."""
        self._rows.clear()
        self._keys.clear()
        self.dirty.clear()
        self._marked.clear()  # a tag holds back again once a row of it is written
        self.held_batch = -1
        if not keep_unsaved:
            self.unsaved.clear()

    def received(self, queue: int, tag: int, messages: int, bytes_out: int,
                 first_in_line: bool) -> bool:
        """Count a receive's deliveries; -> whether they are held back (module docstring:
        the caller judges whether its batch allows it, ``held_batch``)."""
        if first_in_line and (queue, tag) in self._marked:
            row_key = (queue, tag, self._context._now // DAY_MS)
            held = self.unsaved.get(row_key)
            if held is None:
                self.unsaved[row_key] = [messages, bytes_out]
            else:
                held[0] += messages
                held[1] += bytes_out
            return True
        self.count(queue, tag, RECEIVED, messages, BYTES_OUT, bytes_out)
        return False

    def numbered(self, queue: int, tag: int) -> None:
        """A lease of the tag got a new number without a receive (``change_visibility``):
        its row is written with this operation, so that its mark passes that number."""
        if (queue, tag) in self._marked:
            self.count(queue, tag, RECEIVED, 0)

    def save_received(self) -> None:
        """Add the held receives to their rows (written with the batch being written)."""
        for (queue, tag, day), (messages, bytes_out) in self.unsaved.items():
            self.count(queue, tag, RECEIVED, messages, BYTES_OUT, bytes_out, day)
        self.unsaved.clear()

    def tag_loaded(self, q: QueueState, t: TagState) -> None:
        """Opening (or reading again) a tag whose leases are loaded: its mark from its rows,
        and the receives held back when the engine stopped counted again from its lease
        rows and the log (module docstring)."""
        for row_key in [k for k in self.unsaved if k[0] == q.id and k[1] == t.id]:
            del self.unsaved[row_key]
        self._marked.discard((q.id, t.id))
        store = self._context._store
        mark = -1
        for value in Store.values(store.meta, keys.day_key(q.id, t.id, 0),
                                  keys.day_key(q.id, t.id + 1, 0)):
            if len(value) == _MARKED_ROW.size:
                mark = max(mark, _MARKED_ROW.unpack(value)[7])
        if mark < 0:
            return
        figures = q.unsaved_received.get(t.id)  # the watermarks row's mark
        if figures is not None and figures[2] > mark:
            mark = figures[2]
        self._marked.add((q.id, t.id))
        for seq, lease in t.leases.items():
            if lease.state == LEASED and lease.count == 1 and lease.number >= mark:
                record = store.log.get(keys.log_key(q.id, lease.lane, seq))
                if record is None:  # at or above gone_seq: the log holds it
                    continue
                row_key = (q.id, t.id, lease.first_ms // DAY_MS)
                held = self.unsaved.setdefault(row_key, [0, 0])
                held[0] += 1
                held[1] += len(record) - PREFIX_SIZE

    def count(self, queue: int, tag: int, field: int, amount: int = 1, field2: int = -1,
              amount2: int = 0, day: int = -1) -> None:
        """Add ``amount`` to ``field`` of today's (or ``day``'s) row of (queue, tag); with
        ``field2``, also ``amount2`` to that field (two figures of one row, one lookup)."""
        row_key = (queue, tag, self._context._now // DAY_MS if day < 0 else day)
        row = self._rows.get(row_key)
        if row is None:
            row = self._load(row_key)
        row[field] += amount
        if field2 >= 0:
            row[field2] += amount2
        self.dirty.add(row_key)

    def count_deleted(self, row_key: tuple[int, int, int], deleted: int) -> None:
        """``count(queue, tag, DELETED, deleted, day=day)`` of ``row_key`` (queue, tag,
        day): a delete's, with its day at hand."""
        row = self._rows.get(row_key)
        if row is None:
            row = self._load(row_key)
        row[DELETED] += deleted
        self.dirty.add(row_key)

    def save_sends(self, q: QueueState) -> None:
        """Add the queue's unsaved sends to its rows (the caller writes the open segment's
        row in the same batch: module docstring)."""
        for day, (sent, bytes_in) in q.unsaved_sends.items():
            row_key = (q.id, 0, day)
            row = self._rows.get(row_key) or self._load(row_key)
            row[SENT] += sent
            row[BYTES_IN] += bytes_in
            self.dirty.add(row_key)
        q.unsaved_sends.clear()

    def save_deletes(self, q: QueueState) -> None:
        """Add the queue's unsaved deletes to its tags' rows (the caller writes the
        watermarks row, which held them, in the same batch: module docstring); those of a
        day past the ``KEEP_DAYS`` kept are dropped, as its rows were."""
        if q.unsaved_day <= self._context._now // DAY_MS - KEEP_DAYS:
            q.unsaved_deletes.clear()
            q.unsaved_received.clear()
        for tag, deleted in q.unsaved_deletes.items():
            row_key = (q.id, tag, q.unsaved_day)
            row = self._rows.get(row_key) or self._load(row_key)
            row[DELETED] += deleted
            self.dirty.add(row_key)
        for tag, (received, bytes_out, _) in q.unsaved_received.items():
            self.count(q.id, tag, RECEIVED, received, BYTES_OUT, bytes_out, q.unsaved_day)
        q.unsaved_deletes.clear()
        q.unsaved_received.clear()

    def hold_in_watermarks(self, q: QueueState, t: TagState,
                           day: int) -> tuple[list[int], int] | None:
        """A delete whose count goes to the watermarks row (it raises ``gone_seq``) takes
        the receives held back there too, when they are all the tag's, of ``day`` (the
        usual consumer: a receive, then its delete), with a mark of the tag's next lease
        number: nothing is held back after it (module docstring). -> what ``unhold``
        needs to undo it, or None when nothing moved. The tag's first such delete of a
        day moves nothing: it writes today's row, which drops the row of the day past the
        ``KEEP_DAYS`` kept (``_load``)."""
        unsaved = self.unsaved
        if len(unsaved) != 1:
            return None
        row_key = (q.id, t.id, day)
        held = unsaved.get(row_key)
        if held is None or row_key not in self._rows:
            return None
        unsaved.clear()  # it held that one entry
        received = q.unsaved_received
        figures = received.get(t.id)
        if figures is None:
            received[t.id] = [held[0], held[1], t.lease_counter]
            return held, -1
        mark = figures[2]
        figures[0] += held[0]
        figures[1] += held[1]
        figures[2] = t.lease_counter
        return held, mark

    def unhold(self, q: QueueState, t: TagState, day: int, moved: tuple[list[int], int]) -> None:
        """Undo ``hold_in_watermarks`` (the delete did not raise ``gone_seq`` after all)."""
        held, mark = moved
        self.unsaved[q.id, t.id, day] = held
        if mark < 0:
            del q.unsaved_received[t.id]
        else:
            figures = q.unsaved_received[t.id]
            figures[0] -= held[0]
            figures[1] -= held[1]
            figures[2] = mark

    def tag_created(self, q: QueueState, tag: int) -> None:
        """A tag without a filter was created: today's sends so far are sends it did not
        receive (module docstring)."""
        today = self._context._now // DAY_MS
        row_key = (q.id, 0, today)
        row = self._rows.get(row_key) or self._load(row_key)
        sent, bytes_in = q.unsaved_sends.get(today, (0, 0))
        if row[SENT] + sent:
            self.count(q.id, tag, SENT, row[SENT] + sent, BYTES_IN, row[BYTES_IN] + bytes_in)

    def _load(self, row_key: tuple[int, int, int]) -> list[int]:
        """Today's row of (queue, tag), from the store (or new), kept in the cache."""
        context = self._context
        queue, tag, day = row_key
        rows = self._rows
        store = context._store
        stored = store.meta.get(keys.day_key(queue, tag, day))
        row = list(_ROW.unpack_from(stored)) if stored else [0] * len(FIELDS)
        if len(rows) > 65536:  # rows of past days are written already: forget them
            for old in [k for k in rows if k[2] < day]:
                del rows[old]
                self._keys.pop(old, None)
        rows[row_key] = row
        if stored is None and day >= KEEP_DAYS:  # a new day: forget the one past the window
            store.delete(store.meta_h, keys.day_key(queue, tag, day - KEEP_DAYS))
        return row

    def write(self, pending: int) -> None:
        """Put every counter row changed by the operation (once each, not once per bump),
        before a batch of ``pending`` rows is written; with the held receives, unless that
        batch is a receive's lease rows alone (``held_batch``: module docstring)."""
        if self.unsaved and (self.dirty or (pending and pending != self.held_batch)):
            self.save_received()
        self.held_batch = -1
        if not self.dirty:
            return
        dirty = self.dirty
        rows, row_keys = self._rows, self._keys
        context = self._context
        store, queues = context._store, context._queues
        put, meta_h = store.put, store.meta_h
        for row_key in dirty:
            row = rows.get(row_key)
            if row is not None:
                known = row_keys.get(row_key)
                if known is None:
                    queue, tag, _ = row_key
                    q = queues.get(queue)
                    t = q.tags.get(tag) if q is not None and tag else None
                    key = keys.day_key(*row_key)
                    if t is not None or not tag:  # (not a tag being deleted: ``forget``)
                        row_keys[row_key] = key, t
                else:
                    key, t = known
                if t is None:  # the queue's row (or one of a tag being deleted)
                    put(meta_h, key, _ROW.pack(*row))
                else:  # every delivery of the tag so far is counted: its mark
                    put(meta_h, key, _MARKED_ROW.pack(*row, t.lease_counter))
                    self._marked.add(row_key[:2])
        dirty.clear()

    def forget(self, queue: int, tag: int | None = None) -> None:
        """Drop the rows of a deleted queue (``tag`` None) or tag."""
        rows = self._rows
        for row_key in [k for k in rows if k[0] == queue and (tag is None or k[1] == tag)]:
            del rows[row_key]
            self._keys.pop(row_key, None)
            self.dirty.discard(row_key)
        for row_key in [k for k in self.unsaved
                        if k[0] == queue and (tag is None or k[1] == tag)]:
            del self.unsaved[row_key]
        self._marked = {k for k in self._marked
                        if not (k[0] == queue and (tag is None or k[1] == tag))}
        store = self._context._store
        if tag is None:
            store.delete_range(store.meta_h, *keys.day_bounds(queue))
        else:
            lower = keys.day_key(queue, tag, 0)
            store.delete_range(store.meta_h, lower, keys.day_key(queue, tag + 1, 0))

    def days(self, q: QueueState, tag: TagState | None, days: int) -> list[dict[str, Any]]:
        """Newest first, days without activity omitted. ``tag`` None: the queue's totals."""
        today = self._context._now // DAY_MS
        first = today - days + 1
        totals: dict[int, list[int]] = {}
        # A tag without a filter: the queue's sends from its day of creation, less its own.
        follows = tag is not None and tag.filter is None
        from_day = tag.created // DAY_MS if tag is not None else 0
        day = q.unsaved_day
        if q.unsaved_deletes and first <= day <= today:
            for tag_id, deleted in q.unsaved_deletes.items():
                if tag is None or tag_id == tag.id:
                    totals.setdefault(day, [0] * len(FIELDS))[DELETED] += deleted
            for tag_id, (received, bytes_out, _) in q.unsaved_received.items():
                if tag is None or tag_id == tag.id:
                    total = totals.setdefault(day, [0] * len(FIELDS))
                    total[RECEIVED] += received
                    total[BYTES_OUT] += bytes_out
        if tag is None or follows:
            for day, (sent, bytes_in) in q.unsaved_sends.items():
                if first <= day <= today and day >= from_day:
                    total = totals.setdefault(day, [0] * len(FIELDS))
                    total[SENT] += sent
                    total[BYTES_IN] += bytes_in
        for (queue, row_tag, day), (messages, bytes_out) in self.unsaved.items():
            if (queue == q.id and (tag is None or row_tag == tag.id) and first <= day <= today):
                total = totals.setdefault(day, [0] * len(FIELDS))
                total[RECEIVED] += messages
                total[BYTES_OUT] += bytes_out
        lower, upper = keys.day_bounds(q.id)
        for key, value in Store.items(self._context._store.meta, lower, upper):
            _, row_tag, day = keys.day_key_decode(key)
            if day < first or day > today:
                continue
            row = _ROW.unpack_from(value)
            if tag is not None and row_tag != tag.id:
                if follows and row_tag == 0 and day >= from_day:
                    total = totals.setdefault(day, [0] * len(FIELDS))
                    total[SENT] += row[SENT]
                    total[BYTES_IN] += row[BYTES_IN]
                continue
            total = totals.setdefault(day, [0] * len(FIELDS))
            for index, amount in enumerate(row):
                if index in (SENT, BYTES_IN):
                    if tag is None and row_tag != 0:
                        continue  # per-tag sends are the tag's view; the queue counts once
                    if follows:
                        amount = -amount  # sends of the queue the tag did not receive
                total[index] += amount
        return [dict(day=day_name(day), **dict(zip(FIELDS, totals[day])))
                for day in sorted(totals, reverse=True) if any(totals[day])]


def migrate_tag_rows(store: Store) -> None:
    """Schema version 2 -> 3: the row of a tag without a filter held the sends it received;
    it holds those of the queue it did not receive now (module docstring). Puts the rows
    (the caller writes them with the new version)."""
    for key, value in Store.items(store.meta, keys.QUEUE_DEF_LOWER, keys.QUEUE_DEF_UPPER):
        queue = keys.queue_def_id(key)
        rows: dict[tuple[int, int], list[int]] = {}
        for day_key, value in Store.items(store.meta, *keys.day_bounds(queue)):
            _, tag, day = keys.day_key_decode(day_key)
            rows[tag, day] = list(_ROW.unpack_from(value))
        queue_days = {day for tag, day in rows if tag == 0}
        for tag, definition in tag_definitions(store, queue):
            if definition["filter"] is not None:
                continue
            from_day = definition["created"] // DAY_MS
            tag_days = {day for row_tag, day in rows if row_tag == tag}
            for day in sorted(queue_days | tag_days):
                if day < from_day:
                    continue
                queue_row = rows.get((0, day), [0] * len(FIELDS))
                row = rows.get((tag, day), [0] * len(FIELDS))
                row[SENT] = max(0, queue_row[SENT] - row[SENT])
                row[BYTES_IN] = max(0, queue_row[BYTES_IN] - row[BYTES_IN])
                store.put(store.meta_h, keys.day_key(queue, tag, day), _ROW.pack(*row))
