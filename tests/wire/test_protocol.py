"""Specification of PROTOCOL.md §1–4 as seen by one connection: requests, responses, greeting,
pre-auth limits, spliced deliveries, auth signatures, and the client's mirror image."""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.engine.errors import InternalError, InvalidArgument, QueueNotFound, Unauthorized
from lamina.wire import auth, protocol
from lamina.engine.records import cbor_head as encode_head
from lamina.wire.framing import MIN_MAX_FRAME_BYTES, PRE_AUTH_MAX_FRAME_BYTES
from lamina.wire.answers import EntriesAnswer, MapAnswer, PeekAnswer, ReceiveAnswer, SendAnswer
from lamina.wire.errors import AnswerTooLarge, RequestTooLarge, UnknownRequestId
from lamina.wire.protocol import (
    MAX_REQUEST_ID,
    ClientConnection,
    Greeting,
    LocalProtocolError,
    ProtocolViolation,
    RejectedRequest,
    Request,
    Response,
    ServerConnection,
    auth_signature,
    encode_greeting,
    encode_protocol_error,
    verify_auth_signature,
)

NONCE = bytes(range(16))


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def request(request_id: Any, op: Any = "ping", args: Any = None) -> bytes:
    return frame(cbor2.dumps([request_id, op, {} if args is None else args]))


def unframe(data: bytes) -> Any:
    (length,) = struct.unpack_from(">I", data)
    assert len(data) == 4 + length
    return cbor2.loads(data[4:])


def greeted_server(**kwargs: Any) -> ServerConnection:
    conn = ServerConnection(auth_required=kwargs.pop("auth_required", False), **kwargs)
    conn.greeting(version="test", idle_timeout_s=300)
    return conn


def greeted_client(**limits: Any) -> ClientConnection:
    client = ClientConnection()
    greeting = encode_greeting(
        version="9.9", auth_required=False, nonce=NONCE, features=["rewind"],
        max_frame_bytes=limits.get("max_frame_bytes", 16 * 2**20), max_inflight=1024,
        max_waiting=64, idle_timeout_s=300,
    )
    [event] = client.receive_data(greeting)
    assert isinstance(event, Greeting)
    return client


def test_public_api_changes_only_on_purpose() -> None:
    assert sorted(protocol.__all__) == sorted([
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
    ])
    assert all(hasattr(protocol, name) for name in protocol.__all__)


# --- Requests in -------------------------------------------------------------------------------


def test_well_formed_request_is_delivered() -> None:
    conn = greeted_server()
    assert conn.receive_data(request(7, "get_queue", {"queue": "q"})) == [
        Request(7, "get_queue", {"queue": "q"})
    ]
    assert conn.outstanding_count == 1


def test_pipelined_requests_come_out_in_order_received() -> None:
    conn = greeted_server()
    events = conn.receive_data(request(3) + request(1) + request(2))
    assert [event.id for event in events] == [3, 1, 2]


def test_frame_split_across_many_reads() -> None:
    conn = greeted_server()
    data = request(1, "send", {"queue": "q", "messages": [b"x" * 300]})
    for byte in data[:-1]:
        assert conn.receive_data(bytes([byte])) == []
    assert conn.receive_data(data[-1:]) == [Request(1, "send", {"queue": "q", "messages": [b"x" * 300]})]


@given(st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=40))
def test_any_chunking_of_the_stream_yields_the_same_requests(cuts: list[int]) -> None:
    data = b"".join(request(i, "op", {"n": i, "pad": b"p" * i}) for i in range(1, 11))
    conn = greeted_server()
    events: list[Any] = []
    position = 0
    for size in cuts:
        events += conn.receive_data(data[position : position + size])
        position += size
    events += conn.receive_data(data[position:])
    assert events == [Request(i, "op", {"n": i, "pad": b"p" * i}) for i in range(1, 11)]


def test_zero_length_frame_is_protocol_error_without_body() -> None:
    conn = greeted_server()
    [event] = conn.receive_data(b"\x00\x00\x00\x00")
    assert isinstance(event, ProtocolViolation) and "zero-length" in event.message


