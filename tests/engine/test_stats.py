"""get_queue stats and daily counters (DESIGN.md §8)."""

import pytest

from lamina.engine import InvalidArgument, TagNotFound

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
DAY = 86_400_000
TAG_KEYS = {"active", "inflight", "delayed", "parked", "lag", "approximate"}


@pytest.fixture
def q(engine):
    engine.create_queue("q")
    return "q"


def tag_stats(engine, queue, tag="default"):
    return engine.get_queue(queue).stats["tags"][tag]


def counts(stats):
    return {k: stats[k] for k in ("active", "inflight", "delayed", "parked")}


ZERO = {"active": 0, "inflight": 0, "delayed": 0, "parked": 0}


# -- get_queue stats -----------------------------------------------------------------------

def test_empty_queue_stats(engine, q):
    stats = engine.get_queue(q).stats
    assert set(stats) == {"messages", "bytes", "segments", "oldest", "newest", "rewindable",
                          "tags"}
    assert (stats["messages"], stats["oldest"], stats["newest"], stats["rewindable"]) == (
        0, None, None, 0)
    assert stats["tags"] == {"default": {**ZERO, "lag": None, "approximate": False}}


def test_queue_figures_in_a_small_scenario(engine, q, clock):
    engine.send(q, [b"a"])
    clock.advance(10)
    engine.send(q, [b"b", b"c"])
    stats = engine.get_queue(q).stats
    assert (stats["messages"], stats["oldest"], stats["newest"]) == (3, T0, T0 + 10)
    assert stats["segments"] == 1 and stats["bytes"] > 3


def test_tag_counts_each_state_exactly(engine, q, clock):
    engine.send(q, [b"a"])
    clock.advance(1)
    engine.send(q, [b"b", {1: b"c", 5: 10}, {1: b"t1", 3: "t"}, {1: b"t2", 3: "t"}])
    engine.receive(q)  # a
    stats = tag_stats(engine, q)
    assert counts(stats) == {"active": 2, "inflight": 1, "delayed": 1, "parked": 1}
    assert stats["lag"] == T0 and stats["approximate"] is False


def test_tag_counts_follow_leases_running_out_and_delays_ending(engine, q, clock):
    engine.send(q, [b"a", {1: b"d", 5: 5}])
    engine.receive(q, visibility_timeout=5)
    assert counts(tag_stats(engine, q)) == {**ZERO, "inflight": 1, "delayed": 1}
    clock.advance(5000)
    assert counts(tag_stats(engine, q)) == {**ZERO, "active": 2}


def test_counts_on_a_one_lane_queue_without_topics(engine, q, clock):
    """Such a queue's Active messages are counted, not walked (every seq is a record of the
    one lane): delays, leases, deletes, lease expiry, a rewind and a tag's start all count."""
    engine.set_queue_attributes(q, {"rewind": 3600})
    engine.send(q, [b"%d" % i for i in range(10)])
    engine.send(q, [{1: b"d1", 5: 5}, {1: b"d2", 5: 5}, {1: b"d3", 5: 50}])
    clock.advance(1)
    engine.send(q, [b"%d" % i for i in range(10, 15)])
    got = engine.receive(q, max=4, visibility_timeout=2)
    engine.delete(q, [d.receipt for d in got[:2]])
    assert counts(tag_stats(engine, q)) == {**ZERO, "active": 11, "inflight": 2, "delayed": 3}
    clock.advance(5_000)  # two delays end; the two leases ran out
    assert counts(tag_stats(engine, q)) == {**ZERO, "active": 15, "delayed": 1}
    taken = engine.receive(q, max=15, visibility_timeout=60)
    assert len(taken) == 15
    engine.delete(q, [d.receipt for d in taken[:5]])
    assert counts(tag_stats(engine, q)) == {**ZERO, "inflight": 10, "delayed": 1}
    engine.create_tag(q, "later", start=T0 + 1)  # the last five sends and later ones
    engine.send(q, [b"new"])
    assert counts(tag_stats(engine, q, "later")) == {**ZERO, "active": 6}
    assert counts(tag_stats(engine, q)) == {**ZERO, "active": 1, "inflight": 10, "delayed": 1}
    engine.rewind(q, T0 - 1_000, tag="default")  # back to the start: all but in flight
    assert counts(tag_stats(engine, q)) == {**ZERO, "active": 8, "inflight": 10, "delayed": 1}
    assert counts(tag_stats(engine, q, "later")) == {**ZERO, "active": 6}


