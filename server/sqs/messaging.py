"""SQS message actions: SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch),
ChangeMessageVisibility(Batch), over the server's own send / receive / delete /
change_visibility (a FIFO queue's sends: the engine's deduplicated send).

Parameters arrive in the JSON protocol's shape (the Query protocol is converted to it);
answers leave in it. Numbers may arrive as text (Query).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable, TypeVar

from lamina.engine import wall_clock_ms
from lamina.engine.errors import (
    LaminaError,
    MessageTooLarge,
    QueueNotFound,
    StaleReceipt,
    error_from_wire,
)
from lamina.engine.records import Message
from lamina.engine.results import Sent, VisibilityChanged

from .context import Context
from .errors import SqsError, batch_entry_error, from_lamina, invalid, missing
from .messages import (
    DEDUP,
    SYSTEM_ATTRIBUTE_NAMES,
    SENDER,
    TRACE,
    attributes_size,
    check_text,
    checked_attributes,
    checked_system_attributes,
    md5_hex,
    md5_of_attributes,
    receipt_bytes,
    received_message,
    sequence_number,
    stored_attributes,
)
from .queues import ALL_ATTRIBUTES as ALL_QUEUE_ATTRIBUTES
from .queues import QueueRef, sqs_name_of

__all__ = ["MESSAGE_ACTIONS", "int_param", "queue_of"]

MAX_BATCH_ENTRIES = 10
MAX_PAYLOAD_BYTES = 1048576  # SQS: a message, and a whole batch, at most 1 MiB
MAX_VISIBILITY_S = 43200
MAX_WAIT_S = 20
T = TypeVar("T")
_BATCH_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_FIFO_ID_RE = re.compile(r"[!-~]{1,128}")


def int_param(params: dict[str, Any], name: str, low: int, high: int,
              default: int | None = None) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,12}", value):
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise invalid(f"Value {str(value)[:40]} for parameter {name} is invalid. Reason: "
                      f"must be an integer from {low} to {high}.")
    return value


def queue_of(ctx: Context, params: dict[str, Any]) -> QueueRef:
    url = params.get("QueueUrl")
    if url is None:
        raise missing("QueueUrl")
    return ctx.naming.ref_of_url(url)


def _tag_args(ref: QueueRef) -> dict[str, Any]:
    return {"queue": ref.lamina_name, "tag": ref.tag} if ref.tag else {"queue": ref.lamina_name}


def _batch_entries(params: dict[str, Any]) -> list[dict[str, Any]]:
    entries = params.get("Entries")
    if entries is None:
        raise missing("Entries")
    if not isinstance(entries, list) or not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the "
                       "request.")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per "
                       f"request are {MAX_BATCH_ENTRIES}. You have sent {len(entries)}.")
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id") if isinstance(entry, dict) else None
        if not isinstance(entry_id, str) or not _BATCH_ID_RE.fullmatch(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain "
                           "alphanumeric characters, hyphens and underscores. It can be at "
                           "most 80 letters long.")
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failed(entry_id: str, error: SqsError | LaminaError) -> dict[str, Any]:
    code, sender_fault, message = batch_entry_error(error)
    return {"Id": entry_id, "SenderFault": sender_fault, "Code": code, "Message": message}


def _checked_entries(params: dict[str, Any], check: Callable[[int, dict[str, Any]], T]
                     ) -> tuple[list[dict[str, Any]], list[tuple[str, T]]]:
    """A batch's entries through ``check(index, entry)``: -> (the ``Failed`` entries of those
    it refused, ``(Id, checked value)`` of the others, in order)."""
    failed: list[dict[str, Any]] = []
    ready: list[tuple[str, T]] = []
    for index, entry in enumerate(_batch_entries(params)):
        try:
            ready.append((entry["Id"], check(index, entry)))
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
    return failed, ready


# -- send -----------------------------------------------------------------------------------


class _Outgoing:
    """One message to send, checked: its Lamina entry and what the answer reports."""

    def __init__(self, ctx: Context, ref: QueueRef, entry: dict[str, Any], where: str):
        body = entry.get("MessageBody")
        if body is None:
            raise missing("MessageBody")
        if not isinstance(body, str) or not body:
            raise invalid(f"{where}: the message body must be a non-empty string.")
        check_text(body, f"{where}: the message body", "InvalidMessageContents")
        self.body = body
        self.where = where
        attributes = checked_attributes(entry.get("MessageAttributes"), where)
        system = checked_system_attributes(entry.get("MessageSystemAttributes"), where)
        self.size = len(body.encode()) + attributes_size(attributes) + attributes_size(system)
        if self.size > MAX_PAYLOAD_BYTES:
            raise invalid(f"{where}: one or more parameters are invalid. Reason: message must "
                          f"be shorter than {MAX_PAYLOAD_BYTES} bytes.")
        self.md5_of_attributes = md5_of_attributes(attributes)
        self.md5_of_system = md5_of_attributes(system)
        stored, priority = stored_attributes(attributes, where)
        if system:
            stored[TRACE] = system["AWSTraceHeader"]["StringValue"]
        if ctx.bridge.key_id is not None:
            stored[SENDER] = ctx.bridge.key_id
        lamina: dict[int, Any] = {1: body}
        delay = int_param(entry, "DelaySeconds", 0, 900)
        group = entry.get("MessageGroupId")
        dedup = entry.get("MessageDeduplicationId")
        self.group: str | None = None
        self.dedup: str | None = None
        if ref.fifo:
            if delay is not None:
                raise invalid(f"{where}: the request includes a parameter that is not valid "
                              "for this queue type: DelaySeconds (per message) on a FIFO "
                              "queue.")
            if group is None:
                raise missing("MessageGroupId")
            for name, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
                if value is not None and (not isinstance(value, str)
                                          or not _FIFO_ID_RE.fullmatch(value)):
                    raise invalid(f"{where}: {name} is 1-128 printable ASCII characters "
                                  "(letters, digits, punctuation).")
            self.group, self.dedup = group, dedup
            lamina[3] = group
            if priority is not None:
                raise invalid(f"{where}: lamina.priority does not apply to a FIFO queue.")
        else:
            if group is not None or dedup is not None:
                raise invalid(f"{where}: MessageGroupId and MessageDeduplicationId apply to "
                              "FIFO queues only here.")
            if delay is not None:
                lamina[5] = delay
            if priority is not None:
                lamina[4] = priority
        self.stored = stored
        self.lamina = lamina

    def finish(self) -> Any:
        if self.stored:
            self.lamina[2] = self.stored
        return self.lamina if len(self.lamina) > 1 else self.body

    def answer(self, sent: Sent, fifo: bool) -> dict[str, Any]:
        result: dict[str, Any] = {"MessageId": sent.id,
                                  "MD5OfMessageBody": md5_hex(self.body.encode())}
        if self.md5_of_attributes:
            result["MD5OfMessageAttributes"] = self.md5_of_attributes
        if self.md5_of_system:
            result["MD5OfMessageSystemAttributes"] = self.md5_of_system
        if fifo:
            result["SequenceNumber"] = sequence_number(sent.id)
        return result


async def _send(ctx: Context, ref: QueueRef, outgoing: list[_Outgoing]) -> list[Any]:
    """Send checked messages; per message a ``Sent`` or the error that refused it."""
    if ref.tag is not None:
        raise invalid("Messages are sent to a queue, not through one of its tags: use the "
                      "queue's URL.")
    if not ref.fifo:
        entries = [out.finish() for out in outgoing]
        answer = await ctx.bridge.call("send", {"queue": ref.lamina_name, "messages": entries},
                                       sum(out.size for out in outgoing))
        return answer.results

    def run(engine: Any, caller: str | None) -> list[Any]:
        engine.check_queue_access(ref.lamina_name, caller=caller)  # the send checks "send"
        extras = engine.queue_extras(ref.lamina_name)
        if not extras.get("FifoQueue"):
            raise QueueNotFound("queue is not a FIFO queue", field="queue")
        keys = []
        for out in outgoing:
            dedup = out.dedup
            if dedup is None:
                if not extras.get("ContentBasedDeduplication"):
                    raise invalid("The queue should either have ContentBasedDeduplication "
                                  "enabled or MessageDeduplicationId provided explicitly.")
                dedup = hashlib.sha256(out.body.encode()).hexdigest()
            out.stored[DEDUP] = dedup
            key = dedup.encode()
            if extras.get("DeduplicationScope") == "messageGroup":
                key = out.group.encode() + b"\x00" + key  # type: ignore[union-attr]
            keys.append(key)
        entries = [out.finish() for out in outgoing]
        return engine.send_deduplicated(ref.lamina_name, entries, keys, caller=caller)

    return await ctx.bridge.job(run)


def _send_error(error: LaminaError, out: _Outgoing) -> SqsError:
    """The SQS error for a refused send; a message over the queue's size limit is named as
    the request named it (Lamina names its own entry and attribute)."""
    if isinstance(error, MessageTooLarge):
        reason = error.message.split(": ", 1)[-1].replace(
            "max_message_size", "the queue's MaximumMessageSize")
        return invalid(f"{out.where}: one or more parameters are invalid. Reason: {reason}.")
    return from_lamina(error)


async def send_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    out = _Outgoing(ctx, ref, params, "SendMessage")
    result = (await _send(ctx, ref, [out]))[0]
    if isinstance(result, LaminaError):
        raise _send_error(result, out)
    return out.answer(result, ref.fifo)


async def send_message_batch(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    failed, ready = _checked_entries(
        params, lambda index, entry: _Outgoing(ctx, ref, entry, f"Entries[{index}]"))
    total = sum(out.size for _, out in ready)
    if total > MAX_PAYLOAD_BYTES:
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                       f"{MAX_PAYLOAD_BYTES} bytes. You have sent {total} bytes.")
    successful: list[dict[str, Any]] = []
    if ready:
        results = await _send(ctx, ref, [out for _, out in ready])
        for (entry_id, out), result in zip(ready, results):
            if isinstance(result, LaminaError):
                failed.append(_failed(entry_id, _send_error(result, out)))
            else:
                successful.append({"Id": entry_id, **out.answer(result, ref.fifo)})
    return {"Successful": successful, "Failed": failed}


# -- receive ----------------------------------------------------------------------------------


def _names(params: dict[str, Any], name: str) -> list[str]:
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(f"{name} must be a list of strings.")
    return value


async def receive_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    count = int_param(params, "MaxNumberOfMessages", 1, 10, 1)
    visibility = int_param(params, "VisibilityTimeout", 0, MAX_VISIBILITY_S)
    wait = int_param(params, "WaitTimeSeconds", 0, MAX_WAIT_S)
    system_names = _names(params, "AttributeNames") + _names(params,
                                                            "MessageSystemAttributeNames")
    for name in system_names:
        if name != "All" and name not in SYSTEM_ATTRIBUTE_NAMES \
                and name not in ALL_QUEUE_ATTRIBUTES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:80]}.")
    attribute_names = _names(params, "MessageAttributeNames")
    for name in attribute_names:
        if not 1 <= len(name) <= 256:
            raise invalid("MessageAttributeNames: a name is 1-256 characters.")
    attempt_id = params.get("ReceiveRequestAttemptId")
    if attempt_id is not None:
        if not isinstance(attempt_id, str) or not _FIFO_ID_RE.fullmatch(attempt_id):
            raise invalid("ReceiveRequestAttemptId is 1-128 printable ASCII characters.")
        if ref.fifo:
            remembered = ctx.state.attempt(ref.lamina_name, attempt_id)
            if remembered is not None:
                return remembered
    args = _tag_args(ref)
    args["max"] = count
    if visibility is not None:
        args["visibility_timeout"] = max(1, visibility)  # a Lamina lease lasts >= 1 s
    if wait is not None:
        args["wait"] = wait
    answer = await ctx.bridge.call("receive", args)
    naming = ctx.naming
    messages = []
    for delivery in answer.deliveries:
        received = received_message(
            Message.decode(delivery.record), delivery.receipt, delivery.dequeue_count,
            delivery.first_dequeue_time, system_names,
            attribute_names, naming.account, lambda name: naming.arn(sqs_name_of(name)),
            ref.fifo)
        message: dict[str, Any] = {"MessageId": received.message_id,
                                   "ReceiptHandle": received.receipt_handle,
                                   "MD5OfBody": received.md5_of_body, "Body": received.body}
        if received.attributes:
            message["Attributes"] = received.attributes
        if received.message_attributes:
            message["MessageAttributes"] = received.message_attributes
            message["MD5OfMessageAttributes"] = received.md5_of_message_attributes
        messages.append(message)
    result = {"Messages": messages} if messages else {}
    if attempt_id is not None and ref.fifo and messages:
        leases_end_ms = min(delivery.next_visible_time for delivery in answer.deliveries)
        ctx.state.remember_attempt(ref.lamina_name, attempt_id, result,
                                   (leases_end_ms - wall_clock_ms()) / 1000)
    return result


# -- delete / change visibility --------------------------------------------------------------


async def _standings(ctx: Context, ref: QueueRef, receipts: list[bytes]) -> list[str]:
    """Where the leases of stale receipts stand (``Engine.receipt_standing``)."""
    def run(engine: Any, caller: str | None) -> list[str]:
        return [engine.receipt_standing(ref.lamina_name, receipt, ref.tag, caller=caller)
                for receipt in receipts]

    return await ctx.bridge.job(run)


async def _delete(ctx: Context, ref: QueueRef, handles: list[bytes]) -> list[SqsError | None]:
    """Per handle None (done) or the error. SQS: a handle of an earlier receive (its lease
    ended: the message was deleted, received again or is visible again) "succeeds, but the
    message will not be deleted"; Lamina calls that receipt stale, so it answers success
    too, except on a FIFO queue, where SQS refuses a handle whose visibility timeout passed
    as expired (a message deleted already stays a success: a retried delete; so does the
    older of two handles of one message deleted in one batch). A handle this server never
    issued for this queue is ``ReceiptHandleIsInvalid``."""
    now = wall_clock_ms()
    receipts = [ctx.state.handles.resolve(handle, now) for handle in handles]
    args = _tag_args(ref)
    args["receipts"] = receipts
    results = (await ctx.bridge.call("delete", args)).results
    for handle, result in zip(handles, results):
        if result is None or isinstance(result, StaleReceipt):
            ctx.state.handles.forget(handle)
    errors = [None if result is None or isinstance(result, StaleReceipt)
              else from_lamina(result) for result in results]
    stale = [index for index, result in enumerate(results) if isinstance(result, StaleReceipt)]
    if ref.fifo and stale:
        standings = await _standings(ctx, ref, [receipts[index] for index in stale])
        for index, standing in zip(stale, standings):
            if standing != "gone":
                errors[index] = invalid("Value for parameter ReceiptHandle is invalid. "
                                        "Reason: The receipt handle has expired.")
    return errors


async def delete_message(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    if params.get("ReceiptHandle") is None:
        raise missing("ReceiptHandle")
    error = (await _delete(ctx, ref, [receipt_bytes(params["ReceiptHandle"])]))[0]
    if error is not None:
        raise error
    return {}


async def delete_message_batch(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    failed, ready = _checked_entries(
        params, lambda _, entry: receipt_bytes(entry.get("ReceiptHandle")))
    successful = []
    if ready:
        errors = await _delete(ctx, ref, [handle for _, handle in ready])
        for (entry_id, _), error in zip(ready, errors):
            if error is None:
                successful.append({"Id": entry_id})
            else:
                failed.append(_failed(entry_id, error))
    return {"Successful": successful, "Failed": failed}


async def _change(ctx: Context, ref: QueueRef, changes: list[tuple[bytes, int]]
                  ) -> list[VisibilityChanged | SqsError]:
    """Per change the new lease or the error. SQS: a handle whose message is visible again is
    ``MessageNotInflight``; one whose message was received again since, or deleted, names a
    message that "does not exist or is not available" (``InvalidParameterValue``)."""
    now = wall_clock_ms()
    handles = ctx.state.handles
    receipts = [handles.resolve(handle, now) for handle, _ in changes]
    args = _tag_args(ref)
    args["entries"] = [[receipt, timeout] for receipt, (_, timeout) in zip(receipts, changes)]
    results = (await ctx.bridge.call("change_visibility", args)).result["results"]
    decoded: list[VisibilityChanged | SqsError] = []
    stale: list[int] = []
    for (handle, _), result in zip(changes, results):
        if isinstance(result, dict):  # an error map
            error = error_from_wire(result)
            if isinstance(error, StaleReceipt):
                stale.append(len(decoded))
            decoded.append(from_lamina(error))
            continue
        receipt, end_ms = result
        handles.changed(handle, receipt, end_ms, now)
        decoded.append(VisibilityChanged(receipt, end_ms))
    if stale:
        standings = await _standings(ctx, ref, [receipts[index] for index in stale])
        for index, standing in zip(stale, standings):
            decoded[index] = (
                SqsError("MessageNotInflight", "The message is not in flight: its visibility "
                         "timeout passed.") if standing in ("visible", "current") else
                invalid("Value for parameter ReceiptHandle is invalid. Reason: Message does "
                        "not exist or is not available for visibility timeout change."))
    return decoded


async def change_message_visibility(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    if params.get("ReceiptHandle") is None:
        raise missing("ReceiptHandle")
    timeout = int_param(params, "VisibilityTimeout", 0, MAX_VISIBILITY_S)
    if timeout is None:
        raise missing("VisibilityTimeout")
    result = (await _change(ctx, ref, [(receipt_bytes(params["ReceiptHandle"]), timeout)]))[0]
    if isinstance(result, SqsError):
        raise result
    return {}


async def change_message_visibility_batch(ctx: Context, params: dict[str, Any]
                                          ) -> dict[str, Any]:
    ref = queue_of(ctx, params)

    def check(_: int, entry: dict[str, Any]) -> tuple[bytes, int]:
        timeout = int_param(entry, "VisibilityTimeout", 0, MAX_VISIBILITY_S)
        if timeout is None:
            raise missing("VisibilityTimeout")
        return receipt_bytes(entry.get("ReceiptHandle")), timeout

    failed, ready = _checked_entries(params, check)
    successful = []
    if ready:
        results = await _change(ctx, ref, [change for _, change in ready])
        for (entry_id, _), result in zip(ready, results):
            if isinstance(result, SqsError):
                failed.append(_failed(entry_id, result))
            else:
                successful.append({"Id": entry_id})
    return {"Successful": successful, "Failed": failed}


MESSAGE_ACTIONS = {
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
}
