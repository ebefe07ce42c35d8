"""Receive, peek, send and batch-entry frames built by hand: the server's hot path (PROTOCOL §4).

A stored record is already one CBOR item, so a response embedding it is built from hand-written
heads around the stored bytes: never decoded, never re-encoded. Every piece is encoded as
cbor2.dumps would (shortest heads, dict order), so the output is byte-identical to cbor2.dumps
of the decoded structure. Sizes below are exact, for staying under max_frame.

What the server splices per message is a :class:`Deliverable` (the engine's ``Delivery``, or a
:class:`DeliveryFrame` tuple) or a :data:`PeekedFrame`, not the client's decoded
``lamina.client.Delivery`` / ``Peeked``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

import cbor2

from lamina.engine.errors import LaminaError
from lamina.engine.receipts import RECEIPT_BYTES
from lamina.engine.records import cbor_head
from lamina.engine.results import FirstDeliveries, SentColumns

from .framing import encode_frame_header, encode_int, head_size, int_size

__all__ = [
    "PEEK_STATES", "Deliverable", "DeliveryFrame", "PeekEntry", "PeekedFrame", "delivery_size",
    "encode_entries_response", "encode_peek_response", "encode_receive_response",
    "encode_response", "encode_send_response", "peek_entry_size", "peek_response_overhead",
    "receive_response_overhead",
]

#: PROTOCOL §4: the states a peeked message can be in.
PEEK_STATES = frozenset({"active", "inflight", "delayed", "parked", "deleted", "dead"})


class Deliverable(Protocol):
    """What a receive response splices per delivery: the engine's ``Delivery``, or a
    :class:`DeliveryFrame`. ``record`` is the stored, already-encoded CBOR record (PROTOCOL §4)."""

    @property
    def record(self) -> bytes: ...
    @property
    def receipt(self) -> bytes: ...
    @property
    def dequeue_count(self) -> int: ...
    @property
    def first_dequeue_time(self) -> int: ...
    @property
    def next_visible_time(self) -> int: ...


class DeliveryFrame(NamedTuple):
    """A :class:`Deliverable` built by hand: ``(record, receipt, dequeue_count,
    first_dequeue_time, next_visible_time)``."""

    record: bytes
    receipt: bytes
    dequeue_count: int
    first_dequeue_time: int
    next_visible_time: int

#: ``(record, state, dequeue_count, first_dequeue_time, next_visible_time)``.
PeekedFrame: TypeAlias = tuple[bytes, str, int, int | None, int | None]
#: A peek entry is a peeked message, or (``ids`` mode) the error map for that id.
PeekEntry: TypeAlias = PeekedFrame | Mapping[str, Any] | LaminaError


_ARRAY_OF_3 = cbor_head(4, 3)
_ARRAY_OF_5 = cbor_head(4, 5)
_MAP_OF_1 = cbor_head(5, 1)
_MAP_OF_2 = cbor_head(5, 2)
_NULL = cbor2.dumps(None)
_MESSAGES_KEY = cbor2.dumps("messages")
_NEXT_KEY = cbor2.dumps("next")
_STATE_TEXTS = {state: cbor2.dumps(state) for state in PEEK_STATES}
#: A receive response's fixed bytes: ``[``, ``null``, ``{"messages":`` (its id and count vary).
_RECEIVE_ENVELOPE_BYTES = len(_ARRAY_OF_3) + len(_NULL) + len(_MAP_OF_1) + len(_MESSAGES_KEY)


def delivery_size(delivery: Deliverable) -> int:
    """Bytes ``delivery`` adds to a receive response."""
    receipt = delivery.receipt
    return (len(_ARRAY_OF_5) + len(delivery.record) + head_size(len(receipt)) + len(receipt)
            + int_size(delivery.dequeue_count) + int_size(delivery.first_dequeue_time)
            + int_size(delivery.next_visible_time))


def receive_response_overhead(request_id: int, count: int) -> int:
    """Bytes of a receive response body besides its ``count`` deliveries (no length prefix):
    body length = this + sum of :func:`delivery_size`, which must stay <= max_frame."""
    return _RECEIVE_ENVELOPE_BYTES + int_size(request_id) + head_size(count)


#: Batches of at least this many entries are assembled column-wise when they allow it (one
#: list of records, one of receipts...): a few steps per batch instead of one per entry, which
#: pays from about this size on.
COLUMNS_FROM = 6


def encode_receive_response(request_id: int, deliveries: Sequence[Deliverable]) -> bytes:
    """The frame ``[id, null, {"messages": [delivery...]}]``, each delivery
    ``[record, receipt, dequeue_count, first_dequeue_time, next_visible_time]``."""
    if deliveries.__class__ is FirstDeliveries:  # no Delivery objects to make
        columns: FirstDeliveries = deliveries
        return _columns_receive_frame(request_id, columns.records, columns.receipts, 1,
                                      columns.first_dequeue_time, columns.next_visible_time)
    if len(deliveries) == 1:  # a receive of one: its frame in one join
        delivery = deliveries[0]
        receipt = delivery.receipt
        body = b"".join((_answer_head(request_id, _MESSAGES_OPENING, 1), _ARRAY_OF_5,
                         delivery.record, _RECEIPT_HEAD if len(receipt) == RECEIPT_BYTES
                         else cbor_head(2, len(receipt)), receipt,
                         _delivery_tail(delivery.dequeue_count, delivery.first_dequeue_time,
                                        delivery.next_visible_time)))
        return _FRAME_HEADER.pack(len(body)) + body
    if len(deliveries) >= COLUMNS_FROM:
        frame = _uniform_receive_frame(request_id, deliveries)
        if frame is not None:
            return frame
    parts = [b"", _answer_head(request_id, _MESSAGES_OPENING, len(deliveries))]
    extend = parts.extend
    pack_usual_tail = _USUAL_DELIVERY_TAIL.pack
    receipt_head_bytes, receipt_head = RECEIPT_BYTES, _RECEIPT_HEAD
    for delivery in deliveries:
        receipt = delivery.receipt
        if len(receipt) != receipt_head_bytes:  # receipts of one queue: one length, usually
            receipt_head_bytes = len(receipt)
            receipt_head = cbor_head(2, receipt_head_bytes)
        dequeue_count = delivery.dequeue_count
        first_dequeue_time = delivery.first_dequeue_time
        next_visible_time = delivery.next_visible_time
        if (0 <= dequeue_count < 24 and _U32_END <= first_dequeue_time < _U64_END
                and _U32_END <= next_visible_time < _U64_END):  # in line: the usual tail
            tail = pack_usual_tail(dequeue_count, _U64_HEAD, first_dequeue_time, _U64_HEAD,
                                   next_visible_time)
        else:
            tail = _delivery_tail(dequeue_count, first_dequeue_time, next_visible_time)
        extend((_ARRAY_OF_5, delivery.record, receipt_head, receipt, tail))
    return _frame_of_parts(parts)


def _uniform_receive_frame(request_id: int, deliveries: Sequence[Deliverable]) -> bytes | None:
    """The receive frame of ``deliveries`` that share their receipt length, dequeue count and
    times (a batch of first deliveries: all leased at one time, for one visibility timeout),
    assembled column-wise without a Python step per delivery; None if they do not."""
    first = deliveries[0]
    dequeue_count, first_time = first.dequeue_count, first.first_dequeue_time
    next_time, receipt_bytes = first.next_visible_time, len(first.receipt)
    for delivery in deliveries:
        if (delivery.next_visible_time != next_time or delivery.first_dequeue_time != first_time
                or delivery.dequeue_count != dequeue_count
                or len(delivery.receipt) != receipt_bytes):
            return None
    return _columns_receive_frame(request_id, [delivery.record for delivery in deliveries],
                                  [delivery.receipt for delivery in deliveries], dequeue_count,
                                  first_time, next_time)


def _columns_receive_frame(request_id: int, records: list[bytes], receipts: list[bytes],
                           dequeue_count: int, first_time: int, next_time: int) -> bytes:
    """The receive frame of deliveries given as columns that share their dequeue count and
    times, and whose receipts share their length (the engine's receipts do)."""
    receipt_bytes = len(receipts[0])
    tail = _delivery_tail(dequeue_count, first_time, next_time)
    count = len(records)
    head = _answer_head(request_id, _MESSAGES_OPENING, count)
    # Per delivery: record, receipt head, receipt, tail + the next delivery's array head.
    parts = [_RECEIPT_HEAD if receipt_bytes == RECEIPT_BYTES
             else cbor_head(2, receipt_bytes)] * (4 * count + 1)
    parts[0] = head + _ARRAY_OF_5
    parts[1::4] = records
    parts[3::4] = receipts
    parts[4::4] = [tail + _ARRAY_OF_5] * count
    parts[-1] = tail
    body_length = (len(head) + sum(map(len, records))
                   + count * (len(_ARRAY_OF_5) + len(parts[2]) + receipt_bytes + len(tail)))
    return _FRAME_HEADER.pack(body_length) + b"".join(parts)


#: The byte string head of a receipt issued by the engine (every receipt, in practice).
_RECEIPT_HEAD = cbor_head(2, RECEIPT_BYTES)


def _delivery_tail(dequeue_count: int, first_dequeue_time: int, next_visible_time: int) -> bytes:
    """A delivery's three integers, as encode_int writes them."""
    if (0 <= dequeue_count < 24 and _U32_END <= first_dequeue_time < _U64_END
            and _U32_END <= next_visible_time < _U64_END):
        return _USUAL_DELIVERY_TAIL.pack(dequeue_count, _U64_HEAD, first_dequeue_time,
                                         _U64_HEAD, next_visible_time)
    return (encode_int(dequeue_count) + encode_int(first_dequeue_time)
            + encode_int(next_visible_time))


# The usual tail of a delivery in one pack, as encode_int would write it: a dequeue count
# below 24 is its own head byte, and a time in ms since 1970 is past 2^32, so it takes the
# 8-byte form (head 0x1b).
_USUAL_DELIVERY_TAIL = struct.Struct(">BBQBQ")
_U64_HEAD = 0x1B
_U32_END = 0x100000000
_U64_END = 0x10000000000000000


def encode_send_response(request_id: int, results: Sequence[Any] | SentColumns) -> bytes:
    """The frame ``[id, null, {"results": [...]}]`` answering a ``send``: per entry ``[id,
    enqueue_time, md5]`` for a ``Sent`` (anything with those attributes), else the error map
    of a LaminaError; from the columns of ``SentColumns``. Byte-identical to cbor2.dumps, at
    a fraction of its cost (the hot path of every producer)."""
    if isinstance(results, SentColumns):
        return _sent_columns_frame(request_id, results.enqueue_time, results.ids,
                                   results.digests)
    if len(results) >= COLUMNS_FROM and not isinstance(results[0], LaminaError):
        frame = _uniform_send_frame(request_id, results)
        if frame is not None:
            return frame
    parts = [b"", _answer_head(request_id, _RESULTS_OPENING, len(results))]
    append, extend = parts.append, parts.extend
    prefixes = _SENT_PREFIXES
    last_time, time_bytes = None, b""
    for entry in results:
        if isinstance(entry, LaminaError):
            append(cbor2.dumps(entry.to_wire()))
            continue
        message_id = entry.id.encode()
        prefix = prefixes.get(len(message_id))
        if prefix is None:  # the array head and the id's text head, by id length
            prefix = prefixes[len(message_id)] = _ARRAY_OF_3 + cbor_head(3, len(message_id))
        if entry.enqueue_time != last_time:  # one time for a whole batch, usually
            last_time = entry.enqueue_time
            time_bytes = encode_int(last_time)
        md5 = entry.md5
        extend((prefix, message_id, time_bytes,
                _BYTES_16_HEAD if len(md5) == 16 else cbor_head(2, len(md5)), md5))
    return _frame_of_parts(parts)


_SENT_PREFIXES: dict[int, bytes] = {}
_BYTES_16_HEAD = cbor_head(2, 16)
#: An enqueue time of 2^32 ms or more (every epoch time in ms) and the digest's head after it:
#: a CBOR head of 8 bytes, as ``encode_int`` writes it.
_TIME_AND_DIGEST_HEAD = struct.Struct(">BQB")


def _uniform_send_frame(request_id: int, results: Sequence[Any]) -> bytes | None:
    """The send frame of entries all accepted at one time, with ASCII ids of one length and
    16-byte digests (every batch but one with refused entries), assembled column-wise without a
    Python step per entry; None if they are not."""
    first = results[0]
    kind, enqueue_time, id_chars = type(first), first.enqueue_time, len(first.id)
    for entry in results:
        if (type(entry) is not kind or entry.enqueue_time != enqueue_time
                or len(entry.id) != id_chars or len(entry.md5) != 16):
            return None
    ids = [entry.id.encode() for entry in results]
    if sum(map(len, ids)) != len(results) * id_chars:
        return None  # a character of more than one byte: id heads may differ
    return _sent_columns_frame(request_id, enqueue_time, ids, [entry.md5 for entry in results])


def _sent_columns_frame(request_id: int, enqueue_time: int, ids: list[bytes],
                        digests: list[bytes]) -> bytes:
    """The send frame of entries accepted at ``enqueue_time``, from their ids (bytes of one
    length) and 16-byte digests."""
    count, id_chars = len(ids), len(ids[0])
    head = _answer_head(request_id, _RESULTS_OPENING, count)
    prefix = _SENT_PREFIXES.get(id_chars)
    if prefix is None:
        prefix = _SENT_PREFIXES[id_chars] = _ARRAY_OF_3 + cbor_head(3, id_chars)
    middle = (_TIME_AND_DIGEST_HEAD.pack(0x1B, enqueue_time, 0x50) if enqueue_time > 0xFFFFFFFF
              else encode_int(enqueue_time) + _BYTES_16_HEAD)
    if count == 1:  # a send of one (a client awaiting each answer): no columns to interleave
        body = b"".join((head, prefix, ids[0], middle, digests[0]))
        return _FRAME_HEADER.pack(len(body)) + body
    # Per entry: id, time and digest head, digest, the next entry's array and id heads.
    parts = [middle] * (4 * count + 1)
    parts[0] = head + prefix
    parts[1::4] = ids
    parts[3::4] = digests
    parts[4::4] = [prefix] * count
    parts[-1] = b""
    body_length = len(head) + count * (len(prefix) + id_chars + len(middle) + 16)
    return _FRAME_HEADER.pack(body_length) + b"".join(parts)


def encode_entries_response(request_id: int, results: list[LaminaError | None]) -> bytes:
    """The frame ``[id, null, {"results": [...]}]`` answering ``delete``, ``dead`` or
    ``delete_by_id``: per entry null, or the error map of a LaminaError. Byte-identical to
    cbor2.dumps, several times cheaper for the usual all-null batch."""
    count = len(results)
    if results.count(None) == count:  # the usual answer: its tail kept by count
        tail = _NULL_RESULTS.get(count) or _null_results(count)
        if 0x100 <= request_id < 0x10000:  # the usual ids: frame header and head in one pack
            return _U16_FRAMED_HEAD.pack(len(tail) + 5, 0x83, 0x19, request_id, 0xF6) + tail
        body = _id_head(request_id) + tail
    else:
        body = _answer_head(request_id, _RESULTS_OPENING, count) + b"".join(
            [_NULL if entry is None else cbor2.dumps(entry.to_wire()) for entry in results])
    return _FRAME_HEADER.pack(len(body)) + body


#: ``{"results": [null, ...]}`` by the number of entries, as answers need them.
_NULL_RESULTS: dict[int, bytes] = {}


def _null_results(count: int) -> bytes:
    """``{"results": [null x count]}``, kept for the next answer of as many."""
    tail = _NULL_RESULTS[count] = (_RESULTS_OPENING + cbor_head(4, count)  # array(count)
                                   + _NULL * count)
    return tail


def encode_response(request_id: int, result: Mapping[str, Any]) -> bytes:
    """The frame ``[id, null, result]``, byte-identical to cbor2.dumps of it without building
    the array (every ping and most small answers)."""
    tail = cbor2.dumps(result)
    if request_id < 0x10000:  # the usual ids: frame header and head in one pack
        if request_id >= 0x100:
            return _U16_FRAMED_HEAD.pack(len(tail) + 5, 0x83, 0x19, request_id, 0xF6) + tail
    elif request_id < 0x100000000:
        return _U32_FRAMED_HEAD.pack(len(tail) + 7, 0x83, 0x1A, request_id, 0xF6) + tail
    head = _id_head(request_id)
    return b"".join((_FRAME_HEADER.pack(len(head) + len(tail)), head, tail))


def _id_head(request_id: int) -> bytes:
    """``[id, null, ``: how every success answer starts."""
    if request_id < 24:
        return _SMALL_ID_HEADS[request_id]
    if request_id < 0x100:
        return _U8_ID_HEAD.pack(0x83, 0x18, request_id, 0xF6)  # array(3), uint8, null
    if request_id < 0x10000:
        return _U16_ID_HEAD.pack(0x83, 0x19, request_id, 0xF6)  # array(3), uint16, null
    if request_id < 0x100000000:  # a long-lived connection's ids pass 65,535
        return _U32_ID_HEAD.pack(0x83, 0x1A, request_id, 0xF6)  # array(3), uint32, null
    return _ARRAY_OF_3 + encode_int(request_id) + _NULL


def _answer_head(request_id: int, opening: bytes, count: int) -> bytes:
    """``[id, null, {key: [`` with an array of ``count``: the start of an answer listing
    entries (``opening`` is the map head and key)."""
    array_head = _SMALL_ARRAY_HEADS[count] if count < 24 else cbor_head(4, count)
    return _id_head(request_id) + opening + array_head


#: encode_frame_header without its range check (an answer longer than 4 GiB fails the pack
#: instead; one over max_frame is refused before it is sent), and ``[id, null, `` by the size
#: of the id's CBOR head.
_FRAME_HEADER = struct.Struct(">I")
_SMALL_ID_HEADS = tuple(_ARRAY_OF_3 + bytes((n,)) + _NULL for n in range(24))
_U8_ID_HEAD = struct.Struct(">BBBB")
_U16_ID_HEAD = struct.Struct(">BBHB")
_U32_ID_HEAD = struct.Struct(">BBIB")
#: The frame header and ``[id, null, `` of a 16- or 32-bit id, for one pack (encode_response).
_U16_FRAMED_HEAD = struct.Struct(">IBBHB")
_U32_FRAMED_HEAD = struct.Struct(">IBBIB")
_SMALL_ARRAY_HEADS = tuple(cbor_head(4, n) for n in range(24))
_MESSAGES_OPENING = _MAP_OF_1 + _MESSAGES_KEY
_RESULTS_OPENING = _MAP_OF_1 + cbor2.dumps("results")


def _optional_int(value: int | None) -> bytes:
    return _NULL if value is None else encode_int(value)


def _state_text(state: str) -> bytes:
    try:
        return _STATE_TEXTS[state]
    except KeyError:
        raise ValueError(f"peek state {state!r} is not one of {sorted(PEEK_STATES)}") from None


def peek_entry_size(entry: PeekEntry) -> int:
    """Bytes ``entry`` adds to a peek response."""
    if isinstance(entry, tuple):
        record, state, dequeue_count, first_dequeue_time, next_visible_time = entry
        return (len(_ARRAY_OF_5) + len(record) + len(_state_text(state)) + int_size(dequeue_count)
                + (1 if first_dequeue_time is None else int_size(first_dequeue_time))
                + (1 if next_visible_time is None else int_size(next_visible_time)))
    return len(_encode_error_entry(entry))


def peek_response_overhead(request_id: int, count: int, next_cursor: Any) -> int:
    """Bytes of a peek response body besides its ``count`` entries (no length prefix)."""
    return (len(_ARRAY_OF_3) + int_size(request_id) + len(_NULL) + len(_MAP_OF_2)
            + len(_MESSAGES_KEY) + head_size(count) + len(_NEXT_KEY) + len(cbor2.dumps(next_cursor)))


def _encode_error_entry(entry: Mapping[str, Any] | LaminaError) -> bytes:
    return cbor2.dumps(entry.to_wire() if isinstance(entry, LaminaError) else entry)


def encode_peek_response(request_id: int, entries: Sequence[PeekEntry], next_cursor: Any) -> bytes:
    """The frame ``[id, null, {"messages": [entry...], "next": next_cursor}]``, each entry
    ``[record, state, dequeue_count, first_dequeue_time|null, next_visible_time|null]`` or, in
    ``ids`` mode, an error map (or LaminaError) for an id that failed."""
    parts = [b"", _ARRAY_OF_3, encode_int(request_id), _NULL, _MAP_OF_2, _MESSAGES_KEY,
             cbor_head(4, len(entries))]
    for entry in entries:
        if isinstance(entry, tuple):
            record, state, dequeue_count, first_dequeue_time, next_visible_time = entry
            parts.extend((_ARRAY_OF_5, record, _state_text(state), encode_int(dequeue_count),
                          _optional_int(first_dequeue_time), _optional_int(next_visible_time)))
        else:
            parts.append(_encode_error_entry(entry))
    parts.extend((_NEXT_KEY, cbor2.dumps(next_cursor)))
    return _frame_of_parts(parts)


def _frame_of_parts(parts: list[bytes]) -> bytes:
    """Join ``parts[1:]`` as a frame body; ``parts[0]`` is the placeholder for the prefix."""
    parts[0] = encode_frame_header(sum(map(len, parts)))
    return b"".join(parts)
