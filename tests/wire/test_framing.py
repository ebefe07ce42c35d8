"""Specification of PROTOCOL.md §1 at the byte level: frames, strict CBOR items, CBOR heads."""

from __future__ import annotations

import math
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.engine.errors import LaminaError, ProtocolError
from lamina.engine.records import cbor_head as encode_head
from lamina.engine.results import Delivery, FirstDeliveries, Sent
from lamina.wire.framing import (
    COLLECT_BODY_BYTES,
    MAX_NESTING_DEPTH,
    CBORTagged,
    FAST_DECODE_MAX_BYTES,
    FrameReader,
    decode_frame_item,
    decode_item,
    decode_item_strict,
    encode_frame_header,
    encode_int,
    find_unsupported_value,
    head_size,
    int_size,
)
from lamina.wire.splicing import (
    PEEK_STATES,
    DeliveryFrame,
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


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def tag_head(number: int) -> bytes:
    return encode_head(6, number)


# --- CBOR heads ----------------------------------------------------------------------------------

BOUNDARIES = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]


@pytest.mark.parametrize("argument", BOUNDARIES)
def test_unsigned_head_is_shortest_form_like_cbor2(argument: int) -> None:
    assert encode_head(0, argument) == cbor2.dumps(argument)
    assert head_size(argument) == len(cbor2.dumps(argument))


@pytest.mark.parametrize(
    ("argument", "first_byte_low_bits", "size"),
    [(0, 0, 1), (23, 23, 1), (24, 24, 2), (255, 24, 2), (256, 25, 3), (65535, 25, 3),
     (65536, 26, 5), (2**32 - 1, 26, 5), (2**32, 27, 9), (2**64 - 1, 27, 9)],
)
@pytest.mark.parametrize("major_type", range(8))
def test_head_carries_major_type_and_big_endian_argument(
    major_type: int, argument: int, first_byte_low_bits: int, size: int
) -> None:
    head = encode_head(major_type, argument)
    assert len(head) == size
    assert head[0] == major_type << 5 | first_byte_low_bits
    assert int.from_bytes(head[1:] or bytes([argument]), "big") == argument


@pytest.mark.parametrize("length", [0, 1, 23, 24, 255, 256, 65535, 65536, 70000])
def test_length_heads_match_cbor2_strings_and_arrays(length: int) -> None:
    for major_type, value in ((2, bytes(length)), (3, "a" * length), (4, [0] * length),
                              (5, {i: 0 for i in range(length)})):
        head = encode_head(major_type, length)
        assert cbor2.dumps(value)[: len(head)] == head


@given(st.integers(min_value=-(2**64), max_value=2**64 - 1))
def test_encode_int_matches_cbor2_over_the_whole_range(value: int) -> None:
    assert encode_int(value) == cbor2.dumps(value)
    assert int_size(value) == len(cbor2.dumps(value))


@pytest.mark.parametrize(("major_type", "argument"), [(0, 2**64), (0, -1), (8, 1), (8, 100), (-1, 0)])
def test_head_outside_cbor_range_is_refused(major_type: int, argument: int) -> None:
    with pytest.raises(ValueError):
        encode_head(major_type, argument)


@pytest.mark.parametrize("length", [0, 2**32])
def test_frame_header_refuses_unrepresentable_lengths(length: int) -> None:
    with pytest.raises(ValueError):
        encode_frame_header(length)


# --- Cutting frames out of the stream ----------------------------------------------------------


def test_zero_length_frame_is_protocol_error_without_body() -> None:
    reader = FrameReader(1024)
    reader.feed(b"\x00\x00\x00\x00")
    with pytest.raises(ProtocolError, match="zero-length"):
        reader.next_frame()


def test_oversized_length_is_protocol_error_from_header_alone() -> None:
    reader = FrameReader(1024)
    reader.feed(struct.pack(">I", 1025))  # no body byte has arrived
    with pytest.raises(ProtocolError, match="exceeds max_frame 1024"):
        reader.next_frame()


def test_frame_of_exactly_max_length_is_accepted() -> None:
    reader = FrameReader(10)
    reader.feed(frame(b"0123456789"))
    assert reader.next_frame() == b"0123456789"


def test_frame_split_across_many_reads() -> None:
    reader = FrameReader(1024)
    data = frame(b"abcdefgh")
    for byte in data[:-1]:
        reader.feed(bytes([byte]))
        assert reader.next_frame() is None
    reader.feed(data[-1:])
    assert reader.next_frame() == b"abcdefgh"
    assert reader.next_frame() is None
    assert reader.buffered_bytes == 0


