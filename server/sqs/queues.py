"""SQS queues on Lamina queues: names, URLs and ARNs, and queue attributes.

Names: a standard queue keeps its name (Lamina's rule applies: 1-64 of ``[A-Za-z0-9_-]``
starting with a letter, and names differing only in letter case are one queue); a FIFO queue
``NAME.fifo`` is the Lamina queue ``NAME-fifo`` (so no standard queue's name ends in
``-fifo``), with ``FifoQueue`` and its other FIFO attributes in its extras.

URLs are ``http(s)://HOST:PORT/ACCOUNT/NAME``; ``/ACCOUNT/NAME/TAG`` reads (receives,
deletes, changes visibility) through the Lamina tag ``TAG`` of that queue: a second reader
of the same messages. ARNs are ``arn:aws:sqs:REGION:ACCOUNT:NAME``.

Attributes SQS and Lamina share map onto the queue's Lamina attributes (same meaning, SQS's
ranges); the SQS-only ones are kept in the queue's extras and answered back.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lamina.engine.validation import NAME_RE

from .errors import SqsError, invalid

__all__ = ["QueueRef", "Naming", "lamina_attributes", "extras_of", "READ_ONLY_ATTRIBUTES"]

FIFO_SUFFIX = ".fifo"
LAMINA_FIFO_SUFFIX = "-fifo"
_SQS_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")

#: SQS attribute -> (Lamina attribute, SQS minimum, SQS maximum, SQS default).
SHARED_ATTRIBUTES: dict[str, tuple[str, int, int, int]] = {
    "DelaySeconds": ("delay", 0, 900, 0),
    "MaximumMessageSize": ("max_message_size", 1024, 1048576, 1048576),
    "MessageRetentionPeriod": ("retention", 60, 1209600, 345600),
    "ReceiveMessageWaitTimeSeconds": ("polling_wait", 0, 20, 0),
    "VisibilityTimeout": ("visibility_timeout", 0, 43200, 30),
}
FIFO_ATTRIBUTES = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
                   "FifoThroughputLimit")
#: SQS's quota on a queue policy; the other kept text attributes (a KMS key id, a redrive
#: allow policy of at most 10 queues) are held to the same.
MAX_KEPT_VALUE_BYTES = 8192
KEPT_ATTRIBUTES = ("Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
                   "SqsManagedSseEnabled", "RedriveAllowPolicy",
                   "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
READ_ONLY_ATTRIBUTES = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                        "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp",
                        "LastModifiedTimestamp", "QueueArn")
ALL_ATTRIBUTES = (*SHARED_ATTRIBUTES, "RedrivePolicy", *KEPT_ATTRIBUTES, "FifoQueue",
                  *READ_ONLY_ATTRIBUTES)


@dataclass(frozen=True, slots=True)
class QueueRef:
    """A queue as a request names it."""

    sqs_name: str
    lamina_name: str
    fifo: bool
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class Naming:
    """URLs and ARNs of this gateway."""

    account: str
    region: str
    base_url: str  # scheme://host:port, no trailing slash

    def url(self, sqs_name: str, base_url: str | None = None) -> str:
        return f"{base_url or self.base_url}/{self.account}/{sqs_name}"

    def arn(self, sqs_name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account}:{sqs_name}"

    def ref_of_url(self, url: Any) -> QueueRef:
        """A QueueUrl (full URL or path) -> the queue it names."""
        if not isinstance(url, str) or not url or len(url) > 2048:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        return _ref_of_url(url, self.account)

    def ref_of_arn(self, arn: Any, field: str) -> QueueRef:
        if not isinstance(arn, str):
            raise invalid(f"{field} must be a queue ARN.")
        parts = arn.split(":")
        if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or parts[4] != self.account:
            raise invalid(f"{field}: {arn[:200]!r} is not the ARN of a queue of this "
                          f"server (arn:aws:sqs:{self.region}:{self.account}:NAME).")
        return ref_of_name(parts[5], None, lookup=True, field=field)


@functools.lru_cache(maxsize=4096)  # clients name the same few queues request after request
def _ref_of_url(url: str, account: str) -> QueueRef:
    path = urlsplit(url).path if "://" in url else url
    parts = [part for part in path.split("/") if part]
    if len(parts) not in (2, 3) or parts[0] != account:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    tag = parts[2] if len(parts) == 3 else None
    if tag is not None and not NAME_RE.fullmatch(tag):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    return ref_of_name(parts[1], tag, lookup=True)


def ref_of_name(name: Any, tag: str | None = None, *, lookup: bool = False,
                field: str = "QueueName") -> QueueRef:
    """An SQS queue name -> its Lamina queue. ``lookup``: the name comes from a request that
    names an existing queue (an impossible name is then a queue that does not exist)."""
    if not isinstance(name, str):
        raise invalid(f"{field} must be a string.")
    fifo = name.endswith(FIFO_SUFFIX)
    stem = name[:-len(FIFO_SUFFIX)] if fifo else name
    lamina = stem + LAMINA_FIFO_SUFFIX if fifo else stem
    if not _SQS_NAME_RE.fullmatch(stem) or len(name) > 80:
        if lookup:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        raise invalid(f"{field}: can only include alphanumeric characters, hyphens, or "
                      "underscores. 1 to 80 in length (a FIFO queue's ends in .fifo).")
    if not NAME_RE.fullmatch(lamina) or (not fifo and lamina.lower().endswith(
            LAMINA_FIFO_SUFFIX)):
        if lookup:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        raise invalid(f"{field}: {name[:80]!r} is an SQS name this server cannot hold: "
                      "names start with a letter and are at most 64 characters (a FIFO "
                      "queue's at most 59 before .fifo), and only a FIFO queue's name ends "
                      "in -fifo (FIFO queues are stored that way).")
    return QueueRef(name, lamina, fifo, tag)


def sqs_name_of(lamina_name: str) -> str:
    """A Lamina queue's SQS name."""
    if lamina_name.lower().endswith(LAMINA_FIFO_SUFFIX):
        return lamina_name[:-len(LAMINA_FIFO_SUFFIX)] + FIFO_SUFFIX
    return lamina_name


