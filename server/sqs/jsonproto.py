"""AWS JSON 1.0, as current SDKs speak it to SQS: ``POST /`` with
``X-Amz-Target: AmazonSQS.<Action>`` and a JSON object of the action's parameters; the answer
is a JSON object, an error ``{"__type": "com.amazonaws.sqs#<Code>", "message": ...}`` with the
Query code in the ``x-amzn-query-error`` header. Blobs (binary attribute values) travel as
base64 text.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from .errors import SqsError

__all__ = ["CONTENT_TYPE", "TARGET_PREFIX", "parse_request", "render_error", "render_result"]

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."


def _decode_blobs(attributes: Any) -> None:
    if not isinstance(attributes, dict):
        return
    for attribute in attributes.values():
        if isinstance(attribute, dict) and isinstance(attribute.get("BinaryValue"), str):
            try:
                attribute["BinaryValue"] = base64.b64decode(attribute["BinaryValue"],
                                                            validate=True)
            except (binascii.Error, ValueError):
                raise SqsError("InvalidParameterValue", "A BinaryValue is not valid "
                               "base64.") from None


def parse_request(target: str, body: bytes) -> tuple[str, dict[str, Any]]:
    """-> (action, parameters), blobs decoded."""
    action = target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else ""
    if not action:
        raise SqsError("InvalidAction", f"The action {target[:80]!r} is not valid for this "
                       "endpoint (X-Amz-Target: AmazonSQS.<Action>).")
    try:
        params = json.loads(body) if body.strip() else {}
    except (ValueError, UnicodeDecodeError):
        raise SqsError("InvalidParameterValue", "The request body is not valid JSON.") \
            from None
    if not isinstance(params, dict):
        raise SqsError("InvalidParameterValue", "The request body must be a JSON object.")
    _decode_blobs(params.get("MessageAttributes"))
    _decode_blobs(params.get("MessageSystemAttributes"))
    entries = params.get("Entries")
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict):
                _decode_blobs(entry.get("MessageAttributes"))
                _decode_blobs(entry.get("MessageSystemAttributes"))
    return action, params


def _default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot encode {type(value).__name__}")


def render_result(result: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    body = json.dumps(result, default=_default, separators=(",", ":")).encode()
    return 200, [("Content-Type", CONTENT_TYPE)], body


def render_error(error: SqsError) -> tuple[int, list[tuple[str, str]], bytes]:
    body = json.dumps({"__type": f"com.amazonaws.sqs#{error.code}",
                       "message": error.message}).encode()
    fault = "Sender" if error.sender_fault else "Receiver"
    return error.status, [("Content-Type", CONTENT_TYPE),
                          ("x-amzn-query-error", f"{error.query_code};{fault}")], body
