"""Tags, Xiaomi EMQ's multi-reader model: every tag receives every message of its scope
independently (own cursors, leases, deletes, dead-letter moves, stats)."""

from __future__ import annotations

from typing import Any


from . import keys
from .core import EngineCore
from .errors import InvalidArgument, TagAlreadyExists, TooManyTags
from .results import TagInfo
from .state import DEFAULT_TAG, QueueState, TagState
from .topics import check_filter
from .validation import check_name, check_time_ms

MAX_TAGS = 256


class TagOps:
    """create_tag / delete_tag / list_tags."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core

    def create_tag(self, queue: str, tag: str, start: int | str = "now",
                   filter: dict[str, Any] | None = None, *,
                   caller: str | None = None) -> TagInfo:
        """A new reader of ``queue`` seeing messages produced at or after ``start`` (ms,
        ``"oldest"`` = everything retained, ``"now"`` = exactly what is sent from now on)
        that pass ``filter``. Start and filter are fixed at creation."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            check_name(tag, "tag")
            flt = check_filter(filter)
            if start == "oldest":
                start_ms, start_seq = 0, 0
            elif start == "now":
                start_ms, start_seq = now, q.next_seq
            else:
                start_ms = check_time_ms(start, "start")
                start_seq = self._core._first_seq_at(q, start_ms) if start_ms <= now else q.next_seq
            if q.tag_named(tag) is not None:
                raise TagAlreadyExists(f"tag: queue {q.name!r} already has a tag {tag!r}",
                                       field="tag")
            if len(q.tags) >= MAX_TAGS:
                raise TooManyTags(f"tag: queue {q.name!r} has {MAX_TAGS} tags")
            self._core._advance(q, now)
            self._core._settle(q, now)  # what is gone by now is gone for the new tag too
            t = self._add_tag(q, tag, start_ms, start_seq, flt, now)
            return TagInfo(t.name, t.start_ms, t.filter, t.created)

    def _add_tag(self, q: QueueState, name: str, start_ms: int, start_seq: int,
                 filter: Any, now: int) -> TagState:
        store = self._core._store
        tag_id = self._core._next_tag_id
        self._core._next_tag_id += 1
        store.put(store.meta_h, keys.META_IDS,
                  keys.u32(self._core._next_queue_id) + keys.u32(self._core._next_tag_id))
        t = TagState(tag_id, name, start_ms, start_seq, filter, now)
        if filter is None:
            self._core._counters.tag_created(q, tag_id)
        t.cursors = [max(start_seq, q.gone_seq)] * len(t.cursors)
        q.tags[tag_id] = t
        q.tag_names[name.lower()] = tag_id
        for lane in q.lanes_used:
            self._core._snap_cursor(q, t, lane)
        q.delayseq_from = min(q.delayseq_from, q.gone_seq)
        self._core._save_tag_definition(q, t)
        store.put(store.tags_h, keys.tag_key(q.id, tag_id), t.encode_cursors())
        return t

    def delete_tag(self, queue: str, tag: str, *, caller: str | None = None) -> None:
        """Drop a tag and its state (the ``default`` tag cannot be deleted)."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            t = self._core._tag(q, tag)
            if t.name.lower() == DEFAULT_TAG:
                raise InvalidArgument("tag", "the default tag cannot be deleted")
            store = self._core._store
            lower, upper = keys.tag_scope_bounds(q.id, t.id)
            store.delete_range(store.leases_h, lower, upper)
            store.delete_range(store.leasebatches_h, lower, upper)
            store.delete(store.tags_h, keys.tag_key(q.id, t.id))
            store.delete(store.meta_h, keys.tag_def_key(q.id, t.id))
            store.delete_range(store.meta_h, *keys.parked_topics_bounds(q.id, t.id))
            del q.tags[t.id]
            del q.tag_names[t.name.lower()]
            self._core._counters.forget(q.id, t.id)
            q.unsaved_received.pop(t.id, None)  # held with its deletes
            if q.unsaved_deletes.pop(t.id, None) is not None:
                self._core._persist_watermarks(q)
            self._core._advance(q, now)
            self._core._settle(q, now)
