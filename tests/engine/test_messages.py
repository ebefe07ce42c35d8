"""Send, receive, delete and change_visibility on the default tag, with a fake clock."""

import hashlib

import cbor2
import pytest

from lamina.engine import (
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    StaleReceipt,
    TagNotFound,
)


@pytest.fixture
def q(engine):
    engine.create_queue("q")
    return "q"


def bodies(deliveries):
    return [d.body for d in deliveries]


def test_send_returns_ids_in_production_order_with_time_and_md5(engine, q, clock):
    sent = engine.send(q, [b"one", "two"])
    assert [s.enqueue_time for s in sent] == [clock.now_ms] * 2
    assert sent[0].md5 == hashlib.md5(b"one").digest()
    assert sent[1].md5 == hashlib.md5("two".encode()).digest()
    clock.advance(1)
    later = engine.send(q, [b"three"])
    ids = [s.id for s in sent + later]
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_received_record_is_the_protocol_record(engine, q, clock):
    sent = engine.send(q, [{1: b"body", 2: {"k": "v", "n": 3}, 5: 0}])[0]
    delivery = engine.receive(q)[0]
    assert cbor2.loads(delivery.record) == [
        sent.id, b"body", {"k": "v", "n": 3}, None, 8, clock.now_ms, clock.now_ms,
        hashlib.md5(b"body").digest(), None,
    ]
    assert delivery.dequeue_count == 1
    assert delivery.first_dequeue_time == clock.now_ms
    assert delivery.next_visible_time == clock.now_ms + 30_000


def test_text_bodies_stay_text(engine, q):
    engine.send(q, ["héllo"])
    assert engine.receive(q)[0].body == "héllo"


@pytest.mark.parametrize("entry, field", [
    (b"", "messages[0].body"),
    ("", "messages[0].body"),
    (5, "messages[0]"),
    ({2: {}}, "messages[0].body"),
    ({1: b"x", 9: 1}, "messages[0].9"),
    ({1: b"x", "1": 1}, "messages[0].1"),
    ({1: b"x", 4: 0}, "messages[0].priority"),
    ({1: b"x", 4: 17}, "messages[0].priority"),
    ({1: b"x", 4: True}, "messages[0].priority"),
    ({1: b"x", 5: -1}, "messages[0].delay"),
    ({1: b"x", 5: 30 * 86400 + 1}, "messages[0].delay"),
    ({1: b"x", 5: float("nan")}, "messages[0].delay"),
    ({1: b"x", 3: ""}, "messages[0].topic"),
    ({1: b"x", 3: "t" * 129}, "messages[0].topic"),
    ({1: b"x", 3: "t", 4: 2}, "messages[0].priority"),
    ({1: b"x", 2: {"DLQ.x": 1}}, "messages[0].attributes.DLQ.x"),
    ({1: b"x", 2: {"": 1}}, "messages[0].attributes."),
    ({1: b"x", 2: {"k": None}}, "messages[0].attributes.k"),
    ({1: b"x", 2: {"k": [1]}}, "messages[0].attributes.k"),
    ({1: b"x", 2: {"k": float("inf")}}, "messages[0].attributes.k"),
    ({1: b"x", 2: {f"k{i}": i for i in range(65)}}, "messages[0].attributes"),
])
def test_bad_entries_fail_alone_naming_the_field(engine, q, entry, field):
    results = engine.send(q, [b"before", entry, b"after"])
    error = results[1]
    assert isinstance(error, InvalidArgument)
    assert error.field == field.replace("[0]", "[1]")
    assert bodies(engine.receive(q, max=10)) == [b"before", b"after"]


def test_64_attributes_with_128_byte_names_are_accepted(engine, q):
    attributes = {f"{i:02d}".ljust(128, "n"): i for i in range(64)}
    assert not isinstance(engine.send(q, [{1: b"x", 2: attributes}])[0], InvalidArgument)
    assert engine.receive(q)[0].message.attributes == attributes


def test_delay_must_be_below_retention(engine):
    engine.create_queue("short", {"retention": 60})
    assert isinstance(engine.send("short", [{1: b"x", 5: 60}])[0], InvalidArgument)
    assert not isinstance(engine.send("short", [{1: b"x", 5: 59.999}])[0], InvalidArgument)


