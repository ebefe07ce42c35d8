"""The operation table of PROTOCOL.md §5: which arguments each op takes, how it reaches the
engine, and how its result goes on the wire.

Everything here is synchronous and runs on the server's one engine thread (the applier task,
``server.py``), inside a group commit. Wire argument names are the engine's parameter names, so
an op is called as ``engine.<op>(**args, caller=caller)`` once its argument *names* are checked
here; the engine checks the values.

An op's outcome is an :data:`Answer`: a result map, deliveries or a peek page to splice into a
frame (``connection.py`` encodes it once the group is durable), or the ``LaminaError`` that
failed the whole request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import cbor2

from lamina.engine.errors import (
    InvalidArgument,
    LaminaError,
    UnknownOperation,
)
from lamina.engine.results import Grant, QueueInfo, TagInfo, VisibilityChanged

from lamina.wire.answers import (
    Answer,
    EntriesAnswer,
    MapAnswer,
    PeekAnswer,
    ReceiveAnswer,
    SendAnswer,
)
from .bugs import internal_error
from lamina.wire.splicing import (
    peek_entry_size,
    peek_response_overhead,
    receive_response_overhead,
)

if TYPE_CHECKING:
    from lamina.engine import Engine

__all__ = ["Answer", "Continuation", "EntriesAnswer", "MAX_WAIT_S", "MapAnswer", "OPERATIONS",
           "Operation", "PeekAnswer", "ReceiveAnswer", "SendAnswer", "apply_operation",
           "check_request", "continue_operation", "receive_budget", "receive_call",
           "wait_seconds"]

#: PROTOCOL §5 ``receive`` ``wait``: 0-30 s.
MAX_WAIT_S = 30
#: A delivery's real size is at most ``len(record) + 71`` bytes (a 41-byte receipt, three ints
#: of up to 9 bytes); the engine's own estimate (``len(stored value) + 64``) covers that today,
#: and this much more per delivery keeps the frame limit safe should the estimate shrink.
DELIVERY_SLACK_BYTES = 8


@dataclass(slots=True)
class Continuation:
    """Long work not finished (DESIGN.md §3: it runs in chunks, yielding between them):
    ``step(engine)`` runs its next chunk, one engine operation, and returns the answer or
    another Continuation (``longwork.py`` runs them)."""

    step: Callable[[Engine], Answer | Continuation]


@dataclass(frozen=True, slots=True)
class Operation:
    """One wire op: its argument names and what it does."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    #: (engine, args, caller, request id, max_frame) -> answer; raises LaminaError.
    run: Callable[[Engine, dict[str, Any], str | None, int, int],
                  Answer | Continuation] | None
    allowed: frozenset[str] = field(init=False)
    needed: frozenset[str] = field(init=False)  # ``required`` as a set

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", frozenset(self.required + self.optional))
        object.__setattr__(self, "needed", frozenset(self.required))


# --- Result encoders -----------------------------------------------------------------------


def _error_or(value: Any, encode: Callable[[Any], Any]) -> Any:
    return value.to_wire() if isinstance(value, LaminaError) else encode(value)


def _changed(entry: VisibilityChanged) -> list[Any]:
    return [entry.receipt, entry.next_visible_time]


def _queue_info(info: QueueInfo, *, stats: bool = False) -> MapAnswer:
    result = {"queue": info.queue, "attributes": info.attributes, "created": info.created}
    if stats:
        result["stats"] = info.stats
    return MapAnswer(result)


def _tag_info(info: TagInfo, *, stats: bool = False) -> dict[str, Any]:
    result = {"tag": info.tag, "start": info.start, "filter": info.filter,
              "created": info.created}
    if stats:
        result["stats"] = info.stats
    return result


def _grant(grant: Grant) -> dict[str, Any]:
    return {"queue": grant.queue, "key": grant.key, "permissions": list(grant.permissions)}


EMPTY = MapAnswer({})


# --- Ops that need more than a plain engine call -------------------------------------------