def test_several_frames_in_one_read_come_out_in_order() -> None:
    reader = FrameReader(1024)
    reader.feed(frame(b"one") + frame(b"two") + frame(b"three")[:5])
    assert [reader.next_frame(), reader.next_frame(), reader.next_frame()] == [b"one", b"two", None]
    assert reader.buffered_bytes == 5
    reader.feed(frame(b"three")[5:])
    assert reader.next_frame() == b"three"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 3, 1000, COLLECT_BODY_BYTES - 1, COLLECT_BODY_BYTES,
                                 COLLECT_BODY_BYTES + 70_000]), min_size=1, max_size=4),
       st.lists(st.integers(1, 3) | st.integers(1000, 200_000), min_size=1, max_size=30)
       .filter(lambda cuts: sum(cuts) > 5000), st.booleans())
def test_frames_come_out_whole_however_the_stream_is_cut(sizes: list[int], cuts: list[int],
                                                         collect: bool) -> None:
    # Large bodies given their whole buffer early: the same frames, the same counts.
    bodies = [bytes([n % 251 + 1]) * size + b"!" for n, size in enumerate(sizes)]
    data = b"".join(frame(body) for body in bodies)
    reader = FrameReader(4 * COLLECT_BODY_BYTES)
    got: list[bytes] = []
    position, fed = 0, 0
    for cut in cuts * (len(data) // sum(cuts) + 1):
        if position >= len(data):
            break
        piece = data[position:position + cut]
        position += len(piece)
        reader.feed(piece)
        if collect:
            reader.collect_front_frame()
        fed += len(piece)
        assert reader.buffered_bytes == fed - sum(len(b) + 4 for b in got)
        while (body := reader.next_frame()) is not None:
            got.append(body)
            assert reader.buffered_bytes == fed - sum(len(b) + 4 for b in got)
        if reader.buffered_bytes >= 4 and len(got) < len(bodies):
            assert reader.front_frame_bytes == len(bodies[len(got)]) + 4
    assert got == bodies and reader.buffered_bytes == 0


def _drain(reader: FrameReader, got: list[bytes]) -> bool:
    """Take the reader's frames into ``got``; whether it refused one."""
    try:
        while (body := reader.next_frame()) is not None:
            got.append(body)
    except ProtocolError:
        return True
    return False


@settings(max_examples=300)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=6), st.integers(0, 6),
       st.sampled_from([None, 0, 41]), st.lists(st.integers(1, 90), min_size=1, max_size=12))
