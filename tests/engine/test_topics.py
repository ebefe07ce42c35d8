"""Ordered topics: per tag, one message of a topic at a time, in production order
(DESIGN.md §2 "Topics", "Delivery order")."""

import pytest

from lamina.engine import InvalidArgument


@pytest.fixture
def q(engine):
    engine.create_queue("q")
    return "q"


def bodies(deliveries):
    return [d.body for d in deliveries]


def topic(body, name="t", **fields):
    entry = {1: body, 3: name}
    if "delay" in fields:
        entry[5] = fields["delay"]
    if "attributes" in fields:
        entry[2] = fields["attributes"]
    return entry


def test_messages_of_one_topic_come_one_at_a_time_in_order(engine, q):
    engine.send(q, [topic(b"1"), topic(b"2"), topic(b"3")])
    first = engine.receive(q, max=10)
    assert bodies(first) == [b"1"]
    assert engine.receive(q, max=10) == []  # 2 is parked behind 1
    engine.delete(q, [first[0].receipt])
    second = engine.receive(q, max=10)
    assert bodies(second) == [b"2"]
    engine.delete(q, [second[0].receipt])
    assert bodies(engine.receive(q, max=10)) == [b"3"]


def test_at_most_one_message_per_topic_per_receive(engine, q):
    engine.send(q, [topic(b"a1", "a"), topic(b"b1", "b"), topic(b"a2", "a"), b"plain",
                    topic(b"b2", "b")])
    assert bodies(engine.receive(q, max=10)) == [b"a1", b"b1", b"plain"]


def test_messages_without_topic_never_wait(engine, q):
    engine.send(q, [topic(b"head"), b"free1", topic(b"next"), b"free2"])
    assert bodies(engine.receive(q, max=10)) == [b"head", b"free1", b"free2"]


def test_visibility_timeout_redelivers_the_head_only(engine, q, clock):
    engine.send(q, [topic(b"1"), topic(b"2")])
    head = engine.receive(q, visibility_timeout=5)[0]
    clock.advance(5000)
    again = engine.receive(q, max=10)
    assert bodies(again) == [b"1"]
    assert again[0].id == head.id and again[0].dequeue_count == 2
    clock.advance(30_000)
    third = engine.receive(q, max=10)
    assert bodies(third) == [b"1"] and third[0].dequeue_count == 3
    engine.delete(q, [third[0].receipt])
    assert bodies(engine.receive(q, max=10)) == [b"2"]


def test_successor_never_overtakes_a_head_that_ran_out_unseen(engine, q, clock):
    engine.send(q, [topic(b"1"), topic(b"2")])
    engine.receive(q, visibility_timeout=1)
    clock.advance(10_000)  # head is Active again; successor still parked
    stats = engine.get_queue(q).stats["tags"]["default"]
    assert (stats["active"], stats["parked"], stats["inflight"]) == (1, 1, 0)
    assert bodies(engine.receive(q, max=10)) == [b"1"]


def test_change_visibility_zero_on_the_head_makes_it_active_again(engine, q):
    engine.send(q, [topic(b"1"), topic(b"2")])
    head = engine.receive(q)[0]
    engine.change_visibility(q, [[head.receipt, 0]])
    again = engine.receive(q, max=10)
    assert bodies(again) == [b"1"] and again[0].dequeue_count == 2


def test_successor_is_active_once_the_head_is_deleted(engine, q):
    engine.send(q, [topic(b"1"), topic(b"2")])
    head = engine.receive(q)[0]
    engine.delete(q, [head.receipt])
    successor = engine.peek(q).messages
    assert [p.message.body for p in successor] == [b"2"]
    assert successor[0].state == "active"
    delivered = engine.receive(q)[0]
    assert (delivered.body, delivered.dequeue_count) == (b"2", 1)


