"""A receive whose every message is a first delivery made in line is held as columns
(``FirstDeliveries``: records, receipts and the times they share) for a server to splice;
``Engine.receive`` still hands out a list of ``Delivery``. Whatever the mix of deliveries, the
entries, their order and their receipts are those of a receive without columns."""

from __future__ import annotations

import pytest

from lamina.engine import Delivery
from lamina.engine.results import FirstDeliveries


def topic(body: bytes, name: str = "t") -> dict[int, object]:
    return {1: body, 3: name}


@pytest.fixture
def q(engine):
    engine.create_queue("q", {"visibility_timeout": 30})
    return "q"


def test_a_receive_of_first_deliveries_comes_as_columns_sharing_their_times(engine, q, clock):
    engine.send(q, [b"m%d" % i for i in range(5)])
    got = engine.receive_columns(q, max=4)
    assert type(got) is FirstDeliveries and len(got) == 4
    assert [d.body for d in got] == [b"m0", b"m1", b"m2", b"m3"]
    assert got.records == [d.record for d in got] and got.receipts == [d.receipt for d in got]
    assert {(d.dequeue_count, d.first_dequeue_time, d.next_visible_time) for d in got} == {
        (1, clock.now_ms, clock.now_ms + 30_000)}
    assert got.record_bytes() == sum(len(d.record) for d in got)
    assert engine.delete(q, got.receipts) == [None] * 4


def test_engine_receive_hands_out_a_list_of_deliveries(engine, q):
    engine.send(q, [b"a", b"b", b"c"])
    got = engine.receive(q, max=3)
    assert type(got) is list and all(type(d) is Delivery for d in got)
    assert [d.body for d in got] == [b"a", b"b", b"c"]


def test_columns_read_as_the_list_of_deliveries_they_stand_for(engine, q):
    engine.send(q, [b"a", b"b", b"c"])
    got = engine.receive_columns(q, max=3)
    listed = got.deliveries()
    assert got.deliveries() is listed  # made once
    assert got[0] is listed[0] and got[-1] is listed[2] and got[1:] == listed[1:]
    assert list(got) == listed and got == listed and got == tuple(listed) and got != listed[:2]
    assert got == FirstDeliveries(list(got.records), list(got.receipts), got.first_dequeue_time,
                                  got.next_visible_time)
    assert got.index(listed[1]) == 1 and listed[2] in got and bool(got)
    assert repr(got).startswith("FirstDeliveries([Delivery(record=")


def test_a_redelivery_ahead_of_first_deliveries_makes_a_list_in_delivery_order(
        engine, q, clock):
    engine.send(q, [b"early"])
    engine.receive(q, max=1, visibility_timeout=1)
    engine.send(q, [b"x", b"y"])
    clock.advance(1_500)  # "early" is Active again: it comes first
    got = engine.receive_columns(q, max=5)
    assert type(got) is list
    assert [(d.body, d.dequeue_count) for d in got] == [(b"early", 2), (b"x", 1), (b"y", 1)]
    assert engine.delete(q, [d.receipt for d in got]) == [None] * 3


def test_a_topic_message_among_plain_ones_keeps_the_log_order(engine, q):
    engine.send(q, [b"a", b"b", topic(b"t1"), b"c", topic(b"t2"), b"d"])
    got = engine.receive_columns(q, max=10)
    assert type(got) is list
    assert [d.body for d in got] == [b"a", b"b", b"t1", b"c", b"d"]  # t2 waits behind t1
    assert len({d.receipt for d in got}) == 5
    assert engine.delete(q, [d.receipt for d in got]) == [None] * 5


def test_max_bytes_counts_the_deliveries_held_as_columns(engine, q):
    engine.send(q, [b"x" * 1000 for _ in range(4)])
    got = engine.receive_columns(q, max=4, max_bytes=2400)
    assert len(got) == 2  # a third would pass the budget
    assert len(engine.receive_columns(q, max=4)) == 2


def test_receipts_of_columns_survive_a_restart(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%d" % i for i in range(6)])
    got = engine.receive_columns("q", max=6)
    engine.close()
    clock.advance(1_000)
    engine = open_engine()
    assert engine.delete("q", got.receipts[:3]) == [None] * 3
    clock.advance(30_000)  # the other three are Active again
    assert [d.body for d in engine.receive("q", max=6)] == [b"m3", b"m4", b"m5"]
