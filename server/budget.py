"""The server's memory budget for connection buffers, and the bound of each answer's size.

Two things a client can make the server hold in memory, beyond what it stores:

- input: the bytes of a frame read in part (up to ``max_frame`` each);
- output: answers encoded and not yet taken by the client, and answers still to come for
  requests already handed to the applier (a peek of 1000 messages can answer ``max_frame``
  bytes from a 40-byte request).

Rules (each one lives here or in connection.py, which applies them):

1. One :class:`MemoryBudget` per server bounds the sum over every connection of granted frame
   bytes, unsent answer bytes and expected answer bytes (``--max-buffered``).
2. A frame longer than SMALL_BYTES is granted its whole length when its header arrives, before
   its body is read; until the budget has room its connection reads nothing more (backpressure,
   nothing dropped). A frame once granted is read to its end, so no two connections can each
   hold half of what they need and wait on one another.
3. A request whose answer may be large (:func:`answer_bound_bytes` > 0) is handed to the
   applier only once its bound fits both its connection's unsent cap (4 x max_frame) and this
   budget; its bound turns into the real size of its answer when the answer is encoded.
4. Frames of at most SMALL_BYTES and requests with small answers (ping, send, delete...) need
   nothing from the budget: a connection that only asks small things is served however full the
   budget is. What they can hold is bounded by one read per connection.
5. An empty budget always grants (a single frame or answer larger than the whole budget is still
   served, alone).
"""

from __future__ import annotations

from typing import Any, Protocol

from lamina.engine.errors import InvalidArgument, LaminaError
from lamina.wire.answers import MapAnswer
from lamina.wire.errors import AnswerTooLarge
from lamina.wire.protocol import Request

from .bugs import internal_error

__all__ = ["BOUNDED_ANSWER_OPS", "DEFAULT_MAX_BUFFERED_BYTES", "MAX_ANSWERED_MESSAGE_BYTES",
           "SMALL_BYTES", "MemoryBudget", "answer_bound_bytes"]

#: ``--max-buffered`` default: 16 frames of the default 16 MiB ``max_frame``.
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
#: Rule 4: frames up to one socket read need no grant.
SMALL_BYTES = 64 * 1024
#: The most one message adds to a receive or peek answer: the largest ``max_message_size``
#: (body and attributes, DESIGN §1) plus its id, topic, md5, receipt and counters.
MAX_ANSWERED_MESSAGE_BYTES = 1024 * 1024 + 1024
#: Per op, the most a name-listing answer takes per listed item, and the items it may list.
_LISTED_NAME_BYTES = 72        # a queue name is at most 64 bytes, plus CBOR heads
_TAG_INFO_BYTES = 512          # one tag with its figures (list_tags, get_queue)
_TAG_FILTER_BYTES = 4096 + 8   # its filter's attributes (list_tags), at most MAX_FILTER_BYTES
_MAX_TAGS = 256
_MAX_LIST_LIMIT = 1000
#: An answer's envelope: ``[id, null, {...}]`` with its keys, at most.
_ANSWER_ENVELOPE_BYTES = 128


#: The ops :func:`answer_bound_bytes` gives a bound (> 0).
BOUNDED_ANSWER_OPS = frozenset({"receive", "peek", "list_queues", "list_tags", "get_queue",
                                "list_grants"})


def _count(args: dict[str, Any], name: str, default: int, most: int) -> int:
    value = args.get(name, default)
    if type(value) is not int or not 1 <= value <= most:
        return 1  # refused by its op's check: the answer is an error
    return value


def answer_bound_bytes(request: Request, max_frame: int) -> int:
    """An upper bound of the frame answering ``request`` when it may be large (rule 3), else
    0: the answers of every other op are small or no larger than their requests."""
    op = request.op
    args = request.args
    if op == "receive" or op == "peek":
        ids = args.get("ids")
        if op == "peek" and type(ids) is list:
            count = max(1, min(len(ids), _MAX_LIST_LIMIT))
        else:
            count = _count(args, "max", 1, _MAX_LIST_LIMIT)
        return min(max_frame + 4, _ANSWER_ENVELOPE_BYTES + count * MAX_ANSWERED_MESSAGE_BYTES)
    if op == "list_queues":
        return (_ANSWER_ENVELOPE_BYTES
                + _count(args, "limit", _MAX_LIST_LIMIT, _MAX_LIST_LIMIT) * _LISTED_NAME_BYTES)
    if op == "list_tags":
        return _ANSWER_ENVELOPE_BYTES + _MAX_TAGS * (_TAG_INFO_BYTES + _TAG_FILTER_BYTES)
    if op == "get_queue":
        return _ANSWER_ENVELOPE_BYTES + _MAX_TAGS * _TAG_INFO_BYTES
    if op == "list_grants":
        return max_frame + 4  # a key may hold any number of grants
    return 0


def unencodable(request_id: int, answer: object, exc: Exception) -> LaminaError:
    """The error answering ``request_id`` when its ``answer`` could not be encoded (``exc``).
    Only a ``list_grants`` answer may outgrow ``max_frame`` (PROTOCOL.md gives it no paging;
    every other answer is bounded or trimmed): that asks for fewer grants. Anything else is a
    bug."""
    if isinstance(exc, AnswerTooLarge) and type(answer) is MapAnswer and "grants" in answer.result:
        return InvalidArgument("queue", f"the grants to list do not fit one answer ({exc}): "
                               "list the grants of one queue or of one key")
    return internal_error(f"encoding the answer to request {request_id}", exc)


class Waker(Protocol):
    """What waits for room: a connection's reader."""

    def wake(self) -> None: ...


class MemoryBudget:
    """Rule 1: bytes held for all connections, against ``limit_bytes``.

    Only the trio thread touches it. Connections take and give back; a connection that found
    no room registers itself with :meth:`wait_for_room` and is woken (all of them, each then
    tries again) once bytes are given back and there is room again.
    """

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError("the memory budget must be positive")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        #: The most ``used_bytes`` has been (for benchmarks and tests).
        self.peak_bytes = 0
        self._waiting: set[Waker] = set()

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be taken now (rule 5: always, when nothing is held)."""
        return self.used_bytes + nbytes <= self.limit_bytes or self.used_bytes == 0

    def take(self, nbytes: int) -> None:
        """Count ``nbytes`` more as held (answers already produced are taken unasked)."""
        self.used_bytes = used = self.used_bytes + nbytes
        if used > self.peak_bytes:
            self.peak_bytes = used

    def give_back(self, nbytes: int) -> None:
        self.used_bytes -= nbytes
        if self._waiting and self.used_bytes < self.limit_bytes:
            waiting, self._waiting = self._waiting, set()
            for waker in waiting:
                waker.wake()

    def wait_for_room(self, waker: Waker) -> None:
        """Wake ``waker`` the next time bytes are given back below the limit."""
        self._waiting.add(waker)

    def forget(self, waker: Waker) -> None:
        self._waiting.discard(waker)
