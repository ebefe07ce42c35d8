"""Counting the CBOR items of a frame body without decoding it (PROTOCOL.md §1).

Decoding costs ~70 ns of the event loop per item, so a 16 MiB frame of one-byte items takes
seconds, and item counts can only be judged once decoded. :func:`check_item_count` walks the
item heads instead, skipping string contents, and stops at the limit: a frame with too many
items is refused after bounded work (~20 ms for a limit of 150,000 items).
"""

from __future__ import annotations

import re

from lamina.engine.errors import ProtocolError

__all__ = ["check_item_count"]

#: Initial bytes that are whole items: integers -24..23 and simple values 0..23 (false, true,
#: null among them). A run of them is counted at C speed (a frame of millions of tiny items).
_ONE_BYTE_ITEMS = re.compile(rb"[\x00-\x17\x20-\x37\xe0-\xf7]+")
#: By initial byte: the bytes of the item's head (0: indefinite or reserved, left to the
#: decoder). Strings are followed by as many bytes as the head's argument says.
_HEAD_BYTES = bytes(1 if initial & 31 < 24 else {24: 2, 25: 3, 26: 5, 27: 9}.get(initial & 31, 0)
                    for initial in range(256))
_STRING_HEADS = frozenset(range(0x40, 0x80))
_ONE_BYTE_ITEM_HEADS = frozenset((*range(0x00, 0x18), *range(0x20, 0x38), *range(0xE0, 0xF8)))


def check_item_count(body: bytes, max_items: int) -> None:
    """Raise ProtocolError if ``body`` holds more than ``max_items`` CBOR items (every head
    counts: containers, map keys, scalars), looking at no more heads than that. Anything
    malformed (truncated, indefinite, reserved) ends the walk: the decoder refuses it and
    words why."""
    count, position, end = 0, 0, len(body)
    one_byte_run = _ONE_BYTE_ITEMS.match
    head_bytes, string_heads, one_byte_heads = _HEAD_BYTES, _STRING_HEADS, _ONE_BYTE_ITEM_HEADS
    while position < end:
        initial = body[position]
        size = head_bytes[initial]
        if initial in string_heads:
            if size == 1:
                position += 1 + (initial & 31)
            elif size:
                position += size + int.from_bytes(body[position + 1:position + size], "big")
            else:
                return
            count += 1
        elif initial in one_byte_heads:
            run_end = one_byte_run(body, position).end()  # type: ignore[union-attr]
            count += run_end - position
            position = run_end
        elif size:
            position += size
            count += 1
        else:
            return
        if count > max_items:
            raise ProtocolError(f"a frame may hold at most {max_items} CBOR items")