def test_message_too_large_counts_body_and_encoded_attributes(engine):
    engine.create_queue("small", {"max_message_size": 1024})
    attributes = {"k": "v"}
    room = 1024 - len(cbor2.dumps(attributes))
    results = engine.send("small", [{1: b"x" * room, 2: attributes},
                                    {1: b"x" * (room + 1), 2: attributes}, b"x" * 1025])
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], MessageTooLarge)
    assert isinstance(results[2], MessageTooLarge)


def test_batch_length_is_checked(engine, q):
    with pytest.raises(InvalidArgument, match="messages"):
        engine.send(q, [])
    with pytest.raises(InvalidArgument, match="messages"):
        engine.send(q, [b"x"] * 1001)


def test_queue_full_refuses_entries_past_max_messages_in_order(engine, clock):
    engine.create_queue("q", {"max_messages": 2})
    results = engine.send("q", [b"a", b"b", b"c"])
    assert isinstance(results[2], QueueFull)
    delivery = engine.receive("q")[0]
    engine.delete("q", [delivery.receipt])
    # A message produced in the current ms is not gone yet (DESIGN.md §2 gone_seq).
    assert isinstance(engine.send("q", [b"d"])[0], QueueFull)
    clock.advance(1)
    assert not isinstance(engine.send("q", [b"d"])[0], Exception)
    assert engine.get_queue("q").stats["messages"] == 2


def test_unknown_queue_and_tag(engine, q):
    with pytest.raises(QueueNotFound):
        engine.send("nope", [b"x"])
    with pytest.raises(TagNotFound):
        engine.receive(q, tag="nope")
    with pytest.raises(InvalidArgument, match="tag"):
        engine.receive(q, tag="bad tag")


def test_priorities_are_strict_then_seq(engine, q):
    engine.send(q, [{1: b"p8a"}, {1: b"p16", 4: 16}, {1: b"p1", 4: 1}, {1: b"p8b", 4: 8},
                    {1: b"p2", 4: 2}])
    assert bodies(engine.receive(q, max=10)) == [b"p1", b"p2", b"p8a", b"p8b", b"p16"]


def test_receive_max_and_visibility_override(engine, q, clock):
    engine.send(q, [b"a", b"b", b"c"])
    first = engine.receive(q, max=2, visibility_timeout=5)
    assert bodies(first) == [b"a", b"b"]
    assert first[0].next_visible_time == clock.now_ms + 5000
    with pytest.raises(InvalidArgument, match="max"):
        engine.receive(q, max=0)
    with pytest.raises(InvalidArgument, match="visibility_timeout"):
        engine.receive(q, visibility_timeout=0)


def test_leased_message_is_not_delivered_twice_until_timeout(engine, q, clock):
    engine.send(q, [b"a"])
    lease = engine.receive(q, visibility_timeout=10)[0]
    clock.advance(9999)
    assert engine.receive(q) == []
    clock.advance(1)
    again = engine.receive(q)[0]
    assert again.id == lease.id
    assert again.dequeue_count == 2
    assert again.first_dequeue_time == lease.first_dequeue_time


def test_stale_receipt_after_visibility_timeout(engine, q, clock):
    engine.send(q, [b"a"])
    receipt = engine.receive(q, visibility_timeout=1)[0].receipt
    clock.advance(1000)
    assert isinstance(engine.delete(q, [receipt])[0], StaleReceipt)


def test_old_receipt_is_stale_after_redelivery(engine, q, clock):
    engine.send(q, [b"a"])
    old = engine.receive(q, visibility_timeout=1)[0].receipt
    clock.advance(1000)
    new = engine.receive(q)[0].receipt
    assert isinstance(engine.delete(q, [old])[0], StaleReceipt)
    assert engine.delete(q, [new]) == [None]


def test_delete_ends_the_message(engine, q, clock):
    engine.send(q, [b"a"])
    receipt = engine.receive(q, visibility_timeout=1)[0].receipt
    assert engine.delete(q, [receipt]) == [None]
    clock.advance(5000)
    assert engine.receive(q) == []


def test_second_use_of_a_receipt_in_one_batch_is_stale(engine, q):
    engine.send(q, [b"a"])
    receipt = engine.receive(q)[0].receipt
    results = engine.delete(q, [receipt, receipt])
    assert results[0] is None and isinstance(results[1], StaleReceipt)


