"""The sans-IO wire codec of PROTOCOL.md §1–4: requests in, responses out, no sockets.

Modelled on h11/wsproto. The server feeds received bytes to a :class:`ServerConnection` and gets
events back; it turns answers into bytes through the same object, the one place that knows
which request ids are unanswered. :class:`ClientConnection` is the mirror image for clients::

    server                                          client
    conn = ServerConnection(auth_required=False)    conn = ClientConnection()
    write(conn.greeting(version=..., ...))          conn.receive_data(read())  -> [Greeting]
                                                    rid, frame = conn.encode_request("ping")
    for event in conn.receive_data(read()):         write(frame)
        Request           -> write(conn.respond(event.id, result))
        RejectedRequest   -> write(conn.respond_error(event.id, event.error))
        ProtocolViolation -> answer what is unanswered, write(conn.protocol_error_frame()), close
                                                    conn.receive_data(read())  -> [Response]

Rules of the connection state (every one of them lives in this file):

1. The greeting is the first frame the server sends, and is sent once.
2. A request id is *outstanding* from the moment its request is parsed until its answer is
   encoded. Parsing a request whose id is outstanding is a protocol error.
3. Events come out in the order the requests arrived. A ProtocolViolation is always the last
   event: requests parsed before it are still delivered and must be answered; nothing after it
   is parsed; the final ``[0, {"code": "ProtocolError", ...}, null]`` frame goes out after
   every outstanding request is answered, and then the connection is closed.
4. Before ``auth`` succeeds (``pre_auth``) frames over 4 KiB are protocol errors and at most one
   request is delivered until it is answered (PROTOCOL §3, "one request at a time"). Bytes after
   it stay buffered, unparsed, so they are judged by the limit in force once it is answered:
   call ``receive_data(b"")`` after answering to parse them.
5. A tag, an odd simple value or a NaN/infinite float inside ``args`` fails that request alone:
   a RejectedRequest with InvalidArgument naming the top-level argument it sits under. Inside
   the entries of a batch (``BATCH_ARGUMENTS``) it fails only that entry (PROTOCOL §2): the
   engine judges each entry, and refuses such values there.

Frames and strict CBOR live in ``framing.py``, a request's frame in ``requests.py``, the
encoders that splice stored records in ``splicing.py``, the events in ``events.py``, the server's
answers in ``answers.py`` and the auth signature in ``auth.py``; what a server or client needs
of them is re-exported here, so they need only this module.

Errors split as in h11: the peer misbehaving is a ProtocolViolation event carrying the wire
``ProtocolError``; our own code misusing this API raises :class:`LocalProtocolError` (its subclasses, in
``errors.py``, say which misuse).
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import cbor2

from lamina.engine.errors import InvalidArgument, LaminaError, ProtocolError

from .answers import (
    Answer,
    EntriesAnswer,
    MapAnswer,
    PeekAnswer,
    ReceiveAnswer,
    SendAnswer,
)
from .auth import AUTH_CONTEXT, auth_signature, verify_auth_signature
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
from .framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER_BYTES,
    MAX_FRAME_LENGTH,
    MIN_MAX_FRAME_BYTES,
    PLAIN_SCALAR_TYPES,
    TEXT_ONLY,
    PRE_AUTH_MAX_FRAME_BYTES,
    FrameReader,
    decode_frame_item,
    decode_item,
    encode_frame_header,
    find_unsupported_value,
)
from .requests import encode_request_frame
from .splicing import (
    PEEK_STATES,
    Deliverable,
    DeliveryFrame,
    PeekedFrame,
    PeekEntry,
    delivery_size,
    encode_entries_response,
    encode_peek_response,
    encode_receive_response,
    encode_response,
    encode_send_response,
    peek_entry_size,
    peek_response_overhead,
    receive_response_overhead,
)

__all__ = [
    "AUTH_CONTEXT", "DEFAULT_MAX_INFLIGHT", "DEFAULT_MAX_WAITING", "DEFAULT_PORT",
    "MAX_BUSY_POLL_US", "MAX_REQUEST_ID", "MAX_REQUEST_ITEMS", "NONCE_BYTES", "PEEK_STATES",
    "PROTOCOL_VERSION", "SERVER_NAME", "Answer", "AnswerTooLarge", "ClientConnection",
    "ClientEvent", "ConnectionEnding", "DeliveryFrame", "EntriesAnswer", "Greeting",
    "LocalProtocolError", "MapAnswer", "PeekAnswer", "PeekEntry", "PeekedFrame",
    "ProtocolViolation", "ReceiveAnswer", "RejectedRequest", "Request", "RequestIdsExhausted",
    "RequestTooLarge", "Response", "SendAnswer", "ServerConnection", "ServerEvent",
    "UnknownRequestId", "auth_signature", "delivery_size", "encode_error_response",
    "encode_greeting", "encode_message", "encode_peek_response", "encode_protocol_error",
    "encode_receive_response", "encode_response", "peek_entry_size", "peek_response_overhead",
    "receive_response_overhead", "verify_auth_signature",
]

#: The port a server listens on and clients connect to unless told otherwise.
DEFAULT_PORT = 7766
#: PROTOCOL §1 greeting ``protocol``; additions never bump it.
PROTOCOL_VERSION = 1
#: PROTOCOL §1 greeting ``server``.
SERVER_NAME = "lamina"
#: PROTOCOL §1: the greeting's nonce is 16 random bytes, enough that no two connections share one.
NONCE_BYTES = 16
#: PROTOCOL §2: ids fit a signed 64-bit integer, so clients in every language can hold them;
#: 0 is reserved for frames about the connection (greeting, final protocol error).
MAX_REQUEST_ID = 2**63 - 1
#: PROTOCOL §2 defaults, advertised in the greeting.
#: Batch arguments: lists whose entries are judged one by one (rule 5), each entry's error at
#: its position (send ``messages``, change_visibility ``entries``, delete / dead ``receipts``,
#: peek / delete_by_id ``ids``).
BATCH_ARGUMENTS = frozenset({"messages", "entries", "receipts", "ids"})
DEFAULT_MAX_INFLIGHT = 1024
DEFAULT_MAX_WAITING = 64
#: The most CBOR items one request may hold. The largest valid request, a send of 1000
#: messages each with body, topic, priority, delay and 64 attributes, holds about 139,000;
#: without a bound a 16 MiB frame of one-byte items takes seconds of the event loop to decode.
MAX_REQUEST_ITEMS = 150_000
#: The longest busy-polling window allowed (server and clients; SO_BUSY_POLL): polling is for
#: the gap between an answer and the next request, not a way to keep a core busy.
MAX_BUSY_POLL_US = 10_000


# --- Encoding whole frames ---------------------------------------------------------------------


def encode_message(item: Any) -> bytes:
    """One frame holding ``item`` encoded by cbor2."""
    body = cbor2.dumps(item)
    return encode_frame_header(len(body)) + body


def encode_error_response(request_id: int, error: LaminaError | Mapping[str, Any]) -> bytes:
    """``[id, {"code", "message"[, "details"]}, null]``; id 0 for errors about the connection."""
    wire = error.to_wire() if isinstance(error, LaminaError) else error
    return encode_message([request_id, wire, None])


def encode_protocol_error(message: str) -> bytes:
    """The server's last frame on a connection that broke the protocol."""
    return encode_error_response(0, ProtocolError(message))


