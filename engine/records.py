"""The stored message: the fixed prefix, the PROTOCOL.md §4 record, message ids.

A log value is ``prefix | record``:

    prefix  enqueue_ms:u64 | visible_ms:u64 | topic_id:u32 | priority:u8      (21 bytes)
    record  CBOR [id, body, attributes|null, topic|null, priority, enqueue_time,
                  visible_time, md5, dead|null]

The record is encoded once, at send, and spliced unchanged into every delivery; skip decisions
(delay, topic, priority) read only the prefix. The record is assembled by hand from CBOR heads:
measured ≈ 3x faster than ``cbor2.dumps`` of the same list, and byte-identical to it (a test
checks that).

Message ids are 25 lower-case hex digits ``queue:8 | seq:16 | lane-1:1``: unique on a server
forever (queue ids are never reused, seqs are dense per queue), sorting in production order
within a queue, and carrying the lane so a lookup by id is one ``get``.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Callable

import cbor2

try:  # CPython's own MD5: missing only where Python was built without its own hashes
    from _md5 import md5 as _builtin_md5  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - such builds are rare
    _builtin_md5 = hashlib.md5

PREFIX = struct.Struct(">QQIB")
PREFIX_SIZE = PREFIX.size
ID_LENGTH = 25

_ID_HEAD = b"\x78\x19"  # CBOR text string of 25 bytes
#: A record's array head and its id's text head: what every record starts with.
RECORD_HEAD = b"\x89" + _ID_HEAD


# RFC 8949 §3: a head is the major type (3 bits) and an argument; the argument is stored in the
# additional-information bits when below 24, else in the shortest of 1, 2, 4 or 8 following bytes.
_SMALL_HEADS = tuple(tuple(bytes([major << 5 | arg]) for arg in range(24)) for major in range(8))
_U16 = struct.Struct(">BH")
_U32 = struct.Struct(">BI")
_U64 = struct.Struct(">BQ")


def cbor_head(major_type: int, argument: int) -> bytes:
    """The shortest (RFC 8949 preferred) head for ``major_type`` 0..7 and ``argument`` 0..2^64-1.

    For byte strings, text, arrays and maps the argument is the length; for major types 0 and 1
    it is the integer itself (see ``lamina.wire.framing.encode_int``).
    """
    if argument < 24:
        if argument < 0 or not 0 <= major_type <= 7:
            raise ValueError(f"no CBOR head for major type {major_type}, argument {argument}")
        return _SMALL_HEADS[major_type][argument]
    initial = major_type << 5
    if not 0 <= major_type <= 7:
        raise ValueError(f"no CBOR major type {major_type}")
    if argument < 0x100:
        return bytes((initial | 24, argument))
    if argument < 0x10000:
        return _U16.pack(initial | 25, argument)
    if argument < 0x100000000:
        return _U32.pack(initial | 26, argument)
    if argument < 0x10000000000000000:
        return _U64.pack(initial | 27, argument)
    raise ValueError(f"CBOR head argument {argument} does not fit in 64 bits")


#: Bodies up to this size are digested by CPython's own MD5, larger ones by OpenSSL's
#: (``hashlib.md5``). OpenSSL 3 looks its algorithm up by name on every call: for a body of
#: 256 bytes 0.62-0.70 µs against 0.51-0.54, at 1 KiB about even, from 4 KiB on OpenSSL's is
#: 7-10 % quicker (measured, Python 3.11).
SHORT_BODY_BYTES = 2048


def md5_for(size: int) -> Callable[[bytes], Any]:
    """The MD5 constructor quickest for bodies of up to ``size`` bytes: ``md5_for(n)(body)
    .digest()`` is the body's MD5 (the record's ``md5``, the answer's digest), whichever
    is chosen."""
    return _builtin_md5 if size <= SHORT_BODY_BYTES else hashlib.md5


def body_md5(data: bytes) -> bytes:
    """The MD5 digest of a body's bytes (UTF-8 for text)."""
    return md5_for(len(data))(data).digest()


def cbor_uint(value: int) -> bytes:
    return cbor_head(0, value)


def cbor_bytes(value: bytes) -> bytes:
    return cbor_head(2, len(value)) + value


def cbor_text(value: str) -> bytes:
    data = value.encode()
    return cbor_head(3, len(data)) + data


CBOR_NULL = b"\xf6"


def message_id(queue: int, seq: int, lane: int) -> str:
    return f"{queue:08x}{seq:016x}{lane - 1:x}"


def parse_message_id(value: object) -> tuple[int, int, int] | None:
    """-> (queue, seq, lane), or None when ``value`` is not a well-formed message id."""
    if not isinstance(value, str) or len(value) != ID_LENGTH:
        return None
    try:
        raw = int(value, 16)
    except ValueError:
        return None
    if value != value.lower() or not value.isalnum():
        return None
    return raw >> 68, (raw >> 4) & ((1 << 64) - 1), (raw & 0xF) + 1


def encode_record(
    msg_id: str,
    body_cbor: bytes,
    attributes_cbor: bytes | None,
    topic: str | None,
    priority: int,
    enqueue_ms: int,
    visible_ms: int,
    md5: bytes,
    dead_cbor: bytes | None = None,
) -> bytes:
    """The PROTOCOL.md §4 record; ``body_cbor`` / ``attributes_cbor`` / ``dead_cbor`` are
    already CBOR-encoded items."""
    return b"".join((
        RECORD_HEAD, msg_id.encode(), body_cbor,
        attributes_cbor if attributes_cbor is not None else CBOR_NULL,
        cbor_text(topic) if topic is not None else CBOR_NULL,
        bytes((priority,)) if priority < 24 else cbor_uint(priority),
        cbor_uint(enqueue_ms), cbor_uint(visible_ms),
        b"\x50", md5,
        dead_cbor if dead_cbor is not None else CBOR_NULL,
    ))


_DEFAULTS = ("", b"", None, None, 8, 0, 0, b"", None)


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded record (PROTOCOL.md §4)."""

    id: str
    body: bytes | str
    attributes: dict[str, Any] | None
    topic: str | None
    priority: int
    enqueue_time: int
    visible_time: int
    md5: bytes
    dead: list[Any] | None

    @classmethod
    def decode(cls, record: bytes) -> Message:
        """Fields are only ever appended (PROTOCOL.md §4): extra ones are ignored, missing
        trailing ones take their defaults."""
        fields = cbor2.loads(record)
        return cls(*fields[:9], *_DEFAULTS[len(fields):])


def body_size(record: bytes) -> int:
    """The body's size in a stored record (bytes; UTF-8 bytes of a text body): the argument of
    its CBOR head, which follows the array head and the 25-character id."""
    info = record[_BODY_HEAD] & 0x1F
    if info < 24:
        return info
    return int.from_bytes(record[_BODY_HEAD + 1:_BODY_HEAD + 1 + (1 << (info - 24))], "big")


_BODY_HEAD = 1 + len(_ID_HEAD) + ID_LENGTH


def split_value(value: bytes) -> tuple[int, int, int, int, bytes]:
    """A log value -> (enqueue_ms, visible_ms, topic_id, priority, record bytes)."""
    enqueue_ms, visible_ms, topic_id, priority = PREFIX.unpack_from(value)
    return enqueue_ms, visible_ms, topic_id, priority, value[PREFIX_SIZE:]
