"""Lamina's wire codec, sans-IO (PROTOCOL.md §1–4): bytes in, events out; answers in, bytes out.

Both the server and the clients use it; it touches no socket and imports neither of them.

- ``framing``: frames, strict CBOR decoding, CBOR head sizes;
- ``splicing``: receive, peek, send and batch-entry frames built around stored records;
- ``requests``: a request's frame, spliced around its args (the clients' hot path);
- ``events``: what parsing the peer's bytes yields (``Request``, ``Response``, ...);
- ``answers``: what a server's operation produces before it becomes bytes;
- ``protocol``: the connection state machines, :class:`ServerConnection` and
  :class:`ClientConnection`, the one place that knows which requests await an answer;
- ``auth``: the ``auth`` request's signature (PROTOCOL §3);
- ``errors``: :class:`LocalProtocolError` and its subclasses, our own code misusing the above.
"""

from .answers import Answer, EntriesAnswer, MapAnswer, PeekAnswer, ReceiveAnswer, SendAnswer
from .errors import (
    AnswerTooLarge,
    ConnectionEnding,
    LocalProtocolError,
    RequestIdsExhausted,
    RequestTooLarge,
    UnknownRequestId,
)
from .events import (
    ClientEvent,
    Greeting,
    ProtocolViolation,
    RejectedRequest,
    Request,
    Response,
    ServerEvent,
)
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameReader
from .protocol import (
    DEFAULT_PORT,
    PROTOCOL_VERSION,
    ClientConnection,
    ServerConnection,
    auth_signature,
    verify_auth_signature,
)
from .splicing import DeliveryFrame, PeekedFrame, PeekEntry

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES", "DEFAULT_PORT", "PROTOCOL_VERSION", "Answer", "AnswerTooLarge",
    "ClientConnection", "ClientEvent", "ConnectionEnding", "DeliveryFrame", "EntriesAnswer",
    "FrameReader", "Greeting", "LocalProtocolError", "MapAnswer", "PeekAnswer", "PeekEntry",
    "PeekedFrame", "ProtocolViolation", "ReceiveAnswer", "RejectedRequest", "Request",
    "RequestIdsExhausted", "RequestTooLarge", "Response", "SendAnswer", "ServerConnection",
    "ServerEvent", "UnknownRequestId", "auth_signature", "verify_auth_signature",
]