def _int_attribute(name: str, value: Any) -> int:
    low, high = SHARED_ATTRIBUTES[name][1:3]
    text = str(value)
    if not re.fullmatch(r"\d{1,10}", text) or not low <= int(text) <= high:
        raise SqsError("InvalidAttributeValue",
                       f"Invalid value for the parameter {name}: must be an integer from "
                       f"{low} to {high}.")
    return int(text)


def _bool_attribute(name: str, value: Any) -> bool:
    if str(value).lower() not in ("true", "false"):
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}: "
                       "must be true or false.")
    return str(value).lower() == "true"


def _check_kept_size(name: str, value: str) -> None:
    if len(value.encode()) > MAX_KEPT_VALUE_BYTES:
        raise SqsError("InvalidAttributeValue", f"{name} takes at most "
                       f"{MAX_KEPT_VALUE_BYTES} bytes.")


def _json_attribute(name: str, value: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise SqsError("InvalidAttributeValue",
                       f"Invalid value for the parameter {name}: must be a JSON object.")
    return parsed


def check_attribute_names(attributes: Any, fifo: bool, creating: bool) -> dict[str, str]:
    """The Attributes map of CreateQueue / SetQueueAttributes: names known and settable."""
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        raise invalid("Attributes must be a map of attribute names to values.")
    for name, value in attributes.items():
        if name in READ_ONLY_ATTRIBUTES or name not in ALL_ATTRIBUTES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {str(name)[:80]}.")
        if name in FIFO_ATTRIBUTES and not fifo and not (name == "FifoQueue" and creating):
            raise SqsError("InvalidAttributeName",
                           f"Unknown Attribute {name}: it applies to FIFO queues only.")
        if name == "FifoQueue" and not creating:
            raise SqsError("InvalidAttributeName",
                           "FifoQueue is set when the queue is created.")
        if not isinstance(value, str):
            raise SqsError("InvalidAttributeValue",
                           f"Invalid value for the parameter {name}: must be a string.")
    if creating and fifo and str(attributes.get("FifoQueue", "true")).lower() != "true":
        raise invalid("A queue whose name ends in .fifo is a FIFO queue: FifoQueue must be "
                      "true.")
    if creating and not fifo and str(attributes.get("FifoQueue", "false")).lower() == "true":
        raise invalid("The name of a FIFO queue can only include alphanumeric characters, "
                      "hyphens, or underscores, must end with .fifo suffix.")
    return attributes


def lamina_attributes(attributes: dict[str, str], naming: Naming, creating: bool,
                      dlq_name_of: Any) -> dict[str, Any]:
    """The Lamina attributes an SQS Attributes map sets (SQS's defaults when creating)."""
    result: dict[str, Any] = {}
    if creating:
        for name, (lamina, _, _, default) in SHARED_ATTRIBUTES.items():
            result[lamina] = default
    for name, value in attributes.items():
        if name in SHARED_ATTRIBUTES:
            result[SHARED_ATTRIBUTES[name][0]] = _int_attribute(name, value)
        elif name == "RedrivePolicy":
            result["redrive"] = redrive_of(value, naming, dlq_name_of)
    if "visibility_timeout" in result:
        result["visibility_timeout"] = max(1, result["visibility_timeout"])
    return result


def redrive_of(value: str, naming: Naming, dlq_name_of: Any) -> dict[str, Any] | None:
    """RedrivePolicy -> Lamina ``redrive`` (an empty value removes it)."""
    if value == "":
        return None
    policy = _json_attribute("RedrivePolicy", value)
    target, count = policy.get("deadLetterTargetArn"), policy.get("maxReceiveCount")
    if target is None or count is None:
        raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is "
                       "invalid. Reason: Redrive policy does not contain mandatory "
                       "attribute: deadLetterTargetArn and maxReceiveCount.")
    try:
        receives = int(count)
    except (TypeError, ValueError):
        receives = 0
    if not 1 <= receives <= 1000:
        raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is "
                       "invalid. Reason: maxReceiveCount must be an integer from 1 to 1000.")
    ref = naming.ref_of_arn(target, "RedrivePolicy.deadLetterTargetArn")
    return {"dlq": dlq_name_of(ref), "max_receives": receives}


