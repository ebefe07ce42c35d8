"""The stored record, message ids and CBOR heads."""

import hashlib

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lamina.engine.records import (
    Message,
    cbor_head,
    encode_record,
    message_id,
    parse_message_id,
)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_cbor_head_is_the_shortest_encoding(value):
    assert cbor_head(0, value) == cbor2.dumps(value)


@given(body=st.one_of(st.binary(min_size=1), st.text(min_size=1)),
       attributes=st.none() | st.dictionaries(st.text(min_size=1), st.integers()),
       topic=st.none() | st.text(min_size=1),
       priority=st.integers(1, 16),
       enqueue=st.integers(0, 2**63 - 1), delay=st.integers(0, 10**9))
def test_hand_built_record_equals_cbor2_encoding(body, attributes, topic, priority, enqueue,
                                                 delay):
    msg_id = message_id(3, 12345, priority)
    data = body.encode() if isinstance(body, str) else body
    md5 = hashlib.md5(data).digest()
    record = encode_record(msg_id, cbor2.dumps(body),
                           cbor2.dumps(attributes) if attributes is not None else None,
                           topic, priority, enqueue, enqueue + delay, md5)
    expected = [msg_id, body, attributes, topic, priority, enqueue, enqueue + delay, md5, None]
    assert record == cbor2.dumps(expected)
    assert Message.decode(record) == Message(*expected)


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(1, 16))
def test_message_ids_round_trip(queue, seq, lane):
    assert parse_message_id(message_id(queue, seq, lane)) == (queue, seq, lane)


def test_message_ids_sort_in_production_order_across_lanes():
    ids = [message_id(1, seq, lane) for seq, lane in [(0, 16), (1, 1), (2, 8), (300, 2)]]
    assert ids == sorted(ids)


@pytest.mark.parametrize("bad", [None, 5, "", "x" * 25, "0" * 24, "A" * 25, "0" * 26])
def test_malformed_message_ids_do_not_parse(bad):
    assert parse_message_id(bad) is None


def test_shorter_and_longer_records_decode_with_defaults():
    short = cbor2.dumps(["id", b"body"])
    assert Message.decode(short) == Message("id", b"body", None, None, 8, 0, 0, b"", None)
    longer = cbor2.dumps(["id", b"b", None, None, 3, 1, 2, b"m" * 16, None, "future"])
    assert Message.decode(longer).priority == 3
