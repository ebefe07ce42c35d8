"""A request before authentication (PROTOCOL §3, connection.py rule 4): what answers it.

Sans-IO: given the request, the key ring's look-up and the greeting's nonce, ``pre_auth_answer``
says what to answer and whether the connection is now authenticated or must close; the
connection applies that. It needs the key ring, not the engine, so it runs in the reader.

- Any op but ``auth`` is ``Unauthorized`` (the connection stays open: the client may still
  authenticate).
- An ``auth`` with malformed arguments is answered with the error naming the field.
- An ``auth`` with an unknown key or a wrong signature is ``Unauthorized`` with one message
  for both causes, after the same HMAC (no timing difference either), and the connection
  closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lamina.engine.errors import InvalidArgument, LaminaError, Unauthorized
from lamina.wire.protocol import RejectedRequest, Request, verify_auth_signature

from .dispatch import Answer, MapAnswer, check_request
from .keyring import ServerKey

__all__ = ["AUTH_FAILED", "PreAuthAnswer", "pre_auth_answer"]

#: One message for every failed ``auth``: unknown key and wrong signature look the same.
AUTH_FAILED = "authentication failed"


@dataclass(frozen=True, slots=True)
class PreAuthAnswer:
    """The answer to a request before authentication, and what it did to the connection."""

    answer: Answer
    #: The key the request authenticated (None: not authenticated).
    key_id: str | None = None
    #: A failed ``auth``: read nothing more, close once answered.
    failed_auth: bool = False


def pre_auth_answer(request: Request | RejectedRequest,
                    key: Callable[[object], ServerKey | None], nonce: bytes) -> PreAuthAnswer:
    """The answer to ``request``, read before authentication; ``key`` looks a key id up in the
    keys in force, ``nonce`` is the greeting's. A request the codec refused (a value no
    request may carry: a tag, NaN) is answered like any other of its op."""
    if request.op != "auth":
        return PreAuthAnswer(Unauthorized(
            f"{request.op}: authenticate first (the first request must be auth)"))
    if isinstance(request, RejectedRequest):
        return PreAuthAnswer(request.error)
    try:
        check_request("auth", request.args)
        key_id, signature = request.args["key"], request.args["signature"]
        if type(key_id) is not str:
            raise InvalidArgument("key", "must be text")
        if type(signature) is not bytes:
            raise InvalidArgument("signature", "must be a byte string")
    except LaminaError as exc:
        return PreAuthAnswer(exc)
    found = key(key_id)
    # An unknown key costs the same HMAC as a known one: no timing difference either.
    secret = found.secret if found is not None else "\x00unknown key"
    if verify_auth_signature(secret, nonce, key_id, signature) and found is not None:
        return PreAuthAnswer(MapAnswer({"key": key_id}), key_id=key_id)
    return PreAuthAnswer(Unauthorized(AUTH_FAILED), failed_auth=True)