def test_whole_frames_cut_a_read_as_next_frame_would(bodies: list[bytes], bad_at: int,
                                                     bad_length: int | None,
                                                     cuts: list[int]) -> None:
    frames = [frame(body) for body in bodies]
    if bad_length is not None:  # a zero-length or (whole) oversized frame somewhere in it
        frames.insert(min(bad_at, len(frames)), struct.pack(">I", bad_length) + b"r" * 41)
    data = b"".join(frames)
    expected: list[bytes] = []
    reference = FrameReader(40)
    reference.feed(data)
    refused = _drain(reference, expected)
    reader, got, position = FrameReader(40), [], 0
    for cut in cuts * (len(data) // sum(cuts) + 1):
        if position >= len(data):
            break
        piece = data[position:position + cut]
        position += len(piece)
        got.extend(reader.whole_frames(piece))
        if _drain(reader, got):
            assert refused and got == expected
            return
    assert got == expected and not refused


def test_whole_frames_leaves_a_partial_frame_buffered() -> None:
    reader = FrameReader(1024)
    data = frame(b"one") + frame(b"two") + frame(b"three")
    assert reader.whole_frames(data[:-2]) == [b"one", b"two"]
    assert reader.buffered_bytes == len(frame(b"three")) - 2
    assert reader.whole_frames(data[-2:]) == []  # behind the pending bytes: fed
    assert reader.next_frame() == b"three" and reader.buffered_bytes == 0


def test_reader_stays_failed_after_a_bad_header() -> None:
    reader = FrameReader(1024)
    reader.feed(b"\x00\x00\x00\x00" + frame(b"fine"))
    with pytest.raises(ProtocolError):
        reader.next_frame()
    reader.feed(frame(b"also fine"))
    with pytest.raises(ProtocolError):
        reader.next_frame()


def test_lowered_limit_applies_to_the_next_header() -> None:
    reader = FrameReader(1024)
    reader.feed(frame(b"x" * 100) + frame(b"y" * 100))
    assert reader.next_frame() == b"x" * 100
    reader.max_frame_bytes = 99
    with pytest.raises(ProtocolError):
        reader.next_frame()


# --- One strict CBOR item ----------------------------------------------------------------------


def test_well_formed_item_decodes() -> None:
    assert decode_item(cbor2.dumps([1, "op", {"a": b"b"}])) == [1, "op", {"a": b"b"}]


@pytest.mark.parametrize("trailing", [b"\x00", b"\x18", b"\x81", b"\xff", bytes(1000)])
def test_trailing_bytes_after_item_are_protocol_error(trailing: bytes) -> None:
    with pytest.raises(ProtocolError, match="trailing"):
        decode_item(cbor2.dumps([1, "ping", {}]) + trailing)


@pytest.mark.parametrize(
    "body",
    [
        b"\x83\x01",  # truncated array
        b"\x1c",  # reserved additional information
        b"\xff",  # a lone break code
        b"\xf8\x14",  # two-byte encoding of a simple value below 32
        b"\x62\xc3\x28",  # text string with invalid UTF-8
        b"\x5a\xff\xff\xff\xff\x00",  # byte string claiming 4 GiB
    ],
)
def test_malformed_cbor_is_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        decode_item(body)


@pytest.mark.parametrize(
    "body",
    [b"\x9f\x01\xff", b"\xbf\x61a\x01\xff", b"\x5f\x41a\xff", b"\x7f\x61a\xff",
     b"\x81\x9f\xff"],
)
def test_indefinite_length_items_are_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_item(body)


@pytest.mark.parametrize(
    "body",
    [
        b"\xa2\x01\x00\xf5\x00",  # {1: 0, true: 0}
        b"\xa2\xf5\x00\x01\x00",  # {true: 0, 1: 0}
        b"\xa2\x01\x00\xf9\x3c\x00\x00",  # {1: 0, 1.0 (half float): 0}
        b"\xa2\xf5\x00\xfb\x3f\xf0\x00\x00\x00\x00\x00\x00\x00",  # {true: 0, 1.0: 0}
        b"\xa2\x61a\x00\x61a\x00",  # {"a": 0, "a": 0}
        b"\x81\xa1\x61x\xa2\x00\x00\xf9\x00\x00\x00",  # [{"x": {0: 0, 0.0: 0}}]: nested
    ],
)
def test_duplicate_keys_one_and_true_are_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError, match="[Dd]uplicate"):
        decode_item(body)


def test_text_and_byte_string_keys_are_different_keys() -> None:
    assert decode_item(b"\xa2\x61a\x00\x41a\x01") == {"a": 0, b"a": 1}


def _arrays_around_scalar(depth: int) -> bytes:
    """Deepest item (the scalar) at ``depth``; the outermost item is depth 1."""
    return b"\x81" * (depth - 1) + b"\x01"


def _arrays_around_empty_array(depth: int) -> bytes:
    return b"\x81" * (depth - 1) + b"\x80"


def _maps_around_scalar(depth: int) -> bytes:
    return b"\xa1\x61k" * (depth - 1) + b"\x01"


@pytest.mark.parametrize("shape", [_arrays_around_scalar, _arrays_around_empty_array, _maps_around_scalar])
def test_nested_depth_32_accepted_33_rejected(shape) -> None:  # type: ignore[no-untyped-def]
    assert MAX_NESTING_DEPTH == 32
    decode_item(shape(32))
    with pytest.raises(ProtocolError, match="nesting deeper than 32"):
        decode_item(shape(33))


def test_a_tag_counts_as_a_nesting_level() -> None:
    assert decode_item(b"\x81" * 30 + tag_head(42) + b"\x01") is not None  # scalar at depth 32
    with pytest.raises(ProtocolError):
        decode_item(b"\x81" * 31 + tag_head(42) + b"\x01")  # scalar at depth 33


