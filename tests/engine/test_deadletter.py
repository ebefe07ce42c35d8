"""Dead-letter queues: moves at lease end, ``dead``, policies, ``redrive``
(DESIGN.md §2 "Dead-letter queues")."""

import pytest

from lamina.engine import (
    InvalidArgument,
    InvalidRedrivePolicy,
    NoDeadLetterQueue,
    QueueFull,
    Redriven,
    StaleReceipt,
)

T0 = 1_700_000_000_000


@pytest.fixture
def dlq(engine):
    engine.create_queue("dlq")
    return "dlq"


def make_source(engine, name="src", max_receives=1, **attributes):
    engine.create_queue(name, {"redrive": {"dlq": "dlq", "max_receives": max_receives},
                               **attributes})
    return name


def bodies(deliveries):
    return [d.body for d in deliveries]


# -- policies ------------------------------------------------------------------------------

def test_redrive_policy_is_an_attribute(engine, dlq):
    info = engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 3}})
    assert info.attributes["redrive"] == {"dlq": "dlq", "max_receives": 3}
    assert engine.set_queue_attributes("src", {"redrive": None})["redrive"] is None


def test_set_attributes_checks_redrive_policy_rules(engine, dlq):
    engine.create_queue("src")
    with pytest.raises(InvalidRedrivePolicy):
        engine.set_queue_attributes("src", {"redrive": {"dlq": "missing", "max_receives": 1}})
    with pytest.raises(InvalidRedrivePolicy):
        engine.set_queue_attributes("src", {"redrive": {"dlq": "SRC", "max_receives": 1}})
    engine.set_queue_attributes("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.create_queue("other")
    with pytest.raises(InvalidRedrivePolicy):  # src is a source: cannot be a DLQ
        engine.set_queue_attributes("other", {"redrive": {"dlq": "src", "max_receives": 1}})
    with pytest.raises(InvalidRedrivePolicy):  # dlq is named as a DLQ: cannot get a policy
        engine.set_queue_attributes("dlq", {"redrive": {"dlq": "other", "max_receives": 1}})
    assert engine.get_queue("other").attributes["redrive"] is None
    assert engine.get_queue("dlq").attributes["redrive"] is None


@pytest.mark.parametrize("max_receives", [0, 1001, True, 2.0])
def test_max_receives_range(engine, dlq, max_receives):
    with pytest.raises(InvalidArgument) as caught:
        engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": max_receives}})
    assert caught.value.field == "attributes.redrive.max_receives"


def test_deleting_the_dlq_sets_redrive_to_null_on_every_source(engine, dlq, clock):
    make_source(engine, "a")
    make_source(engine, "b")
    engine.delete_queue("dlq")
    assert engine.get_queue("a").attributes["redrive"] is None
    assert engine.get_queue("b").attributes["redrive"] is None
    engine.send("a", [b"x"])
    engine.receive("a", visibility_timeout=1)
    clock.advance(1000)
    again = engine.receive("a")
    assert bodies(again) == [b"x"] and again[0].dequeue_count == 2


# -- moves at lease end --------------------------------------------------------------------

def test_lease_expiry_at_max_receives_moves_the_message(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    sent = engine.send(src, [b"poison"])[0]
    engine.receive(src, visibility_timeout=5)
    clock.advance(7000)  # the lease ended at T0 + 5000; nobody looked until now
    assert engine.receive(src, max=10) == []
    copy = engine.receive(dlq)[0]
    assert copy.body == b"poison"
    assert copy.id != sent.id
    assert copy.message.dead == [src, "default", T0 + 5000, sent.id, 1]


def test_message_comes_back_until_max_receives_is_reached(engine, dlq, clock):
    src = make_source(engine, max_receives=3)
    engine.send(src, [b"m"])
    for count in (1, 2, 3):
        got = engine.receive(src, visibility_timeout=1)
        assert [d.dequeue_count for d in got] == [count]
        assert engine.receive(dlq) == []
        clock.advance(1000)
    assert engine.receive(src) == []
    assert engine.receive(dlq)[0].message.dead[4] == 3


def test_change_visibility_zero_at_max_receives_moves_at_once(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    sent = engine.send(src, [b"m"])[0]
    delivery = engine.receive(src)[0]
    clock.advance(10)
    result = engine.change_visibility(src, [[delivery.receipt, 0]])[0]
    assert (result.receipt, result.next_visible_time) == (None, T0 + 10)
    assert engine.receive(src) == []
    assert engine.receive(dlq)[0].message.dead == [src, "default", T0 + 10, sent.id, 1]


def test_change_visibility_nonzero_does_not_move(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    engine.send(src, [b"m"])
    delivery = engine.receive(src)[0]
    changed = engine.change_visibility(src, [[delivery.receipt, 5]])[0]
    assert engine.receive(dlq) == []
    assert engine.delete(src, [changed.receipt]) == [None]
    clock.advance(60_000)
    assert engine.receive(dlq) == [] and engine.receive(src) == []


def test_deleted_message_is_not_moved(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    engine.send(src, [b"m"])
    engine.delete(src, [engine.receive(src, visibility_timeout=1)[0].receipt])
    clock.advance(5000)
    assert engine.receive(dlq) == []


def test_dlq_copy_keeps_user_attributes_and_priority_without_topic_or_delay(
        engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    engine.send(src, [{1: "text body", 2: {"k": "v", "n": 2}, 4: 3},
                      {1: b"ordered", 3: "topic-a"},
                      {1: b"late", 5: 2}])
    clock.advance(2000)
    leased = engine.receive(src, max=10)
    assert sorted(bodies(leased), key=str) == sorted(["text body", b"ordered", b"late"], key=str)
    engine.dead(src, [d.receipt for d in leased])
    copies = {d.message.dead[3]: d.message for d in engine.receive(dlq, max=10)}
    by_body = {m.body: m for m in copies.values()}
    text = by_body["text body"]
    assert text.attributes == {"k": "v", "n": 2, "DLQ.sourceQueue": src}
    assert text.priority == 3
    assert by_body[b"ordered"].topic is None
    assert by_body[b"ordered"].attributes == {"DLQ.sourceQueue": src}
    late = by_body[b"late"]
    assert late.visible_time == late.enqueue_time and late.priority == 8


def test_dlq_copy_of_a_topic_message_is_not_ordered_in_the_dlq(engine, dlq):
    src = make_source(engine, max_receives=5)
    engine.send(src, [{1: b"1", 3: "t"}])
    engine.dead(src, [engine.receive(src)[0].receipt])
    engine.send(src, [{1: b"2", 3: "t"}])
    engine.dead(src, [engine.receive(src)[0].receipt])
    assert bodies(engine.receive(dlq, max=10)) == [b"1", b"2"]


def test_peek_on_the_source_shows_dead(engine, dlq):
    src = make_source(engine, max_receives=5)
    sent = engine.send(src, [b"m"])[0]
    engine.dead(src, [engine.receive(src)[0].receipt])
    peeked = engine.peek(src, ids=[sent.id]).messages[0]
    assert peeked.state == "dead" and peeked.dequeue_count == 1
    assert [p.state for p in engine.peek(src, start=0, max=10).messages] == ["dead"]


# -- dead ----------------------------------------------------------------------------------

def test_dead_moves_at_once_and_answers_per_receipt(engine, dlq, clock):
    src = make_source(engine, max_receives=10)
    engine.send(src, [b"a", b"b"])
    a = engine.receive(src, visibility_timeout=30)[0]
    b = engine.receive(src, visibility_timeout=1)[0]
    clock.advance(1000)  # b's lease ran out
    results = engine.dead(src, [a.receipt, b.receipt, a.receipt])
    assert results[0] is None
    assert isinstance(results[1], StaleReceipt) and isinstance(results[2], StaleReceipt)
    copies = engine.receive(dlq, max=10)
    assert bodies(copies) == [b"a"]
    assert copies[0].message.dead == [src, "default", T0 + 1000, a.id, 1]
    assert bodies(engine.receive(src, max=10)) == [b"b"]


def test_dead_without_a_policy_fails_the_whole_request(engine):
    engine.create_queue("plain")
    engine.send("plain", [b"a"])
    receipt = engine.receive("plain")[0].receipt
    with pytest.raises(NoDeadLetterQueue):
        engine.dead("plain", [receipt, b"junk"])
    assert engine.delete("plain", [receipt]) == [None]  # nothing changed


def test_dead_under_a_tag_is_for_that_tag_only(engine, dlq):
    src = make_source(engine, max_receives=10)
    engine.create_tag(src, "b")
    sent = engine.send(src, [b"m"])[0]
    on_b = engine.receive(src, tag="b")[0]
    assert engine.dead(src, [on_b.receipt], tag="b") == [None]
    assert engine.receive(dlq)[0].message.dead[:2] == [src, "b"]
    assert engine.receive(src, tag="b") == []
    assert [d.id for d in engine.receive(src)] == [sent.id]  # default still has it


def test_moves_ignore_the_dlq_max_messages_and_max_message_size(engine, clock):
    engine.create_queue("dlq", {"max_messages": 1, "max_message_size": 1024})
    src = make_source(engine, max_receives=1)
    engine.send("dlq", [b"fills it"])
    engine.send(src, [b"x" * 1000, {1: b"y" * 1020, 2: {"a": "b"}}])
    leased = engine.receive(src, max=2)
    assert engine.dead(src, [d.receipt for d in leased]) == [None, None]
    assert len(engine.receive("dlq", max=10)) == 3
    assert isinstance(engine.send("dlq", [b"z"])[0], QueueFull)


def test_dlq_accepts_ordinary_sends(engine, dlq):
    make_source(engine)
    assert not isinstance(engine.send(dlq, [b"plain"])[0], Exception)
    assert engine.receive(dlq)[0].message.dead is None


def test_a_move_is_visible_in_the_dlq_without_touching_the_source(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    engine.send(src, [b"m"])
    engine.receive(src, visibility_timeout=5)
    clock.advance(5000)
    # "Every engine operation first applies the deadlines due by now"
    assert bodies(engine.receive(dlq)) == [b"m"]


def test_dead_letters_survive_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("dlq")
    src = make_source(engine, max_receives=5)
    sent = engine.send(src, [b"m"])[0]
    engine.dead(src, [engine.receive(src)[0].receipt])
    engine.close()
    engine = open_engine()
    assert engine.peek(src, ids=[sent.id]).messages[0].state == "dead"
    assert engine.receive(dlq := "dlq")[0].message.dead[3] == sent.id
    assert engine.receive(src) == [] and dlq


# -- redrive -------------------------------------------------------------------------------

def kill(engine, src, tag=None, count=1):
    """Receive ``count`` messages on ``tag`` and dead-letter them -> their deliveries."""
    got = engine.receive(src, tag=tag, max=count)
    assert engine.dead(src, [d.receipt for d in got], tag=tag) == [None] * len(got)
    return got


def test_redrive_moves_back_with_the_original_id_and_a_fresh_count(engine, dlq, clock):
    src = make_source(engine, max_receives=3)
    sent = engine.send(src, [b"m"])[0]
    for _ in range(2):
        engine.receive(src, visibility_timeout=1)
        clock.advance(1000)
    kill(engine, src)  # third delivery, dead-lettered
    assert engine.redrive(dlq) == Redriven(1, 0)
    assert engine.receive(dlq) == []
    back = engine.receive(src)[0]
    assert (back.id, back.body, back.dequeue_count) == (sent.id, b"m", 1)
    assert back.message.dead is None


def test_redrive_goes_to_the_tag_it_died_under_only(engine, dlq):
    src = make_source(engine, max_receives=5)
    engine.create_tag(src, "b")
    engine.send(src, [b"m"])
    engine.delete(src, [engine.receive(src)[0].receipt])  # default: done with it
    kill(engine, src, tag="b")
    assert engine.redrive(dlq) == Redriven(1, 0)
    assert engine.receive(src) == []
    assert bodies(engine.receive(src, tag="b")) == [b"m"]


def test_redriven_copy_is_ended_for_every_dlq_tag(engine, dlq):
    engine.create_tag(dlq, "audit", start="oldest")
    src = make_source(engine, max_receives=5)
    engine.send(src, [b"m"])
    kill(engine, src)
    engine.redrive(dlq)
    assert engine.receive(dlq, tag="audit") == []
    assert engine.receive(dlq) == []


def test_redrive_dry_run_changes_nothing(engine, dlq):
    src = make_source(engine, max_receives=5)
    engine.send(src, [b"a", b"b"])
    kill(engine, src, count=2)
    assert engine.redrive(dlq, dry_run=True) == Redriven(2, 0)
    assert engine.receive(src) == []
    assert engine.redrive(dlq) == Redriven(2, 0)
    assert bodies(engine.receive(src, max=10)) == [b"a", b"b"]


def test_redrive_skips_when_the_source_tag_was_deleted(engine, dlq):
    src = make_source(engine, max_receives=5)
    engine.create_tag(src, "b")
    engine.send(src, [b"m"])
    kill(engine, src, tag="b")
    engine.delete_tag(src, "b")
    engine.create_tag(src, "b", start="oldest")  # a new tag under the old name
    assert engine.redrive(dlq, dry_run=True) == Redriven(0, 1)
    assert engine.redrive(dlq) == Redriven(0, 1)
    fresh = engine.receive(src, tag="b")
    assert [d.dequeue_count for d in fresh] == [1]  # only as a message it never saw


def test_redrive_skips_when_the_source_queue_was_deleted(engine, dlq):
    src = make_source(engine, max_receives=5)
    engine.send(src, [b"m"])
    kill(engine, src)
    engine.delete_queue(src)
    make_source(engine, src)
    assert engine.redrive(dlq) == Redriven(0, 1)
    assert engine.receive(src) == []
    assert bodies(engine.receive(dlq)) == [b"m"]  # the skipped copy stays


def test_redrive_does_not_take_messages_inflight_or_ended_in_the_dlq(engine, dlq):
    src = make_source(engine, max_receives=5)
    engine.send(src, [b"a", b"b", b"c"])
    kill(engine, src, count=3)
    a, b = engine.receive(dlq, max=2)
    engine.delete(dlq, [a.receipt])
    assert engine.redrive(dlq) == Redriven(1, 0)
    assert bodies(engine.receive(src, max=10)) == [b"c"]


def test_redrive_ignores_ordinary_messages_of_the_dlq(engine, dlq):
    make_source(engine)
    engine.send(dlq, [b"plain"])
    assert engine.redrive(dlq) == Redriven(0, 0)
    assert bodies(engine.receive(dlq)) == [b"plain"]


def test_redrive_narrows_by_source_time_and_max(engine, dlq, clock):
    a = make_source(engine, "a", max_receives=5)
    b = make_source(engine, "b", max_receives=5)
    engine.send(a, [b"a1", b"a2", b"a3"])
    engine.send(b, [b"b1"])
    kill(engine, a)                      # dead at T0
    clock.advance(1000)
    kill(engine, a)                      # dead at T0 + 1000
    kill(engine, b)                      # dead at T0 + 1000
    clock.advance(1000)
    kill(engine, a)                      # dead at T0 + 2000
    assert engine.redrive(dlq, source="B", dry_run=True) == Redriven(1, 0)
    assert engine.redrive(dlq, since=T0 + 1000, until=T0 + 1000, dry_run=True) == \
        Redriven(2, 0)
    assert engine.redrive(dlq, source="a", since=T0 + 1, max=1) == Redriven(1, 0)
    assert bodies(engine.receive(a, max=10)) == [b"a2"]
    assert engine.redrive(dlq, until=T0) == Redriven(1, 0)
    assert bodies(engine.receive(a, max=10)) == [b"a1"]


@pytest.mark.parametrize("args, field", [
    ({"max": 0}, "max"), ({"max": 100_001}, "max"), ({"since": -1}, "since"),
    ({"until": "x"}, "until"), ({"dry_run": 1}, "dry_run"), ({"source": 7}, "source"),
])
def test_redrive_arguments_are_checked(engine, dlq, args, field):
    with pytest.raises(InvalidArgument) as caught:
        engine.redrive(dlq, **args)
    assert caught.value.field == field


def test_redriven_message_can_die_again(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    sent = engine.send(src, [b"m"])[0]
    engine.receive(src, visibility_timeout=1)
    clock.advance(1000)
    assert engine.receive(src) == []  # dead-lettered
    assert engine.redrive(dlq) == Redriven(1, 0)
    again = engine.receive(src, visibility_timeout=1)[0]
    assert (again.id, again.dequeue_count) == (sent.id, 1)
    clock.advance(1000)
    assert engine.receive(src) == []
    copies = engine.receive(dlq, max=10)
    assert [c.message.dead[3] for c in copies] == [sent.id]
    assert copies[0].message.dead[2] == T0 + 2000


def test_redrive_sees_a_move_due_by_now_without_touching_the_source(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    engine.send(src, [b"m"])
    engine.receive(src, visibility_timeout=1)
    clock.advance(1000)  # the lease ended: the message is in the DLQ from this moment
    assert engine.redrive(dlq) == Redriven(1, 0)
    assert bodies(engine.receive(src)) == [b"m"]


def test_source_keeps_a_dead_letter_until_its_dlq_copy_ends(engine, dlq, clock):
    src = make_source(engine, max_receives=5)
    engine.send(src, [b"m"])
    kill(engine, src)
    clock.advance(1)
    assert engine.get_queue(src).stats["messages"] == 1  # redrive can still reach it
    copy = engine.receive(dlq)[0]
    engine.delete(dlq, [copy.receipt])
    clock.advance(1)
    assert engine.get_queue(src).stats["messages"] == 0


def test_redrive_skips_a_message_its_tag_holds_a_lease_on(engine, clock):
    engine.create_queue("dlq")
    engine.create_queue("src", {"rewind": 3600,
                                "redrive": {"dlq": "dlq", "max_receives": 5}})
    engine.send("src", [b"m"])
    kill(engine, "src")
    engine.rewind("src", T0)
    leased = engine.receive("src")  # the original, delivered again after the rewind
    assert [d.dequeue_count for d in leased] == [1]
    assert engine.redrive("dlq") == Redriven(0, 1)
    assert bodies(engine.receive("dlq")) == [b"m"]


def test_max_receives_counts_per_tag(engine, dlq, clock):
    src = make_source(engine, max_receives=2)
    engine.create_tag(src, "b")
    engine.send(src, [b"m"])
    engine.receive(src, visibility_timeout=1)
    engine.receive(src, tag="b", visibility_timeout=1)
    clock.advance(1000)
    assert [d.dequeue_count for d in engine.receive(src, visibility_timeout=1)] == [2]
    clock.advance(1000)  # default reached 2: dead; b has 1
    assert engine.receive(src) == []
    assert [d.dequeue_count for d in engine.receive(src, tag="b")] == [2]
    assert [c.message.dead[1] for c in engine.receive(dlq, max=10)] == ["default"]


def test_expiry_under_a_tag_names_that_tag(engine, dlq, clock):
    src = make_source(engine, max_receives=1)
    engine.create_tag(src, "b")
    sent = engine.send(src, [b"m"])[0]
    engine.receive(src, tag="b", visibility_timeout=1)
    clock.advance(1000)
    assert engine.receive(src, tag="b") == []
    assert engine.receive(dlq)[0].message.dead == [src, "b", T0 + 1000, sent.id, 1]
    assert [d.id for d in engine.receive(src)] == [sent.id]


def test_redrive_does_not_take_a_copy_inflight_on_another_dlq_tag(engine, dlq):
    engine.create_tag(dlq, "audit")
    src = make_source(engine, max_receives=5)
    engine.send(src, [b"m"])
    kill(engine, src)
    engine.receive(dlq, tag="audit")
    assert engine.redrive(dlq) == Redriven(0, 0)
    assert engine.receive(src) == []


def test_a_lease_that_ends_while_closed_moves_with_its_own_dead_time(open_engine, clock):
    engine = open_engine()
    engine.create_queue("dlq")
    src = make_source(engine, max_receives=1)
    sent = engine.send(src, [b"m"])[0]
    engine.receive(src, visibility_timeout=5)
    engine.close()
    clock.advance(60_000)
    engine = open_engine()
    copies = engine.receive("dlq", max=10)
    assert [c.message.dead for c in copies] == [[src, "default", T0 + 5000, sent.id, 1]]
    assert engine.receive(src) == []


def test_redrive_skips_when_the_original_expired(engine, dlq, clock):
    src = make_source(engine, max_receives=5, retention=60)
    engine.send(src, [b"m"])
    kill(engine, src)
    clock.advance(60_001)
    assert engine.redrive(dlq) == Redriven(0, 1)
    assert engine.receive(src) == []
    assert bodies(engine.receive(dlq)) == [b"m"]


# -- a redriven topic message whose successors were delivered meanwhile ----------------------

def _redriven_topic_head(engine, clock):
    """``a`` and ``b`` of one topic: ``a`` dies at its lease's end, ``b`` goes in its turn and
    is deleted, then ``a`` is redriven and received again."""
    src = make_source(engine, visibility_timeout=1)
    engine.send(src, [{1: b"a", 3: "t"}, {1: b"b", 3: "t"}])
    assert bodies(engine.receive(src)) == [b"a"]
    clock.advance(1000)  # a's lease ends: dead-lettered (max_receives 1)
    (b,) = engine.receive(src)
    assert b.body == b"b" and engine.delete(src, [b.receipt]) == [None]
    assert engine.redrive("dlq") == Redriven(1, 0)
    (a,) = engine.receive(src)
    assert (a.body, a.dequeue_count) == (b"a", 1)
    return src, a


def test_a_redriven_topic_message_does_not_bring_back_its_deleted_successor(engine, dlq,
                                                                           clock):
    src, a = _redriven_topic_head(engine, clock)
    clock.advance(1000)  # a dies again; b was deleted in its turn: nothing comes back
    assert engine.peek(src).messages == []
    assert engine.receive(src) == []
    engine.send(src, [{1: b"c", 3: "t"}])
    assert bodies(engine.receive(src)) == [b"c"]


def test_the_successor_stays_deleted_across_a_reopen_and_after_a_delete(open_engine, clock):
    engine = open_engine()
    engine.create_queue("dlq")
    src, a = _redriven_topic_head(engine, clock)
    engine.send(src, [{1: b"c", 3: "t"}])  # parked behind a (Inflight)
    engine.close()
    engine = open_engine()
    assert engine.delete(src, [a.receipt]) == [None]
    assert bodies(engine.receive(src, max=5)) == [b"c"]  # b stays deleted, c comes


def test_a_successor_parked_again_behind_a_redriven_message_is_active_from_its_end(
        engine, dlq, clock):
    # DESIGN.md §2: a parked message is Active again from the end of the predecessor that
    # parked it, ordered by that time. b is Active again when a dies; a comes back (redrive)
    # before it and parks it again; so b is Active from a's second end, after c.
    src = make_source(engine, max_receives=5)
    engine.send(src, [{1: b"a", 3: "t"}, {1: b"b", 3: "t"}, b"c"])
    a, c = engine.receive(src, max=5, visibility_timeout=60)  # b parked behind a
    assert (a.body, c.body) == (b"a", b"c")
    assert engine.dead(src, [a.receipt]) == [None]  # b: Active again now
    clock.advance(1000)
    assert engine.redrive("dlq") == Redriven(1, 0)  # a goes before b again
    (a,) = engine.receive(src, max=5)
    assert a.body == b"a"
    clock.advance(500)
    assert engine.change_visibility(src, [[c.receipt, 0]])[0].receipt is None  # c: Active
    clock.advance(500)
    assert engine.delete(src, [a.receipt]) == [None]  # b: Active from now, after c
    assert bodies(engine.receive(src, max=5)) == [b"c", b"b"]


def test_a_redriven_topic_message_waits_behind_the_inflight_head_across_a_reopen(
        open_engine, clock):
    engine = open_engine()
    engine.create_queue("dlq")
    src = make_source(engine, visibility_timeout=1)
    engine.send(src, [{1: b"a", 3: "t"}, {1: b"b", 3: "t"}])
    assert bodies(engine.receive(src)) == [b"a"]
    clock.advance(1000)  # a dies; b's turn
    (b,) = engine.receive(src, visibility_timeout=60)
    assert engine.redrive("dlq") == Redriven(1, 0)  # a is back, behind b (Inflight)
    for _ in range(2):
        assert engine.receive(src) == []
        states = {p.message.body: p.state for p in engine.peek(src, start=0, max=10).messages}
        assert states == {b"a": "parked", b"b": "inflight"}
        engine.close()
        engine = open_engine()  # the topic stays locked on b, not on a (the lowest lease)
    assert engine.delete(src, [b.receipt]) == [None]
    assert bodies(engine.receive(src)) == [b"a"]


def test_a_successor_of_a_head_dead_at_its_lease_end_is_active_from_then(engine, dlq, clock):
    # a dies when its lease ends (+1 s), whenever an operation applies that: b, parked
    # behind it, is Active again from +1 s, before c, whose delay ended at +1.5 s.
    src = make_source(engine)
    engine.send(src, [{1: b"a", 3: "t"}, {1: b"b", 3: "t"}])
    assert bodies(engine.receive(src, max=5, visibility_timeout=1)) == [b"a"]  # b parked
    clock.advance(500)
    engine.send(src, [{1: b"c", 5: 1}])
    clock.advance(1500)
    assert bodies(engine.receive(src, max=5)) == [b"b", b"c"]


def test_a_redriven_topic_message_heads_its_topic_again(engine, dlq, clock):
    # a dies, b goes in its turn; a comes back: c, sent later, waits behind a (Active again,
    # not received yet) in peek too, and comes after it.
    src = make_source(engine, visibility_timeout=1)
    engine.send(src, [{1: b"a", 3: "t"}, {1: b"b", 3: "t"}])
    assert bodies(engine.receive(src)) == [b"a"]
    clock.advance(1000)  # a dies
    (b,) = engine.receive(src)
    assert engine.delete(src, [b.receipt]) == [None]
    assert engine.redrive("dlq") == Redriven(1, 0)
    engine.send(src, [{1: b"c", 3: "t"}])
    states = {p.message.body: p.state for p in engine.peek(src, start=0, max=10).messages}
    assert states == {b"a": "active", b"b": "deleted", b"c": "parked"}
    (a,) = engine.receive(src, max=5)
    assert a.body == b"a" and engine.delete(src, [a.receipt]) == [None]
    assert bodies(engine.receive(src, max=5)) == [b"c"]


# -- a dead letter whose copy ended (decided: model finding 19) -----------------------------

def test_a_dead_letter_whose_copy_is_deleted_is_gone_from_its_queue_at_once(engine, dlq,
                                                                            clock):
    make_source(engine)
    engine.send("src", [b"m"])
    clock.advance(1)  # produced before now: gone_seq may pass it once it is Ended
    engine.dead("src", [d.receipt for d in engine.receive("src")])
    assert engine.queue_depths()["src"] == 1  # the copy is alive: a redrive needs it
    engine.delete("dlq", [d.receipt for d in engine.receive("dlq")])
    assert engine.queue_depths()["src"] == 0  # in that same operation, not a later one


def test_a_rewind_of_the_dlq_does_not_bring_back_an_original_whose_copy_ended(engine, clock):
    engine.create_queue("dlq", {"rewind": 60})
    make_source(engine, max_receives=2)
    engine.send("src", [b"first", b"second"])
    first, second = engine.receive("src", max=2)
    engine.dead("src", [second.receipt])  # "first" stays in flight: gone_seq stays below
    engine.delete("dlq", [d.receipt for d in engine.receive("dlq")])
    clock.advance(1000)
    engine.rewind("dlq", clock() - 10_000)
    assert [p.message.body for p in engine.peek("dlq").messages] == [b"second"]  # deliverable
    assert engine.redrive("dlq") == Redriven(0, 1)  # reported gone, the copy left in the DLQ
    assert [p.message.body for p in engine.peek("dlq", start=0).messages] == [b"second"]
    engine.change_visibility("src", [(first.receipt, 0)])
    assert bodies(engine.receive("src", max=10)) == [b"first"]