def test_oversized_frame_is_protocol_error_from_header_alone() -> None:
    conn = greeted_server(max_frame_bytes=MIN_MAX_FRAME_BYTES)
    [event] = conn.receive_data(struct.pack(">I", MIN_MAX_FRAME_BYTES + 1))
    assert isinstance(event, ProtocolViolation) and "max_frame" in event.message


def test_frame_of_exactly_max_frame_is_accepted() -> None:
    conn = greeted_server(max_frame_bytes=MIN_MAX_FRAME_BYTES)
    [event] = conn.receive_data(padded_request(1, MIN_MAX_FRAME_BYTES))
    assert isinstance(event, Request)


def test_max_frame_below_the_protocol_minimum_is_refused() -> None:
    with pytest.raises(ValueError):
        ServerConnection(auth_required=False, max_frame_bytes=MIN_MAX_FRAME_BYTES - 1)


def test_requests_before_protocol_error_are_still_delivered() -> None:
    conn = greeted_server()
    events = conn.receive_data(request(1) + request(2) + frame(b"\xff") + request(3))
    assert events[:2] == [Request(1, "ping", {}), Request(2, "ping", {})]
    assert isinstance(events[2], ProtocolViolation) and len(events) == 3  # request 3 unparsed
    assert conn.protocol_error is events[2].error


@pytest.mark.parametrize("bad_header", [b"\x00\x00\x00\x00", b"\xff\xff\xff\xff"])
def test_requests_before_a_refused_frame_length_are_still_delivered(bad_header: bytes) -> None:
    conn = greeted_server()
    events = conn.receive_data(request(1) + request(2) + bad_header + request(3))
    assert events[:2] == [Request(1, "ping", {}), Request(2, "ping", {})]
    assert isinstance(events[2], ProtocolViolation) and len(events) == 3
    assert "frame" in events[2].message


def test_receive_data_after_a_violation_is_our_misuse() -> None:
    conn = greeted_server()
    conn.receive_data(frame(b"\xff"))
    with pytest.raises(LocalProtocolError):
        conn.receive_data(request(1))


@pytest.mark.parametrize(
    "item",
    [
        {"id": 1},  # not an array
        [1, "ping"],  # too short
        [1, "ping", {}, None],  # too long
        "ping",
    ],
)
def test_item_that_is_not_a_request_array_is_protocol_error(item: Any) -> None:
    [event] = greeted_server().receive_data(frame(cbor2.dumps(item)))
    assert isinstance(event, ProtocolViolation)


def test_bool_id_is_protocol_error() -> None:
    [event] = greeted_server().receive_data(request(True))
    assert isinstance(event, ProtocolViolation) and "request id" in event.message


@pytest.mark.parametrize("bad_id", [0, -1, 2**63, 2**64 - 1, 1.0, "1", b"\x01", None])
def test_id_outside_1_to_2_63_minus_1_is_protocol_error(bad_id: Any) -> None:
    [event] = greeted_server().receive_data(request(bad_id))
    assert isinstance(event, ProtocolViolation)


def test_largest_id_is_accepted() -> None:
    assert greeted_server().receive_data(request(MAX_REQUEST_ID)) == [Request(2**63 - 1, "ping", {})]


def test_bignum_tagged_id_is_protocol_error() -> None:
    body = b"\x83" + encode_head(6, 2) + b"\x41\x05" + cbor2.dumps("ping") + b"\xa0"
    [event] = greeted_server().receive_data(frame(body))
    assert isinstance(event, ProtocolViolation)
    # The peer is told what it sent in CBOR's terms, not in those of the server's code.
    assert event.message.endswith("not CBOR tag 2"), event.message


def test_self_described_request_is_protocol_error() -> None:
    body = encode_head(6, 55799) + cbor2.dumps([1, "ping", {}])
    [event] = greeted_server().receive_data(frame(body))
    assert isinstance(event, ProtocolViolation)


@pytest.mark.parametrize("op", [b"ping", 5, None, ["ping"]])
def test_op_that_is_not_text_is_protocol_error(op: Any) -> None:
    [event] = greeted_server().receive_data(request(1, op))
    assert isinstance(event, ProtocolViolation) and "op" in event.message


