"""SQS messages on Lamina records: attributes, digests, system attributes.

Message attributes are stored as the Lamina message's attributes, so a binary-protocol reader
sees them as ordinary values: ``String`` -> text, ``Binary`` -> bytes, ``Number`` written as a
plain integer -> an integer. Any other type (a ``Number`` such as ``1.50``, or a custom type
``String.label``) keeps its text or bytes, and its exact type goes in the reserved attribute
``sqs.types`` (CBOR map name -> type), so the digest computed on receipt matches the sender's.

Reserved Lamina attribute names (never shown as SQS message attributes):

    sqs.types   see above             sqs.trace   AWSTraceHeader system attribute
    sqs.dedup   MessageDeduplicationId (FIFO)     sqs.sender  SenderId: the signing key id

Lamina beyond SQS: the message attribute ``lamina.priority`` (Number 1-16) puts the message in
that priority lane instead of storing the attribute; a received message with a priority other
than the default shows it the same way. A body that is not UTF-8 text (sent over the binary
protocol) is delivered base64-encoded with the attribute ``lamina.body-encoding`` = ``base64``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Any, Iterable

import cbor2

from lamina.engine.records import Message, body_md5
from lamina.engine.validation import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY

from .errors import SqsError, invalid

__all__ = ["ReceivedMessage", "SYSTEM_ATTRIBUTE_NAMES", "md5_of_attributes", "md5_hex",
           "received_message", "stored_attributes"]

MAX_MESSAGE_ATTRIBUTES = 10
MAX_NAME_CHARS = 256
PRIORITY_ATTRIBUTE = "lamina.priority"
BODY_ENCODING_ATTRIBUTE = "lamina.body-encoding"
TYPES, TRACE, DEDUP, SENDER = "sqs.types", "sqs.trace", "sqs.dedup", "sqs.sender"
RESERVED = frozenset({TYPES, TRACE, DEDUP, SENDER})
SYSTEM_ATTRIBUTE_NAMES = (
    "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp", "SentTimestamp",
    "SenderId", "MessageDeduplicationId", "MessageGroupId", "SequenceNumber",
    "AWSTraceHeader", "DeadLetterQueueSourceArn")

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_NUMBER_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
#: A Number stored as an integer: exactly the text an integer prints back as ("-0" is not).
_INT_RE = re.compile(r"0|-?[1-9]\d{0,17}")
# XML 1.0 characters: what SQS accepts in a body or a string value.
_INVALID_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_LENGTH = struct.Struct(">I")


def check_text(value: str, what: str, code: str = "InvalidParameterValue") -> None:
    if _INVALID_CHARS.search(value):
        raise SqsError(code, f"{what} contains characters outside the allowed set "
                       "(#x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | "
                       "#x10000 to #x10FFFF).")


def md5_hex(data: bytes) -> str:
    return body_md5(data).hex()


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str | None:
    """SQS's digest of message (or message system) attributes: per attribute in name order,
    length-prefixed name, length-prefixed type, 1 (text) or 2 (binary), length-prefixed
    value; None when there are none."""
    if not attributes:
        return None
    digest = hashlib.md5()
    for name in sorted(attributes):
        attribute = attributes[name]
        for part in (name.encode(), attribute["DataType"].encode()):
            digest.update(_LENGTH.pack(len(part)) + part)
        if "StringValue" in attribute:
            value = attribute["StringValue"].encode()
            digest.update(b"\x01")
        else:
            value = attribute["BinaryValue"]
            digest.update(b"\x02")
        digest.update(_LENGTH.pack(len(value)) + value)
    return digest.hexdigest()


def _check_attribute(name: Any, attribute: Any, where: str) -> dict[str, Any]:
    """One SQS message attribute, checked -> {DataType, StringValue | BinaryValue}."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS \
            or not _NAME_RE.fullmatch(name) or name.startswith(".") or name.endswith(".") \
            or ".." in name:
        raise invalid(f"{where}: the message attribute name {str(name)[:80]!r} is invalid: "
                      "1-256 of A-Z a-z 0-9 _ - . (no leading, trailing or repeated period).")
    lowered = name.lower()
    if lowered.startswith(("aws.", "amazon.")) or name in RESERVED:
        raise invalid(f"{where}: the message attribute name {name!r} is reserved.")
    if not isinstance(attribute, dict):
        raise invalid(f"{where}: message attribute {name!r} must be a structure.")
    data_type = attribute.get("DataType")
    if not isinstance(data_type, str) or not data_type:
        raise invalid(f"{where}: the message attribute {name!r} must contain a non-empty "
                      "attribute type.")
    base, _, label = data_type.partition(".")
    if base not in ("String", "Number", "Binary") or len(data_type) > MAX_NAME_CHARS \
            or (_ and not label):
        raise invalid(f"{where}: the type of message attribute {name!r} is invalid: String, "
                      "Number or Binary, optionally with a .label.")
    if attribute.get("StringListValues") or attribute.get("BinaryListValues"):
        raise invalid(f"{where}: message attribute {name!r}: list values are reserved for "
                      "future use by SQS and not supported.")
    if base == "Binary":
        value = attribute.get("BinaryValue")
        if not isinstance(value, (bytes, bytearray)) or not value:
            raise invalid(f"{where}: the message attribute {name!r} with type 'Binary' must "
                          "use the field 'BinaryValue' with a non-empty value.")
        return {"DataType": data_type, "BinaryValue": bytes(value)}
    value = attribute.get("StringValue")
    if not isinstance(value, str) or not value:
        raise invalid(f"{where}: the message attribute {name!r} must contain a non-empty "
                      "message attribute value for message attribute type "
                      f"{base!r}.")
    check_text(value, f"{where}: message attribute {name!r}")
    if base == "Number":
        if not _NUMBER_RE.fullmatch(value) or len(value.lstrip("+-").replace(".", "")
                                                  .split("e")[0].split("E")[0]) > 38:
            raise invalid(f"{where}: can't cast message attribute {name!r} with value "
                          f"{value[:40]!r} to a number (at most 38 digits).")
    return {"DataType": data_type, "StringValue": value}


