"""Frames and CBOR items: the byte-level half of PROTOCOL.md §1.

Every Lamina stream, in both directions, is a sequence of frames::

    +--------------------+------------------------------------------+
    | N: u32 big-endian  | N bytes holding exactly one CBOR item    |
    +--------------------+------------------------------------------+

This module cuts frames out of a byte stream (:class:`FrameReader`), decodes one frame body
under the protocol's strictness rules (:func:`decode_item`), finds the values a request may not
carry (:func:`find_unsupported_value`), and sizes CBOR heads and integers (:func:`head_size`,
:func:`encode_int`). The frames built around stored records (PROTOCOL §4, the hot path) are in
``splicing.py``.

It knows nothing of requests, ids or connections; that is ``protocol.py``. Bytes from the peer
that break a rule raise :class:`~lamina.engine.errors.ProtocolError` (the wire error, "the peer
misbehaved"); bad arguments from our own code raise ``ValueError`` ("you misused the API").
"""

from __future__ import annotations

import functools
import io
import math
import mmap
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

from lamina.engine.errors import ProtocolError
from lamina.engine.records import cbor_head

from .item_count import check_item_count

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES", "FRAME_HEADER_BYTES", "MAX_FRAME_LENGTH", "MAX_NESTING_DEPTH",
    "MIN_MAX_FRAME_BYTES", "PLAIN_SCALAR_TYPES", "PRE_AUTH_MAX_FRAME_BYTES", "TEXT_ONLY",
    "CBORTagged",
    "FrameReader", "check_item_count", "decode_item", "decode_item_strict", "encode_frame_header",
    "encode_int", "find_unsupported_value", "head_size", "int_size",
]

# --- Hard limits, each with its reason ---------------------------------------------------------

#: Bytes in the length prefix of every frame.
FRAME_HEADER_BYTES = 4
#: The largest length a 4-byte header can state; no ``max_frame`` may exceed it.
MAX_FRAME_LENGTH = 2**32 - 1
#: PROTOCOL §1 default ``max_frame``: room for a 1000-message send or receive of typical messages
#: while bounding what one peer can make us buffer and decode at once.
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: PROTOCOL §1: a server's ``max_frame`` is never below this, so a client may always send a
#: 2 MiB frame without reading the greeting first.
MIN_MAX_FRAME_BYTES = 2 * 1024 * 1024
#: PROTOCOL §3: before ``auth`` succeeds a peer is a stranger; an ``auth`` request is ~100 bytes,
#: so 4 KiB is ample and caps what a stranger can make the server buffer.
PRE_AUTH_MAX_FRAME_BYTES = 4 * 1024
#: PROTOCOL §1: deepest item allowed, the outermost item being depth 1. Bounds the recursion of
#: every decoder that reads our frames, in any language.
MAX_NESTING_DEPTH = 32
# cbor2 counts depth from 0 at the outermost item and counts every item, scalars and empty
# containers included: ``max_depth=1`` accepts ``[1]`` and ``[[]]`` (deepest item at protocol
# depth 2) and rejects ``[[1]]``. So protocol depth d is cbor2 depth d - 1.
_CBOR2_MAX_DEPTH = MAX_NESTING_DEPTH - 1

_HEADER = struct.Struct(">I")


def encode_frame_header(body_length: int) -> bytes:
    """The 4-byte length prefix of a frame whose body is ``body_length`` bytes."""
    if not 1 <= body_length <= MAX_FRAME_LENGTH:
        raise ValueError(f"frame body length {body_length} outside 1..{MAX_FRAME_LENGTH}")
    return _HEADER.pack(body_length)


# --- Cutting frames out of a stream ------------------------------------------------------------


#: A body this long may get an anonymous mapping of its length (``collect_front_frame``): pages
#: cost memory once written and go back when done; buffers grown read by read fragment the heap.
COLLECT_BODY_BYTES = 1024 * 1024