@pytest.mark.parametrize("args", [[], None, "queue", {1: "q"}, {b"queue": "q"}, {"queue": "q", 2: 0}])
def test_args_that_is_not_a_text_keyed_map_is_protocol_error(args: Any) -> None:
    [event] = greeted_server().receive_data(frame(cbor2.dumps([1, "ping", args])))
    assert isinstance(event, ProtocolViolation) and "args" in event.message


def test_duplicate_keys_in_args_are_protocol_error_not_invalid_argument() -> None:
    body = b"\x83\x01" + cbor2.dumps("receive") + b"\xa2\x63max\x01\x63max\x02"
    [event] = greeted_server().receive_data(frame(body))
    assert isinstance(event, ProtocolViolation)


def test_reused_id_while_unanswered_is_protocol_error() -> None:
    conn = greeted_server()
    events = conn.receive_data(request(5) + request(5))
    assert events[0] == Request(5, "ping", {})
    assert isinstance(events[1], ProtocolViolation) and "reused" in events[1].message


def test_id_may_be_reused_once_answered() -> None:
    conn = greeted_server()
    conn.receive_data(request(5))
    conn.respond(5, {"time": 1})
    assert conn.receive_data(request(5)) == [Request(5, "ping", {})]


def test_id_of_rejected_request_stays_outstanding_until_answered() -> None:
    conn = greeted_server()
    [rejected] = conn.receive_data(request(9, "receive", {"wait": float("nan")}))
    assert isinstance(rejected, RejectedRequest)
    [event] = conn.receive_data(request(9))
    assert isinstance(event, ProtocolViolation)


# --- Values inside args ------------------------------------------------------------------------


def test_nan_argument_is_invalid_argument_naming_field() -> None:
    conn = greeted_server()
    [event] = conn.receive_data(request(4, "receive", {"queue": "q", "wait": float("nan")}))
    assert isinstance(event, RejectedRequest) and (event.id, event.op) == (4, "receive")
    assert isinstance(event.error, InvalidArgument) and event.error.field == "wait"
    assert unframe(conn.respond_error(event.id, event.error)) == [
        4, {"code": "InvalidArgument", "message": event.error.message}, None
    ]
    assert "wait" in event.error.message
    assert conn.outstanding_count == 0


def test_infinite_float_deep_inside_names_the_top_level_field() -> None:
    args = {"queue": "q", "attributes": {"redrive": {"dlq": "d", "max_receives": float("inf")}}}
    [event] = greeted_server().receive_data(request(1, "create_queue", args))
    assert isinstance(event, RejectedRequest) and event.error.field == "attributes"


def test_a_bad_value_inside_one_batch_entry_is_left_for_that_entry_alone() -> None:
    args = {"queue": "q", "messages": [b"ok", {1: b"body", 2: {"weight": float("-inf")}}]}
    [event] = greeted_server().receive_data(request(1, "send", args))
    assert isinstance(event, Request) and event.args == args


@pytest.mark.parametrize(
    "encoded_value",
    [
        encode_head(6, 2) + b"\x41\x05",  # bignum 5
        encode_head(6, 1) + b"\x01",  # epoch datetime
        encode_head(6, 1234) + b"\x01",  # unknown tag
        b"\x81" + encode_head(6, 55799) + b"\x01",  # self-described, nested
        b"\xf0",  # simple value 16
        b"\xf7",  # undefined
        b"\xf8\xff",  # simple value 255
    ],
)
def test_tags_and_odd_simple_values_are_invalid_argument(encoded_value: bytes) -> None:
    body = b"\x83\x01" + cbor2.dumps("receive") + b"\xa2" + cbor2.dumps("queue") + cbor2.dumps("q") \
        + cbor2.dumps("max") + encoded_value
    [event] = greeted_server().receive_data(frame(body))
    assert isinstance(event, RejectedRequest)
    assert event.error.code == "InvalidArgument" and event.error.field == "max"


def test_true_false_null_stay_distinct_from_numbers() -> None:
    args = {"a": True, "b": False, "c": None, "d": 1, "e": 1.0, "f": 0}
    [event] = greeted_server().receive_data(request(1, "op", args))
    assert isinstance(event, Request)
    assert [type(event.args[key]) for key in "abcdef"] == [bool, bool, type(None), int, float, int]