@pytest.mark.parametrize(
    ("number", "content"),
    [(2, b"\x41\x01"), (3, b"\x41\x01"), (0, b"\x61a"), (1, b"\x01"), (28, b"\x01"),
     (29, b"\x00"), (55799, b"\x01"), (42, b"\x01"), (2**32, b"\x01"), (256, b"\x01")],
)
def test_every_tag_decodes_to_a_marker_never_to_its_content(number: int, content: bytes) -> None:
    [marker] = decode_item(b"\x81" + tag_head(number) + content)
    assert isinstance(marker, CBORTagged) and marker.tag == number


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_only_protocol_error(body: bytes) -> None:
    try:
        decode_item(body)
    except ProtocolError:
        pass


# --- The fast decoder answers exactly as the strict one --------------------------------------


def _exact(value: object) -> object:
    """``value`` with every distinction the protocol makes spelled out: types (``1`` vs
    ``1.0`` vs ``True``), float bits (NaN, -0.0), and tag markers by number."""
    kind = type(value)
    if kind is float:
        return ("float", struct.pack(">d", value))
    if kind in (list, tuple):
        return (kind.__name__, [_exact(v) for v in value])  # type: ignore[attr-defined]
    if kind in (dict, cbor2.frozendict):
        return (kind.__name__, [(_exact(k), _exact(v))
                                for k, v in value.items()])  # type: ignore[attr-defined]
    if kind is CBORTagged:
        return ("tag", value.tag)  # type: ignore[attr-defined]
    if kind is cbor2.CBORSimpleValue:
        return ("simple", value.value)  # type: ignore[attr-defined]
    return (kind.__name__, value)


def _outcome(decode, body: bytes) -> object:  # type: ignore[no-untyped-def]
    try:
        return _exact(decode(body))
    except ProtocolError:
        return "ProtocolError"


def _heads(major: int) -> st.SearchStrategy[bytes]:
    """A head of ``major`` type with a small, edge or indefinite argument, in any width."""
    return st.one_of(
        st.integers(0, 27).map(lambda info: bytes([major << 5 | info])),
        st.just(bytes([major << 5 | 31])),  # indefinite length / break
        st.integers(0, 2**16).map(lambda n: encode_head(major, n)),
    )


plain_items = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64 - 1),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
              st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-3, 3),
                                                      st.booleans()), inner, max_size=4)),
    max_leaves=12,
)
# Pieces glued at random: valid items, heads of every major type (tags, simple values,
# indefinite lengths, breaks) and raw bytes, so that bodies are sometimes well formed and often
# almost: truncated, with trailing bytes, duplicate keys, stray breaks, deep nesting.
_pieces = st.one_of(
    plain_items.map(cbor2.dumps),
    st.integers(0, 7).flatmap(_heads),
    st.binary(min_size=1, max_size=4),
    st.integers(30, 34).map(lambda depth: b"\x81" * depth),
    st.sampled_from([b"\xa2\x01\x00\xf5\x00", b"\xa2\x61a\x00\x61a\x00", b"\xf9\x7e\x00",
                     b"\xc2\x41\x01", b"\xd8\x1c\x01", b"\xd9\xd9\xf7\x01", b"\x9f\xff",
                     b"\xf8\x20", b"\xf7", b"\xff"]),
)
cbor_like_bodies = st.lists(_pieces, min_size=1, max_size=8).map(b"".join)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(cbor_like_bodies, plain_items.map(cbor2.dumps), st.binary(max_size=48)))
def test_fast_decoder_accepts_and_rejects_exactly_what_the_strict_one_does(body: bytes) -> None:
    assert _outcome(decode_item, body) == _outcome(decode_item_strict, body)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(cbor_like_bodies, plain_items.map(cbor2.dumps), st.binary(max_size=48)))
def test_a_whole_frame_decodes_exactly_as_its_body_does(body: bytes) -> None:
    frame = struct.pack(">I", len(body)) + body
    assert _outcome(decode_frame_item, frame) == _outcome(decode_item_strict, body)


@settings(max_examples=200, deadline=None)
@given(plain_items.map(cbor2.dumps), st.binary(min_size=1, max_size=20))
def test_fast_decoder_never_ignores_trailing_bytes(body: bytes, trailing: bytes) -> None:
    assert _outcome(decode_item, body + trailing) == _outcome(decode_item_strict, body + trailing)
    if _outcome(decode_item_strict, body) != "ProtocolError":
        with pytest.raises(ProtocolError):  # a complete item plus anything is never one item
            decode_item(body + trailing)