class FrameReader:
    """Cuts frame bodies out of a byte stream that arrives in arbitrary pieces.

    Invariants: ``_buffer[_start:]`` holds every byte fed and not yet returned in a frame, but
    for a large body being collected (``_collecting``) or collected (``_body``), which comes
    first. A zero or oversized length is refused from the header alone (PROTOCOL §1); after
    one refusal the reader stays failed: a stream that lost frame sync cannot be trusted.

    ``max_frame_bytes`` may change between calls (lowered before ``auth``); it applies to every
    header not yet judged."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        #: bytes as fed while nothing was pending, else a bytearray collecting the pieces.
        self._buffer: bytes | bytearray = b""
        self._start = 0
        self._failure: ProtocolError | None = None
        self._collecting: mmap.mmap | None = None  # a large frame's body, its length mapped
        self._collected = 0  # ... bytes of it received
        self._body: bytes | None = None  # ... complete, to be returned next

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        if not 1 <= value <= MAX_FRAME_LENGTH:
            raise ValueError(f"max_frame_bytes {value} outside 1..{MAX_FRAME_LENGTH}")
        self._max_frame_bytes = value

    @property
    def front_frame_bytes(self) -> int:
        """The front frame's whole length with its header, once that is in (clipped to max_frame:
        a longer one is refused when parsed); before that, the bytes buffered."""
        if self._collecting is not None:
            return FRAME_HEADER_BYTES + len(self._collecting)
        if self._body is not None:
            return FRAME_HEADER_BYTES + len(self._body)
        available = len(self._buffer) - self._start
        if available < FRAME_HEADER_BYTES:
            return available
        (length,) = _HEADER.unpack_from(self._buffer, self._start)
        return FRAME_HEADER_BYTES + min(length, self._max_frame_bytes)

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed and not yet returned as frames."""
        pending = len(self._buffer) - self._start
        if self._collecting is not None:
            pending += FRAME_HEADER_BYTES + self._collected
        if self._body is not None:
            pending += FRAME_HEADER_BYTES + len(self._body)
        return pending

    def whole_frame(self, data: bytes | bytearray | memoryview) -> bytes | None:
        """The body of ``data`` if nothing is pending and ``data`` is exactly one frame of an
        acceptable length (the usual read of a peer awaiting each answer), taken without
        buffering; else None, and ``data`` is not taken: :meth:`feed` it."""
        if (type(data) is not bytes or self._start < len(self._buffer)
                or self._collecting is not None
                or self._body is not None or self._failure is not None
                or len(data) <= FRAME_HEADER_BYTES):
            return None
        (length,) = _HEADER.unpack_from(data)
        if length != len(data) - FRAME_HEADER_BYTES or length > self._max_frame_bytes:
            return None
        return data[FRAME_HEADER_BYTES:]

    def whole_frames(self, data: bytes) -> list[bytes]:
        """The bodies of the whole frames of acceptable length ``data`` begins with, taken
        without buffering if nothing is pending (a peer that sends a few requests at once);
        the rest of ``data`` (a partial frame, one to refuse, or all of it) is fed."""
        bodies: list[bytes] = []
        offset, end = 0, len(data)
        if not (self._start < len(self._buffer) or self._collecting is not None
                or self._body is not None or self._failure is not None):
            unpack, limit = _HEADER.unpack_from, self._max_frame_bytes
            while end - offset > FRAME_HEADER_BYTES:
                (length,) = unpack(data, offset)
                start = offset + FRAME_HEADER_BYTES
                if length == 0 or length > limit or start + length > end:
                    break
                offset = start + length
                bodies.append(data[start:offset])
        if offset < end:
            self.feed(data[offset:] if offset else data)
        return bodies

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes. Cheap: parsing happens in :meth:`next_frame`."""
        if self._failure is not None:
            return
        if self._collecting is not None:
            self._collect(data)
            return
        buffer = self._buffer
        if self._start >= len(buffer):
            # Nothing pending (the usual case): keep the bytes as they are, no copy.
            self._buffer, self._start = (data if type(data) is bytes else bytes(data)), 0
        else:
            if type(buffer) is not bytearray:
                self._buffer = buffer = bytearray(memoryview(buffer)[self._start:])
                self._start = 0
            elif self._start:
                # Compact only here, so a frame arriving in pieces is never copied repeatedly.
                del buffer[: self._start]
                self._start = 0
            buffer += data

    def collect_front_frame(self) -> None:
        """Allocate the front frame's whole body now if it is large and incomplete (the rest is
        copied in as it arrives); for a reader that accounts for that memory (budget.py)."""
        available = len(self._buffer) - self._start
        if available < FRAME_HEADER_BYTES or self._body is not None:
            return
        (length,) = _HEADER.unpack_from(self._buffer, self._start)
        if (length < COLLECT_BODY_BYTES or length > self._max_frame_bytes
                or available >= FRAME_HEADER_BYTES + length):
            return
        self._collecting = body = mmap.mmap(-1, length)
        self._collected = available - FRAME_HEADER_BYTES
        body[:self._collected] = memoryview(self._buffer)[self._start + FRAME_HEADER_BYTES:]
        self._buffer, self._start = b"", 0

    def _collect(self, data: bytes | bytearray | memoryview) -> None:
        body, start = self._collecting, self._collected
        assert body is not None, "collecting no frame"
        missing = len(body) - start
        if len(data) < missing:
            body[start:start + len(data)] = data
            self._collected = start + len(data)
            return
        body[start:] = memoryview(data)[:missing]
        self._body = body[:]
        body.close()
        self._collecting, self._collected = None, 0
        self._buffer, self._start = bytes(data[missing:]), 0

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None until more bytes are fed. Raises ProtocolError
        for a zero or oversized length, and again on every later call."""
        if self._failure is not None:
            raise self._failure
        if self._body is not None:
            collected, self._body = self._body, None
            return collected
        if self._collecting is not None:
            return None
        available = len(self._buffer) - self._start
        if available < FRAME_HEADER_BYTES:
            return None
        (length,) = _HEADER.unpack_from(self._buffer, self._start)
        if length == 0 or length > self._max_frame_bytes:
            self._failure = ProtocolError("zero-length frame" if length == 0 else f"frame of "
                                          f"{length} bytes exceeds max_frame {self._max_frame_bytes}")
            self._buffer, self._start = b"", 0
            raise self._failure
        if available < FRAME_HEADER_BYTES + length:
            return None
        body_start = self._start + FRAME_HEADER_BYTES
        self._start = end = body_start + length
        body = self._buffer[body_start:end]
        return body if type(body) is bytes else bytes(body)