def checked_attributes(raw: Any, where: str) -> dict[str, dict[str, Any]]:
    """SQS MessageAttributes (None: none), every rule checked."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid(f"{where}: MessageAttributes must be a map.")
    if len(raw) > MAX_MESSAGE_ATTRIBUTES:
        raise invalid(f"{where}: number of message attributes [{len(raw)}] exceeds the "
                      f"allowed maximum [{MAX_MESSAGE_ATTRIBUTES}].")
    return {name: _check_attribute(name, value, where) for name, value in raw.items()}


def checked_system_attributes(raw: Any, where: str) -> dict[str, dict[str, Any]]:
    """SQS MessageSystemAttributes: only ``AWSTraceHeader`` (a String) exists."""
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise invalid(f"{where}: MessageSystemAttributes must be a map.")
    for name in raw:
        if name != "AWSTraceHeader":
            raise invalid(f"{where}: message system attribute {str(name)[:80]!r} is not "
                          "supported; AWSTraceHeader is the only one.")
    attribute = raw["AWSTraceHeader"]
    checked = _check_attribute("AWSTraceHeader", attribute, where) \
        if isinstance(attribute, dict) and attribute.get("DataType") == "String" else None
    if checked is None:
        raise invalid(f"{where}: AWSTraceHeader must be a String.")
    return {"AWSTraceHeader": checked}


def attributes_size(attributes: dict[str, dict[str, Any]]) -> int:
    """What SQS counts of the attributes towards the message size."""
    size = 0
    for name, attribute in attributes.items():
        value = attribute.get("StringValue")
        size += len(name.encode()) + len(attribute["DataType"].encode()) + (
            len(value.encode()) if value is not None else len(attribute["BinaryValue"]))
    return size


def stored_attributes(attributes: dict[str, dict[str, Any]], where: str
                      ) -> tuple[dict[str, Any], int | None]:
    """SQS attributes -> (Lamina attributes, priority from ``lamina.priority`` or None)."""
    stored: dict[str, Any] = {}
    types: dict[str, str] = {}
    priority = None
    for name, attribute in attributes.items():
        data_type = attribute["DataType"]
        if name == PRIORITY_ATTRIBUTE:
            text = attribute.get("StringValue", "")
            if not data_type.startswith("Number") or not _INT_RE.fullmatch(text) \
                    or not MIN_PRIORITY <= int(text) <= MAX_PRIORITY:
                raise invalid(f"{where}: {PRIORITY_ATTRIBUTE} must be a Number from "
                              f"{MIN_PRIORITY} to {MAX_PRIORITY}.")
            priority = int(text)
            continue
        if len(name.encode()) > 128:
            raise invalid(f"{where}: message attribute names are at most 128 bytes here.")
        if data_type == "String":
            stored[name] = attribute["StringValue"]
        elif data_type == "Binary":
            stored[name] = attribute["BinaryValue"]
        elif data_type == "Number" and _INT_RE.fullmatch(attribute["StringValue"]):
            stored[name] = int(attribute["StringValue"])
        else:
            stored[name] = attribute.get("StringValue", attribute.get("BinaryValue"))
            types[name] = data_type
    if types:
        stored[TYPES] = cbor2.dumps(types)
    return stored, priority


def sqs_attributes(stored: dict[str, Any] | None, priority: int) -> dict[str, dict[str, Any]]:
    """Lamina attributes (any message, whoever sent it) -> SQS message attributes."""
    result: dict[str, dict[str, Any]] = {}
    if priority != DEFAULT_PRIORITY:
        result[PRIORITY_ATTRIBUTE] = {"DataType": "Number", "StringValue": str(priority)}
    if not stored:
        return result
    types: dict[str, str] = {}
    if isinstance(stored.get(TYPES), bytes):
        try:
            types = cbor2.loads(stored[TYPES])
        except Exception:  # a binary-protocol sender's own value: not ours
            types = {}
    for name, value in stored.items():
        if name in RESERVED:
            continue
        data_type = types.get(name) if isinstance(types, dict) else None
        if isinstance(value, bytes):
            result[name] = {"DataType": data_type or "Binary", "BinaryValue": value}
        elif isinstance(value, bool):
            result[name] = {"DataType": data_type or "String",
                            "StringValue": "true" if value else "false"}
        elif isinstance(value, (int, float)):
            result[name] = {"DataType": data_type or "Number", "StringValue": repr(value)}
        else:
            result[name] = {"DataType": data_type or "String", "StringValue": str(value)}
    return result


def wanted(names: Iterable[str], attributes: dict[str, Any]) -> dict[str, Any]:
    """The attributes ``MessageAttributeNames`` asks for: ``All``, ``.*``, ``prefix.*`` or
    exact names."""
    names = list(names)
    if not names or not attributes:
        return {}
    if "All" in names or ".*" in names:
        return dict(attributes)
    prefixes = tuple(name[:-1] for name in names if name.endswith(".*"))
    exact = set(names)
    return {name: value for name, value in attributes.items()
            if name in exact or (prefixes and name.startswith(prefixes))}


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One message as SQS answers it (before the protocol shapes it)."""

    message_id: str
    receipt_handle: str
    body: str
    md5_of_body: str
    attributes: dict[str, str]
    message_attributes: dict[str, dict[str, Any]]
    md5_of_message_attributes: str | None


