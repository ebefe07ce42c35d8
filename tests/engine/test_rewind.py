"""Rewind: make what a tag received from a time on never-delivered again
(DESIGN.md §2 "Rewind")."""

import pytest

from lamina.engine import (
    InvalidArgument,
    RewindDisabled,
    RewindOutOfRange,
    Rewound,
    TagNotFound,
)

T0 = 1_700_000_000_000


@pytest.fixture
def q(engine):
    engine.create_queue("q", {"rewind": 3600})
    return "q"


def bodies(deliveries):
    return [d.body for d in deliveries]


def drain(engine, queue, tag=None):
    out = []
    while True:
        got = engine.receive(queue, tag=tag, max=100)
        if not got:
            return out
        engine.delete(queue, [d.receipt for d in got], tag=tag)
        out += bodies(got)


def produce(engine, queue, clock, *names, step=1000):
    """Send one message per name, ``step`` ms apart -> {name: (id, enqueue_time)}."""
    out = {}
    for name in names:
        sent = engine.send(queue, [name])[0]
        out[name] = (sent.id, sent.enqueue_time)
        clock.advance(step)
    return out


# -- the attribute and the window ----------------------------------------------------------

def test_rewind_attribute_is_seconds_up_to_retention(engine):
    info = engine.create_queue("a", {"rewind": 60, "retention": 60})
    assert info.attributes["rewind"] == 60
    with pytest.raises(InvalidArgument):
        engine.set_queue_attributes("a", {"rewind": 61})
    assert engine.get_queue("a").attributes["rewind"] == 60


def test_rewind_disabled_when_rewind_is_zero(engine, clock):
    engine.create_queue("off")
    with pytest.raises(RewindDisabled):
        engine.rewind("off", clock.now_ms)


def test_rewind_time_must_lie_within_the_window(engine, q, clock):
    clock.advance(10_000_000)
    now = clock.now_ms
    with pytest.raises(RewindOutOfRange):
        engine.rewind(q, now - 3600_000 - 1)
    with pytest.raises(RewindOutOfRange):
        engine.rewind(q, now + 1)
    assert engine.rewind(q, now - 3600_000) == Rewound(now - 3600_000, ["default"])
    assert engine.rewind(q, now).time == now


@pytest.mark.parametrize("time", [-1, 1.5, "now", None, True])
def test_rewind_time_must_be_ms(engine, q, time):
    with pytest.raises(InvalidArgument) as caught:
        engine.rewind(q, time)
    assert caught.value.field == "time"


def test_rewind_names_the_tags_it_rewound(engine, q, clock):
    engine.create_tag(q, "b")
    engine.create_tag(q, "A")
    assert engine.rewind(q, clock.now_ms).tags == ["A", "b", "default"]
    assert engine.rewind(q, clock.now_ms, tag="B").tags == ["b"]
    with pytest.raises(TagNotFound):
        engine.rewind(q, clock.now_ms, tag="nope")


# -- what comes back -----------------------------------------------------------------------

def test_deleted_messages_from_time_on_come_back_with_count_reset(engine, q, clock):
    m = produce(engine, q, clock, "a", "b", "c")
    engine.receive(q, visibility_timeout=1)
    clock.advance(1000)
    assert drain(engine, q) == ["a", "b", "c"]  # a was delivered twice
    result = engine.rewind(q, m["b"][1])
    assert result == Rewound(m["b"][1], ["default"])
    again = engine.receive(q, max=10)
    assert bodies(again) == ["b", "c"]
    assert [d.dequeue_count for d in again] == [1, 1]
    assert [d.id for d in again] == [m["b"][0], m["c"][0]]


def test_rewind_to_now_covers_messages_produced_now(engine, q, clock):
    engine.send(q, ["x"])
    assert drain(engine, q) == ["x"]
    engine.rewind(q, clock.now_ms)
    assert drain(engine, q) == ["x"]


