"""A request's frame, ``[id, op, args]`` behind its length (PROTOCOL §1–2): the client's hot path.

The array's head and the op's text are encoded once and spliced around the id's head and the
``args`` map (cbor2), so the bytes are exactly those of ``cbor2.dumps([id, op, args])`` behind
its length prefix, in one copy and without cbor2 walking the outer array (a ping's whole
``ClientConnection.encode_request``: about 0.65 µs instead of 1.55).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from typing import Any

import cbor2

from lamina.engine.records import cbor_head

__all__ = ["encode_request_frame"]

_ARRAY_OF_3 = b"\x83"
_EMPTY_MAP = b"\xa0"
_LENGTH = struct.Struct(">I").pack


@functools.lru_cache(maxsize=256)
def _op_text(op: str) -> bytes:
    """``op`` as a CBOR text string; the ops of PROTOCOL §5 are a few dozen names."""
    return cbor2.dumps(op)


def encode_request_frame(request_id: int, op: str, args: Mapping[str, Any]) -> bytes:
    """The frame of request ``[request_id, op, args]``: ``request_id`` in 1..2^63-1, ``op``
    a ``str``, ``args`` a map with text keys (checked by the caller)."""
    id_head = cbor_head(0, request_id)
    op_text = _op_text(op)
    encoded_args = cbor2.dumps(args) if args else _EMPTY_MAP
    return b"".join((_LENGTH(1 + len(id_head) + len(op_text) + len(encoded_args)),
                     _ARRAY_OF_3, id_head, op_text, encoded_args))
