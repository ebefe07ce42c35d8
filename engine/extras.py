"""What a protocol gateway keeps beside a queue: its extras and deduplicated sends.

**Extras** (``queue_extras`` / ``set_queue_extras``): a small map per queue of settings the
engine itself does not act on (the SQS gateway keeps a queue's SQS-only attributes and its
cost-allocation tags there). Text keys; values text, integers, booleans or maps of text to
text; at most ``MAX_EXTRAS_BYTES`` encoded. Stored as CBOR in ``meta`` under
``b"X" | queue:u32``.

**Deduplicated sends** (``send_deduplicated``): each entry carries a deduplication key; an
entry whose key was accepted by the same queue within ``window_ms`` is not appended again,
its answer is the first one's ``Sent`` (its id and enqueue time). Keys live in ``meta`` under
``b"F" | queue:u32 | key`` -> ``expires_ms:u64 | enqueue_ms:u64 | message id``, written in the
same batch as the messages they admitted, so a key and its message survive a crash together.

Bounded cost: a queue's keys are held in memory in acceptance order, which is expiry order
(the engine clock never goes back), and every deduplicated send first drops the expired ones
(row and memory). Opening the engine drops the rows that expired meanwhile and the rows of
queues deleted since (queue ids are never reused), so rows and memory are at most the keys
accepted within one window, plus those of queues that have not been sent to since.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import cbor2

from .core import EngineCore
from .errors import AccessDenied, InvalidArgument, LaminaError, Unavailable
from .records import body_md5
from .results import QueueInfo, Sent
from .store import Store
from .validation import check_batch

__all__ = ["DEDUP_WINDOW_MS", "MAX_DEDUP_KEY_BYTES", "MAX_EXTRAS_BYTES", "ExtrasOps"]

#: SQS FIFO's deduplication interval: five minutes.
DEDUP_WINDOW_MS = 5 * 60 * 1000
MAX_DEDUP_KEY_BYTES = 512
#: Room for what a gateway keeps: SQS's 50 tags (keys of 128 and values of 256 characters, up
#: to four UTF-8 bytes each: 77 KB), an 8 KiB policy and the other attributes.
MAX_EXTRAS_BYTES = 128 * 1024
#: Deduplicated sends between sweeps of the windows of deleted queues out of memory.
DEDUP_SWEEP_EVERY = 1024

_EXTRAS = b"X"
_DEDUP = b"F"
_QUEUE_ID = struct.Struct(">I")
_DEDUP_VALUE = struct.Struct(">QQ")


def _extras_key(queue_id: int) -> bytes:
    return _EXTRAS + _QUEUE_ID.pack(queue_id)


def _dedup_key(queue_id: int, key: bytes) -> bytes:
    return _DEDUP + _QUEUE_ID.pack(queue_id) + key


def _check_extras(extras: object) -> dict[str, Any]:
    if not isinstance(extras, Mapping):
        raise InvalidArgument("extras", "must be a map")
    for name, value in extras.items():
        if not isinstance(name, str) or not 1 <= len(name) <= 256:
            raise InvalidArgument("extras", "keys are text of 1-256 characters")
        if isinstance(value, Mapping):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise InvalidArgument(f"extras.{name}", "a map value maps text to text")
        elif type(value) not in (str, int, bool):
            raise InvalidArgument(f"extras.{name}", "must be text, an integer, a boolean "
                                  "or a map of text")
    return dict(extras)


class ExtrasOps:
    """Queue extras and deduplicated sends (module docstring)."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core

    _extras: dict[int, dict[str, Any]]
    #: queue id -> deduplication key -> (expires ms, enqueue ms, message id), expiry order.
    _dedup: dict[int, OrderedDict[bytes, tuple[int, int, str]]]
    _dedup_sends: int

    def load(self, *, tidy: bool = True) -> None:
        """Read the extras and deduplication windows (at open, and after a failed write,
        whose changes to them memory had made ahead of it); ``tidy``: delete the rows of
        deleted queues and expired keys as well."""
        self._extras = {}
        self._dedup = {}
        self._dedup_sends = 0
        store = self._core._store
        meta = store.meta
        now = self._core._clock.now()
        stale = False
        for key, value in list(Store.items(meta, _EXTRAS, _EXTRAS + b"\xff")):
            queue_id = _QUEUE_ID.unpack_from(key, 1)[0]
            if queue_id in self._core._queues:
                self._extras[queue_id] = cbor2.loads(value)
            elif tidy:
                store.delete(store.meta_h, key)
                stale = True
        for key, value in list(Store.items(meta, _DEDUP, _DEDUP + b"\xff")):
            queue_id = _QUEUE_ID.unpack_from(key, 1)[0]
            expires, enqueued = _DEDUP_VALUE.unpack_from(value)
            if queue_id in self._core._queues and expires > now:
                self._dedup.setdefault(queue_id, OrderedDict())[key[5:]] = (
                    expires, enqueued, value[_DEDUP_VALUE.size:].decode())
            elif tidy:
                store.delete(store.meta_h, key)
                stale = True
        for window in self._dedup.values():  # rows come in key order: restore expiry order
            ordered = sorted(window.items(), key=lambda item: item[1][0])
            window.clear()
            window.update(ordered)
        if stale:
            store.flush()

    def check_queue_access(self, queue: str, *, caller: str | None = None) -> str:
        """The queue's name, if it exists and ``caller`` holds any permission on it (a
        gateway's lookup by name); else ``QueueNotFound`` / ``AccessDenied``."""
        if self._core._closed:
            raise Unavailable("the engine is closed")
        q = self._core._queue(queue)
        if caller is not None and not self._core._grants.permissions(caller, q.name):
            raise AccessDenied(f"queue: key {caller!r} holds no permission on {q.name!r}",
                               field="queue")
        return q.name

    def queue_summary(self, queue: str, *, caller: str | None = None) -> QueueInfo:
        """``get_queue`` without the stats (no walk of the backlog)."""
        if self._core._closed:
            raise Unavailable("the engine is closed")
        self._core._grants.check(caller, "peek", queue)
        q = self._core._queue(queue)
        return QueueInfo(q.name, dict(q.attributes), q.created)

    # -- extras ---------------------------------------------------------------------------------

    def queue_extras(self, queue: str, *, caller: str | None = None) -> dict[str, Any]:
        """The queue's extras (empty when none were set)."""
        if self._core._closed:
            raise Unavailable("the engine is closed")
        self._core._grants.check(caller, "peek", queue)
        return dict(self._extras.get(self._core._queue(queue).id, {}))

    def set_queue_extras(self, queue: str, extras: Mapping[str, Any], *,
                         caller: str | None = None) -> dict[str, Any]:
        """Replace the queue's extras with ``extras`` (empty: none)."""
        with self._core._operation():
            self._core._grants.check(caller, "manage", queue)
            q = self._core._queue(queue)
            return self.extras_writer(extras)(q.id)

    def extras_writer(self, extras: Mapping[str, Any]) -> Callable[[int], dict[str, Any]]:
        """Check ``extras`` now; -> a function that makes them a queue's (by id), with its
        writes in the batch of the operation that calls it."""
        checked = _check_extras(extras)
        encoded = cbor2.dumps(checked)
        if checked and len(encoded) > MAX_EXTRAS_BYTES:
            raise InvalidArgument("extras", f"at most {MAX_EXTRAS_BYTES} bytes encoded")

        def write(queue_id: int) -> dict[str, Any]:
            store = self._core._store
            if not checked:
                self._extras.pop(queue_id, None)
                store.delete(store.meta_h, _extras_key(queue_id))
                return {}
            self._extras[queue_id] = checked
            store.put(store.meta_h, _extras_key(queue_id), encoded)
            return dict(checked)

        return write

    # -- deduplicated sends ---------------------------------------------------------------------

    def send_deduplicated(self, queue: str, messages: Sequence[Any], dedup_keys: Sequence[bytes],
                          *, window_ms: int = DEDUP_WINDOW_MS, caller: str | None = None
                          ) -> list[Sent | LaminaError]:
        """``send``, except that an entry whose key (``dedup_keys[i]``, 1-512 bytes) was
        accepted within ``window_ms`` answers the first acceptance's ``Sent`` instead of
        being appended again (the first one's body digest is not kept: ``md5`` is this
        entry's)."""
        with self._core._operation() as now:
            self._core._grants.check(caller, "send", queue)
            q = self._core._queue(queue)
            messages = check_batch(messages, "messages")
            if not isinstance(dedup_keys, (list, tuple)) or len(dedup_keys) != len(messages):
                raise InvalidArgument("dedup_keys", "one key per message")
            for index, key in enumerate(dedup_keys):
                if type(key) is not bytes or not 1 <= len(key) <= MAX_DEDUP_KEY_BYTES:
                    raise InvalidArgument(f"dedup_keys[{index}]",
                                          f"must be 1-{MAX_DEDUP_KEY_BYTES} bytes")
            window = self._dedup_window(q.id, now)
            results: list[Sent | LaminaError | None] = [None] * len(messages)
            fresh: list[int] = []
            first_of: dict[bytes, int] = {}
            for index, key in enumerate(dedup_keys):
                seen = window.get(key)
                if seen is not None:
                    results[index] = Sent(seen[2], seen[1], _md5_of(messages[index]))
                elif key not in first_of:
                    first_of[key] = index
                    fresh.append(index)
            self._core._advance(q, now)
            self._core._settle(q, now)
            appended = (self._core._appender.append(q, [messages[i] for i in fresh], now)
                        if fresh else [])
            store = self._core._store
            for index, result in zip(fresh, appended):
                results[index] = result
                if isinstance(result, Sent):
                    key = dedup_keys[index]
                    expires = now + window_ms
                    window[key] = (expires, result.enqueue_time, result.id)
                    store.put(store.meta_h, _dedup_key(q.id, key),
                              _DEDUP_VALUE.pack(expires, result.enqueue_time)
                              + result.id.encode())
            for index, key in enumerate(dedup_keys):
                if results[index] is None:  # a repeat within this batch
                    first = results[first_of[key]]
                    results[index] = (Sent(first.id, first.enqueue_time,
                                           _md5_of(messages[index]))
                                      if isinstance(first, Sent) else first)
            return results  # type: ignore[return-value]

    def _dedup_window(self, queue_id: int, now: int) -> OrderedDict[bytes, tuple[int, int, str]]:
        """The queue's accepted keys, the expired ones dropped first."""
        self._dedup_sends += 1
        if self._dedup_sends % DEDUP_SWEEP_EVERY == 0:
            for gone in [qid for qid in self._dedup if qid not in self._core._queues]:
                del self._dedup[gone]  # a deleted queue's: its rows go at the next open
        window = self._dedup.setdefault(queue_id, OrderedDict())
        store = self._core._store
        while window:
            key, (expires, _, _) = next(iter(window.items()))
            if expires > now:
                break
            del window[key]
            store.delete(store.meta_h, _dedup_key(queue_id, key))
        return window


def _md5_of(entry: Any) -> bytes:
    body = entry.get(1) if isinstance(entry, dict) else entry
    if isinstance(body, str):
        body = body.encode()
    return body_md5(body if isinstance(body, bytes) else b"")
