"""Tags (multi-reader): start, filter, independence, limits, reopen (DESIGN.md §2 "Tags")."""

import pytest

from lamina.engine import (
    InvalidArgument,
    InvalidReceipt,
    TagAlreadyExists,
    TagInfo,
    TagNotFound,
    TooManyTags,
)


@pytest.fixture
def q(engine):
    engine.create_queue("q")
    return "q"


def bodies(deliveries):
    return [d.body for d in deliveries]


def drain(engine, queue, tag=None):
    """Receive and delete everything Active for ``tag`` now -> bodies in delivery order."""
    out = []
    while True:
        got = engine.receive(queue, tag=tag, max=100)
        if not got:
            return out
        engine.delete(queue, [d.receipt for d in got], tag=tag)
        out += bodies(got)


# -- create / delete / list ----------------------------------------------------------------

def test_create_tag_returns_its_definition(engine, q, clock):
    flt = {"attributes": {"colour": "red"}, "match": "all"}
    info = engine.create_tag(q, "red", start="oldest", filter=flt)
    assert info == TagInfo("red", 0, flt, clock.now_ms)


def test_create_tag_defaults_to_now_without_filter(engine, q, clock):
    clock.advance(7)
    info = engine.create_tag(q, "t")
    assert (info.start, info.filter, info.created) == (clock.now_ms, None, clock.now_ms)


def test_filter_match_defaults_to_all(engine, q):
    info = engine.create_tag(q, "t", filter={"attributes": {"a": 1}})
    assert info.filter == {"attributes": {"a": 1}, "match": "all"}


def test_list_tags_orders_by_lower_cased_name_with_stats(engine, q, clock):
    engine.create_tag(q, "beta")
    engine.create_tag(q, "Alpha", start="oldest")
    tags = engine.list_tags(q)
    assert [t.tag for t in tags] == ["Alpha", "beta", "default"]
    default = tags[2]
    assert (default.start, default.filter) == (0, None)
    assert set(default.stats) == {"active", "inflight", "delayed", "parked", "lag",
                                  "approximate"}


def test_list_tags_stats_count_each_tag_on_its_own(engine, q):
    engine.create_tag(q, "t")
    engine.send(q, [b"a", b"b"])
    engine.receive(q, tag="t")
    stats = {t.tag: t.stats for t in engine.list_tags(q)}
    assert (stats["t"]["active"], stats["t"]["inflight"]) == (1, 1)
    assert (stats["default"]["active"], stats["default"]["inflight"]) == (2, 0)


def test_the_default_tag_cannot_be_deleted(engine, q):
    for name in ("default", "DEFAULT"):
        with pytest.raises(InvalidArgument) as caught:
            engine.delete_tag(q, name)
        assert caught.value.field == "tag"
    assert [t.tag for t in engine.list_tags(q)] == ["default"]


def test_tag_names_are_unique_ignoring_case(engine, q):
    engine.create_tag(q, "Blue")
    with pytest.raises(TagAlreadyExists):
        engine.create_tag(q, "blue")
    with pytest.raises(TagAlreadyExists):
        engine.create_tag(q, "Default")
    engine.send(q, [b"x"])
    assert bodies(engine.receive(q, tag="BLUE")) == [b"x"]  # lookups ignore case


@pytest.mark.parametrize("name", ["", "1abc", "a" * 65, "has space", "dot.ted", 7])
def test_invalid_tag_names_are_invalid_argument_naming_tag(engine, q, name):
    with pytest.raises(InvalidArgument) as caught:
        engine.create_tag(q, name)
    assert caught.value.field == "tag"


def test_at_most_256_tags_including_default(engine, q):
    for i in range(255):
        engine.create_tag(q, f"t{i}")
    with pytest.raises(TooManyTags):
        engine.create_tag(q, "onemore")
    engine.delete_tag(q, "t0")
    engine.create_tag(q, "onemore")
    assert len(engine.list_tags(q)) == 256


def test_unknown_tag_is_tag_not_found(engine, q):
    with pytest.raises(TagNotFound):
        engine.delete_tag(q, "nope")
    with pytest.raises(TagNotFound):
        engine.receive(q, tag="nope")


