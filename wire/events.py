"""The events of the sans-IO connections (``protocol.py``): what parsing the peer's bytes yields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from lamina.engine.errors import LaminaError, ProtocolError

__all__ = ["ClientEvent", "Greeting", "ProtocolViolation", "RejectedRequest", "Request",
           "Response", "ServerEvent"]


class Request(NamedTuple):
    """A well-formed request; answer it with ``respond*``. (Immutable like the frozen
    dataclasses here, a tuple because one is made per request: half the cost.)"""

    id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RejectedRequest:
    """A request already known to fail (a value its args may not carry); answer it with
    ``respond_error(event.id, event.error)``. The connection carries on."""

    id: int
    op: str
    error: LaminaError


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """The peer broke PROTOCOL §1–2; always the last event of a connection."""

    error: ProtocolError

    @property
    def message(self) -> str:
        return self.error.message


@dataclass(frozen=True, slots=True)
class Greeting:
    """The server's greeting as a client sees it; unknown greeting keys are ignored."""

    server: str
    version: str
    protocol: int
    auth_required: bool
    nonce: bytes
    features: tuple[str, ...]
    max_frame_bytes: int
    max_inflight: int
    max_waiting: int
    idle_timeout_s: float


class Response(NamedTuple):
    """``[id, error, result]``: exactly one of ``error`` and ``result`` is None. Id 0 after the
    greeting is the server's final ProtocolError about our bytes; it closes after sending it."""

    id: int
    error: dict[str, Any] | None
    result: dict[str, Any] | None


ServerEvent: TypeAlias = Request | RejectedRequest | ProtocolViolation
ClientEvent: TypeAlias = Greeting | Response | ProtocolViolation