def wait_seconds(args: dict[str, Any]) -> float | None:
    """Pop and check ``receive``'s ``wait`` (not an engine argument); None when omitted."""
    wait = args.pop("wait", None)
    if wait is None:
        return None
    if type(wait) is int and 0 <= wait <= MAX_WAIT_S:  # whole seconds (wait=0 above all)
        return wait
    if type(wait) not in (int, float) or not math.isfinite(wait):
        raise InvalidArgument("wait", "must be a number of seconds")
    if not 0 <= wait <= MAX_WAIT_S:
        raise InvalidArgument("wait", f"must be between 0 and {MAX_WAIT_S} seconds")
    return math.floor(wait * 1000) / 1000


def receive_budget(request_id: int, count: object, max_frame: int) -> int | None:
    """The ``max_bytes`` to give the engine so a receive response fits ``max_frame``."""
    if type(count) is not int or not 1 <= count <= 1000:
        return None  # the engine refuses it anyway
    return (max_frame - receive_response_overhead(request_id, count)
            - DELIVERY_SLACK_BYTES * count)


def receive_call(engine: Engine, args: dict[str, Any], caller: str | None, request_id: int,
                 max_frame: int) -> ReceiveAnswer:
    """One receive attempt (no waiting; the server decides that)."""
    budget = receive_budget(request_id, args.get("max", 1), max_frame)
    return ReceiveAnswer(engine.receive_columns(**args, max_bytes=budget, caller=caller))


def _record_id(record: bytes) -> str:
    """The id of a stored record: PROTOCOL §4 puts it first."""
    return str(cbor2.loads(record)[0])


def _peek(engine: Engine, args: dict[str, Any], caller: str | None, request_id: int,
          max_frame: int) -> PeekAnswer:
    count = args.get("max", 1)
    ids = args.get("ids")
    entries_wanted = len(ids) if isinstance(ids, list) else count
    budget = None
    if type(entries_wanted) is int and entries_wanted >= 1:
        budget = max_frame - peek_response_overhead(request_id, entries_wanted, "x" * 25) \
            - 8 * entries_wanted
    page = engine.peek(**args, max_bytes=budget, caller=caller)
    entries = [entry if isinstance(entry, LaminaError) else
               (entry.record, entry.state, entry.dequeue_count, entry.first_dequeue_time,
                entry.next_visible_time) for entry in page.messages]
    next_cursor = page.next
    # The engine's budget is an estimate (error entries in ``ids`` mode are not counted):
    # peek changes nothing, so trimming to the exact size here is always safe.
    sizes = [peek_entry_size(entry) for entry in entries]
    total = peek_response_overhead(request_id, len(entries), next_cursor) + sum(sizes)
    if total > max_frame and len(entries) > 1:
        while total > max_frame and len(entries) > 1:
            entries.pop()
            total -= sizes.pop()
        if next_cursor is not None or args.get("start") is not None:
            last = entries[-1]
            next_cursor = _record_id(last[0]) if isinstance(last, tuple) else next_cursor
    return PeekAnswer(entries, next_cursor)


def _redrive(engine: Engine, args: dict[str, Any], caller: str | None, request_id: int,
             max_frame: int) -> Answer | Continuation:
    """A redrive's first chunk (its checks included); the rest as continuations."""
    return _next_chunk(engine.redrive_steps(**args, caller=caller))


def _next_chunk(steps: Any) -> Answer | Continuation:
    try:
        next(steps)
    except StopIteration as done:
        return MapAnswer({"moved": done.value.moved, "skipped": done.value.skipped})
    return Continuation(lambda engine: _next_chunk(steps))


def _call(method: str, encode: Callable[[Any], Answer]) -> Callable[..., Answer]:
    def run(engine: Engine, args: dict[str, Any], caller: str | None, request_id: int,
            max_frame: int) -> Answer:
        return encode(getattr(engine, method)(**args, caller=caller))
    run.__name__ = f"run_{method}"
    return run