def test_rewound_messages_are_never_delivered_again_by_priority(engine, q, clock):
    engine.send(q, [{1: "low", 4: 9}, {1: "high", 4: 2}, "mid"])
    assert drain(engine, q) == ["high", "mid", "low"]
    engine.rewind(q, T0)
    engine.send(q, [{1: "new-high", 4: 1}])
    assert drain(engine, q) == ["new-high", "high", "mid", "low"]


def test_active_and_expired_leases_are_reset_to_never_delivered(engine, q, clock):
    engine.send(q, ["a", "b"])
    engine.receive(q, visibility_timeout=1)
    clock.advance(5000)  # a Active again with count 1
    engine.rewind(q, T0)
    again = engine.receive(q, max=10)
    assert bodies(again) == ["a", "b"] and [d.dequeue_count for d in again] == [1, 1]
    assert again[0].first_dequeue_time == clock.now_ms


def test_dead_lettered_messages_come_back_and_dlq_copies_stay(engine, clock):
    engine.create_queue("dlq")
    engine.create_queue("src", {"rewind": 3600,
                                "redrive": {"dlq": "dlq", "max_receives": 1}})
    sent = engine.send("src", ["m"])[0]
    engine.dead("src", [engine.receive("src")[0].receipt])
    engine.rewind("src", T0)
    back = engine.receive("src")
    assert [(d.id, d.dequeue_count) for d in back] == [(sent.id, 1)]
    copies = engine.receive("dlq", max=10)
    assert [c.message.dead[3] for c in copies] == [sent.id]


def test_messages_before_time_are_not_rewound(engine, q, clock):
    m = produce(engine, q, clock, "a", "b")
    assert drain(engine, q) == ["a", "b"]
    engine.rewind(q, m["a"][1] + 1)
    assert drain(engine, q) == ["b"]


def test_inflight_messages_keep_their_lease_and_are_not_offered_twice(engine, q, clock):
    engine.send(q, ["a", "b", "c"])
    leased = engine.receive(q, max=2, visibility_timeout=60)  # a b inflight
    engine.rewind(q, T0)
    assert bodies(engine.receive(q, max=10)) == ["c"]
    assert engine.delete(q, [leased[0].receipt]) == [None]   # receipts still current
    changed = engine.change_visibility(q, [[leased[1].receipt, 1]])[0]
    assert changed.receipt is not None
    clock.advance(1000)
    again = engine.receive(q, max=10)
    assert bodies(again) == ["b"] and again[0].dequeue_count == 2  # its count kept


def test_inflight_message_deleted_after_rewind_does_not_come_back(engine, q, clock):
    engine.send(q, ["a", "b"])
    engine.delete(q, [engine.receive(q)[0].receipt])      # a deleted
    b = engine.receive(q)[0]                              # b inflight
    engine.rewind(q, T0)
    assert engine.delete(q, [b.receipt]) == [None]        # b ended after the rewind
    assert drain(engine, q) == ["a"]


def test_rewind_of_one_tag_leaves_other_tags_alone(engine, q, clock):
    engine.create_tag(q, "other", start="oldest")
    engine.send(q, ["a"])
    drain(engine, q)
    drain(engine, q, tag="other")
    engine.rewind(q, T0, tag="default")
    assert drain(engine, q, tag="other") == []
    assert drain(engine, q) == ["a"]


def test_rewind_without_tag_rewinds_every_tag(engine, q, clock):
    engine.create_tag(q, "other", start="oldest")
    engine.send(q, ["a"])
    drain(engine, q)
    drain(engine, q, tag="other")
    engine.rewind(q, T0)
    assert drain(engine, q) == ["a"]
    assert drain(engine, q, tag="other") == ["a"]


def test_messages_before_a_tags_start_are_not_rewound_into_it(engine, q, clock):
    engine.send(q, ["old"])
    clock.advance(1000)
    engine.create_tag(q, "late")
    engine.send(q, ["new"])
    assert drain(engine, q, tag="late") == ["new"]
    assert engine.rewind(q, T0, tag="late").tags == ["late"]
    assert drain(engine, q, tag="late") == ["new"]


