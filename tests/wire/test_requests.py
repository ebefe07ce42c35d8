"""A request's frame spliced around its args (``wire/requests.py``): the bytes cbor2 gives for
``[id, op, args]`` behind their length, which the server reads back as that request."""

from __future__ import annotations

import struct
from typing import Any

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.wire.protocol import MAX_REQUEST_ID, ClientConnection, Request, ServerConnection
from lamina.wire.requests import encode_request_frame

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**64, 2**64 - 1) | st.binary(max_size=300)
    | st.text(max_size=40) | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=5),
    max_leaves=20)
_args = st.dictionaries(st.text(max_size=20), _values, max_size=6)
_ids = st.integers(1, MAX_REQUEST_ID) | st.sampled_from(
    [1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, MAX_REQUEST_ID])


@settings(max_examples=300, deadline=None)
@given(request_id=_ids, op=st.text(max_size=30), args=_args)
def test_a_request_frame_is_cbor2s_encoding_of_id_op_args_behind_its_length(
        request_id: int, op: str, args: dict[str, Any]) -> None:
    body = cbor2.dumps([request_id, op, args])
    assert encode_request_frame(request_id, op, args) == struct.pack(">I", len(body)) + body


@settings(max_examples=100, deadline=None)
@given(op=st.sampled_from(["ping", "send", "receive", "delete", "a-new-op"]), args=_args)
def test_the_server_reads_a_clients_request_back_as_it_was_sent(op: str,
                                                               args: dict[str, Any]) -> None:
    server, client = ServerConnection(auth_required=False), ClientConnection()
    for _ in range(2):  # ids 1 and 2, and the same op's text again
        request_id, frame = client.encode_request(op, args)
        [event] = server.receive_data(frame)
        assert type(event) is Request and event == (request_id, op, args)