# --- Decoding one item strictly ----------------------------------------------------------------


@dataclass(frozen=True, eq=False, slots=True, repr=False)
class CBORTagged:
    """Stands in for any tagged item the peer sent; requests may not carry tags (PROTOCOL §1).

    Identity equality on purpose: two tags as keys of one map are never "duplicates", so the
    request reaches the per-field check and fails as InvalidArgument, not as a protocol error.
    Shown in CBOR's terms (errors quote what the peer sent).
    """

    tag: int

    def __repr__(self) -> str:
        return f"CBOR tag {self.tag}"


def _mark_unknown_tag(tag: cbor2.CBORTag, immutable: bool) -> CBORTagged:
    return CBORTagged(tag.tag)


def _marker_for(tag_number: int) -> Callable[[Any, bool], CBORTagged]:
    def mark(value: Any, immutable: bool) -> CBORTagged:
        return CBORTagged(tag_number)

    return mark


# Tags cbor2 6.2 decodes itself, so ``tag_hook`` never sees them: bignums (2, 3) would turn into
# plain ints, shared values (28) and self-described CBOR (55799) into their content, 0/1 into
# datetimes... Found by decoding every tag in 0..70000 and 2^32-1, 2^32, 2^64-1.
# Each is overridden to a marker; any built-in decoder missed here still yields a non-plain
# Python type, which find_unsupported_value rejects too.
_BUILTIN_TAGS = (0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261,
                 1004, 43000, 55799)