@pytest.mark.parametrize("start", ["later", -1, 1.5, True, None])
def test_bad_start_is_invalid_argument_naming_start(engine, q, start):
    with pytest.raises(InvalidArgument) as caught:
        engine.create_tag(q, "t", start=start)
    assert caught.value.field == "start"


# -- independence --------------------------------------------------------------------------

def test_every_tag_receives_every_message_with_its_own_leases(engine, q, clock):
    engine.create_tag(q, "b")
    engine.send(q, [b"m"])
    on_default = engine.receive(q)[0]
    on_b = engine.receive(q, tag="b")[0]
    assert on_default.id == on_b.id
    assert on_default.dequeue_count == on_b.dequeue_count == 1
    # a receipt of one tag is not a receipt of another
    assert isinstance(engine.delete(q, [on_default.receipt], tag="b")[0], InvalidReceipt)
    assert engine.delete(q, [on_default.receipt]) == [None]
    # b's lease is untouched by default's delete, and runs out on its own
    clock.advance(30_000)
    assert engine.receive(q) == []
    again = engine.receive(q, tag="b")[0]
    assert (again.id, again.dequeue_count) == (on_b.id, 2)


def test_deleting_on_one_tag_leaves_the_message_for_another(engine, q):
    engine.create_tag(q, "b")
    engine.send(q, [b"x", b"y"])
    assert drain(engine, q) == [b"x", b"y"]
    assert drain(engine, q, tag="b") == [b"x", b"y"]


# -- start ---------------------------------------------------------------------------------

def test_start_now_covers_exactly_messages_sent_after_creation(engine, q, clock):
    engine.send(q, [b"before"])
    info = engine.create_tag(q, "t", start="now")  # same ms as "before"
    assert info.start == clock.now_ms == info.created
    engine.send(q, [b"after"])
    clock.advance(1)
    engine.send(q, [b"later"])
    assert drain(engine, q, tag="t") == [b"after", b"later"]


def test_start_oldest_sees_everything_retained(engine, q, clock):
    engine.send(q, [b"a"])
    clock.advance(10)
    engine.send(q, [b"b"])
    info = engine.create_tag(q, "t", start="oldest")
    assert info.start == 0
    engine.send(q, [b"c"])
    assert drain(engine, q, tag="t") == [b"a", b"b", b"c"]


def test_start_ms_sees_messages_produced_at_or_after_it(engine, q, clock):
    t0 = clock.now_ms
    engine.send(q, [b"a"])
    clock.advance(10)
    engine.send(q, [b"b"])
    clock.advance(10)
    engine.send(q, [b"c"])
    info = engine.create_tag(q, "t", start=t0 + 10)
    assert info.start == t0 + 10
    assert drain(engine, q, tag="t") == [b"b", b"c"]


def test_start_ms_between_productions_sees_the_next_one(engine, q, clock):
    t0 = clock.now_ms
    engine.send(q, [b"a"])
    clock.advance(10)
    engine.send(q, [b"b"])
    engine.create_tag(q, "t", start=t0 + 5)
    assert drain(engine, q, tag="t") == [b"b"]


def test_start_in_the_future_waits_for_that_time(engine, q, clock):
    t0 = clock.now_ms
    info = engine.create_tag(q, "t", start=t0 + 100)
    assert info.start == t0 + 100
    clock.advance(50)
    engine.send(q, [b"early"])
    clock.advance(50)
    engine.send(q, [b"on-time"])
    clock.advance(1)
    engine.send(q, [b"late"])
    assert drain(engine, q, tag="t") == [b"on-time", b"late"]
    assert drain(engine, q) == [b"early", b"on-time", b"late"]


# -- filters -------------------------------------------------------------------------------

def send_attrs(engine, queue, *attribute_maps):
    return engine.send(queue, [{1: f"m{i}", 2: a} for i, a in enumerate(attribute_maps)])


def test_filter_match_all_needs_every_attribute(engine, q):
    engine.create_tag(q, "t", filter={"attributes": {"a": 1, "b": "x"}, "match": "all"})
    send_attrs(engine, q, {"a": 1, "b": "x"}, {"a": 1}, {"b": "x"}, {"a": 1, "b": "x", "c": 0})
    assert drain(engine, q, tag="t") == ["m0", "m3"]