def test_rejection_fails_only_that_request() -> None:
    conn = greeted_server()
    events = conn.receive_data(request(1, "op", {"x": float("inf")}) + request(2))
    assert isinstance(events[0], RejectedRequest) and events[1] == Request(2, "ping", {})


@settings(max_examples=300)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_give_requests_then_at_most_one_violation(data: bytes) -> None:
    events = greeted_server().receive_data(data)
    assert all(isinstance(event, (Request, RejectedRequest)) for event in events[:-1])
    assert sum(isinstance(event, ProtocolViolation) for event in events) <= 1


# --- Pre-auth ----------------------------------------------------------------------------------


def padded_request(request_id: int, body_size: int) -> bytes:
    """A request whose frame body is exactly ``body_size`` bytes."""
    padding = body_size - len(cbor2.dumps([request_id, "auth", {"p": b""}]))
    padding -= len(encode_head(2, padding)) - 1  # the padding's own head outgrows one byte
    data = request(request_id, "auth", {"p": bytes(padding)})
    assert len(data) - 4 == body_size
    return data


def test_pre_auth_frame_over_4_kib_is_protocol_error() -> None:
    assert PRE_AUTH_MAX_FRAME_BYTES == 4096
    conn = greeted_server(auth_required=True)
    [event] = conn.receive_data(struct.pack(">I", 4097))
    assert isinstance(event, ProtocolViolation)


def test_pre_auth_frame_of_exactly_4_kib_is_accepted() -> None:
    conn = greeted_server(auth_required=True)
    [event] = conn.receive_data(padded_request(1, 4096))
    assert isinstance(event, Request)


def test_pre_auth_delivers_one_request_at_a_time() -> None:
    conn = greeted_server(auth_required=True)
    assert conn.receive_data(request(1, "ping") + request(2, "ping")) == [Request(1, "ping", {})]
    assert conn.reading_paused
    conn.respond_error(1, Unauthorized("auth first"))
    assert conn.receive_data(b"") == [Request(2, "ping", {})]


def test_large_frame_pipelined_after_auth_is_judged_after_auth() -> None:
    conn = greeted_server(auth_required=True)
    auth = request(1, "auth", {"key": "k", "signature": b"s" * 32})
    [event] = conn.receive_data(auth + padded_request(2, 10_000))
    assert event.id == 1
    conn.authenticated()
    conn.respond(1, {"key": "k"})
    [event] = conn.receive_data(b"")
    assert isinstance(event, Request) and event.id == 2 and not conn.pre_auth


def test_without_auth_required_there_is_no_pre_auth_limit() -> None:
    conn = greeted_server(auth_required=False)
    assert not conn.pre_auth
    [event] = conn.receive_data(padded_request(1, 10_000))
    assert isinstance(event, Request)


def test_authenticated_outside_pre_auth_is_our_misuse() -> None:
    with pytest.raises(LocalProtocolError):
        greeted_server(auth_required=False).authenticated()


# --- Greeting and responses out ----------------------------------------------------------------


@pytest.mark.parametrize("auth_required", [True, False])
def test_greeting_carries_every_field_of_protocol_1(auth_required: bool) -> None:
    conn = ServerConnection(auth_required=auth_required, max_frame_bytes=4 * 2**20)
    greeting = unframe(conn.greeting(version="0.1.0", idle_timeout_s=300, features=["rewind"],
                                     max_inflight=512, max_waiting=32))
    assert greeting == [0, None, {
        "server": "lamina", "version": "0.1.0", "protocol": 1, "auth": auth_required,
        "nonce": conn.nonce, "features": ["rewind"],
        "limits": {"max_frame": 4 * 2**20, "max_inflight": 512, "max_waiting": 32,
                   "idle_timeout": 300},
    }]
    assert type(greeting[2]["nonce"]) is bytes and len(greeting[2]["nonce"]) == 16


def test_each_connection_has_its_own_nonce() -> None:
    assert ServerConnection(auth_required=True).nonce != ServerConnection(auth_required=True).nonce


def test_greeting_is_sent_once() -> None:
    conn = greeted_server()
    with pytest.raises(LocalProtocolError):
        conn.greeting(version="test", idle_timeout_s=1)