_TAG_OVERRIDES = {number: _marker_for(number) for number in _BUILTIN_TAGS}


#: Bodies up to this size take the one-call decode of :func:`decode_item`: copying them once
#: is cheaper than setting up a stream decoder. Larger ones go straight to the stream decoder,
#: which reads them in place.
FAST_DECODE_MAX_BYTES = 64 * 1024
# decode_item's fast path decodes ``[body, sentinel]`` with cbor2.loads, which ignores trailing
# bytes: the sentinel, a 16-byte string drawn at random per process, comes back second only if
# ``body`` is exactly one item. A peer's bytes cannot produce it without knowing it (it is
# never sent), and no proper suffix of its 17-byte encoding can encode 16 bytes.
_SENTINEL = secrets.token_bytes(16)
_SENTINEL_ITEM = cbor2.dumps(_SENTINEL)
_ARRAY_OF_2_HEAD = b"\x82"
#: An array of 3 and the head of a byte string of 4: a frame's length prefix (decode_frame_item).
_FRAMED_HEAD = b"\x83\x44"


def decode_item(body: bytes, max_items: int | None = None) -> Any:
    """Decode a frame body that must hold exactly one well-formed CBOR item (PROTOCOL §1).

    Raises ProtocolError for malformed CBOR, trailing bytes, indefinite lengths, duplicate map
    keys (``1``, ``1.0`` and ``true`` are one key: cbor2 compares keys as Python does), nesting
    deeper than MAX_NESTING_DEPTH, or invalid UTF-8 in a text string. Tagged items come back as
    :class:`CBORTagged` markers, to be judged per request rather than here.

    Same answers as :func:`decode_item_strict`, faster for small bodies: one ``cbor2.loads``
    with the same options, one nesting level more for the wrapping array (see ``_SENTINEL``).
    Anything it does not accept goes to the strict decoder, which also words the error.

    ``max_items``: a body over FAST_DECODE_MAX_BYTES holding more items than this is refused
    (ProtocolError) after counting at most that many, before any is decoded (see
    :func:`check_item_count`). Smaller bodies hold fewer items than bytes.
    """
    if len(body) <= FAST_DECODE_MAX_BYTES:
        try:
            pair = _wrapped_loads(_ARRAY_OF_2_HEAD + body + _SENTINEL_ITEM)
        except Exception:
            pass
        else:
            # The array of 2 is ours, so a decoded one is a list of 2; its second item is the
            # sentinel unless the body's item ran into it. Only bytes equal bytes (cbor2
            # decodes byte strings as bytes, never as bytearray or memoryview).
            if pair[1] == _SENTINEL:
                return pair[0]
    elif max_items is not None:
        check_item_count(body, max_items)
    return decode_item_strict(body)


#: ``cbor2.loads`` with decode_item's options, one nesting level more for the wrapping array.
_wrapped_loads = functools.partial(
    cbor2.loads, tag_hook=_mark_unknown_tag, semantic_decoders=_TAG_OVERRIDES,
    max_depth=_CBOR2_MAX_DEPTH + 1, allow_indefinite=False, allow_duplicate_keys=False)