def test_filter_match_any_needs_one_attribute(engine, q):
    engine.create_tag(q, "t", filter={"attributes": {"a": 1, "b": "x"}, "match": "any"})
    send_attrs(engine, q, {"a": 1}, {"b": "x"}, {"a": 2, "b": "y"}, {"c": 1}, None)
    assert drain(engine, q, tag="t") == ["m0", "m1"]


def test_filter_values_match_only_the_same_cbor_type(engine, q):
    engine.create_tag(q, "int", start="oldest", filter={"attributes": {"v": 1}})
    engine.create_tag(q, "float", start="oldest", filter={"attributes": {"v": 1.0}})
    engine.create_tag(q, "bool", start="oldest", filter={"attributes": {"v": True}})
    engine.create_tag(q, "text", start="oldest", filter={"attributes": {"v": "1"}})
    engine.create_tag(q, "bytes", start="oldest", filter={"attributes": {"v": b"1"}})
    send_attrs(engine, q, {"v": 1}, {"v": 1.0}, {"v": True}, {"v": "1"}, {"v": b"1"})
    assert drain(engine, q, tag="int") == ["m0"]
    assert drain(engine, q, tag="float") == ["m1"]
    assert drain(engine, q, tag="bool") == ["m2"]
    assert drain(engine, q, tag="text") == ["m3"]
    assert drain(engine, q, tag="bytes") == ["m4"]


def test_filter_false_does_not_match_zero(engine, q):
    engine.create_tag(q, "t", filter={"attributes": {"v": False}})
    send_attrs(engine, q, {"v": 0}, {"v": False}, {"v": 0.0})
    assert drain(engine, q, tag="t") == ["m1"]


def test_filter_null_means_has_the_attribute(engine, q):
    engine.create_tag(q, "t", filter={"attributes": {"k": None}})
    send_attrs(engine, q, {"k": "x"}, {"k": False}, {"other": 1}, None, {"k": 0})
    assert drain(engine, q, tag="t") == ["m0", "m1", "m4"]


def test_filtered_out_messages_are_never_delivered_to_that_tag(engine, q, clock):
    engine.create_tag(q, "t", filter={"attributes": {"keep": True}})
    send_attrs(engine, q, {"keep": False}, {"keep": True})
    got = engine.receive(q, tag="t", max=10, visibility_timeout=1)
    assert bodies(got) == ["m1"]
    clock.advance(60_000)
    again = engine.receive(q, tag="t", max=10)
    assert bodies(again) == ["m1"] and again[0].dequeue_count == 2
    # the unfiltered default tag sees both
    assert drain(engine, q) == ["m0", "m1"]


def test_filter_with_16_attributes_is_accepted_17_refused(engine, q):
    sixteen = {f"a{i}": i for i in range(16)}
    engine.create_tag(q, "ok", filter={"attributes": sixteen, "match": "any"})
    with pytest.raises(InvalidArgument) as caught:
        engine.create_tag(q, "bad", filter={"attributes": {**sixteen, "x": 1}})
    assert caught.value.field.startswith("filter")
    assert [t.tag for t in engine.list_tags(q)] == ["default", "ok"]


def test_filter_of_4096_encoded_bytes_is_accepted_4097_refused(engine, q):
    # {"a": text of n bytes} encodes to 6 + n bytes once n >= 256
    engine.create_tag(q, "ok", filter={"attributes": {"a": "v" * 4090}})
    with pytest.raises(InvalidArgument, match="4096 bytes") as caught:
        engine.create_tag(q, "bad", filter={"attributes": {"a": "v" * 4091}})
    assert caught.value.field == "filter.attributes"
    assert [t.tag for t in engine.list_tags(q)] == ["default", "ok"]


@pytest.mark.parametrize("flt", [
    {"attributes": {}},
    {"attributes": {"a": 1}, "match": "some"},
    {"attributes": {"a": [1]}},
    {"attributes": {"a": float("nan")}},
    {"attributes": {"a": 1}, "extra": 1},
    {"match": "all"},
    "colour",
])
def test_bad_filters_are_invalid_argument(engine, q, flt):
    with pytest.raises(InvalidArgument) as caught:
        engine.create_tag(q, "t", filter=flt)
    assert caught.value.field.startswith("filter")
    with pytest.raises(TagNotFound):
        engine.receive(q, tag="t")


