"""A send entry of PROTOCOL.md §4, checked (``parse_send_entry``): what ``Appender.append``
writes for any entry that is not a plain message (a bytes body alone)."""

from __future__ import annotations

import cbor2

from .errors import InvalidArgument, MessageTooLarge
from .records import cbor_head
from .state import QueueState
from .validation import (
    DEFAULT_PRIORITY,
    MAX_DELAY_S,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_int,
    check_message_attributes,
    check_seconds,
    check_topic,
)

_SEND_KEYS = frozenset((1, 2, 3, 4, 5))


class _Entry:
    """A validated send entry, not yet assigned a seq."""

    __slots__ = ("body_cbor", "body", "attributes_cbor", "topic", "priority", "delay_ms", "size",
                 "dead_cbor", "mark")

    def __init__(self, body_cbor: bytes, body: bytes, attributes_cbor: bytes | None,
                 topic: str | None, priority: int, delay_ms: int):
        self.body_cbor = body_cbor
        self.body = body
        self.attributes_cbor = attributes_cbor
        self.topic = topic
        self.priority = priority
        self.delay_ms = delay_ms
        self.size = len(body) + (len(attributes_cbor) if attributes_cbor else 0)
        self.dead_cbor: bytes | None = None  # set on dead-letter copies (deadletter.py),
        self.mark = 0                        # which bypass send validation and limits


def _body(value: object, field: str) -> tuple[bytes, bytes]:
    """-> (CBOR item of the body, its bytes: UTF-8 for text)."""
    if type(value) is bytes:
        if not value:
            raise InvalidArgument(field, "must hold at least 1 byte")
        return cbor_head(2, len(value)) + value, value
    if type(value) is str:
        data = value.encode()
        if not data:
            raise InvalidArgument(field, "must hold at least 1 byte")
        return cbor_head(3, len(data)) + data, data
    raise InvalidArgument(field, "must be bytes or text")


def parse_send_entry(entry: object, index: int, q: QueueState) -> _Entry:
    """A send entry of PROTOCOL.md §4 (body alone, or a map with keys 1-5), fully checked."""
    field = f"messages[{index}]"
    attributes = q.attributes
    if type(entry) is bytes or type(entry) is str:
        body_cbor, body = _body(entry, f"{field}.body")
        parsed = _Entry(body_cbor, body, None, None, DEFAULT_PRIORITY,
                        attributes["delay"] * 1000)
    elif isinstance(entry, dict):
        for key in entry:
            if type(key) is not int or key not in _SEND_KEYS:
                raise InvalidArgument(f"{field}.{key}", "unknown send entry key (1-5)")
        if 1 not in entry:
            raise InvalidArgument(f"{field}.body", "is required")
        body_cbor, body = _body(entry[1], f"{field}.body")
        attributes_cbor = None
        if entry.get(2) is not None:
            attributes_cbor = cbor2.dumps(
                check_message_attributes(entry[2], f"{field}.attributes"))
        topic = check_topic(entry[3], f"{field}.topic") if entry.get(3) is not None else None
        priority = DEFAULT_PRIORITY
        if entry.get(4) is not None:
            priority = check_int(entry[4], f"{field}.priority", MIN_PRIORITY, MAX_PRIORITY)
        if topic is not None and priority != DEFAULT_PRIORITY:
            raise InvalidArgument(f"{field}.priority",
                                  "a message may have a topic or a non-default priority, not both")
        if entry.get(5) is not None:
            delay_ms = check_seconds(entry[5], f"{field}.delay", 0, MAX_DELAY_S)
            if delay_ms >= attributes["retention"] * 1000:
                raise InvalidArgument(f"{field}.delay", "must be less than the queue's retention")
        else:
            delay_ms = attributes["delay"] * 1000
        parsed = _Entry(body_cbor, body, attributes_cbor, topic, priority, delay_ms)
    else:
        raise InvalidArgument(field, "must be bytes, text or a map")
    if parsed.size > attributes["max_message_size"]:
        raise MessageTooLarge(
            f"{field}: {parsed.size} bytes (body + attributes) exceed max_message_size "
            f"{attributes['max_message_size']}", field=field)
    return parsed