def test_no_response_before_the_greeting() -> None:
    conn = ServerConnection(auth_required=False)
    conn.receive_data(request(1))
    with pytest.raises(LocalProtocolError, match="greeting"):
        conn.respond(1, {})


def test_success_response_echoes_id_with_null_error() -> None:
    conn = greeted_server()
    conn.receive_data(request(12))
    assert unframe(conn.respond(12, {"time": 1700000000000})) == [12, None, {"time": 1700000000000}]


@given(st.integers(min_value=0, max_value=2**63 - 1),
       st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8) | st.none(),
                       max_size=4))
def test_success_response_is_the_cbor_of_its_array_byte_for_byte(request_id: int,
                                                                  result: dict[str, Any]
                                                                  ) -> None:
    assert protocol.encode_response(request_id, result) == frame(
        cbor2.dumps([request_id, None, result]))


def test_a_read_of_one_whole_frame_leaves_nothing_buffered_and_a_partial_one_does() -> None:
    conn = greeted_server()
    assert conn.receive_data(request(1)) == [Request(1, "ping", {})]
    assert not conn.buffering
    second = request(2)
    assert conn.receive_data(second[:3]) == [] and conn.buffering
    assert conn.receive_data(second[3:]) == [Request(2, "ping", {})]
    assert not conn.buffering


def test_error_response_carries_code_message_and_details() -> None:
    conn = greeted_server()
    conn.receive_data(request(3) + request(4))
    assert unframe(conn.respond_error(3, QueueNotFound("no queue 'q'"))) == [
        3, {"code": "QueueNotFound", "message": "no queue 'q'"}, None
    ]
    error = QueueNotFound("gone", details={"queue": "q"})
    assert unframe(conn.respond_error(4, error))[1]["details"] == {"queue": "q"}


def test_answering_an_id_not_awaiting_an_answer_is_our_misuse() -> None:
    conn = greeted_server()
    conn.receive_data(request(1))
    conn.respond(1, {})
    for answer in (lambda: conn.respond(1, {}), lambda: conn.respond(2, {})):
        with pytest.raises(LocalProtocolError):
            answer()


def test_response_over_max_frame_is_refused_and_request_stays_unanswered() -> None:
    conn = greeted_server(max_frame_bytes=MIN_MAX_FRAME_BYTES)
    conn.receive_data(request(1))
    with pytest.raises(LocalProtocolError, match="over max_frame"):
        conn.respond(1, {"blob": bytes(MIN_MAX_FRAME_BYTES)})
    assert conn.outstanding_count == 1
    conn.respond_error(1, InternalError("too big"))


def test_protocol_error_frame_is_id_zero_with_code_and_message() -> None:
    conn = greeted_server()
    [violation] = conn.receive_data(frame(b"\x9f\xff"))
    assert unframe(conn.protocol_error_frame()) == [
        0, {"code": "ProtocolError", "message": violation.message}, None
    ]
    assert unframe(encode_protocol_error("bad")) == [0, {"code": "ProtocolError", "message": "bad"}, None]


def test_protocol_error_frame_waits_for_earlier_requests_to_be_answered() -> None:
    conn = greeted_server()
    conn.receive_data(request(1) + frame(b"\xff"))
    with pytest.raises(LocalProtocolError, match="unanswered"):
        conn.protocol_error_frame()
    conn.respond(1, {"time": 0})
    conn.protocol_error_frame()


def test_nothing_is_sent_after_the_protocol_error_frame() -> None:
    conn = greeted_server()
    conn.receive_data(frame(b"\xff"))
    conn.protocol_error_frame()
    with pytest.raises(LocalProtocolError):
        conn.protocol_error_frame("again")


# --- Spliced receive and peek responses (their encoding: test_framing.py) --------------------


def test_spliced_responses_answer_their_request() -> None:
    conn = greeted_server()
    conn.receive_data(request(1, "receive") + request(2, "peek"))
    conn.respond_answer(1, ReceiveAnswer([]))
    conn.respond_answer(2, PeekAnswer([], None))
    assert conn.outstanding_count == 0