# -- reopen and deletion -------------------------------------------------------------------

def test_tags_survive_reopen_with_start_filter_and_leases(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [b"old"])
    clock.advance(5)
    created = engine.create_tag("q", "t", start="now", filter={"attributes": {"k": 1}})
    send_attrs(engine, "q", {"k": 1}, {"k": 2}, {"k": 1})
    leased = engine.receive("q", tag="t")[0]
    engine.close()
    engine = open_engine()
    listed = {t.tag: t for t in engine.list_tags("q")}
    assert (listed["t"].start, listed["t"].filter, listed["t"].created) == (
        created.start, created.filter, created.created)
    assert engine.delete("q", [leased.receipt], tag="t") == [None]
    assert drain(engine, "q", tag="t") == ["m2"]
    engine.send("q", [{1: b"new", 2: {"k": 1}}, {1: b"no", 2: {"k": 1.0}}])
    assert drain(engine, "q", tag="t") == [b"new"]


def test_deleted_tag_is_gone_and_its_receipts_invalid(engine, q):
    engine.create_tag(q, "t")
    engine.send(q, [b"a"])
    receipt = engine.receive(q, tag="t")[0].receipt
    engine.delete_tag(q, "t")
    with pytest.raises(TagNotFound):
        engine.receive(q, tag="t")
    assert [t.tag for t in engine.list_tags(q)] == ["default"]
    engine.create_tag(q, "t", start="oldest")
    assert isinstance(engine.delete(q, [receipt], tag="t")[0], InvalidReceipt)


def test_recreated_tag_sees_from_its_own_start_with_fresh_state(engine, q, clock):
    engine.create_tag(q, "t", start="oldest")
    engine.send(q, [b"a", b"b"])
    first = engine.receive(q, tag="t", max=2)
    engine.delete(q, [first[0].receipt], tag="t")  # a deleted, b inflight
    engine.delete_tag(q, "t")
    engine.create_tag(q, "t", start="oldest")
    again = engine.receive(q, tag="t", max=10)
    assert bodies(again) == [b"a", b"b"]
    assert [d.dequeue_count for d in again] == [1, 1]


def test_recreated_tag_with_start_now_sees_only_new_messages(engine, q, clock):
    engine.create_tag(q, "t", start="oldest")
    engine.send(q, [b"a"])
    engine.receive(q, tag="t")
    engine.delete_tag(q, "t")
    clock.advance(1)
    engine.create_tag(q, "t")
    engine.send(q, [b"b"])
    assert drain(engine, q, tag="t") == [b"b"]


def test_deleting_a_tag_lets_its_messages_go(engine, q, clock):
    engine.create_tag(q, "t", start="oldest")
    engine.send(q, [b"a"])
    assert drain(engine, q) == [b"a"]
    clock.advance(1)
    assert engine.get_queue(q).stats["messages"] == 1  # t still holds it
    engine.delete_tag(q, "t")
    assert engine.get_queue(q).stats["messages"] == 0


def test_filtered_out_messages_do_not_keep_the_queue_full(engine, clock):
    engine.create_queue("small", {"max_messages": 1})
    engine.create_tag("small", "f", filter={"attributes": {"k": 1}})
    engine.send("small", [{1: b"out", 2: {"k": 2}}])
    assert drain(engine, "small") == [b"out"]
    clock.advance(1)  # Ended for default (deleted) and for f (filtered out): gone
    assert engine.get_queue("small").stats["messages"] == 0
    assert not isinstance(engine.send("small", [b"next"])[0], Exception)


def test_messages_before_a_tags_start_do_not_keep_the_queue_full(engine, clock):
    engine.create_queue("small", {"max_messages": 1})
    engine.send("small", [b"a"])
    clock.advance(10)
    engine.create_tag("small", "t", start=clock.now_ms - 5)
    assert drain(engine, "small") == [b"a"]
    clock.advance(1)
    assert engine.get_queue("small").stats["messages"] == 0
