"""Every RocksDB key family of Lamina: one encoder and one decoder each, side by side.

All integers are fixed-width big-endian, so byte order is numeric order and a bytewise
comparator (RocksDB's default, kept by rocksdict's raw mode) sorts keys the way the engine
iterates them. Names never appear inside hot keys: queues and tags are ``u32`` ids that are
never reused. No key is built anywhere else.

Column families and their layouts::

    meta       b"V"                                   -> schema version
               b"C"                                   -> engine clock (u64 ms)
               b"I"                                   -> next queue id u32 | next tag id u32
               b"N" | lower(queue name) utf-8         -> queue id u32
               b"Q" | queue:u32                       -> queue definition (CBOR)
               b"W" | queue:u32                       -> watermarks (fixed struct)
               b"T" | queue:u32 | tag:u32             -> tag definition (CBOR)
               b"P" | queue:u32 | topic utf-8         -> topic id u32
               b"G" | key id utf-8 | 0 | queue pattern -> permissions (CBOR list)
               b"D" | queue:u32 | tag:u32 | day:u32   -> daily counters (fixed struct)
               b"K" | queue:u32 | tag:u32 | topic:u32 -> b"" (successors passed while parked)
    log        queue:u32 | lane:u8 | seq:u64          -> fixed prefix + record (records.py)
    time       queue:u32 | time_ms:u64 | seq:u64      -> b"" (first seq produced at that ms)
    segments   queue:u32 | first_seq:u64              -> segment summary (fixed struct)
    delays     queue:u32 | visible_ms:u64 | seq:u64   -> lane:u8
    delayseq   queue:u32 | seq:u64                    -> visible_ms:u64
    topics     queue:u32 | topic:u32 | seq:u64        -> enqueue_ms:u64 | visible_ms:u64
    tags       queue:u32 | tag:u32                    -> tag cursors (fixed struct)
    leases     queue:u32 | tag:u32 | seq:u64          -> lease (fixed struct)
    leasebatches queue:u32 | tag:u32 | lane:u8 | last seq:u64 -> a receive's first leases in
                                                      one lane (engine/leasebatch.py)
"""

from __future__ import annotations

import struct

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_Q_L = struct.Struct(">IB")
_Q_L_S = struct.Struct(">IBQ")
_Q_S = struct.Struct(">IQ")
_Q_T = struct.Struct(">II")
_Q_T_S = struct.Struct(">IIQ")
_Q_T_S_S = struct.Struct(">IQQ")
_Q_T_L_S = struct.Struct(">IIBQ")

U64_MAX = (1 << 64) - 1

# -- meta ---------------------------------------------------------------------------------

META_VERSION = b"V"
META_CLOCK = b"C"
META_IDS = b"I"
_NAME = b"N"
_QUEUE = b"Q"
_WATERMARKS = b"W"
_TAGDEF = b"T"


def queue_name_key(name: str) -> bytes:
    """``b"N" | lower(name)``: the case-insensitive name index, ordered like listings."""
    return _NAME + name.lower().encode()


def queue_name_from_key(key: bytes) -> str:
    return key[1:].decode()


def queue_name_prefix(prefix: str) -> bytes:
    return _NAME + prefix.lower().encode()


QUEUE_NAME_LOWER = _NAME
QUEUE_NAME_UPPER = b"O"  # the byte after b"N": bounds a scan of the whole name index


def queue_def_key(queue: int) -> bytes:
    return _QUEUE + _U32.pack(queue)


def queue_def_id(key: bytes) -> int:
    return _U32.unpack_from(key, 1)[0]


QUEUE_DEF_LOWER = _QUEUE
QUEUE_DEF_UPPER = b"R"


def watermarks_key(queue: int) -> bytes:
    return _WATERMARKS + _U32.pack(queue)


def tag_def_key(queue: int, tag: int) -> bytes:
    return _TAGDEF + _Q_T.pack(queue, tag)


def tag_def_ids(key: bytes) -> tuple[int, int]:
    return _Q_T.unpack_from(key, 1)