def test_fast_decoder_bounds() -> None:
    # Bodies past the fast path's size go to the strict decoder, with the same rules.
    big = cbor2.dumps([1, "send", {"messages": [b"x" * FAST_DECODE_MAX_BYTES]}])
    assert decode_item(big) == cbor2.loads(big)
    with pytest.raises(ProtocolError, match="trailing"):
        decode_item(big + b"\x00")
    # Depth is counted as if the body were alone: the wrapping array adds no level.
    decode_item(b"\x81" * 31 + b"\x01")
    with pytest.raises(ProtocolError, match="nesting deeper than 32"):
        decode_item(b"\x81" * 32 + b"\x01")


# --- Values a request may not carry ------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"\xf9\x7e\x00", b"\xfa\x7f\xc0\x00\x00", b"\xfb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # NaN
     b"\xf9\x7c\x00", b"\xf9\xfc\x00", b"\xfb\x7f\xf0\x00\x00\x00\x00\x00\x00"],  # +-inf
)
def test_nan_and_infinite_floats_are_unsupported_at_every_width(body: bytes) -> None:
    value = decode_item(body)
    assert not math.isfinite(value)
    assert "finite" in (find_unsupported_value([1, {"x": value}]) or "")


@pytest.mark.parametrize("body", [b"\xe0", b"\xf0", b"\xf7", b"\xf8\x20", b"\xf8\xff"])
def test_simple_values_other_than_true_false_null_are_unsupported(body: bytes) -> None:
    assert find_unsupported_value({"x": [decode_item(body)]}) is not None


def test_tag_as_nested_map_key_is_unsupported() -> None:
    value = decode_item(b"\xa1" + tag_head(2) + b"\x41\x01" + b"\x00")
    assert find_unsupported_value(value) == "CBOR tag 2 is not allowed"


def test_plain_values_are_supported() -> None:
    plain = decode_item(cbor2.dumps([True, False, None, 1, -1, 1.5, -0.0, "t", b"b", [], {},
                                     {1: [2**64 - 1, -(2**64)]}, {(1, 2): 0}]))
    assert find_unsupported_value(plain) is None


# --- Spliced receive and peek frames -----------------------------------------------------------

ints = st.integers(min_value=0, max_value=2**64 - 1)
records = st.builds(
    lambda *fields: cbor2.dumps(list(fields)),
    st.text(max_size=30),  # id
    st.one_of(st.binary(max_size=300), st.text(max_size=100)),  # body
    st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.one_of(
        st.text(max_size=8), st.binary(max_size=8), st.integers(), st.booleans(),
        st.floats(allow_nan=False, allow_infinity=False)), max_size=4)),  # attributes
    st.one_of(st.none(), st.text(max_size=10)),  # topic
    st.integers(min_value=1, max_value=16), ints, ints,  # priority, enqueue_time, visible_time
    st.binary(min_size=16, max_size=16),  # md5
    st.one_of(st.none(), st.tuples(st.text(max_size=5), st.text(max_size=5), ints,
                                   st.text(max_size=5), ints).map(list)),  # dead
)
deliveries = st.builds(DeliveryFrame, records, st.binary(max_size=300), ints, ints, ints)
# What a server sends (the encoder's fast path): one receipt length, small dequeue counts,
# times in ms since 1970 (past 2^32), and the edges of that path.
usual_deliveries = st.builds(DeliveryFrame, records, st.just(b"r" * 41), st.integers(0, 30),
                             st.integers(2**32 - 2, 2**41), st.integers(2**32 - 2, 2**41))
request_ids = st.integers(min_value=1, max_value=2**63 - 1)


@settings(max_examples=300)
@given(request_ids, st.lists(st.one_of(deliveries, usual_deliveries), max_size=30))
def test_receive_response_splices_records_byte_identically(request_id: int, items: list[Any]) -> None:
    data = encode_receive_response(request_id, items)
    body = data[4:]
    structure = [request_id, None, {"messages": [
        [cbor2.loads(record), receipt, count, first, next_visible]
        for record, receipt, count, first, next_visible in items
    ]}]
    assert cbor2.dumps(structure) == body
    assert cbor2.dumps(cbor2.loads(body)) == body
    assert struct.unpack(">I", data[:4])[0] == len(body)
    assert receive_response_overhead(request_id, len(items)) + sum(map(delivery_size, items)) == len(body)