def test_forged_and_foreign_receipts_are_invalid(engine, q):
    engine.create_queue("other")
    engine.send("other", [b"x"])
    foreign = engine.receive("other")[0].receipt
    engine.send(q, [b"a"])
    genuine = engine.receive(q)[0].receipt
    forged = genuine[:-1] + bytes([genuine[-1] ^ 1])
    results = engine.delete(q, [foreign, forged, b"short", "text", genuine])
    assert [type(r) for r in results[:4]] == [InvalidReceipt] * 4
    assert results[4] is None


def test_change_visibility_extends_with_a_new_receipt(engine, q, clock):
    engine.send(q, [b"a"])
    old = engine.receive(q, visibility_timeout=5)[0].receipt
    changed = engine.change_visibility(q, [[old, 60]])[0]
    assert changed.next_visible_time == clock.now_ms + 60_000
    clock.advance(30_000)
    assert engine.receive(q) == []
    assert isinstance(engine.delete(q, [old])[0], StaleReceipt)
    assert engine.delete(q, [changed.receipt]) == [None]


def test_change_visibility_zero_makes_the_message_active_at_once(engine, q, clock):
    engine.send(q, [b"a", b"b"])
    first = engine.receive(q)[0]
    result = engine.change_visibility(q, [[first.receipt, 0]])[0]
    assert result.receipt is None and result.next_visible_time == clock.now_ms
    again = engine.receive(q, max=2)
    assert bodies(again) == [b"a", b"b"]  # Active again comes before never-delivered
    assert again[0].dequeue_count == 2
    assert isinstance(engine.delete(q, [first.receipt])[0], StaleReceipt)


def test_change_visibility_checks_each_entry(engine, q):
    engine.send(q, [b"a"])
    receipt = engine.receive(q)[0].receipt
    results = engine.change_visibility(q, [[receipt, 43201], [receipt], "x", [b"f" * 41, 1],
                                           [7, 1], [receipt, 1]])
    assert [type(r).__name__ for r in results] == [
        "InvalidArgument", "InvalidArgument", "InvalidArgument", "InvalidReceipt",
        "InvalidReceipt", "VisibilityChanged"]


def test_active_again_messages_come_first_by_time_then_seq(engine, q, clock):
    engine.send(q, [b"a", b"b", b"c", b"d"])
    leased = engine.receive(q, max=3, visibility_timeout=10)  # a b c
    engine.change_visibility(q, [[leased[2].receipt, 2]])     # c due in 2 s
    engine.change_visibility(q, [[leased[1].receipt, 1]])     # b due in 1 s
    clock.advance(10_000)
    assert bodies(engine.receive(q, max=4)) == [b"b", b"c", b"a", b"d"]


def test_delayed_message_becomes_active_when_the_delay_ends(engine, q, clock):
    engine.send(q, [{1: b"later", 5: 2.5}, b"now"])
    assert bodies(engine.receive(q, max=10)) == [b"now"]
    stats = engine.get_queue(q).stats["tags"]["default"]
    assert stats["delayed"] == 1 and stats["inflight"] == 1
    clock.advance(2499)
    assert engine.receive(q) == []
    clock.advance(1)
    later = engine.receive(q)[0]
    assert later.body == b"later"
    assert later.message.visible_time == later.message.enqueue_time + 2500


def test_queue_default_delay_applies_and_zero_overrides(engine, clock):
    engine.create_queue("d", {"delay": 5})
    engine.send("d", [b"default-delayed", {1: b"immediate", 5: 0}])
    assert bodies(engine.receive("d", max=10)) == [b"immediate"]
    clock.advance(5000)
    assert bodies(engine.receive("d", max=10)) == [b"default-delayed"]


def test_ended_delays_order_with_expired_leases_by_time(engine, q, clock):
    engine.send(q, [b"leased"])
    engine.receive(q, visibility_timeout=3)
    engine.send(q, [{1: b"delayed", 5: 2}])
    clock.advance(3000)
    assert bodies(engine.receive(q, max=10)) == [b"delayed", b"leased"]


def test_expired_messages_are_never_delivered(engine, clock):
    engine.create_queue("r", {"retention": 60})
    engine.send("r", [b"old"])
    receipt = engine.receive("r", visibility_timeout=1)[0].receipt
    clock.advance(30_000)
    engine.send("r", [b"young"])
    clock.advance(30_001)
    assert bodies(engine.receive("r", max=10)) == [b"young"]
    assert isinstance(engine.delete("r", [receipt])[0], StaleReceipt)
    assert engine.get_queue("r").stats["messages"] == 1