def test_lag_is_the_production_time_of_the_oldest_message_not_ended(engine, q, clock):
    engine.send(q, [b"a"])
    clock.advance(10)
    engine.send(q, [b"b"])
    first = engine.receive(q)[0]
    assert tag_stats(engine, q)["lag"] == T0
    engine.delete(q, [first.receipt])
    assert tag_stats(engine, q)["lag"] == T0 + 10
    engine.delete(q, [engine.receive(q)[0].receipt])
    assert tag_stats(engine, q)["lag"] is None


def test_tags_are_counted_independently(engine, q, clock):
    engine.create_tag(q, "other")
    engine.send(q, [b"a", b"b"])
    engine.delete(q, [engine.receive(q)[0].receipt])
    tags = engine.get_queue(q).stats["tags"]
    assert counts(tags["default"]) == {**ZERO, "active": 1}
    assert counts(tags["other"]) == {**ZERO, "active": 2}
    assert set(tags["other"]) == TAG_KEYS


def test_approximate_only_for_filtered_tags(engine, q):
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    engine.create_tag(q, "plain")
    engine.send(q, [{1: b"in", 2: {"k": 1}}, {1: b"out", 2: {"k": 2}}])
    tags = engine.get_queue(q).stats["tags"]
    assert tags["f"]["approximate"] is True
    assert tags["plain"]["approximate"] is False and tags["default"]["approximate"] is False
    assert counts(tags["f"]) == {**ZERO, "active": 1}
    assert counts(tags["plain"]) == {**ZERO, "active": 2}


def test_rewindable_counts_messages_inside_the_rewind_window(engine, clock):
    engine.create_queue("r", {"rewind": 60})
    engine.send("r", [b"a"])
    clock.advance(30_000)
    engine.send("r", [b"b"])
    assert engine.get_queue("r").stats["rewindable"] == 2
    clock.advance(30_001)
    stats = engine.get_queue("r").stats
    assert (stats["messages"], stats["rewindable"]) == (2, 1)


def test_messages_ended_for_every_tag_leave_the_count(engine, q, clock):
    engine.send(q, [b"a", b"b"])
    engine.delete(q, [engine.receive(q)[0].receipt])
    clock.advance(1)
    stats = engine.get_queue(q).stats
    assert (stats["messages"], stats["oldest"]) == (1, T0)


# -- daily counters ------------------------------------------------------------------------

def day(offset=0):
    from datetime import datetime, timezone
    return datetime.fromtimestamp((T0 + offset * DAY) / 1000, tz=timezone.utc).strftime(
        "%Y-%m-%d")


def test_daily_counters_in_a_small_scenario(engine, clock):
    engine.create_queue("dlq")
    engine.create_queue("q", {"redrive": {"dlq": "dlq", "max_receives": 5}})
    engine.send("q", [b"aa", b"bbb", "cccc"])
    a, b = engine.receive("q", max=2, visibility_timeout=1)
    engine.delete("q", [a.receipt])
    clock.advance(1000)
    b_again = engine.receive("q")[0]
    engine.dead("q", [b_again.receipt])
    days = engine.stats("q")
    assert len(days) == 1
    row = days[0]
    assert set(row) == {"day", "sent", "received", "deleted", "dead", "expired", "bytes_in",
                        "bytes_out"}
    assert row["day"] == day(0) == "2023-11-14"
    assert (row["sent"], row["received"], row["deleted"], row["dead"], row["expired"]) == (
        3, 3, 1, 1, 0)
    assert row["bytes_in"] == 2 + 3 + 4
    assert row["bytes_out"] > 0


