"""The Query protocol, as older SDKs and tools speak it to SQS: ``Action=...`` and the
action's parameters form-encoded (POST body or GET query string), flattened with numbered
members (``Attribute.1.Name``, ``MessageAttribute.1.Value.StringValue``,
``SendMessageBatchRequestEntry.1.Id`` ...); answers are XML documents, errors an
``<ErrorResponse>`` with the Query code.

Parameters are converted to the JSON protocol's shape, answers from it, so the actions are
written once.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from .errors import SqsError

__all__ = ["CONTENT_TYPE", "parse_request", "render_error", "render_result"]

CONTENT_TYPE = "text/xml"
XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
MAX_PARAMETERS = 2000
_INDEX_RE = re.compile(r"[1-9]\d{0,3}")

#: Query member -> JSON member: lists of text.
_LISTS = {"AttributeName": "AttributeNames", "MessageAttributeName": "MessageAttributeNames",
          "MessageSystemAttributeName": "MessageSystemAttributeNames", "TagKey": "TagKeys",
          "AWSAccountId": "AWSAccountIds", "ActionName": "Actions"}
#: Query member -> (JSON member, key field, value field): maps of text.
_MAPS = {"Attribute": ("Attributes", "Name", "Value"), "Tag": ("Tags", "Key", "Value")}
_MESSAGE_ATTRIBUTES = {"MessageAttribute": "MessageAttributes",
                       "MessageSystemAttribute": "MessageSystemAttributes"}
_ENTRIES = ("SendMessageBatchRequestEntry", "DeleteMessageBatchRequestEntry",
            "ChangeMessageVisibilityBatchRequestEntry")


def _tree(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """``a.1.b=v`` -> ``{"a": {"1": {"b": "v"}}}``."""
    root: dict[str, Any] = {}
    for key, value in pairs:
        node = root
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SqsError("InvalidParameterValue", f"Parameter {key[:80]!r} conflicts "
                               "with another parameter.")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise SqsError("InvalidParameterValue", f"Parameter {key[:80]!r} conflicts with "
                           "another parameter.")
        node[parts[-1]] = value
    return root


def _members(node: Any, name: str) -> list[Any]:
    """A numbered member's items, in index order."""
    if not isinstance(node, dict) or not all(_INDEX_RE.fullmatch(key) for key in node):
        raise SqsError("InvalidParameterValue", f"{name} must be numbered {name}.1, "
                       f"{name}.2, ...")
    return [node[key] for key in sorted(node, key=int)]


