"""Misuse of the sans-IO connection objects by our own code (never the peer's fault).

    LocalProtocolError              a bug in the caller, or a request it must not send
    ├── UnknownRequestId            answering an id that is not awaiting an answer
    ├── AnswerTooLarge              an answer over the peer's max_frame (still answerable,
    │                               with a smaller error answer)
    ├── RequestTooLarge             a request over the server's max_frame (not sent; the
    │                               connection is fine)
    ├── ConnectionEnding            a request on a connection that is closing
    └── RequestIdsExhausted         every request id of the connection was used

These are not ``LaminaError``s and never go on the wire as such: the peer misbehaving is a
``ProtocolViolation`` event carrying the wire's ``ProtocolError`` instead (as in h11). Callers
match these classes, never the message text.
"""

from __future__ import annotations

__all__ = ["AnswerTooLarge", "ConnectionEnding", "LocalProtocolError", "RequestIdsExhausted",
           "RequestTooLarge", "UnknownRequestId"]


class LocalProtocolError(Exception):
    """Our own code misused this API (answered an unknown id, greeted twice, ...): a bug here,
    never the peer's fault, so it is not a LaminaError and never goes on the wire as such."""


class UnknownRequestId(LocalProtocolError):
    """An answer for a request id that is not awaiting one (never read, or answered already)."""


class AnswerTooLarge(LocalProtocolError):
    """An answer over ``max_frame``; the request is still awaiting an answer."""


class RequestTooLarge(LocalProtocolError):
    """A request over the server's ``max_frame``; it was not sent and the connection is fine."""


class ConnectionEnding(LocalProtocolError):
    """A request on a connection that is closing (the server said its last word)."""


class RequestIdsExhausted(LocalProtocolError):
    """Every request id of this connection (1..2^63-1) was used; open a new connection."""