def sequence_number(message_id: str) -> str:
    """SQS SequenceNumber: the message's sequence in its queue (dense, increasing)."""
    return str(int(message_id[8:24], 16))


def received_message(message: Message, receipt: bytes, count: int, first_ms: int,
                     system_names: Iterable[str], attribute_names: Iterable[str],
                     account: str, arn_of: Any, fifo: bool) -> ReceivedMessage:
    """A delivery -> what ReceiveMessage answers for it."""
    stored = message.attributes if isinstance(message.attributes, dict) else {}
    body = message.body
    attributes = sqs_attributes(stored, message.priority)
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
            check_text(body, "body")
        except (UnicodeDecodeError, SqsError):
            body = base64.b64encode(message.body).decode()  # type: ignore[arg-type]
            attributes[BODY_ENCODING_ATTRIBUTE] = {"DataType": "String",
                                                   "StringValue": "base64"}
    system: dict[str, str] = {}
    names = set(system_names)
    every = "All" in names
    values: dict[str, Any] = {
        "ApproximateReceiveCount": str(count),
        "ApproximateFirstReceiveTimestamp": str(first_ms),
        "SentTimestamp": str(message.enqueue_time),
        "SenderId": stored.get(SENDER) if isinstance(stored.get(SENDER), str) else account,
        "MessageGroupId": message.topic,
        "MessageDeduplicationId": stored.get(DEDUP) if fifo else None,
        "SequenceNumber": sequence_number(message.id) if fifo else None,
        "AWSTraceHeader": stored.get(TRACE) if isinstance(stored.get(TRACE), str) else None,
        "DeadLetterQueueSourceArn": arn_of(message.dead[0]) if message.dead else None,
    }
    for name, value in values.items():
        if value is not None and (every or name in names):
            system[name] = value
    chosen = wanted(attribute_names, attributes)
    return ReceivedMessage(
        message.id, base64.urlsafe_b64encode(receipt).decode(), body,
        md5_hex(body.encode()), system, chosen, md5_of_attributes(chosen))


def receipt_bytes(handle: Any, field: str = "ReceiptHandle") -> bytes:
    """A receipt handle -> the Lamina receipt (``ReceiptHandleIsInvalid`` when it cannot be
    one)."""
    if not isinstance(handle, str) or not handle or len(handle) > 1024:
        raise SqsError("ReceiptHandleIsInvalid",
                       f"The input receipt handle {str(handle)[:80]!r} is not valid.")
    try:
        return base64.urlsafe_b64decode(handle.encode())
    except (ValueError, TypeError):
        raise SqsError("ReceiptHandleIsInvalid",
                       f"The input receipt handle {handle[:80]!r} is not valid.") from None