def _message_attributes(node: Any, name: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in _members(node, name):
        if not isinstance(item, dict) or not isinstance(item.get("Name"), str) \
                or not isinstance(item.get("Value"), dict):
            raise SqsError("InvalidParameterValue", f"Each {name} needs a Name and a Value.")
        value = dict(item["Value"])
        if isinstance(value.get("BinaryValue"), str):
            try:
                value["BinaryValue"] = base64.b64decode(value["BinaryValue"], validate=True)
            except (binascii.Error, ValueError):
                raise SqsError("InvalidParameterValue", f"{name} {item['Name'][:80]!r}: "
                               "BinaryValue is not valid base64.") from None
        result[item["Name"]] = value
    return result


def _normalize(tree: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in tree.items():
        if key in _LISTS:
            params[_LISTS[key]] = _members(value, key)
        elif key in _MAPS:
            member, key_field, value_field = _MAPS[key]
            params[member] = {item.get(key_field): item.get(value_field, "")
                              for item in _members(value, key) if isinstance(item, dict)}
        elif key in _MESSAGE_ATTRIBUTES:
            params[_MESSAGE_ATTRIBUTES[key]] = _message_attributes(value, key)
        elif key in _ENTRIES:
            params["Entries"] = [_normalize(item) if isinstance(item, dict) else item
                                 for item in _members(value, key)]
        else:
            params[key] = value
    return params


def parse_request(form: bytes, path: str) -> tuple[str, dict[str, Any]]:
    """-> (action, parameters); a request to a queue's URL names that queue."""
    try:
        pairs = parse_qsl(form.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=MAX_PARAMETERS)
    except (UnicodeDecodeError, ValueError):
        raise SqsError("InvalidParameterValue", "The request is not a valid form of at most "
                       f"{MAX_PARAMETERS} parameters.") from None
    tree = _tree(pairs)
    action = tree.pop("Action", None)
    tree.pop("Version", None)
    if not isinstance(action, str) or not action:
        raise SqsError("MissingParameter", "The request must contain the parameter Action.")
    params = _normalize(tree)
    if "QueueUrl" not in params and path.strip("/").count("/") in (1, 2):
        params["QueueUrl"] = path
    return action, params


# -- answers ----------------------------------------------------------------------------------


#: A carriage return is written as a reference: XML readers turn a literal one into a line
#: feed, which would change a body (and its MD5) on its way to the client.
_ENTITIES = {"\r": "&#xD;"}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return escape(str(value), _ENTITIES)


def _element(name: str, value: Any) -> str:
    return f"<{name}>{_text(value)}</{name}>"


def _pairs(tag: str, mapping: dict[str, Any], key: str, value: str) -> str:
    return "".join(f"<{tag}>{_element(key, k)}{_element(value, v)}</{tag}>"
                   for k, v in mapping.items())


def _message_attribute_xml(attributes: dict[str, Any]) -> str:
    parts = []
    for name, attribute in attributes.items():
        inner = "".join(_element(field, attribute[field])
                        for field in ("StringValue", "BinaryValue", "DataType")
                        if field in attribute)
        parts.append(f"<MessageAttribute>{_element('Name', name)}<Value>{inner}</Value>"
                     "</MessageAttribute>")
    return "".join(parts)


def _body(action: str, result: dict[str, Any]) -> str:
    out: list[str] = []
    for key, value in result.items():
        if key in ("QueueUrls", "queueUrls"):
            out.extend(_element("QueueUrl", url) for url in value)
        elif key == "Attributes":
            out.append(_pairs("Attribute", value, "Name", "Value"))
        elif key == "Tags":
            out.append(_pairs("Tag", value, "Key", "Value"))
        elif key == "Messages":
            for message in value:
                out.append(f"<Message>{_message(message)}</Message>")
        elif key == "Successful":
            out.extend(f"<{action}ResultEntry>{_body(action, entry)}</{action}ResultEntry>"
                       for entry in value)
        elif key == "Failed":
            out.extend(f"<BatchResultErrorEntry>{_body(action, entry)}</BatchResultErrorEntry>"
                       for entry in value)
        elif key == "Results":
            out.extend(f"<{action}ResultEntry>{_body(action, entry)}</{action}ResultEntry>"
                       for entry in value)
        else:
            out.append(_element(key, value))
    return "".join(out)


def _message(message: dict[str, Any]) -> str:
    out: list[str] = []
    for key, value in message.items():
        if key == "Attributes":
            out.append(_pairs("Attribute", value, "Name", "Value"))
        elif key == "MessageAttributes":
            out.append(_message_attribute_xml(value))
        else:
            out.append(_element(key, value))
    return "".join(out)


def render_result(action: str, result: dict[str, Any], request_id: str
                  ) -> tuple[int, list[tuple[str, str]], bytes]:
    document = (f'<?xml version="1.0"?><{action}Response xmlns="{XMLNS}">'
                f"<{action}Result>{_body(action, result)}</{action}Result>"
                f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
                f"</{action}Response>")
    return 200, [("Content-Type", CONTENT_TYPE)], document.encode()


def render_error(error: SqsError, request_id: str) -> tuple[int, list[tuple[str, str]], bytes]:
    fault = "Sender" if error.sender_fault else "Receiver"
    document = (f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error>'
                f"<Type>{fault}</Type><Code>{escape(error.query_code)}</Code>"
                f"<Message>{escape(error.message)}</Message><Detail/></Error>"
                f"<RequestId>{request_id}</RequestId></ErrorResponse>")
    return error.status, [("Content-Type", CONTENT_TYPE)], document.encode()