# --- Auth signatures ---------------------------------------------------------------------------


def test_auth_signature_is_hmac_sha256_of_context_nonce_and_key() -> None:
    # Known answers computed with `openssl dgst -sha256 -hmac`, independently of this code.
    assert auth_signature("s3cret", NONCE, "key-1").hex() == (
        "b230175eec79b749066b496ce7df9b3721084b53a6590907c1b305bb32483d0e")
    assert auth_signature("pässword", NONCE, "clé").hex() == (
        "1ecf7352a7bdd7d035fca399735835cb3f2e3a6af25378ed98df5dcb317fc079")


def test_verify_accepts_only_the_right_signature() -> None:
    good = auth_signature("s3cret", NONCE, "key-1")
    assert verify_auth_signature("s3cret", NONCE, "key-1", good)
    assert not verify_auth_signature("s3cret", NONCE, "key-2", good)
    assert not verify_auth_signature("s3cret", bytes(16), "key-1", good)
    assert not verify_auth_signature("other", NONCE, "key-1", good)
    assert not verify_auth_signature("s3cret", NONCE, "key-1", good[:-1])
    assert not verify_auth_signature("s3cret", NONCE, "key-1", good.hex())


def test_verify_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    verify_auth_signature("s3cret", NONCE, "key-1", b"x" * hashlib.sha256().digest_size)
    assert calls == [1]


# --- The client's side -------------------------------------------------------------------------


def test_client_parses_the_servers_greeting() -> None:
    server = ServerConnection(auth_required=True, nonce=NONCE)
    client = ClientConnection()
    [greeting] = client.receive_data(server.greeting(version="0.1.0", idle_timeout_s=2.5,
                                                     features=["rewind", "spark"]))
    assert greeting == Greeting(
        server="lamina", version="0.1.0", protocol=1, auth_required=True, nonce=NONCE,
        features=("rewind", "spark"), max_frame_bytes=16 * 2**20, max_inflight=1024,
        max_waiting=64, idle_timeout_s=2.5,
    )
    assert client.greeting == greeting


def test_client_ignores_greeting_keys_it_does_not_know() -> None:
    greeting = unframe(ServerConnection(auth_required=False).greeting(version="1", idle_timeout_s=1))
    greeting[2]["shiny"] = [1, 2]
    greeting[2]["limits"]["max_topics"] = 5
    [event] = ClientConnection().receive_data(frame(cbor2.dumps(greeting)))
    assert isinstance(event, Greeting)


@pytest.mark.parametrize("change", [
    lambda g: g[2].update(protocol=2),
    lambda g: g[2].update(nonce=b"short"),
    lambda g: g[2].update(auth=1),
    lambda g: g[2].pop("limits"),
    lambda g: g.__setitem__(0, 1),
])
def test_client_refuses_a_greeting_it_cannot_trust(change: Any) -> None:
    greeting = unframe(ServerConnection(auth_required=False).greeting(version="1", idle_timeout_s=1))
    change(greeting)
    [event] = ClientConnection().receive_data(frame(cbor2.dumps(greeting)))
    assert isinstance(event, ProtocolViolation)


def test_client_ids_count_up_from_one_and_encode_the_envelope() -> None:
    client = ClientConnection()
    first_id, first = client.encode_request("ping")
    second_id, second = client.encode_request("get_queue", {"queue": "q"})
    assert (first_id, second_id) == (1, 2)
    assert unframe(first) == [1, "ping", {}]
    assert unframe(second) == [2, "get_queue", {"queue": "q"}]
    assert client.outstanding_count == 2


def test_round_trip_with_responses_out_of_order() -> None:
    server, client = greeted_server(), ClientConnection()
    client.receive_data(ServerConnection(auth_required=False).greeting(version="1", idle_timeout_s=1))
    frames = [client.encode_request("receive", {"queue": "q", "wait": 5})[1],
              client.encode_request("ping")[1]]
    assert [event.id for event in server.receive_data(b"".join(frames))] == [1, 2]
    replies = server.respond(2, {"time": 7}) + server.respond_error(1, QueueNotFound("q"))
    assert client.receive_data(replies) == [
        Response(2, None, {"time": 7}),
        Response(1, {"code": "QueueNotFound", "message": "q"}, None),
    ]
    assert client.outstanding_count == 0