def expected_receive_body(request_id: int, items: list[DeliveryFrame]) -> bytes:
    return cbor2.dumps([request_id, None, {"messages": [
        [cbor2.loads(record), receipt, count, first, next_visible]
        for record, receipt, count, first, next_visible in items]}])


# A batch of first deliveries (what most receives answer): one receipt length, dequeue count
# and pair of times for all, at the edges of each integer's head widths.
edge_ints = st.sampled_from([0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
                             1_764_000_000_000, 2**64 - 1])


@settings(max_examples=300)
@given(request_ids, st.lists(records, min_size=1, max_size=30),
       st.sampled_from([0, 23, 24, 41, 255, 256]), st.one_of(edge_ints, ints),
       st.one_of(edge_ints, ints), st.one_of(edge_ints, ints))
def test_receive_response_of_a_uniform_batch_is_byte_identical_to_cbor2(
        request_id: int, stored: list[bytes], receipt_bytes: int, count: int, first: int,
        next_visible: int) -> None:
    items = [DeliveryFrame(record, bytes([n % 256]) * receipt_bytes, count, first, next_visible)
             for n, record in enumerate(stored)]
    assert encode_receive_response(request_id, items) == frame(expected_receive_body(request_id, items))


@settings(max_examples=100)
@given(request_ids, st.lists(records, min_size=2, max_size=10), st.integers(0, 3))
def test_receive_response_of_a_batch_differing_in_one_delivery_is_byte_identical_to_cbor2(
        request_id: int, stored: list[bytes], field: int) -> None:
    items = [DeliveryFrame(record, b"r" * 41, 1, 1_764_000_000_000, 1_764_000_030_000)
             for record in stored]
    last = list(items[-1])
    last[1 + field] = b"r" * 40 if field == 0 else 25  # receipt, count or a time
    items[-1] = DeliveryFrame(*last)
    assert encode_receive_response(request_id, items) == frame(expected_receive_body(request_id, items))


@pytest.mark.parametrize("count", [1, 5, 6, 16])
def test_the_engines_deliveries_are_spliced_as_their_tuples_would_be(count: int) -> None:
    record = cbor2.dumps(["id", b"body", None, None, 1, 2, 3, bytes(16), None])
    items = [DeliveryFrame(record, bytes([n]) * 41, 1, 1_764_000_000_000, 1_764_000_030_000)
             for n in range(count)]
    deliveries = [Delivery(*item) for item in items]
    assert encode_receive_response(3, deliveries) == encode_receive_response(3, items)
    assert encode_receive_response(3, deliveries) == frame(expected_receive_body(3, items))
    assert sum(map(delivery_size, deliveries)) == sum(map(delivery_size, items))


@settings(max_examples=200)
@given(request_ids, st.lists(records, min_size=1, max_size=30), st.one_of(edge_ints, ints),
       st.one_of(edge_ints, ints))
def test_first_deliveries_are_spliced_from_their_columns_as_their_tuples_would_be(
        request_id: int, stored: list[bytes], first: int, next_visible: int) -> None:
    receipts = [bytes([n % 256]) * 41 for n in range(len(stored))]
    columns = FirstDeliveries(stored, receipts, first, next_visible)
    items = [DeliveryFrame(record, receipt, 1, first, next_visible)
             for record, receipt in zip(stored, receipts)]
    assert encode_receive_response(request_id, columns) == frame(
        expected_receive_body(request_id, items))
    assert columns._made is None  # spliced without a Delivery object each


@pytest.mark.parametrize("count", [0, 1, 23, 24, 255, 256])
def test_receive_response_sizes_are_exact_across_array_head_widths(count: int) -> None:
    record = cbor2.dumps(["id", b"body", None, None, 1, 2, 3, bytes(16), None])
    items = [DeliveryFrame(record, b"r" * 24, 1, 1_700_000_000_000, 1_700_000_030_000)] * count
    body = encode_receive_response(70000, items)[4:]
    assert cbor2.loads(body)[2]["messages"] == [[cbor2.loads(record), b"r" * 24, 1,
                                                  1_700_000_000_000, 1_700_000_030_000]] * count
    assert receive_response_overhead(70000, count) + sum(map(delivery_size, items)) == len(body)


peeked = st.tuples(records, st.sampled_from(sorted(PEEK_STATES)), ints,
                   st.one_of(st.none(), ints), st.one_of(st.none(), ints))
error_entries = st.builds(lambda message: {"code": "MessageNotFound", "message": message}, st.text(max_size=20))
cursors = st.one_of(st.none(), ints, st.binary(max_size=20), st.text(max_size=20))