def tag_def_bounds(queue: int) -> tuple[bytes, bytes]:
    return _TAGDEF + _U32.pack(queue), _TAGDEF + _U32.pack(queue + 1)


_TOPIC = b"P"
_GRANT = b"G"
_DAY = b"D"


def topic_name_key(queue: int, topic: str) -> bytes:
    return _TOPIC + _U32.pack(queue) + topic.encode()


def topic_names_bounds(queue: int) -> tuple[bytes, bytes]:
    return _TOPIC + _U32.pack(queue), _TOPIC + _U32.pack(queue + 1)


_PARKED = b"K"


def parked_topic_key(queue: int, tag: int, topic: int) -> bytes:
    """``b"K" | queue | tag | topic``: the tag passed successors of ``topic`` while they were
    parked (TagState.parked_topics)."""
    return _PARKED + _Q_T.pack(queue, tag) + _U32.pack(topic)


def parked_topic_decode(key: bytes) -> int:
    """-> topic"""
    return _U32.unpack_from(key, 9)[0]


def parked_topics_bounds(queue: int, tag: int | None = None) -> tuple[bytes, bytes]:
    """Every marker of ``tag`` (or of every tag of ``queue``)."""
    if tag is None:
        return _PARKED + _U32.pack(queue), _PARKED + _U32.pack(queue + 1)
    return _PARKED + _Q_T.pack(queue, tag), _PARKED + _Q_T.pack(queue, tag + 1)


def grant_key(key_id: str, pattern: str) -> bytes:
    """``b"G" | key id | 0 | pattern``: grants grouped by key (key ids hold no NUL)."""
    return _GRANT + key_id.encode() + b"\x00" + pattern.encode()


def grant_key_decode(key: bytes) -> tuple[str, str]:
    key_id, _, pattern = key[1:].partition(b"\x00")
    return key_id.decode(), pattern.decode()


GRANTS_LOWER = _GRANT
GRANTS_UPPER = b"H"


def day_key(queue: int, tag: int, day: int) -> bytes:
    """Daily counters of a tag (``tag`` 0: the queue's sends), ``day`` = days since epoch."""
    return _DAY + _Q_T.pack(queue, tag) + _U32.pack(day)


def day_key_decode(key: bytes) -> tuple[int, int, int]:
    queue, tag = _Q_T.unpack_from(key, 1)
    return queue, tag, _U32.unpack_from(key, 9)[0]


def day_bounds(queue: int) -> tuple[bytes, bytes]:
    return _DAY + _U32.pack(queue), _DAY + _U32.pack(queue + 1)


# -- log: queue | lane | seq ----------------------------------------------------------------

def log_key(queue: int, lane: int, seq: int) -> bytes:
    return _Q_L_S.pack(queue, lane, seq)


def log_lane_prefix(queue: int, lane: int) -> bytes:
    """The first 5 bytes of ``log_key(queue, lane, seq)``: with ``seq.to_bytes(8, "big")``
    after it, the key (a batch of one lane packs its keys so)."""
    return _Q_L.pack(queue, lane)


def log_key_decode(key: bytes) -> tuple[int, int, int]:
    """-> (queue, lane, seq)"""
    return _Q_L_S.unpack(key)


def log_lane_bounds(queue: int, lane: int, first_seq: int = 0) -> tuple[bytes, bytes]:
    """Bounds of one lane of one queue from ``first_seq`` on (upper exclusive)."""
    return _Q_L_S.pack(queue, lane, first_seq), _Q_L_S.pack(queue, lane + 1, 0)


def log_seq(key: bytes) -> int:
    return _U64.unpack_from(key, 5)[0]


#: ``LOG_SEQ.unpack_from(key, 5)[0]`` is ``log_seq(key)``, for loops that inline it.
LOG_SEQ = _U64


# -- time: queue | time | seq ---------------------------------------------------------------

def time_key(queue: int, time_ms: int, seq: int) -> bytes:
    return _Q_T_S_S.pack(queue, time_ms, seq)


