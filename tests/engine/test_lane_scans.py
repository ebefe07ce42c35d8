"""A receive walks a lane's records with the iterator of the lane's previous walk, sought
again, while nothing was appended to the lane (``Store.lane_scan``); a receive that leaves a
message at ``gone_seq`` leased for its tag does not settle. What receives deliver, and what
a reopened engine holds, are those of fresh iterators: records appended since, reclaimed
segments, a deleted queue, a rewind below the last walk, two tags walking the lane in turn
(the iterator rests where one tag's cursor does), and the limit of walks one iterator
serves."""

from __future__ import annotations

import pytest

from lamina.engine import store as store_module


@pytest.fixture
def q(engine):
    engine.create_queue("q", {"visibility_timeout": 60, "rewind": 3600})
    return "q"


def receive_all(engine, queue, batch=16):
    """Receive and delete in batches until nothing comes -> the bodies, in order."""
    out = []
    while got := engine.receive(queue, max=batch):
        assert engine.delete(queue, [d.receipt for d in got]) == [None] * len(got)
        out += [d.body for d in got]
    return out


def kept_uses(engine):
    return [scan.uses for scan in engine._store._lanes.values()]


def test_receives_in_a_row_seek_the_lane_iterator_of_the_walk_before(engine, q):
    engine.send(q, [b"m%d" % i for i in range(100)])
    assert receive_all(engine, q) == [b"m%d" % i for i in range(100)]
    assert kept_uses(engine) and max(kept_uses(engine)) >= 5  # one iterator, sought again


def test_records_appended_after_a_walk_are_delivered(engine, q):
    engine.send(q, [b"a%d" % i for i in range(20)])
    first = engine.receive(q, max=16)
    engine.send(q, [b"b%d" % i for i in range(20)])
    second = engine.receive(q, max=16)
    third = engine.receive(q, max=16)
    assert [d.body for d in first + second + third] == (
        [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)])[:48]
    engine.delete(q, [d.receipt for d in first + second + third])
    assert receive_all(engine, q) == []


def test_a_rewind_below_the_last_walk_delivers_again_from_there(engine, q, clock):
    engine.send(q, [b"m%d" % i for i in range(40)])
    clock.advance(1000)
    assert receive_all(engine, q) == [b"m%d" % i for i in range(40)]
    engine.rewind(q, clock.now_ms - 1000)
    assert receive_all(engine, q) == [b"m%d" % i for i in range(40)]


def test_walks_after_segments_are_reclaimed_and_a_queue_recreated(open_engine, clock):
    engine = open_engine(segment_max_messages=32)
    engine.create_queue("q")
    for round_ in range(4):
        engine.send("q", [b"r%d-%d" % (round_, i) for i in range(50)])
        assert receive_all(engine, "q") == [b"r%d-%d" % (round_, i) for i in range(50)]
    engine.delete_queue("q")
    engine.create_queue("q")
    engine.send("q", [b"new%d" % i for i in range(20)])
    assert receive_all(engine, "q") == [b"new%d" % i for i in range(20)]


def test_an_iterator_serves_a_bounded_number_of_walks(engine, q, monkeypatch):
    monkeypatch.setattr(store_module, "LANE_SCAN_USES", 3)
    engine.send(q, [b"m%d" % i for i in range(120)])
    assert receive_all(engine, q, batch=4) == [b"m%d" % i for i in range(120)]
    assert max(kept_uses(engine)) <= 3


def test_in_order_receives_without_settling_leave_the_store_as_they_would(open_engine):
    engine, q = open_engine(), "q"
    engine.create_queue(q)
    engine.send(q, [b"m%d" % i for i in range(64)])
    held = []
    for _ in range(3):  # three batches in flight: each receive leaves gone_seq leased
        held.append(engine.receive(q, max=16))
    for got in held:  # in order: each delete raises gone_seq past its batch
        assert engine.delete(q, [d.receipt for d in got]) == [None] * 16
    stats = engine.get_queue(q).stats
    engine.close()
    engine = open_engine()
    assert engine.get_queue(q).stats == stats
    assert receive_all(engine, q) == [b"m%d" % i for i in range(48, 64)]


def test_tags_walking_one_lane_in_turn_each_start_at_their_own_cursor(engine, q):
    engine.create_tag(q, "other", start="oldest")
    engine.send(q, [b"m%d" % i for i in range(64)])
    got = {None: [], "other": []}
    for _ in range(4):  # each tag's walk starts where the other's left the lane's iterator
        for tag in (None, "other", "other"):
            batch = engine.receive(q, tag=tag, max=8)
            got[tag] += [d.body for d in batch]
    assert got[None] == [b"m%d" % i for i in range(32)]
    assert got["other"] == [b"m%d" % i for i in range(64)]


def test_a_send_to_any_queue_drops_the_kept_iterators(engine, q):
    """A kept iterator pins the store's memtables and files of its creation: it is kept only
    while the log is not written, so it never holds what sends add and flush."""
    engine.create_queue("other")
    engine.send(q, [b"m%d" % i for i in range(40)])
    engine.receive(q, max=16)
    assert kept_uses(engine) == [0]
    engine.send("other", [b"x"])
    assert kept_uses(engine) == []
    assert [d.body for d in engine.receive(q, max=16)] == [b"m%d" % i for i in range(16, 32)]