def test_client_response_for_an_id_it_did_not_send_is_violation() -> None:
    client = greeted_client()
    [event] = client.receive_data(frame(cbor2.dumps([5, None, {}])))
    assert isinstance(event, ProtocolViolation)


@pytest.mark.parametrize("reply", [[1, None, None], [1, {"code": "X"}, None],
                                   [1, {"code": "X", "message": "m"}, {}], [True, None, {}]])
def test_client_malformed_response_is_violation(reply: Any) -> None:
    client = greeted_client()
    client.encode_request("ping")
    [event] = client.receive_data(frame(cbor2.dumps(reply)))
    assert isinstance(event, ProtocolViolation)


def test_client_first_frame_must_be_the_greeting() -> None:
    client = ClientConnection()
    client.encode_request("ping")
    [event] = client.receive_data(frame(cbor2.dumps([1, None, {"time": 1}])))
    assert isinstance(event, ProtocolViolation) and "greeting" in event.message


def test_server_frame_over_the_clients_max_is_violation_from_header_alone() -> None:
    client = ClientConnection(max_frame_bytes=1000)
    [event] = client.receive_data(struct.pack(">I", 1001))
    assert isinstance(event, ProtocolViolation)


def test_client_sees_the_final_protocol_error_as_response_id_zero() -> None:
    client = greeted_client()
    request_id, _ = client.encode_request("ping")
    late_answer = frame(cbor2.dumps([request_id, None, {"time": 1}]))
    events = client.receive_data(encode_protocol_error("bad frame") + late_answer)
    assert events[0] == Response(0, {"code": "ProtocolError", "message": "bad frame"}, None)
    assert isinstance(events[1], ProtocolViolation)


def test_client_refuses_a_request_over_the_servers_max_frame() -> None:
    client = greeted_client(max_frame_bytes=MIN_MAX_FRAME_BYTES)
    with pytest.raises(LocalProtocolError, match="max_frame"):
        client.encode_request("send", {"messages": [bytes(MIN_MAX_FRAME_BYTES)]})
    assert client.encode_request("ping")[0] == 1  # the refused request used no id


def test_client_before_greeting_assumes_the_protocol_minimum_max_frame() -> None:
    client = ClientConnection()
    with pytest.raises(LocalProtocolError):
        client.encode_request("send", {"messages": [bytes(MIN_MAX_FRAME_BYTES)]})


def test_misuse_is_told_apart_by_class_not_by_message() -> None:
    conn = greeted_server(max_frame_bytes=MIN_MAX_FRAME_BYTES)
    conn.receive_data(request(1))
    with pytest.raises(UnknownRequestId):
        conn.respond(2, {})
    with pytest.raises(AnswerTooLarge):
        conn.respond(1, {"blob": bytes(MIN_MAX_FRAME_BYTES)})
    client = greeted_client(max_frame_bytes=MIN_MAX_FRAME_BYTES)
    with pytest.raises(RequestTooLarge):
        client.encode_request("send", {"blob": bytes(MIN_MAX_FRAME_BYTES)})
    for kind in (UnknownRequestId, AnswerTooLarge, RequestTooLarge):
        assert issubclass(kind, LocalProtocolError)


@pytest.mark.parametrize("answer, expected", [
    (MapAnswer({"n": 1}), [7, None, {"n": 1}]),
    (EntriesAnswer([None, QueueNotFound("q")]),
     [7, None, {"results": [None, {"code": "QueueNotFound", "message": "q"}]}]),
    (PeekAnswer([], None), [7, None, {"messages": [], "next": None}]),
    (ReceiveAnswer([]), [7, None, {"messages": []}]),
    (SendAnswer([]), [7, None, {"results": []}]),
    (QueueNotFound("gone"), [7, {"code": "QueueNotFound", "message": "gone"}, None]),
])
def test_respond_answer_encodes_each_kind_of_answer(answer: Any, expected: Any) -> None:
    conn = greeted_server()
    conn.receive_data(request(7))
    assert unframe(conn.respond_answer(7, answer)) == expected
    assert conn.outstanding_count == 0
