"""What the blocking and the trio client share: encoding requests, matching answers, failing.

The clients differ only in how they wait (threads or tasks); everything here is the same for
both and touches no socket. Connection failures are the subtree of ``errors.py``.
"""

from __future__ import annotations

import ssl
from typing import Any, Callable, Sequence, TypeVar

from lamina.engine.errors import InvalidArgument, LaminaError, Unauthorized, error_from_wire
from lamina.wire.protocol import (
    ClientConnection,
    ConnectionEnding,
    Greeting,
    LocalProtocolError,
    ProtocolViolation,
    RequestTooLarge,
    Response,
    auth_signature,
)

from .errors import ConnectionLost, LaminaConnectionError, ServerProtocolViolation

__all__ = ["Answers", "auth_args", "encode_request", "encode_requests", "raise_for",
           "tls_context"]

T = TypeVar("T")


def tls_context(tls: bool | ssl.SSLContext) -> ssl.SSLContext | None:
    if tls is False or tls is None:
        return None
    if isinstance(tls, ssl.SSLContext):
        return tls
    return ssl.create_default_context()


def encode_request(proto: ClientConnection, op: str, args: dict[str, Any]) -> tuple[int, bytes]:
    try:
        return proto.encode_request(op, args)
    except RequestTooLarge as exc:  # not sent; the connection is fine
        raise InvalidArgument(op, str(exc)) from None
    except ConnectionEnding as exc:
        raise ConnectionLost(str(exc)) from None
    except LocalProtocolError as exc:
        raise LaminaConnectionError(str(exc)) from None


def encode_requests(proto: ClientConnection, requests: Sequence[tuple[str, dict[str, Any]]]
                ) -> tuple[list[int], list[bytes], LaminaError | None]:
    """Encode ``requests`` in order up to the first that cannot be: -> (ids, frames, its
    error or None)."""
    ids: list[int] = []
    frames: list[bytes] = []
    for op, args in requests:
        try:
            request_id, frame = encode_request(proto, op, args)
        except LaminaError as exc:
            return ids, frames, exc
        ids.append(request_id)
        frames.append(frame)
    return ids, frames, None


def raise_for(response: Response, decode: Callable[[dict[str, Any]], T]) -> T:
    if response.error is not None:
        raise error_from_wire(response.error)
    assert response.result is not None
    return decode(response.result)


class Answers:
    """What both clients do with decoded server frames: match answers to requests, and turn
    the end of the connection into one ``LaminaConnectionError`` for everyone waiting."""

    def __init__(self) -> None:
        self.responses: dict[int, Response] = {}
        self.greeting: Greeting | None = None
        self.failure: LaminaConnectionError | None = None

    def take(self, events: list[Any]) -> None:
        for event in events:
            if type(event) is Response:
                if event.id == 0:  # the server's last word about our bytes
                    error = error_from_wire(event.error or {})
                    self.fail(ConnectionLost, f"the server closed the connection: "
                                              f"{error.code}: {error.message}")
                else:
                    self.responses[event.id] = event
            elif type(event) is Greeting:
                self.greeting = event
            elif type(event) is ProtocolViolation:
                self.fail(ServerProtocolViolation,
                          f"the server broke the protocol: {event.message}")

    def fail(self, kind: type[LaminaConnectionError], reason: str) -> LaminaConnectionError:
        """The connection's one failure: the first one reported (``kind`` with ``reason``)."""
        if self.failure is None:
            self.failure = kind(reason)
        return self.failure


def auth_args(greeting: Greeting, key: str | None, secret: str | None) -> dict[str, Any] | None:
    if not greeting.auth_required:
        return None
    if key is None or secret is None:
        raise Unauthorized("the server requires authentication: pass key and secret")
    return {"key": key, "signature": auth_signature(secret, greeting.nonce, key)}