def test_leases_and_receipts_survive_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    engine.send(q := "q", [b"a", b"b", {1: b"c", 5: 5}])
    receipt = engine.receive(q, visibility_timeout=10)[0].receipt
    engine.close()
    engine = open_engine()
    assert bodies(engine.receive(q, max=10)) == [b"b"]
    assert engine.delete(q, [receipt]) == [None]
    clock.advance(10_000)
    assert bodies(engine.receive(q, max=10)) == [b"c"]


def test_lease_deadlines_run_on_while_closed(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [b"a"])
    receipt = engine.receive("q", visibility_timeout=5)[0].receipt
    engine.close()
    clock.advance(6000)
    engine = open_engine()
    assert isinstance(engine.delete("q", [receipt])[0], StaleReceipt)
    assert engine.receive("q")[0].dequeue_count == 2


def test_engine_clock_never_goes_backwards(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    first = engine.send("q", [b"a"])[0]
    clock.advance(-60_000)
    second = engine.send("q", [b"b"])[0]
    assert second.enqueue_time == first.enqueue_time
    engine.close()
    engine = open_engine()
    assert engine.send("q", [b"c"])[0].enqueue_time == first.enqueue_time


def test_receive_respects_max_bytes_and_leases_nothing_it_does_not_return(engine, q):
    engine.send(q, [b"x" * 1000, b"y" * 1000, b"z" * 1000])
    first = engine.receive(q, max=3, max_bytes=2400)
    assert bodies(first) == [b"x" * 1000, b"y" * 1000]
    assert bodies(engine.receive(q, max=3)) == [b"z" * 1000]


def test_receive_examines_a_bounded_number_and_resumes(engine, q, clock):
    engine.send(q, [{1: b"d", 5: 100}] * 1000)
    for _ in range(5):
        engine.send(q, [{1: b"d", 5: 100}] * 1000)
    engine.send(q, [b"ready"])
    results = []
    for _ in range(3):
        results += engine.receive(q)
    assert bodies(results) == [b"ready"]


def test_gone_seq_advances_as_messages_end(engine, q, clock):
    engine.send(q, [b"a", b"b", {1: b"p1", 4: 1}])
    leased = engine.receive(q, max=3)
    clock.advance(1)
    engine.delete(q, [leased[0].receipt])  # p1 (seq 2) ends first: a, b still pending
    assert engine.get_queue(q).stats["messages"] == 3
    engine.delete(q, [d.receipt for d in leased[1:]])
    assert engine.get_queue(q).stats["messages"] == 0


def test_deadlines_report_lease_expiry_and_delay_end(engine, q, clock):
    assert engine.next_deadline() is None
    start = clock.now_ms
    engine.send(q, [b"a", {1: b"later", 5: 3}])
    assert engine.next_deadline() == start + 3000
    engine.receive(q, visibility_timeout=2)
    assert engine.next_deadline() == start + 2000
    assert engine.process_deadlines() == []
    clock.advance(2000)
    assert engine.process_deadlines() == [("q", "default")]
    assert engine.next_deadline() == start + 3000
    clock.advance(1000)
    assert engine.process_deadlines() == [("q", None)]
    assert engine.next_deadline() is None
    assert len(engine.receive(q, max=10)) == 2


def test_deadline_registrations_do_not_grow_with_leases(engine, q):
    engine.send(q, [b"m"] * 500)
    for _ in range(50):
        engine.receive(q, max=10)
    assert len(engine._deadlines.wake_heap) <= 2


def test_receipt_standing_says_why_a_receipt_is_stale(engine, q, clock):
    engine.send(q, [b"m"])
    first = engine.receive(q, visibility_timeout=5)[0].receipt
    assert engine.receipt_standing(q, first) == "current"
    clock.advance(5000)
    assert engine.receipt_standing(q, first) == "visible"  # its lease ended, nobody took it
    second = engine.receive(q, visibility_timeout=5)[0].receipt
    assert engine.receipt_standing(q, first) == "released"
    assert engine.receipt_standing(q, second) == "current"
    assert engine.delete(q, [second]) == [None]
    assert engine.receipt_standing(q, second) == "gone"
    assert engine.receipt_standing(q, first) == "gone"
    engine.create_queue("other")
    with pytest.raises(InvalidReceipt):
        engine.receipt_standing("other", first)