def test_head_that_expires_by_retention_releases_its_successor(engine, clock):
    engine.create_queue("short", {"retention": 60})
    engine.send("short", [topic(b"1")])
    engine.receive("short", visibility_timeout=43200)
    clock.advance(30_000)
    engine.send("short", [topic(b"2")])
    assert engine.receive("short") == []
    clock.advance(30_001)  # "1" is Expired now, "2" is not
    assert bodies(engine.receive("short")) == [b"2"]


def test_a_successor_released_by_retention_is_active_from_the_heads_expiry(engine, clock):
    # The head expires at its production + retention + 1 ms, whenever an operation notices:
    # its successor is Active again from then, so it goes before a lease that ran out later.
    engine.create_queue("short", {"retention": 60})
    engine.send("short", [topic(b"a")])
    engine.receive("short", visibility_timeout=120)
    clock.advance(10_000)
    engine.send("short", [topic(b"b"), b"c"])
    assert bodies(engine.receive("short", max=5, visibility_timeout=51)) == [b"c"]  # b parked
    clock.advance(52_000)  # a expired at +60.001 s, c's lease ran out at +61 s
    assert bodies(engine.receive("short", max=5)) == [b"b", b"c"]


def test_dead_lettered_head_releases_its_successor(engine):
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("src", [topic(b"1"), topic(b"2")])
    head = engine.receive("src")[0]
    assert engine.receive("src") == []
    engine.change_visibility("src", [[head.receipt, 0]])  # max_receives reached: dead
    assert bodies(engine.receive("src", max=10)) == [b"2"]
    assert bodies(engine.receive("dlq")) == [b"1"]


def test_dead_with_receipt_releases_the_successor(engine):
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 5}})
    engine.send("src", [topic(b"1"), topic(b"2")])
    head = engine.receive("src")[0]
    assert engine.dead("src", [head.receipt]) == [None]
    assert bodies(engine.receive("src", max=10)) == [b"2"]


def test_a_delayed_head_holds_back_its_successor(engine, q, clock):
    engine.send(q, [topic(b"1", delay=10), topic(b"2"), b"free"])
    assert bodies(engine.receive(q, max=10)) == [b"free"]
    clock.advance(9999)
    assert engine.receive(q, max=10) == []
    clock.advance(1)
    head = engine.receive(q, max=10)
    assert bodies(head) == [b"1"]
    engine.delete(q, [head[0].receipt])
    assert bodies(engine.receive(q, max=10)) == [b"2"]


def test_a_delayed_successor_still_waits_for_its_delay(engine, q, clock):
    engine.send(q, [topic(b"1"), topic(b"2", delay=10)])
    head = engine.receive(q)[0]
    engine.delete(q, [head.receipt])
    assert engine.receive(q, max=10) == []
    clock.advance(10_000)
    assert bodies(engine.receive(q, max=10)) == [b"2"]


def test_successor_keeps_production_order_not_priority_order(engine, q):
    engine.send(q, [topic(b"1"), {1: b"urgent", 4: 1}, topic(b"2")])
    assert bodies(engine.receive(q, max=10)) == [b"urgent", b"1"]


def test_topic_with_non_default_priority_fails_that_entry(engine, q):
    results = engine.send(q, [{1: b"a", 3: "t", 4: 2}, {1: b"b", 3: "t", 4: 8},
                              {1: b"c", 4: 2}])
    assert isinstance(results[0], InvalidArgument)
    assert results[0].field == "messages[0].priority"
    assert not isinstance(results[1], Exception)
    assert not isinstance(results[2], Exception)
    assert bodies(engine.receive(q, max=10)) == [b"c", b"b"]


def test_tags_keep_independent_topic_order(engine, q):
    engine.create_tag(q, "other")
    engine.send(q, [topic(b"1"), topic(b"2")])
    head = engine.receive(q)[0]
    engine.delete(q, [head.receipt])
    assert bodies(engine.receive(q)) == [b"2"]
    on_other = engine.receive(q, tag="other", max=10)
    assert bodies(on_other) == [b"1"]  # default's progress does not move "other"
    assert engine.receive(q, tag="other", max=10) == []


