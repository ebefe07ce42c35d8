"""rewind (DESIGN.md §2 "Rewind").

Rewind of a tag to ``time`` in O(log n + lease rows): one seek in the time index gives the
seq ``from_seq``; then the tag's cursors move back to it, its lease rows from it on are dropped
(the Inflight ones stay: they keep their leases and are not offered again) with their
deadlines, and the delay position moves back before every delay that can end at or after
``time``. Delay entries below ``from_seq`` that the tag had already handled are recognised by
``rewind_seq`` / the old delay position and skipped.

Topics: a rewound message waits behind an Inflight message of its topic; when that head ends,
its successor is looked for from ``from_seq`` rather than after the head
(``TagState.topic_from``). When the head's lease runs out instead, it is no longer Inflight:
the earliest rewound message takes the topic over and the head waits behind it
(``Topics.head_lapsed``, applied by every operation first, like dead-letter moves).
"""

from __future__ import annotations


from . import keys, leasebatch
from .core import EngineCore
from .deadletter import DeadLetterOps
from .errors import RewindDisabled, RewindOutOfRange
from .results import Rewound
from .state import LEASED, QueueState, TagState
from .validation import check_time_ms

NO_SEQ = 1 << 63  # above every seq: a delay position before every entry of the next ms


class RewindOps:
    """Needs ``_check`` from the engine."""

    def __init__(self, core: EngineCore, dead_letter_ops: DeadLetterOps) -> None:
        self._core = core
        self._dead_letter_ops = dead_letter_ops

    def rewind(self, queue: str, time: int, tag: str | None = None, *,
               caller: str | None = None) -> Rewound:
        """Make everything a tag (or every tag) received from ``time`` on never-delivered
        again, except what is Inflight now."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            targets = [self._core._tag(q, tag)] if tag is not None else \
                sorted(q.tags.values(), key=lambda t: t.name.lower())
            time_ms = check_time_ms(time, "time")
            window_ms = q.attributes["rewind"] * 1000
            if not window_ms:
                raise RewindDisabled(f"queue: {q.name!r} has rewind 0", field="queue")
            if not now - window_ms <= time_ms <= now:
                raise RewindOutOfRange(f"time: must lie within [{now - window_ms}, {now}]",
                                       field="time")
            self._core._advance(q, now)
            if self._core._dead_sources.get(q.id):  # a DLQ: its ended copies' originals stay Ended
                self._dead_letter_ops._seal_dead_letters(q)
            for t in targets:
                self._rewind_tag(q, t, max(time_ms, t.start_ms), now)
            self._core._notify(q)
            self._core._settle(q, now)
            return Rewound(time_ms, [t.name for t in targets])

    def _rewind_tag(self, q: QueueState, t: TagState, time_ms: int, now: int) -> None:
        store = self._core._store
        from_seq = max(self._core._first_seq_at(q, time_ms), q.gone_seq, t.start_seq)
        if from_seq >= q.next_seq:
            return
        # Lease rows from from_seq on: Inflight ones stay, the rest go (with their deadlines).
        kept = set()
        for seq, lease in list(t.leases.items()):
            if seq < from_seq:
                continue
            if lease.state == LEASED and lease.due_ms > now:
                kept.add(seq)
                continue
            del t.leases[seq]
            if lease.state == LEASED:
                t.due_index.discard(lease.due_ms, seq)
        # One range delete (the rows on disk only too: state.py ENDED_DELETED), then the
        # Inflight rows again: O(in-flight), not O(messages).
        store.delete_range(store.leases_h, keys.lease_key(q.id, t.id, from_seq),
                           keys.lease_key(q.id, t.id, q.next_seq))
        for seq in kept:
            lease = t.leases[seq]
            lease.batch = None  # its batch entry goes with the cut below
            store.put(store.leases_h, keys.lease_key(q.id, t.id, seq), lease.encode())
        for lane in q.lanes_used:  # batch entries from from_seq on go too
            cut = leasebatch.cut(store, q.id, t.id, lane, from_seq)
            if cut is not None:
                old_key, batch = cut
                for lease in t.leases.values():
                    if lease.batch is not None and lease.batch.key == old_key:
                        lease.batch = batch
        # Topics: heads that stay Inflight keep their topic locked; rewound messages of it
        # wait behind them and are looked for from from_seq when they end.
        for topic, head in list(t.locked.items()):
            if head < from_seq:
                continue  # not rewound: still the earliest unfinished message of its topic
            if head in kept:
                # The first rewound message of the topic (none: nothing waits behind it).
                messages = self._core._topics.messages(q, t, topic, from_seq, head)
                first = next((seq for seq, _, _ in messages), None)
                if first is not None:
                    t.topic_from[topic] = min(t.topic_from.get(topic, first), first)
                    self._core._topics.watch_lapse(q, t, topic)
            else:
                t.unlock(topic)
        # Marks of messages ended in their turn: from from_seq on they are never-delivered.
        for topic, (limit, vt, dseq) in list(t.topic_ended.items()):
            t.topic_ended[topic] = (min(limit, from_seq), vt, dseq)
        # Cursors and the delay position move back.
        for lane in q.lanes_used:
            if t.cursors[lane] > from_seq:
                t.cursors[lane] = from_seq
                self._core._snap_cursor(q, t, lane)
        if (t.delay_vt, t.delay_seq) >= (time_ms, 0):
            # What the delay index handled stays handled below from_seq: up to the present
            # position, and, where an earlier rewind's walk has not caught up yet, up to that
            # rewind's position below its own from_seq (older pairs; at most one per rewind
            # whose walk is still behind).
            position = (t.delay_vt, t.delay_seq)
            pairs = [(t.rewind_seq, t.rewind_vt, t.rewind_dseq), *t.rewind_older]
            t.rewind_older = [(min(seq, from_seq), vt, dseq) for seq, vt, dseq in pairs
                              if seq and (vt, dseq) > position]
            t.rewind_seq, (t.rewind_vt, t.rewind_dseq) = from_seq, position
            t.delay_vt, t.delay_seq = max(time_ms - 1, 0), NO_SEQ
        q.delayseq_from = min(q.delayseq_from, from_seq)
        t.delay_hint = 0
        store.put(store.tags_h, keys.tag_key(q.id, t.id), t.encode_cursors())
        self._core._save_tag_definition(q, t)