def extras_of(attributes: dict[str, str], fifo: bool, old: dict[str, Any] | None,
              now_s: int) -> dict[str, Any]:
    """The queue's extras after an SQS Attributes map (SQS-only attributes, checked)."""
    extras = dict(old or {})
    if fifo:
        extras["FifoQueue"] = True
        extras.setdefault("ContentBasedDeduplication", False)
        extras.setdefault("DeduplicationScope", "queue")
        extras.setdefault("FifoThroughputLimit", "perQueue")
    for name, value in attributes.items():
        if name == "ContentBasedDeduplication":
            extras[name] = _bool_attribute(name, value)
        elif name == "SqsManagedSseEnabled":
            extras[name] = _bool_attribute(name, value)
        elif name == "DeduplicationScope":
            if value not in ("messageGroup", "queue"):
                raise SqsError("InvalidAttributeValue", "DeduplicationScope must be "
                               "messageGroup or queue.")
            extras[name] = value
        elif name == "FifoThroughputLimit":
            if value not in ("perQueue", "perMessageGroupId"):
                raise SqsError("InvalidAttributeValue", "FifoThroughputLimit must be "
                               "perQueue or perMessageGroupId.")
            extras[name] = value
        elif name == "RedriveAllowPolicy":
            _check_kept_size(name, value)
            if value:
                policy = _json_attribute(name, value)
                if policy.get("redrivePermission") not in ("allowAll", "denyAll", "byQueue"):
                    raise SqsError("InvalidAttributeValue", "RedriveAllowPolicy "
                                   "redrivePermission must be allowAll, denyAll or byQueue.")
            extras[name] = value
        elif name == "KmsDataKeyReusePeriodSeconds":
            if not re.fullmatch(r"\d{1,6}", value) or not 60 <= int(value) <= 86400:
                raise SqsError("InvalidAttributeValue", "KmsDataKeyReusePeriodSeconds must "
                               "be an integer from 60 to 86400.")
            extras[name] = value
        elif name in ("Policy", "KmsMasterKeyId"):
            _check_kept_size(name, value)
            extras[name] = value
        elif name == "VisibilityTimeout":  # 0: Lamina holds 1 s, answered as 0
            if int(value) == 0:
                extras[name] = 0
            else:
                extras.pop(name, None)
    if extras.get("FifoThroughputLimit") == "perMessageGroupId" and \
            extras.get("DeduplicationScope") != "messageGroup":
        raise SqsError("InvalidAttributeValue", "FifoThroughputLimit perMessageGroupId "
                       "needs DeduplicationScope messageGroup.")
    if attributes:
        extras["LastModifiedTimestamp"] = now_s
    return extras