def test_filtered_tag_orders_only_the_messages_it_receives(engine, q):
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    engine.send(q, [topic(b"skip", attributes={"k": 2}), topic(b"1", attributes={"k": 1}),
                    topic(b"2", attributes={"k": 1})])
    first = engine.receive(q, tag="f", max=10)
    assert bodies(first) == [b"1"]  # not held back by a message the tag does not receive
    engine.delete(q, [first[0].receipt], tag="f")
    assert bodies(engine.receive(q, tag="f", max=10)) == [b"2"]


def test_topics_are_independent_of_each_other(engine, q):
    engine.send(q, [topic(b"a1", "a"), topic(b"a2", "a"), topic(b"b1", "b")])
    a1 = engine.receive(q)[0]
    assert bodies(engine.receive(q, max=10)) == [b"b1"]
    engine.delete(q, [a1.receipt])
    assert bodies(engine.receive(q, max=10)) == [b"a2"]


def test_topic_order_survives_reopen_with_the_head_inflight(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [topic(b"1"), topic(b"2"), topic(b"3")])
    head = engine.receive("q", visibility_timeout=10)[0]
    assert engine.receive("q", max=10) == []
    engine.close()
    engine = open_engine()
    assert engine.receive("q", max=10) == []
    clock.advance(10_000)
    again = engine.receive("q", max=10)
    assert bodies(again) == [b"1"] and again[0].dequeue_count == 2
    engine.delete("q", [again[0].receipt])
    engine.close()
    engine = open_engine()
    assert bodies(engine.receive("q", max=10)) == [b"2"]
    assert engine.receive("q", max=10) == []


def test_parked_state_survives_reopen_behind_a_delayed_head(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [topic(b"1", delay=10), topic(b"2")])
    assert engine.receive("q", max=10) == []
    ids = [p.message.id for p in engine.peek("q", start=0, max=10).messages]
    assert [p.state for p in engine.peek("q", ids=ids).messages] == ["delayed", "parked"]
    engine.close()
    engine = open_engine()
    assert [p.state for p in engine.peek("q", ids=ids).messages] == ["delayed", "parked"]
    assert engine.get_queue("q").stats["tags"]["default"]["parked"] == 1
    clock.advance(10_000)
    head = engine.receive("q", max=10)
    assert bodies(head) == [b"1"]
    engine.delete("q", [head[0].receipt])
    assert bodies(engine.receive("q", max=10)) == [b"2"]


def test_topic_message_record_carries_its_topic(engine, q):
    engine.send(q, [topic(b"1", "orders-42")])
    assert engine.receive(q)[0].message.topic == "orders-42"


def test_head_dead_lettered_at_expiry_releases_its_successor_at_once(engine, clock):
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.send("src", [topic(b"1"), topic(b"2")])
    engine.receive("src", visibility_timeout=5)
    assert engine.receive("src") == []
    clock.advance(5000)  # the head's lease ends: it moves to the DLQ, "2" is Active
    assert bodies(engine.receive("src", max=10)) == [b"2"]


def test_a_tag_starting_mid_topic_is_not_held_by_earlier_messages(engine, q, clock):
    engine.send(q, [topic(b"1")])
    clock.advance(1)
    engine.create_tag(q, "late")
    engine.send(q, [topic(b"2"), topic(b"3")])
    assert bodies(engine.receive(q, tag="late", max=10)) == [b"2"]
    assert bodies(engine.receive(q, max=10)) == [b"1"]


def test_delete_by_id_of_a_parked_successor_lets_the_next_one_follow(engine, q):
    sent = engine.send(q, [topic(b"1"), topic(b"2"), topic(b"3")])
    head = engine.receive(q)[0]
    assert engine.receive(q) == []
    engine.delete_by_id(q, [sent[1].id])
    engine.delete(q, [head.receipt])
    third = engine.receive(q, max=10)
    assert bodies(third) == [b"3"] and third[0].dequeue_count == 1