def test_days_are_newest_first_and_quiet_days_omitted(engine, q, clock):
    engine.send(q, [b"a"])
    clock.advance(2 * DAY)
    engine.send(q, [b"b", b"c"])
    days = engine.stats(q)
    assert [(d["day"], d["sent"]) for d in days] == [(day(2), 2), (day(0), 1)]
    assert [d["day"] for d in engine.stats(q, days=2)] == [day(2)]
    assert [d["day"] for d in engine.stats(q, days=3)] == [day(2), day(0)]


def test_per_tag_sent_counts_only_messages_the_tag_receives(engine, q, clock):
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    engine.send(q, [{1: b"in", 2: {"k": 1}}, {1: b"out", 2: {"k": 2}}, b"plain"])
    assert engine.stats(q, tag="f")[0]["sent"] == 1
    assert engine.stats(q, tag="default")[0]["sent"] == 3
    assert engine.stats(q)[0]["sent"] == 3  # once for the queue, not once per tag


def test_tag_started_later_does_not_count_earlier_sends(engine, q, clock):
    engine.send(q, [b"early"])
    clock.advance(1)
    engine.create_tag(q, "late")
    engine.send(q, [b"new"])
    assert engine.stats(q, tag="late")[0]["sent"] == 1
    assert engine.stats(q)[0]["sent"] == 2


def test_queue_totals_sum_the_rest_over_tags(engine, q):
    engine.create_tag(q, "other")
    engine.send(q, [b"a"])
    engine.delete(q, [engine.receive(q)[0].receipt])
    engine.delete(q, [engine.receive(q, tag="other")[0].receipt], tag="other")
    total = engine.stats(q)[0]
    assert (total["sent"], total["received"], total["deleted"]) == (1, 2, 2)
    other = engine.stats(q, tag="other")[0]
    assert (other["sent"], other["received"], other["deleted"]) == (1, 1, 1)


def test_every_delivery_counts_as_received(engine, q, clock):
    engine.send(q, [b"a"])
    for _ in range(3):
        engine.receive(q, visibility_timeout=1)
        clock.advance(1000)
    row = engine.stats(q, tag="default")[0]
    assert row["received"] == 3
    single = engine.stats(q)[0]["bytes_out"]
    assert single % 3 == 0 and single > 0


def test_expired_counts_messages_that_expired_while_not_ended(engine, clock):
    engine.create_queue("short", {"retention": 60})
    engine.create_tag("short", "other")
    engine.send("short", [b"done", b"leased", b"waiting"])
    engine.delete("short", [engine.receive("short")[0].receipt])       # done: Ended
    engine.receive("short")                                            # leased: Inflight
    clock.advance(60_001)
    assert engine.get_queue("short").stats["messages"] == 0
    assert engine.stats("short", tag="default")[0]["expired"] == 2   # leased, waiting
    assert engine.stats("short", tag="other")[0]["expired"] == 3
    assert engine.stats("short")[0]["expired"] == 5


def test_expired_counts_a_lease_that_ran_out_before_expiry(engine, clock):
    engine.create_queue("short", {"retention": 60})
    engine.send("short", [b"a"])
    engine.receive("short", visibility_timeout=1)
    clock.advance(60_001)
    assert engine.stats("short")[0]["expired"] == 1


def test_purged_messages_are_not_expired(engine, q, clock):
    engine.send(q, [b"a", b"b"])
    engine.receive(q)
    engine.purge_queue(q)
    assert engine.stats(q)[0]["expired"] == 0


@pytest.mark.parametrize("days", [0, 32, -1, 1.0, True])
def test_days_must_be_1_to_31(engine, q, days):
    with pytest.raises(InvalidArgument) as caught:
        engine.stats(q, days=days)
    assert caught.value.field == "days"