@settings(max_examples=200)
@given(request_ids, st.lists(st.one_of(peeked, error_entries), max_size=30), cursors)
def test_peek_response_splices_records_byte_identically(request_id: int, entries: list[Any], cursor: Any) -> None:
    body = encode_peek_response(request_id, entries, cursor)[4:]
    structure = [request_id, None, {"messages": [
        entry if isinstance(entry, dict) else [cbor2.loads(entry[0]), *entry[1:]] for entry in entries
    ], "next": cursor}]
    assert cbor2.dumps(structure) == body
    assert cbor2.dumps(cbor2.loads(body)) == body
    assert peek_response_overhead(request_id, len(entries), cursor) + sum(map(peek_entry_size, entries)) == len(body)


sent_entries = st.one_of(
    st.builds(Sent, st.text(max_size=40), ints, st.binary(min_size=16, max_size=16)),
    st.builds(LaminaError, st.text(max_size=20)),
)


@settings(max_examples=200)
@given(request_ids, st.lists(sent_entries, max_size=30))
def test_send_response_is_byte_identical_to_cbor2(request_id: int, results: list[Any]) -> None:
    data = encode_send_response(request_id, results)
    structure = [request_id, None, {"results": [
        entry.to_wire() if isinstance(entry, LaminaError)
        else [entry.id, entry.enqueue_time, entry.md5] for entry in results]}]
    assert data == frame(cbor2.dumps(structure))


# Ids of one length in characters; ASCII ones (as the engine's) are one length in bytes too.
same_length_ids = st.one_of(
    st.lists(st.text(st.characters(max_codepoint=127), min_size=5, max_size=5), min_size=1, max_size=30),
    st.lists(st.text(min_size=5, max_size=5), min_size=1, max_size=30))


@settings(max_examples=200)
@given(request_ids, same_length_ids, st.one_of(edge_ints, ints), st.booleans())
def test_send_response_of_a_batch_accepted_at_one_time_is_byte_identical_to_cbor2(
        request_id: int, ids: list[str], enqueue_time: int, refuse_last: bool) -> None:
    results: list[Any] = [Sent(message_id, enqueue_time, bytes([n % 256]) * 16)
                          for n, message_id in enumerate(ids)]
    if refuse_last:
        results[-1] = LaminaError("refused")
    structure = [request_id, None, {"results": [
        entry.to_wire() if isinstance(entry, LaminaError)
        else [entry.id, entry.enqueue_time, entry.md5] for entry in results]}]
    assert encode_send_response(request_id, results) == frame(cbor2.dumps(structure))


@settings(max_examples=200)
@given(request_ids, st.lists(st.one_of(st.none(), st.builds(LaminaError, st.text(max_size=20))),
                             max_size=30))
def test_entries_response_is_byte_identical_to_cbor2(request_id: int, results: list[Any]) -> None:
    structure = [request_id, None, {"results": [
        None if entry is None else entry.to_wire() for entry in results]}]
    assert encode_entries_response(request_id, results) == frame(cbor2.dumps(structure))


@pytest.mark.parametrize("count", [0, 1, 23, 24, 255, 256])
def test_send_response_array_head_widths(count: int) -> None:
    results = [Sent(f"id{n}", 1_700_000_000_000 + n // 7, bytes(16)) for n in range(count)]
    assert cbor2.loads(encode_send_response(9, results)[4:])[2]["results"] == [
        [entry.id, entry.enqueue_time, entry.md5] for entry in results]


def test_peek_error_entry_may_be_a_lamina_error() -> None:
    body = encode_peek_response(1, [LaminaError("x")], None)[4:]
    assert cbor2.loads(body)[2]["messages"] == [{"code": "LaminaError", "message": "x"}]


def test_peek_state_outside_protocol_list_is_our_misuse() -> None:
    with pytest.raises(ValueError):
        encode_peek_response(1, [(cbor2.dumps([]), "sleeping", 0, None, None)], None)


@pytest.mark.parametrize("request_id", [1, 23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32,
                                        2**63 - 1])
def test_a_map_answer_is_byte_identical_to_cbor2_for_ids_of_every_width(request_id: int) -> None:
    result = {"time": 1_764_000_000_000}
    assert encode_response(request_id, result) == frame(cbor2.dumps([request_id, None, result]))