def encode_greeting(
    *,
    version: str,
    auth_required: bool,
    nonce: bytes,
    features: Sequence[str],
    max_frame_bytes: int,
    max_inflight: int,
    max_waiting: int,
    idle_timeout_s: float,
) -> bytes:
    """PROTOCOL §1 greeting. Prefer :meth:`ServerConnection.greeting`, which enforces rule 1."""
    if type(auth_required) is not bool or len(nonce) != NONCE_BYTES:
        raise LocalProtocolError("greeting needs a bool auth_required and a 16-byte nonce")
    limits = {
        "max_frame": max_frame_bytes,
        "max_inflight": max_inflight,
        "max_waiting": max_waiting,
        "idle_timeout": idle_timeout_s,
    }
    return encode_message([0, None, {
        "server": SERVER_NAME, "version": version, "protocol": PROTOCOL_VERSION,
        "auth": auth_required, "nonce": bytes(nonce), "features": list(features),
        "limits": limits,
    }])


# --- The server's side of one connection -------------------------------------------------------


#: The length prefix of a frame.
_FRAME_LENGTH = struct.Struct(">I")
_new_request = _new_response = tuple.__new__
#: What a request that is not an array unpacks to: nothing (a ValueError, as for a wrong length).
_NOT_A_LIST: Any = ()


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class ServerConnection:
    """The protocol state of one accepted connection (rules 1–5 in the module docstring).

    Not thread-safe; one connection is driven by one reader and its handlers in one trio task
    tree. ``nonce`` is generated here because it belongs to this connection's greeting and to
    the ``auth`` check against it.
    """

    def __init__(
        self,
        *,
        auth_required: bool,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        nonce: bytes | None = None,
    ) -> None:
        if not MIN_MAX_FRAME_BYTES <= max_frame_bytes <= MAX_FRAME_LENGTH:
            raise ValueError(f"max_frame_bytes {max_frame_bytes} outside "
                             f"{MIN_MAX_FRAME_BYTES}..{MAX_FRAME_LENGTH} (PROTOCOL §1)")
        if nonce is None:
            nonce = secrets.token_bytes(NONCE_BYTES)
        elif len(nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        self.auth_required = auth_required
        self.max_frame_bytes = max_frame_bytes
        self.nonce = bytes(nonce)
        #: True until :meth:`authenticated`, when the greeting says auth is required (read it).
        self.pre_auth = auth_required
        self._frames = FrameReader(PRE_AUTH_MAX_FRAME_BYTES if auth_required else max_frame_bytes)
        #: Requests delivered and not yet answered (read it; this class changes it).
        self.outstanding_ids: set[int] = set()
        self._greeted = False
        self._closed = False
        #: The violation that ends this connection, once one has been seen (read it).
        self.protocol_error: ProtocolError | None = None
        #: Part of a frame is buffered (the last :meth:`receive_data` left bytes unparsed).
        self.buffering = False

    # -- state -----------------------------------------------------------------------------

    @property
    def outstanding_count(self) -> int:
        """Requests delivered and not yet answered; compare with ``max_inflight``."""
        return len(self.outstanding_ids)

    @property
    def front_frame_bytes(self) -> int:
        """The whole length of the frame being read, once its header is in (0: none)."""
        return self._frames.front_frame_bytes

    def collect_front_frame(self) -> None:
        """Give the frame being read a buffer of its whole length (see FrameReader)."""
        self._frames.collect_front_frame()

    @property
    def reading_paused(self) -> bool:
        """Rule 4: pre-auth with a request unanswered. Stop reading the socket until it is
        answered: bytes fed meanwhile are buffered unparsed, without bound."""
        return self.pre_auth and bool(self.outstanding_ids)

    def authenticated(self) -> None:
        """Leave pre-auth mode after a successful ``auth``: later frames may be up to
        ``max_frame_bytes`` and requests are no longer delivered one at a time."""
        if not self.pre_auth:
            raise LocalProtocolError("authenticated() outside pre-auth mode")
        self.pre_auth = False
        self._frames.max_frame_bytes = self.max_frame_bytes

    # -- input -----------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[ServerEvent]:
        """Feed bytes read from the peer; returns the events they complete (rule 3).

        ``b""`` just parses what is buffered (needed after answering in pre-auth mode).
        """
        got = self.receive_request(data if type(data) is bytes else bytes(data))
        return got if isinstance(got, list) else [got]

    def receive_request(self, data: bytes) -> Request | list[ServerEvent]:
        """:meth:`receive_data`, with the usual read of a peer awaiting each answer after auth
        (one whole frame holding a well-formed request, nothing buffered) given as its
        Request alone, no list around it. ``data`` is ``bytes`` (what ``os.read`` gives)."""
        if self.protocol_error is not None or self._closed:
            raise LocalProtocolError("receive_data after a ProtocolViolation")
        if not (self.buffering or self.pre_auth):
            size = len(data) - FRAME_HEADER_BYTES  # FrameReader.whole_frame, without the call
            if not (0 < size <= self.max_frame_bytes  # else whole frames (a pipelining peer),
                    and _FRAME_LENGTH.unpack_from(data)[0] == size):  # cut; the rest fed
                return self._parse_frames(self._frames.whole_frames(data))
            try:  # nothing was buffered, nothing is
                request = self._parse_request(decode_frame_item(data, MAX_REQUEST_ITEMS))
            except ProtocolError as exc:
                return self._violation(exc)
            return request if type(request) is Request else [request]
        if not (self.pre_auth and self.outstanding_ids):  # not reading_paused (rule 4)
            body = self._frames.whole_frame(data)
            if body is not None:
                self.buffering = False
                try:
                    return [self._parse_request(decode_item(body, MAX_REQUEST_ITEMS))]
                except ProtocolError as exc:
                    return self._violation(exc)
        self._frames.feed(data)
        return self._parse_frames([])

    def _violation(self, exc: ProtocolError) -> list[ServerEvent]:
        self.protocol_error = exc
        return [ProtocolViolation(exc)]

    def _parse_frames(self, bodies: list[bytes]) -> list[ServerEvent]:
        """Parse ``bodies`` (frames already cut), then the frames buffered until reading pauses
        (rule 4); a violation ends the events."""
        frames = self._frames
        events: list[ServerEvent] = []
        try:
            for cut in bodies:
                events.append(self._parse_request(decode_item(cut, MAX_REQUEST_ITEMS)))
            while not (self.pre_auth and self.outstanding_ids):  # not reading_paused
                body = frames.next_frame()
                if body is None:
                    break
                events.append(self._parse_request(decode_item(body, MAX_REQUEST_ITEMS)))
        except ProtocolError as exc:
            self.protocol_error = exc
            events.append(ProtocolViolation(exc))
        self.buffering = frames.buffered_bytes > 0
        return events

    def _parse_request(self, item: Any) -> Request | RejectedRequest:
        """The request of a frame whose body decoded to ``item``."""
        try:  # the length of a list (a map or a text of 3 would unpack too)
            request_id, op, args = item if type(item) is list else _NOT_A_LIST
        except ValueError:
            raise ProtocolError(f"a request is a CBOR array [id, op, args], "
                                f"not {_brief(item)}") from None
        # type() is not int, not isinstance: bool is a subclass of int but never an integer here.
        if type(request_id) is not int or not 1 <= request_id <= MAX_REQUEST_ID:
            raise ProtocolError(f"request id must be an integer 1..2^63-1, not {_brief(request_id)}")
        if type(op) is not str:
            raise ProtocolError(f"request {request_id}: op must be a text string")
        if type(args) is not dict:
            raise ProtocolError(f"request {request_id}: args must be a map with text keys")
        rejected: InvalidArgument | None = None
        if args:
            if not TEXT_ONLY.issuperset(map(type, args)):  # every key's type at C speed
                raise ProtocolError(f"request {request_id}: args must be a map with text keys")
            for name, value in args.items():
                if type(value) not in PLAIN_SCALAR_TYPES and not (
                        name in BATCH_ARGUMENTS and type(value) is list):
                    problem = find_unsupported_value(value)
                    if problem is not None:
                        rejected = InvalidArgument(name, problem)  # the first one is told
                        break
        if request_id in self.outstanding_ids:
            raise ProtocolError(f"request id {request_id} reused while unanswered")
        self.outstanding_ids.add(request_id)
        if rejected is not None:
            return RejectedRequest(request_id, op, rejected)
        return _new_request(Request, item)  # Request(*item), at half its cost

    # -- output ----------------------------------------------------------------------------

    def greeting(
        self,
        *,
        version: str,
        idle_timeout_s: float,
        features: Sequence[str] = (),
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> bytes:
        """The greeting: the first frame this connection sends (rule 1)."""
        if self._greeted:
            raise LocalProtocolError("the greeting was already sent")
        self._greeted = True
        return encode_greeting(
            version=version, auth_required=self.auth_required, nonce=self.nonce,
            features=features, max_frame_bytes=self.max_frame_bytes, max_inflight=max_inflight,
            max_waiting=max_waiting, idle_timeout_s=idle_timeout_s,
        )

    def respond(self, request_id: int, result: Mapping[str, Any]) -> bytes:
        """Answer ``request_id`` with success."""
        return self.respond_answer(request_id, MapAnswer(dict(result)))

    def respond_error(self, request_id: int, error: LaminaError) -> bytes:
        """Answer ``request_id`` with failure."""
        return self.respond_answer(request_id, error)

    def respond_answer(self, request_id: int, answer: Answer) -> bytes:
        """Answer ``request_id`` with what the server's op produced: a result map, entries,
        deliveries or a peek page to splice, or the LaminaError that failed the request."""
        if self._closed or not self._greeted:
            self._check_can_send()  # raises
        if request_id not in self.outstanding_ids:
            raise UnknownRequestId(f"request {request_id} is not awaiting an answer")
        # The encoders are called here directly, the commonest answers first.
        if type(answer) is MapAnswer:
            frame = encode_response(request_id, answer.result)
        elif type(answer) is SendAnswer:
            frame = encode_send_response(request_id, answer.results)
        elif type(answer) is EntriesAnswer:
            frame = encode_entries_response(request_id, answer.results)
        elif type(answer) is ReceiveAnswer:
            frame = encode_receive_response(request_id, answer.deliveries)
        elif type(answer) is PeekAnswer:
            frame = encode_peek_response(request_id, answer.entries, answer.next)
        elif isinstance(answer, LaminaError):
            frame = encode_error_response(request_id, answer)
        else:
            raise TypeError(f"not an answer: {type(answer).__name__}")
        if len(frame) - FRAME_HEADER_BYTES > self.max_frame_bytes:
            # Still outstanding: the caller can answer it with a smaller (error) response.
            raise AnswerTooLarge(f"response to request {request_id} is "
                                 f"{len(frame) - FRAME_HEADER_BYTES} bytes, over max_frame "
                                 f"{self.max_frame_bytes}")
        self.outstanding_ids.discard(request_id)
        return frame

    def protocol_error_frame(self, message: str | None = None) -> bytes:
        """The final ``[0, ProtocolError, null]`` frame; close the connection after sending it.

        ``message`` defaults to the violation's. Rule 3: every request delivered before the
        violation must be answered first.
        """
        self._check_can_send()
        if message is None:
            if self.protocol_error is None:
                raise LocalProtocolError("no protocol error to report; pass a message")
            message = self.protocol_error.message
        if self.outstanding_ids:
            raise LocalProtocolError(f"{len(self.outstanding_ids)} requests read before the "
                                     "protocol error are still unanswered")
        self._closed = True
        return encode_protocol_error(message)

    def _check_can_send(self) -> None:
        if not self._greeted:
            raise LocalProtocolError("the greeting must be the first frame sent")
        if self._closed:
            raise LocalProtocolError("the final protocol error frame was already sent")


# --- The client's side of one connection -------------------------------------------------------


def _parse_greeting(result: Any) -> Greeting:
    """Check a greeting's known keys; unknown keys are ignored (PROTOCOL §1)."""
    if type(result) is not dict or type(result.get("limits")) is not dict:
        raise ProtocolError("the greeting must be a map with a limits map")
    limits = result["limits"]

    def field(source: dict[Any, Any], key: str, *types: type) -> Any:
        value = source.get(key)
        if type(value) not in types:
            raise ProtocolError(f"greeting {key!r} is missing or mistyped: {_brief(value)}")
        return value

    if field(result, "protocol", int) != PROTOCOL_VERSION:
        raise ProtocolError(f"server speaks protocol {result['protocol']}, not {PROTOCOL_VERSION}")
    nonce = field(result, "nonce", bytes)
    features = field(result, "features", list)
    if len(nonce) != NONCE_BYTES or any(type(name) is not str for name in features):
        raise ProtocolError("greeting nonce must be 16 bytes and features text strings")
    return Greeting(
        server=field(result, "server", str),
        version=field(result, "version", str),
        protocol=PROTOCOL_VERSION,
        auth_required=field(result, "auth", bool),
        nonce=nonce,
        features=tuple(features),
        max_frame_bytes=field(limits, "max_frame", int),
        max_inflight=field(limits, "max_inflight", int),
        max_waiting=field(limits, "max_waiting", int),
        idle_timeout_s=field(limits, "idle_timeout", int, float),
    )


class ClientConnection:
    """The protocol state of one client connection: ids, the greeting, responses.

    Ids count up from 1, so none is ever reused. Frames from the server obey the same framing
    rules as requests, with this client's own ``max_frame_bytes`` as the limit; set it at least
    as high as the servers' ``max_frame`` (both default to 16 MiB).
    """

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._frames = FrameReader(max_frame_bytes)
        self.greeting: Greeting | None = None
        self._next_id = 1
        self._outstanding: set[int] = set()
        self._server_closed = False
        self._protocol_error: ProtocolError | None = None

    @property
    def outstanding_count(self) -> int:
        """Requests encoded and not yet answered."""
        return len(self._outstanding)

    @property
    def protocol_error(self) -> ProtocolError | None:
        """The server's violation that ended this connection, once seen."""
        return self._protocol_error

    def encode_request(self, op: str, args: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
        """``(id, frame)`` for ``[id, op, args]``.

        Refuses a frame over the server's ``max_frame`` (2 MiB, the guaranteed minimum, until
        the greeting is in), which would only earn a protocol error and a closed connection.
        """
        if self._protocol_error is not None or self._server_closed:
            raise ConnectionEnding("the connection is closing; open a new one")
        args = args if type(args) is dict else dict(args or {})  # a dict is not copied
        if type(op) is not str:
            raise LocalProtocolError("op and argument names must be str")
        for name in args:
            if type(name) is not str:
                raise LocalProtocolError("op and argument names must be str")
        if (request_id := self._next_id) > MAX_REQUEST_ID:
            raise RequestIdsExhausted("request ids exhausted; open a new connection")
        frame = encode_request_frame(request_id, op, args)
        limit = self.greeting.max_frame_bytes if self.greeting else MIN_MAX_FRAME_BYTES
        if len(frame) - FRAME_HEADER_BYTES > limit:
            raise RequestTooLarge(f"{op} request is {len(frame) - FRAME_HEADER_BYTES} bytes, "
                                  f"over the server's max_frame {limit}")
        self._next_id += 1
        self._outstanding.add(request_id)
        return request_id, frame

    def receive_data(self, data: bytes | bytearray) -> list[ClientEvent]:
        """Feed bytes read from the server; returns the greeting and responses they complete,
        ending with a ProtocolViolation if the server broke the protocol."""
        if self._protocol_error is not None:
            raise LocalProtocolError("receive_data after a ProtocolViolation")
        body = self._frames.whole_frame(data)
        if body is not None:  # the usual read: one whole answer, nothing buffered
            try:
                return [self._parse_frame(body)]
            except ProtocolError as exc:
                self._protocol_error = exc
                return [ProtocolViolation(exc)]
        self._frames.feed(data)
        events: list[ClientEvent] = []
        try:
            while (body := self._frames.next_frame()) is not None:
                events.append(self._parse_frame(body))
        except ProtocolError as exc:
            self._protocol_error = exc
            events.append(ProtocolViolation(exc))
        return events

    def _parse_frame(self, body: bytes) -> Greeting | Response:
        item = decode_item(body)
        if type(item) is not list or len(item) != 3:
            raise ProtocolError(f"a server frame is an array [id, error, result], not {_brief(item)}")
        response_id, error, result = item
        if type(response_id) is not int or not 0 <= response_id <= MAX_REQUEST_ID:
            raise ProtocolError(f"response id must be an integer 0..2^63-1, not {_brief(response_id)}")
        if self._server_closed:
            raise ProtocolError("frame after the server's final error")
        if self.greeting is None:
            if response_id != 0 or error is not None:
                raise ProtocolError(f"expected the greeting, got {_brief(item)}")
            self.greeting = _parse_greeting(result)
            return self.greeting
        if error is None:
            if response_id == 0 or type(result) is not dict:
                raise ProtocolError(f"response {response_id}: a success needs a request id and a result map")
        elif (type(error) is not dict or type(error.get("code")) is not str
              or type(error.get("message")) is not str or result is not None):
            raise ProtocolError(f"response {response_id}: malformed error {_brief(error)}")
        if response_id == 0:
            self._server_closed = True
        elif response_id in self._outstanding:
            self._outstanding.discard(response_id)
        else:
            raise ProtocolError(f"response to request {response_id}, which is not awaiting one")
        return _new_response(Response, item)  # Response(*item), at half its cost