def test_filtered_out_messages_are_not_rewound_into_a_tag(engine, q, clock):
    engine.create_tag(q, "f", start="oldest", filter={"attributes": {"k": 1}})
    engine.send(q, [{1: "in", 2: {"k": 1}}, {1: "out", 2: {"k": 2}}])
    assert drain(engine, q, tag="f") == ["in"]
    engine.rewind(q, T0, tag="f")
    assert drain(engine, q, tag="f") == ["in"]


def test_purge_makes_messages_non_rewindable(engine, q, clock):
    engine.send(q, ["a"])
    drain(engine, q)
    engine.purge_queue(q)
    engine.send(q, ["b"])
    drain(engine, q)
    engine.rewind(q, T0)
    assert drain(engine, q) == ["b"]


def test_deleted_messages_stay_rewindable_for_the_window(engine, clock):
    engine.create_queue("w", {"rewind": 60})
    m = produce(engine, "w", clock, "a", "b", step=30_000)
    drain(engine, "w")
    clock.advance(1)  # a: produced 60 001 ms ago, past the window; b: inside it
    stats = engine.get_queue("w").stats
    assert (stats["messages"], stats["rewindable"]) == (1, 1)
    engine.rewind("w", clock.now_ms - 60_000)
    assert drain(engine, "w") == ["b"]
    assert m


def test_rewind_survives_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"rewind": 3600})
    engine.send("q", ["a", "b"])
    drain(engine, "q")
    engine.rewind("q", T0)
    engine.close()
    engine = open_engine()
    assert drain(engine, "q") == ["a", "b"]
    engine.close()
    engine = open_engine()
    assert drain(engine, "q") == []


def test_rewound_delayed_messages_come_back_after_their_delay(engine, q, clock):
    engine.send(q, [{1: "late", 5: 10}, "now"])
    clock.advance(10_000)
    assert sorted(drain(engine, q)) == ["late", "now"]
    engine.rewind(q, T0)
    got = engine.receive(q, max=10)
    assert set(bodies(got)) == {"now", "late"}  # the delay ended long ago


def test_rewound_message_still_delayed_waits_for_its_delay(engine, q, clock):
    engine.send(q, [{1: "late", 5: 10}, "now"])
    engine.delete(q, [engine.receive(q)[0].receipt])
    engine.rewind(q, T0)
    assert drain(engine, q) == ["now"]
    clock.advance(10_000)
    assert drain(engine, q) == ["late"]


def test_rewound_topic_message_waits_behind_an_inflight_one_of_its_topic(engine, q, clock):
    engine.send(q, [{1: "1", 3: "t"}, {1: "2", 3: "t"}])
    engine.delete(q, [engine.receive(q)[0].receipt])  # 1 done
    two = engine.receive(q)[0]                        # 2 inflight
    engine.rewind(q, T0)
    assert engine.receive(q, max=10) == []            # 1 waits behind 2
    engine.delete(q, [two.receipt])
    assert bodies(engine.receive(q, max=10)) == ["1"]


def test_a_rewound_topic_message_waiting_behind_an_inflight_one_is_parked(engine, q, clock):
    # Peek and stats say so once a receive passed it: it comes after the Inflight one ends.
    engine.send(q, [{1: "1", 3: "t"}, {1: "2", 3: "t"}])
    engine.delete(q, [engine.receive(q)[0].receipt])
    two = engine.receive(q)[0]
    engine.rewind(q, T0)
    for _ in range(2):  # before and after a receive passed "1"
        states = {p.message.body: p.state for p in engine.peek(q, start=0, max=10).messages}
        assert states == {"1": "parked", "2": "inflight"}
        assert engine.get_queue(q).stats["tags"]["default"]["parked"] == 1
        assert engine.receive(q, max=10) == []
    engine.delete(q, [two.receipt])
    assert bodies(engine.receive(q, max=10)) == ["1"]