def test_stats_of_an_unknown_tag(engine, q):
    with pytest.raises(TagNotFound):
        engine.stats(q, tag="nope")


def test_counters_survive_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [b"a", b"b"])
    engine.delete("q", [engine.receive("q")[0].receipt])
    before = engine.stats("q")
    engine.close()
    engine = open_engine()
    assert engine.stats("q") == before
    engine.send("q", [b"c"])
    assert engine.stats("q")[0]["sent"] == 3


def test_deleted_tag_counters_leave_the_totals(engine, q):
    engine.create_tag(q, "other")
    engine.send(q, [b"a"])
    engine.receive(q, tag="other")
    engine.receive(q)
    engine.delete_tag(q, "other")
    assert engine.stats(q)[0]["received"] == 1


def test_expired_on_a_filtered_tag_counts_only_messages_it_receives(engine, clock):
    engine.create_queue("short", {"retention": 60})
    engine.create_tag("short", "f", filter={"attributes": {"k": 1}})
    engine.send("short", [{1: b"out", 2: {"k": 2}}, {1: b"in", 2: {"k": 1}}])
    clock.advance(60_001)
    engine.get_queue("short")
    assert engine.stats("short", tag="f")[0]["expired"] == 1
    assert engine.stats("short", tag="default")[0]["expired"] == 2


def test_expired_does_not_count_messages_deleted_by_id(engine, clock):
    engine.create_queue("short", {"retention": 60})
    sent = engine.send("short", [b"a", b"b"])
    engine.delete_by_id("short", [sent[1].id])
    clock.advance(60_001)
    engine.get_queue("short")
    assert engine.stats("short")[0]["expired"] == 1


def test_expired_counts_delayed_messages_never_delivered(engine, clock):
    engine.create_queue("short", {"retention": 60})
    engine.send("short", [{1: b"a", 5: 30}, {1: b"b", 5: 11}])
    clock.advance(60_001)
    engine.get_queue("short")
    assert engine.stats("short")[0]["expired"] == 2


def test_lag_of_a_filtered_tag_skips_messages_it_does_not_receive(engine, q, clock):
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    engine.send(q, [{1: b"out", 2: {"k": 2}}])
    clock.advance(10)
    engine.send(q, [{1: b"in", 2: {"k": 1}}])
    assert tag_stats(engine, q, "f")["lag"] == T0 + 10


def test_lag_of_a_tag_starting_later_ignores_earlier_messages(engine, q, clock):
    engine.send(q, [b"early"])
    clock.advance(10)
    engine.create_tag(q, "late")
    assert tag_stats(engine, q, "late")["lag"] is None
    engine.send(q, [b"new"])
    assert tag_stats(engine, q, "late")["lag"] == T0 + 10


def test_dlq_tag_with_a_filter_counts_the_dead_letters_it_receives(engine, clock):
    engine.create_queue("dlq")
    engine.create_tag("dlq", "from-a", filter={"attributes": {"DLQ.sourceQueue": "a"}})
    engine.create_queue("a", {"redrive": {"dlq": "dlq", "max_receives": 5}})
    engine.create_queue("b", {"redrive": {"dlq": "dlq", "max_receives": 5}})
    engine.send("a", [b"x"])
    engine.send("b", [b"y"])
    engine.dead("a", [engine.receive("a")[0].receipt])
    engine.dead("b", [engine.receive("b")[0].receipt])
    assert [d.body for d in engine.receive("dlq", tag="from-a", max=10)] == [b"x"]
    assert engine.stats("dlq", tag="from-a")[0]["sent"] == 1
    assert engine.stats("dlq", tag="default")[0]["sent"] == 2


def test_counters_work_with_a_clock_near_the_epoch(tmp_path):
    from lamina.engine import Engine, FakeClock
    with Engine.open(tmp_path / "early", clock=FakeClock(5 * 86_400_000)) as engine:
        engine.create_queue("q")
        assert not isinstance(engine.send("q", [b"x"])[0], Exception)
        assert engine.stats("q")[0]["sent"] == 1
