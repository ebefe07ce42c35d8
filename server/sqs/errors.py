"""SQS errors: each code with its JSON type, its Query code and its HTTP status, and how a
Lamina error becomes one.

SQS answers errors in each protocol's own shape: AWS JSON 1.0 puts the JSON name in
``__type`` and the older Query code in the ``x-amzn-query-error`` header (SDKs report that
one as the error code); Query puts the Query code in an ``<ErrorResponse>`` document.
"""

from __future__ import annotations

from lamina.engine.errors import LaminaError

__all__ = ["SqsError", "batch_entry_error", "from_lamina", "invalid", "missing"]

#: JSON name -> (Query code, HTTP status). The common AWS codes keep their name in both.
_CODES: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 404),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "InvalidIdFormat": ("InvalidIdFormat", 400),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "OverLimit": ("OverLimit", 403),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    "RequestThrottled": ("RequestThrottled", 403),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "InvalidAction": ("InvalidAction", 400),
    "AccessDenied": ("AccessDenied", 403),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "IncompleteSignature": ("IncompleteSignature", 400),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403),
    "RequestExpired": ("RequestExpired", 400),
    "InternalFailure": ("InternalFailure", 500),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
    "RequestEntityTooLarge": ("RequestEntityTooLarge", 413),
}


class SqsError(Exception):
    """One SQS error: ``code`` is the JSON name (a key of the table above)."""

    def __init__(self, code: str, message: str) -> None:
        assert code in _CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def query_code(self) -> str:
        return _CODES[self.code][0]

    @property
    def status(self) -> int:
        return _CODES[self.code][1]

    @property
    def sender_fault(self) -> bool:
        return self.status < 500


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


#: Lamina error code -> SQS code, where it is not InvalidParameterValue.
_FROM_LAMINA = {
    "QueueNotFound": "QueueDoesNotExist",
    "QueueAlreadyExists": "QueueNameExists",
    "InvalidQueueName": "InvalidParameterValue",
    "TooManyQueues": "OverLimit",
    "AccessDenied": "AccessDenied",
    "Unauthorized": "AccessDenied",
    "InvalidReceipt": "ReceiptHandleIsInvalid",
    "StaleReceipt": "ReceiptHandleIsInvalid",
    "MessageTooLarge": "InvalidParameterValue",
    "QueueFull": "OverLimit",
    "TagNotFound": "QueueDoesNotExist",
    "InvalidRedrivePolicy": "InvalidParameterValue",
    "NoDeadLetterQueue": "ResourceNotFoundException",
    "Unavailable": "ServiceUnavailable",
    "InternalError": "InternalFailure",
}


def from_lamina(error: LaminaError) -> SqsError:
    """The SQS error for a Lamina one (its message kept: it names the field)."""
    code = _FROM_LAMINA.get(error.code, "InvalidParameterValue")
    if code == "QueueDoesNotExist":
        return SqsError(code, "The specified queue does not exist.")
    if code == "ReceiptHandleIsInvalid":  # Lamina names its own field, "receipt"
        reason = error.message.removeprefix("receipt:").strip()
        return SqsError(code, f"The input receipt handle is not valid: {reason}.")
    return SqsError(code, error.message)


def batch_entry_error(error: SqsError | LaminaError) -> tuple[str, bool, str]:
    """(code, sender fault, message) of one failed batch entry."""
    sqs = error if isinstance(error, SqsError) else from_lamina(error)
    return sqs.code, sqs.sender_fault, sqs.message