def _op(name: str, required: str, optional: str,
        run: Callable[..., Answer | Continuation] | None) -> Operation:
    return Operation(name, tuple(required.split()), tuple(optional.split()), run)


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    # auth, ping and server_info are answered by the server itself (no engine, no caller).
    _op("auth", "key signature", "", None),
    _op("ping", "", "", None),
    _op("server_info", "", "", None),
    _op("create_queue", "queue", "attributes", _call("create_queue", _queue_info)),
    _op("delete_queue", "queue", "", _call("delete_queue", lambda _: EMPTY)),
    _op("purge_queue", "queue", "",
        _call("purge_queue", lambda purged: MapAnswer({"purged": purged}))),
    _op("list_queues", "", "prefix after limit",
        _call("list_queues", lambda page: MapAnswer({"queues": page.queues, "next": page.next}))),
    _op("get_queue", "queue", "",
        _call("get_queue", lambda info: _queue_info(info, stats=True))),
    _op("set_queue_attributes", "queue attributes", "",
        _call("set_queue_attributes", lambda attrs: MapAnswer({"attributes": attrs}))),
    _op("copy_queue", "queue source", "", _call("copy_queue", _queue_info)),
    _op("create_tag", "queue tag", "start filter",
        _call("create_tag", lambda info: MapAnswer(_tag_info(info)))),
    _op("delete_tag", "queue tag", "", _call("delete_tag", lambda _: EMPTY)),
    _op("list_tags", "queue", "",
        _call("list_tags", lambda tags: MapAnswer(
            {"tags": [_tag_info(t, stats=True) for t in tags]}))),
    _op("send", "queue messages", "", _call("send_columns", SendAnswer)),
    _op("receive", "queue", "tag max wait visibility_timeout", receive_call),
    _op("delete", "queue receipts", "tag", _call("delete", EntriesAnswer)),
    _op("change_visibility", "queue entries", "tag",
        _call("change_visibility", lambda results: MapAnswer(
            {"results": [_error_or(r, _changed) for r in results]}))),
    _op("dead", "queue receipts", "tag", _call("dead", EntriesAnswer)),
    _op("peek", "queue", "tag max start after ids", _peek),
    _op("delete_by_id", "queue ids", "tag", _call("delete_by_id", EntriesAnswer)),
    _op("rewind", "queue time", "tag",
        _call("rewind", lambda r: MapAnswer({"time": r.time, "tags": list(r.tags)}))),
    _op("redrive", "queue", "source since until max dry_run", _redrive),
    _op("stats", "queue", "tag days", _call("stats", lambda days: MapAnswer({"days": days}))),
    _op("grant", "queue key permissions", "", _call("grant", lambda _: EMPTY)),
    _op("revoke", "queue key", "permissions", _call("revoke", lambda _: EMPTY)),
    _op("list_grants", "", "queue key",
        _call("list_grants", lambda grants: MapAnswer({"grants": [_grant(g) for g in grants]}))),
)}


def check_request(op: str, args: dict[str, Any]) -> Operation:
    """The op's table entry, once its argument names are right (PROTOCOL §2: an unknown key is
    ``InvalidArgument`` naming it, never ignored; a missing one likewise)."""
    operation = OPERATIONS.get(op)
    if operation is None:
        raise UnknownOperation(f"no operation {op!r}" if len(op) <= 64 else "no such operation")
    names = args.keys()
    if names <= operation.allowed and operation.needed <= names:  # the usual: two set tests
        return operation
    for name in args:
        if name not in operation.allowed:
            shown = name if len(name) <= 64 else name[:61] + "..."
            raise InvalidArgument(shown, f"unknown argument for {op}")
    for name in operation.required:
        if name not in args:
            raise InvalidArgument(name, "is required")
    return operation


def apply_operation(operation: Operation, engine: Engine, args: dict[str, Any],
                    caller: str | None, request_id: int, max_frame: int
                    ) -> Answer | Continuation:
    """Run an engine op; an unexpected exception becomes ``InternalError`` for this request
    alone (the engine already rebuilt its state if the failure was inside it)."""
    assert operation.run is not None
    try:  # in line, not through a closure: this is every request's path
        return operation.run(engine, args, caller, request_id, max_frame)
    except LaminaError as exc:
        return exc.with_traceback(None)
    except Exception as exc:  # a bug: this request fails, the server goes on
        return internal_error(operation.name, exc)


def continue_operation(name: str, continuation: Continuation,
                       engine: Engine) -> Answer | Continuation:
    """The next chunk of long work, failing like ``apply_operation``."""
    try:
        return continuation.step(engine)
    except LaminaError as exc:
        return exc.with_traceback(None)
    except Exception as exc:  # a bug: this request fails, the server goes on
        return internal_error(name, exc)
