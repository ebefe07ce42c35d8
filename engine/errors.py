"""Lamina's exceptions: one base class, one subclass per wire error code (PROTOCOL.md §6).

    LaminaError                      base; ``code`` is the wire code, ``field`` names the argument
    ├── ProtocolError                malformed frame or envelope (the connection is closed)
    ├── UnknownOperation
    ├── InvalidArgument              missing / unknown / mistyped / out-of-range field
    ├── Unauthorized
    ├── AccessDenied
    ├── QueueNotFound
    ├── QueueAlreadyExists
    ├── InvalidQueueName
    ├── TooManyQueues
    ├── TagNotFound
    ├── TagAlreadyExists
    ├── TooManyTags
    ├── MessageTooLarge
    ├── QueueFull
    ├── InvalidReceipt               not a receipt this server issued for this queue and tag
    ├── StaleReceipt                 a real receipt that is no longer the current lease
    ├── MessageNotFound
    ├── NoDeadLetterQueue
    ├── InvalidRedrivePolicy
    ├── RewindDisabled
    ├── RewindOutOfRange
    ├── Unavailable                  had no effect; safe to retry
    └── InternalError

Errors are raised where the rule lives and mapped to the wire in exactly one place
(``LaminaError.to_wire`` / ``error_from_wire``). The clients' connection errors are one more
subtree, under ``LaminaConnectionError``, drawn in ``lamina.client.errors``.
"""

from __future__ import annotations

from typing import Any

#: The most an error's message takes on the wire (UTF-8): a message may show what a client sent,
#: and a batch of 1000 error entries must still fit the smallest max_frame (2 MiB).
MAX_ERROR_MESSAGE_BYTES = 1024


def bounded_message(message: str) -> str:
    """``message``, or its beginning (which names the field) and its end (which says what is
    wrong) around "..." when it is over :data:`MAX_ERROR_MESSAGE_BYTES`."""
    data = message.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_ERROR_MESSAGE_BYTES:
        return message
    half = (MAX_ERROR_MESSAGE_BYTES - 3) // 2
    return (data[:half].decode("utf-8", "ignore") + "..."
            + data[-half:].decode("utf-8", "ignore"))


class LaminaError(Exception):
    """Base of every Lamina error. ``code`` is the PROTOCOL.md §6 code."""

    code = "LaminaError"

    def __init__(self, message: str = "", *, field: str | None = None, details: Any = None):
        super().__init__(message or self.code)
        self.message = message or self.code
        self.field = field
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"code": self.code, "message": bounded_message(self.message)}
        if self.details is not None:
            wire["details"] = self.details
        return wire

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LaminaError)
            and other.code == self.code
            and other.message == self.message
        )

    def __hash__(self) -> int:
        return hash((self.code, self.message))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class ProtocolError(LaminaError):
    code = "ProtocolError"


class UnknownOperation(LaminaError):
    code = "UnknownOperation"


class InvalidArgument(LaminaError):
    """A field is missing, unknown, mistyped or out of range; the message names the field."""

    code = "InvalidArgument"

    def __init__(self, field: str, problem: str, **kwargs: Any):
        super().__init__(f"{field}: {problem}", field=field, **kwargs)


class Unauthorized(LaminaError):
    code = "Unauthorized"


class AccessDenied(LaminaError):
    code = "AccessDenied"


class QueueNotFound(LaminaError):
    code = "QueueNotFound"


class QueueAlreadyExists(LaminaError):
    code = "QueueAlreadyExists"


class InvalidQueueName(LaminaError):
    code = "InvalidQueueName"


class TooManyQueues(LaminaError):
    code = "TooManyQueues"


class TagNotFound(LaminaError):
    code = "TagNotFound"


class TagAlreadyExists(LaminaError):
    code = "TagAlreadyExists"


class TooManyTags(LaminaError):
    code = "TooManyTags"


class MessageTooLarge(LaminaError):
    code = "MessageTooLarge"


class QueueFull(LaminaError):
    code = "QueueFull"


class InvalidReceipt(LaminaError):
    code = "InvalidReceipt"


class StaleReceipt(LaminaError):
    code = "StaleReceipt"


class MessageNotFound(LaminaError):
    code = "MessageNotFound"


class NoDeadLetterQueue(LaminaError):
    code = "NoDeadLetterQueue"


class InvalidRedrivePolicy(LaminaError):
    code = "InvalidRedrivePolicy"


class RewindDisabled(LaminaError):
    code = "RewindDisabled"


class RewindOutOfRange(LaminaError):
    code = "RewindOutOfRange"


class Unavailable(LaminaError):
    code = "Unavailable"


class InternalError(LaminaError):
    code = "InternalError"


ERROR_CLASSES: dict[str, type[LaminaError]] = {
    cls.code: cls
    for cls in (
        ProtocolError, UnknownOperation, InvalidArgument, Unauthorized, AccessDenied,
        QueueNotFound, QueueAlreadyExists, InvalidQueueName, TooManyQueues, TagNotFound,
        TagAlreadyExists, TooManyTags, MessageTooLarge, QueueFull, InvalidReceipt,
        StaleReceipt, MessageNotFound, NoDeadLetterQueue, InvalidRedrivePolicy,
        RewindDisabled, RewindOutOfRange, Unavailable, InternalError,
    )
}


def error_from_wire(wire: dict[str, Any]) -> LaminaError:
    """The exception for a wire error map; an unknown code maps to the base class."""
    code = str(wire.get("code", "LaminaError"))
    message = str(wire.get("message", code))
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        err = LaminaError(message, details=wire.get("details"))
        err.code = code
        return err
    if cls is InvalidArgument:  # "field: problem", as InvalidArgument words it
        err = LaminaError.__new__(InvalidArgument)
        field = message.partition(": ")[0] if ": " in message else None
        LaminaError.__init__(err, message, field=field, details=wire.get("details"))
        return err
    return cls(message, details=wire.get("details"))
