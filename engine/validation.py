"""Argument rules of DESIGN.md §2: names, queue attributes, send entries, durations.

Every check raises ``InvalidArgument`` naming the field (or the more specific code PROTOCOL.md §6
names). Nothing is clamped, truncated or dropped. Booleans are never integers.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .errors import InvalidArgument, InvalidQueueName

NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")

DAY_S = 86400
MAX_DELAY_S = 30 * DAY_S
MAX_VISIBILITY_S = 43200
MAX_WAIT_S = 30
MAX_BATCH = 1000
MAX_ATTRIBUTES = 64
MAX_ATTRIBUTE_NAME_BYTES = 128
MAX_TOPIC_BYTES = 128
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 1, 16, 8
CBOR_INT_MIN, CBOR_INT_MAX = -(1 << 64), (1 << 64) - 1
RESERVED_ATTRIBUTE_PREFIX = "DLQ."

# name -> (minimum, maximum, default); durations in whole seconds.
QUEUE_ATTRIBUTE_RANGES: dict[str, tuple[int, int, int]] = {
    "visibility_timeout": (1, MAX_VISIBILITY_S, 30),
    "polling_wait": (0, MAX_WAIT_S, 0),
    "max_message_size": (1024, 1048576, 262144),
    "retention": (60, 365 * DAY_S, 345600),
    "delay": (0, MAX_DELAY_S, 0),
    "max_messages": (1, 10**10, 100_000_000),
    "rewind": (0, 365 * DAY_S, 0),
}
QUEUE_ATTRIBUTE_NAMES = (*QUEUE_ATTRIBUTE_RANGES, "redrive")


def is_int(value: object) -> bool:
    return type(value) is int


def is_number(value: object) -> bool:
    return (type(value) is int) or (type(value) is float and math.isfinite(value))


def check_name(value: object, field: str) -> str:
    """A queue or tag name (1–64 of ``[A-Za-z0-9_-]``, starting with a letter)."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidArgument(field, "must be 1-64 of [A-Za-z0-9_-] starting with a letter")
    return value


def check_queue_name(value: object, field: str = "queue") -> str:
    """A name for a new queue: ``InvalidQueueName`` for text that breaks the naming rule
    (``InvalidArgument`` for a value that is not text)."""
    if not isinstance(value, str):
        raise InvalidArgument(field, "must be a queue name (text)")
    if not NAME_RE.fullmatch(value):
        raise InvalidQueueName(
            f"{field}: queue names are 1-64 of [A-Za-z0-9_-] starting with a letter",
            field=field,
        )
    return value


def check_int(value: object, field: str, low: int, high: int) -> int:
    if not is_int(value):
        raise InvalidArgument(field, "must be an integer")
    if not low <= value <= high:  # type: ignore[operator]
        raise InvalidArgument(field, f"must be between {low} and {high}")
    return value  # type: ignore[return-value]


def check_seconds(value: object, field: str, low_s: float, high_s: float) -> int:
    """A duration in seconds (int or finite float) -> milliseconds, ``floor(s * 1000)``."""
    if not is_number(value):
        raise InvalidArgument(field, "must be a number of seconds")
    if not low_s <= value <= high_s:  # type: ignore[operator]
        raise InvalidArgument(field, f"must be between {low_s} and {high_s} seconds")
    return math.floor(value * 1000)  # type: ignore[operator]


def check_time_ms(value: object, field: str) -> int:
    if not is_int(value) or not 0 <= value < (1 << 63):  # type: ignore[operator]
        raise InvalidArgument(field, "must be a time in milliseconds since the epoch")
    return value  # type: ignore[return-value]


def check_bool(value: object, field: str) -> bool:
    if type(value) is not bool:
        raise InvalidArgument(field, "must be true or false")
    return value


def check_args(args: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """Unknown argument keys are errors, never ignored."""
    for name in args:
        if name not in allowed:
            raise InvalidArgument(str(name), "unknown argument")


def default_queue_attributes() -> dict[str, Any]:
    attributes: dict[str, Any] = {k: v[2] for k, v in QUEUE_ATTRIBUTE_RANGES.items()}
    attributes["redrive"] = None
    return attributes


def merge_queue_attributes(base: Mapping[str, Any], changes: object) -> dict[str, Any]:
    """``base`` updated with ``changes``, every rule checked on the result (DLQ existence is the
    engine's business)."""
    if changes is None:
        changes = {}
    if not isinstance(changes, Mapping):
        raise InvalidArgument("attributes", "must be a map")
    merged = dict(base)
    for name, value in changes.items():
        field = f"attributes.{name}"
        if name == "redrive":
            merged[name] = _check_redrive(value)
        elif name in QUEUE_ATTRIBUTE_RANGES:
            low, high, _ = QUEUE_ATTRIBUTE_RANGES[name]
            merged[name] = check_int(value, field, low, high)
        else:
            raise InvalidArgument(field, "unknown queue attribute")
    if merged["delay"] >= merged["retention"]:
        raise InvalidArgument("attributes.delay", "must be less than retention")
    if merged["rewind"] > merged["retention"]:
        raise InvalidArgument("attributes.rewind", "must not exceed retention")
    return merged


def _check_redrive(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument("attributes.redrive", "must be null or a map")
    for key in value:
        if key not in ("dlq", "max_receives"):
            raise InvalidArgument(f"attributes.redrive.{key}", "unknown redrive field")
    if "dlq" not in value:
        raise InvalidArgument("attributes.redrive.dlq", "is required")
    if "max_receives" not in value:
        raise InvalidArgument("attributes.redrive.max_receives", "is required")
    return {
        "dlq": check_name(value["dlq"], "attributes.redrive.dlq"),
        "max_receives": check_int(value["max_receives"], "attributes.redrive.max_receives", 1, 1000),
    }


def check_attribute_value(value: object, field: str) -> None:
    kind = type(value)
    if kind is str or kind is bytes or kind is bool:
        return
    if kind is int:
        if not CBOR_INT_MIN <= value <= CBOR_INT_MAX:  # type: ignore[operator]
            raise InvalidArgument(field, "integer out of the CBOR range")
        return
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise InvalidArgument(field, "must be a finite number")
        return
    raise InvalidArgument(field, "must be text, bytes, an integer, a float or a boolean")


def check_message_attributes(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be a map")
    if len(value) > MAX_ATTRIBUTES:
        raise InvalidArgument(field, f"at most {MAX_ATTRIBUTES} attributes")
    for name, item in value.items():
        if not isinstance(name, str):
            raise InvalidArgument(field, "attribute names must be text")
        if not 1 <= len(name.encode()) <= MAX_ATTRIBUTE_NAME_BYTES:
            raise InvalidArgument(f"{field}.{name}", "names are 1-128 bytes")
        if name.startswith(RESERVED_ATTRIBUTE_PREFIX):
            raise InvalidArgument(f"{field}.{name}", "the DLQ. prefix is reserved")
        check_attribute_value(item, f"{field}.{name}")
    return value


def check_topic(value: object, field: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value.encode()) <= MAX_TOPIC_BYTES:
        raise InvalidArgument(field, "must be 1-128 bytes of text")
    return value


def check_batch(value: object, field: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise InvalidArgument(field, "must be a list")
    if not 1 <= len(value) <= MAX_BATCH:
        raise InvalidArgument(field, f"must hold 1-{MAX_BATCH} entries")
    return list(value)
