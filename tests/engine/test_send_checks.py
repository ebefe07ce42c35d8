"""A send checks its batch in line for the usual list and through ``check_batch`` for anything
else: both refuse the same batches with the same error and accept the same ones; and the next
deadline skips the entries of deleted queues whichever comes first."""

from __future__ import annotations

import pytest

from lamina.engine import InvalidArgument


@pytest.mark.parametrize("messages", [[], [b"x"] * 1001, (), (b"x",) * 1001, {1: b"x"}, b"x",
                                      "x", None, 3])
def test_a_send_refuses_a_batch_that_is_not_a_list_or_tuple_of_1_to_1000_entries(
        engine, messages):
    engine.create_queue("q")
    with pytest.raises(InvalidArgument, match="messages"):
        engine.send("q", messages)
    with pytest.raises(InvalidArgument, match="messages"):
        engine.send_columns("q", messages)
    assert engine.get_queue("q").stats["messages"] == 0


@pytest.mark.parametrize("kind", [list, tuple])
@pytest.mark.parametrize("count", [1, 3, 4, 1000])
def test_a_send_of_1_to_1000_entries_as_a_list_or_tuple_stores_them_all(engine, kind, count):
    engine.create_queue("q")
    bodies = [b"%d" % index for index in range(count)]
    sent = engine.send("q", kind(bodies))
    assert len(sent) == count and not any(isinstance(entry, Exception) for entry in sent)
    got = engine.receive("q", max=1000)
    assert [delivery.body for delivery in got] == bodies


def test_a_send_keeps_no_hold_on_the_list_it_was_given(engine):
    engine.create_queue("q")
    bodies = [b"a", b"b", b"c", b"d"]
    engine.send("q", bodies)
    bodies[0] = b"changed"
    bodies.append(b"e")
    assert [delivery.body for delivery in engine.receive("q", max=10)] == [b"a", b"b", b"c",
                                                                          b"d"]


def test_the_next_deadline_skips_the_entries_of_deleted_queues(engine, clock):
    start = clock.now_ms
    for name, seconds in (("first", 1), ("second", 2), ("third", 3)):
        engine.create_queue(name)
        engine.send(name, [b"m"])
        engine.receive(name, visibility_timeout=seconds)
    assert engine.next_deadline() == start + 1000
    engine.delete_queue("first")
    assert engine.next_deadline() == start + 2000
    engine.delete_queue("third")
    assert engine.next_deadline() == start + 2000
    engine.delete_queue("second")
    assert engine.next_deadline() is None