def answer_attributes(names: list[str], lamina: dict[str, Any], extras: dict[str, Any],
                      created_ms: int, stats: dict[str, Any] | None, sqs_name: str,
                      naming: Naming, sqs_name_of_dlq: Any) -> dict[str, str]:
    """GetQueueAttributes' answer for ``names`` (``All``: every one)."""
    every = "All" in names
    fifo = bool(extras.get("FifoQueue"))
    values: dict[str, Any] = {}
    for name, (attr, _, _, _) in SHARED_ATTRIBUTES.items():
        values[name] = lamina[attr]
    if extras.get("VisibilityTimeout") == 0 and lamina["visibility_timeout"] == 1:
        values["VisibilityTimeout"] = 0
    redrive = lamina.get("redrive")
    if redrive:
        values["RedrivePolicy"] = json.dumps({
            "deadLetterTargetArn": naming.arn(sqs_name_of_dlq(redrive["dlq"])),
            "maxReceiveCount": redrive["max_receives"]}, separators=(",", ":"))
    for name in ("Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
                 "RedriveAllowPolicy"):
        if extras.get(name):
            values[name] = extras[name]
    values["SqsManagedSseEnabled"] = extras.get("SqsManagedSseEnabled", False)
    if fifo:
        for name in FIFO_ATTRIBUTES:
            values[name] = extras.get(name)
    values["CreatedTimestamp"] = created_ms // 1000
    values["LastModifiedTimestamp"] = extras.get("LastModifiedTimestamp", created_ms // 1000)
    values["QueueArn"] = naming.arn(sqs_name)
    if stats is not None:
        tag = stats["tags"].get("default", {})
        values["ApproximateNumberOfMessages"] = tag.get("active", 0) + tag.get("parked", 0)
        values["ApproximateNumberOfMessagesNotVisible"] = tag.get("inflight", 0)
        values["ApproximateNumberOfMessagesDelayed"] = tag.get("delayed", 0)
    answer: dict[str, str] = {}
    for name, value in values.items():
        if value is None or not (every or name in names):
            continue
        answer[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return answer


def check_requested_names(names: Any) -> list[str]:
    """GetQueueAttributes' AttributeNames: known names, ``All``."""
    if names is None:
        return []
    if not isinstance(names, list):
        raise invalid("AttributeNames must be a list.")
    for name in names:
        if name != "All" and name not in ALL_ATTRIBUTES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {str(name)[:80]}.")
    return names