def decode_frame_item(frame: bytes, max_items: int | None = None) -> Any:
    """:func:`decode_item` of the body of ``frame``, a whole frame whose length prefix the
    caller checked, without cutting the body out: the prefix is decoded beside the item, as a
    byte string of 4 (the wrapping array holds three items here, the sentinel last)."""
    if len(frame) <= FAST_DECODE_MAX_BYTES + FRAME_HEADER_BYTES:
        try:
            triple = _wrapped_loads(_FRAMED_HEAD + frame + _SENTINEL_ITEM)
        except Exception:
            pass
        else:
            if triple[2] == _SENTINEL:  # (as in decode_item)
                return triple[1]
        return decode_item_strict(frame[FRAME_HEADER_BYTES:])
    return decode_item(frame[FRAME_HEADER_BYTES:], max_items)


def decode_item_strict(body: bytes) -> Any:
    """:func:`decode_item` by a stream decoder, which tells exactly how far the item went."""
    # cbor2.loads silently ignores trailing bytes; a decoder over a stream tells how far it read.
    stream = io.BytesIO(body)
    decoder = cbor2.CBORDecoder(
        stream,
        tag_hook=_mark_unknown_tag,
        semantic_decoders=_TAG_OVERRIDES,
        max_depth=_CBOR2_MAX_DEPTH,
        allow_indefinite=False,
        allow_duplicate_keys=False,
    )
    try:
        item = decoder.decode()
    except cbor2.CBORError as exc:
        reason = str(exc)
        if "nesting depth" in reason:
            reason = f"nesting deeper than {MAX_NESTING_DEPTH}"
        raise ProtocolError(f"malformed CBOR item: {reason}") from None
    consumed = stream.tell()
    if consumed != len(body):
        raise ProtocolError(f"{len(body) - consumed} trailing bytes after the CBOR item")
    return item


#: Values a request may carry that need no look inside (the common arguments).
PLAIN_SCALAR_TYPES = frozenset({str, bytes, int, bool, type(None)})
#: The one type of a request's argument names.
TEXT_ONLY = frozenset({str})
_SEQUENCES = frozenset({list, tuple})  # cbor2 decodes arrays used as map keys to tuples
_MAPPINGS = frozenset({dict, cbor2.frozendict})  # ... and maps used as map keys to frozendicts


def find_unsupported_value(value: Any) -> str | None:
    """Describe the first value inside ``value`` that a request may not carry, or None.

    PROTOCOL §1: CBOR tags, simple values other than true/false/null, and NaN or infinite
    floats. Anything cbor2 turned into a type other than the plain JSON-like ones can only have
    come from one of those. Keys of nested maps are checked like values.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind in PLAIN_SCALAR_TYPES:
            continue
        if kind is float:
            if not math.isfinite(item):
                return f"{item!r} is not a finite number"
        elif kind in _SEQUENCES:
            if not PLAIN_SCALAR_TYPES.issuperset(map(type, item)):  # not just bodies or receipts
                pending.extend(item)
        elif kind in _MAPPINGS:
            pending.extend(item.keys())
            pending.extend(item.values())
        elif kind is CBORTagged:
            return f"CBOR tag {item.tag} is not allowed"
        elif kind is cbor2.CBORSimpleValue:
            return f"CBOR simple value {item.value} is not allowed"
        elif item is cbor2.undefined:
            return "CBOR undefined is not allowed"
        else:
            return f"unsupported CBOR value of type {kind.__name__}"
    return None

# --- Sizes and integers of CBOR heads (the head encoder is ``lamina.engine.records.cbor_head``) --


def encode_int(value: int) -> bytes:
    """A CBOR integer in -2^64..2^64-1, encoded exactly as cbor2.dumps would."""
    if value >= 0:
        return cbor_head(0, value)
    return cbor_head(1, -1 - value)


def head_size(argument: int) -> int:
    """Bytes of the shortest head carrying ``argument`` (any major type)."""
    if argument < 24:
        return 1
    if argument < 0x100:
        return 2
    if argument < 0x10000:
        return 3
    if argument < 0x100000000:
        return 5
    return 9


def int_size(value: int) -> int:
    """Bytes of :func:`encode_int` (``value``)."""
    return head_size(value if value >= 0 else -1 - value)