def test_a_rewound_topic_message_behind_an_inflight_one_holds_gone_seq(engine, clock):
    # Once the rewind window has passed and everything before it is deleted, gone_seq must
    # still not pass it: it is not Ended.
    engine.create_queue("short", {"rewind": 60})
    engine.send("short", ["a", {1: "b", 3: "t"}, {1: "c", 3: "t"}])
    a, b = engine.receive("short", max=5, visibility_timeout=600)
    engine.delete("short", [b.receipt])
    (c,) = engine.receive("short", max=5, visibility_timeout=600)  # c Inflight
    engine.rewind("short", T0)  # b waits behind c; a stays Inflight
    assert engine.receive("short", max=5) == []
    clock.advance(61_000)
    engine.delete("short", [a.receipt])
    assert engine.get_queue("short").stats["messages"] == 2  # b and c
    engine.delete("short", [c.receipt])
    assert bodies(engine.receive("short", max=5)) == ["b"]


@pytest.mark.parametrize("reopen", [False, True])
def test_a_second_rewind_before_the_first_caught_up_loses_and_repeats_nothing(
        open_engine, clock, reopen):
    # Delayed messages come through the delay index. The first rewind makes b and c
    # never-delivered again; b is delivered again, c not yet, when a second rewind (of d
    # only) comes: c must still come (it was lost), b must not (it came twice).
    engine = open_engine()
    engine.create_queue("delayed", {"rewind": 3600, "delay": 1})
    engine.send("delayed", ["a"])
    clock.advance(10_000)
    engine.send("delayed", ["b", "c"])
    clock.advance(500)
    engine.send("delayed", ["d"])
    clock.advance(500)  # a, b, c visible; d at +11.5 s
    assert drain(engine, "delayed") == ["a", "b", "c"]
    engine.rewind("delayed", T0 + 5000)  # b and c again
    (b,) = engine.receive("delayed")
    assert b.body == "b" and engine.delete("delayed", [b.receipt]) == [None]
    engine.rewind("delayed", T0 + 10_500)  # d only
    if reopen:
        engine.close()
        engine = open_engine()
    clock.advance(1000)
    assert drain(engine, "delayed") == ["c", "d"]


def test_rewound_topic_messages_are_delivered_in_order_again(engine, q, clock):
    engine.send(q, [{1: "1", 3: "t"}, {1: "2", 3: "t"}])
    assert drain(engine, q) == ["1", "2"]
    engine.rewind(q, T0)
    first = engine.receive(q, max=10)
    assert bodies(first) == ["1"]
    engine.delete(q, [first[0].receipt])
    assert bodies(engine.receive(q, max=10)) == ["2"]


def test_messages_deleted_by_id_come_back_after_rewind(engine, q):
    sent = engine.send(q, ["a", "b"])
    engine.delete_by_id(q, [sent[0].id])
    assert drain(engine, q) == ["b"]
    engine.rewind(q, T0)
    assert drain(engine, q) == ["a", "b"]


def test_rewound_delayed_messages_survive_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"rewind": 3600})
    engine.send("q", [{1: "late", 5: 10}, "now"])
    clock.advance(10_000)
    assert sorted(drain(engine, "q")) == ["late", "now"]
    engine.rewind("q", T0)
    engine.close()
    engine = open_engine()
    assert sorted(drain(engine, "q")) == ["late", "now"]
    assert drain(engine, "q") == []


def test_inflight_topic_message_deleted_after_rewind_does_not_come_back(engine, q):
    engine.send(q, [{1: "1", 3: "t"}, {1: "2", 3: "t"}, {1: "3", 3: "t"}])
    engine.delete(q, [engine.receive(q)[0].receipt])  # 1 done
    two = engine.receive(q)[0]                        # 2 inflight through the rewind
    engine.rewind(q, T0)
    assert engine.receive(q, max=10) == []            # 1 waits behind 2
    assert engine.delete(q, [two.receipt]) == [None]  # 2 ended after the rewind
    delivered = []
    for _ in range(5):
        got = engine.receive(q, max=10)
        if not got:
            break
        delivered += bodies(got)
        engine.delete(q, [d.receipt for d in got])
    assert delivered == ["1", "3"]