def time_key_decode(key: bytes) -> tuple[int, int, int]:
    """-> (queue, time_ms, seq)"""
    return _Q_T_S_S.unpack(key)


def time_queue_upper(queue: int) -> bytes:
    return _U32.pack(queue + 1)


# -- segments: queue | first seq --------------------------------------------------------------

def segment_key(queue: int, first_seq: int) -> bytes:
    return _Q_S.pack(queue, first_seq)


def segment_key_decode(key: bytes) -> tuple[int, int]:
    """-> (queue, first_seq)"""
    return _Q_S.unpack(key)


# -- delays: queue | visible time | seq -----------------------------------------------------------

def delay_key(queue: int, visible_ms: int, seq: int) -> bytes:
    return _Q_T_S_S.pack(queue, visible_ms, seq)


def delay_key_decode(key: bytes) -> tuple[int, int, int]:
    """-> (queue, visible_ms, seq)"""
    return _Q_T_S_S.unpack(key)


# -- delayseq: queue | seq ------------------------------------------------------------------------

def delayseq_key(queue: int, seq: int) -> bytes:
    return _Q_S.pack(queue, seq)


def delayseq_key_decode(key: bytes) -> tuple[int, int]:
    """-> (queue, seq)"""
    return _Q_S.unpack(key)


# -- topics: queue | topic | seq -------------------------------------------------------------

def topic_key(queue: int, topic: int, seq: int) -> bytes:
    return _Q_T_S.pack(queue, topic, seq)


def topic_key_decode(key: bytes) -> tuple[int, int, int]:
    """-> (queue, topic, seq)"""
    return _Q_T_S.unpack(key)


def topic_bounds(queue: int, topic: int) -> tuple[bytes, bytes]:
    return _Q_T.pack(queue, topic), _Q_T.pack(queue, topic + 1)


# -- tags: queue | tag ----------------------------------------------------------------------------

def tag_key(queue: int, tag: int) -> bytes:
    return _Q_T.pack(queue, tag)


# -- leases: queue | tag | seq --------------------------------------------------------------------

#: ``lease_key(queue, tag, seq)``: a bound ``struct.pack`` (called per leased message).
lease_key = _Q_T_S.pack


def lease_key_decode(key: bytes) -> tuple[int, int, int]:
    """-> (queue, tag, seq)"""
    return _Q_T_S.unpack(key)


# -- lease batches: queue | tag | lane | last seq ---------------------------------------------------

#: ``batch_key(queue, tag, lane, last_seq)``: a bound ``struct.pack`` (called per receive).
batch_key = _Q_T_L_S.pack


def batch_key_decode(key: bytes) -> tuple[int, int, int, int]:
    """-> (queue, tag, lane, last seq)"""
    return _Q_T_L_S.unpack(key)


def batch_lane_bounds(queue: int, tag: int, lane: int, from_seq: int = 0) -> tuple[bytes, bytes]:
    """Bounds of the batch rows of one lane whose last seq is at least ``from_seq``."""
    return _Q_T_L_S.pack(queue, tag, lane, from_seq), _Q_T_L_S.pack(queue, tag, lane + 1, 0)


def tag_scope_bounds(queue: int, tag: int) -> tuple[bytes, bytes]:
    """Bounds of every ``queue | tag | ...`` key (leases, lease batches, tag cursors)."""
    return _Q_T.pack(queue, tag), _Q_T.pack(queue, tag + 1)


# -- queue-wide bounds (every per-queue family starts with queue:u32) -----------------------------

def queue_bounds(queue: int) -> tuple[bytes, bytes]:
    return _U32.pack(queue), _U32.pack(queue + 1)


def u32(value: int) -> bytes:
    return _U32.pack(value)


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u32(data: bytes, offset: int = 0) -> int:
    return _U32.unpack_from(data, offset)[0]


def read_u64(data: bytes, offset: int = 0) -> int:
    return _U64.unpack_from(data, offset)[0]
