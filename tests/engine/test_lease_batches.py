"""Lease batches (schema version 3): the leases a receive makes of never-delivered messages of
a lane are one ``leasebatches`` row, and deleting them rewrites that row. What they hold must
survive a restart exactly as per-message lease rows did: receipts, deadlines, dequeue counts,
deletes; and rewinds, visibility changes and reclaimed segments must leave no stale entry."""

from __future__ import annotations

import shutil
from typing import Any

from lamina.engine import Engine, keys
from lamina.engine.store import Store
from lamina.tools.snapshot import Snapshot
from lamina.tools.verify import verify

START = 1_700_000_000_000


def rows(engine: Engine, family: str) -> int:
    store = engine._store
    lower, upper = keys.queue_bounds(1)
    return sum(1 for _ in Store.keys(getattr(store, family), lower, upper))


def states(engine: Engine, deliveries) -> list[tuple[str, int]]:
    peeked = engine.peek("q", ids=[d.id for d in deliveries]).messages
    return [(p.state, p.dequeue_count) for p in peeked]


def test_a_receive_of_16_writes_one_row_and_its_delete_rewrites_it(open_engine):
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [b"m%d" % i for i in range(17)])
    held = engine.receive("q", max=16)
    assert (rows(engine, "leases"), rows(engine, "leasebatches")) == (0, 1)
    assert engine.delete("q", [d.receipt for d in held[1:]]) == [None] * 15
    assert (rows(engine, "leases"), rows(engine, "leasebatches")) == (0, 1)
    assert states(engine, held[:3]) == [("inflight", 1), ("deleted", 1), ("deleted", 1)]


def test_a_receive_of_many_is_kept_in_rows_of_at_most_64_and_deleted_one_by_one(
        open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%d" % i for i in range(200)])
    held = engine.receive("q", max=200)
    assert rows(engine, "leasebatches") == 4  # 64 + 64 + 64 + 8
    for delivery in held[1::2]:
        assert engine.delete("q", [delivery.receipt]) == [None]
    engine.close()
    clock.advance(10_000)
    engine = open_engine()
    assert states(engine, held[:4]) == [("inflight", 1), ("deleted", 1)] * 2
    clock.advance(21_000)
    again = engine.receive("q", max=200)
    assert [d.body for d in again] == [d.body for d in held[0::2]]


def test_part_of_a_batch_deleted_before_a_restart_stays_deleted_and_the_rest_leased(
        open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"a", b"b", b"c", b"d"])
    held = engine.receive("q", max=4)
    assert engine.delete("q", [held[1].receipt, held[2].receipt]) == [None, None]
    engine.close()
    clock.advance(10_000)
    engine = open_engine()
    assert states(engine, held) == [("inflight", 1), ("deleted", 1), ("deleted", 1),
                                    ("inflight", 1)]
    assert engine.receive("q", max=4) == []
    clock.advance(21_000)  # the two leases left run out; the deleted ones stay deleted
    again = engine.receive("q", max=4)
    assert [(d.body, d.dequeue_count) for d in again] == [(b"a", 2), (b"d", 2)]
    assert engine.delete("q", [held[0].receipt]) != [None]  # stale now


def test_receipts_of_a_batch_are_deleted_after_a_restart(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"a", b"b", b"c"])
    held = engine.receive("q", max=3)
    engine.close()
    engine = open_engine()
    assert engine.delete("q", [held[1].receipt]) == [None]  # checked by its MAC now
    engine.close()
    engine = open_engine()
    assert states(engine, held) == [("inflight", 1), ("deleted", 1), ("inflight", 1)]
    assert engine.delete("q", [held[1].receipt]) != [None]
    clock.advance(31_000)
    assert [d.body for d in engine.receive("q", max=3)] == [b"a", b"c"]


def test_plain_leases_around_a_topics_lease_share_one_row_and_all_survive_a_restart(
        open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"a", b"b", {1: b"t1", 3: "t"}, b"c", b"d", b"e"])
    held = engine.receive("q", max=6)
    assert [d.body for d in held] == [b"a", b"b", b"t1", b"c", b"d", b"e"]
    # The plain leases before and after the topic's are one row, their lease numbers with a
    # gap where the topic's lease took one; the topic's lease has its plain row.
    assert (rows(engine, "leasebatches"), rows(engine, "leases")) == (1, 1)
    engine.close()
    clock.advance(10_000)
    engine = open_engine()
    assert engine.delete("q", [d.receipt for d in held[1::2]]) == [None] * 3
    assert states(engine, held) == [("inflight", 1), ("deleted", 1)] * 3
    clock.advance(21_000)
    assert [d.body for d in engine.receive("q", max=6)] == [b"a", b"t1", b"d"]


def test_a_visibility_change_of_a_batch_lease_outlives_its_batch_entry(open_engine, clock):
    engine, held, changed = _three_held_the_second_changed(open_engine)
    engine.close()
    clock.advance(31_000)
    engine = open_engine()
    assert [d.body for d in engine.receive("q", max=3)] == [b"a", b"c"]
    assert engine.delete("q", [held[1].receipt]) != [None]
    assert engine.delete("q", [changed.receipt]) == [None]
    engine.close()
    engine = open_engine()
    assert states(engine, held[1:2]) == [("deleted", 1)]


def test_a_batch_lease_changed_and_deleted_before_a_restart_stays_deleted(open_engine, clock):
    engine, held, changed = _three_held_the_second_changed(open_engine)
    assert engine.delete("q", [changed.receipt]) == [None]
    engine.close()
    clock.advance(200_000)
    engine = open_engine()
    assert states(engine, held) == [("active", 1), ("deleted", 1), ("active", 1)]
    assert [d.body for d in engine.receive("q", max=3)] == [b"a", b"c"]


def test_a_rewind_into_a_batch_keeps_the_leases_before_it(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30, "rewind": 3600})
    for body in (b"a", b"b", b"c", b"d", b"e", b"f"):
        engine.send("q", [body])
        clock.advance(1000)
    held = engine.receive("q", max=6)  # one batch: a..f
    assert engine.delete("q", [held[3].receipt, held[4].receipt]) == [None, None]
    engine.rewind("q", START + 3000)  # from d: d and e are never-delivered again
    assert engine.delete("q", [held[1].receipt]) == [None]  # b: in the cut batch now
    engine.close()
    engine = open_engine()
    assert states(engine, held) == [("inflight", 1), ("deleted", 1), ("inflight", 1),
                                    ("active", 0), ("active", 0), ("inflight", 1)]
    again = engine.receive("q", max=6)
    assert [(d.body, d.dequeue_count) for d in again] == [(b"d", 1), (b"e", 1)]
    receipts = [held[0].receipt, held[2].receipt, held[5].receipt, *[d.receipt for d in again]]
    assert engine.delete("q", receipts) == [None] * 5
    engine.close()
    engine = open_engine()
    assert engine.receive("q", max=6) == []
    clock.advance(31_000)
    assert engine.receive("q", max=6) == []


def test_batch_rows_go_with_their_segments(open_engine, clock):
    engine = open_engine(segment_max_messages=32)
    engine.create_queue("q")
    for _ in range(20):
        engine.send("q", [b"x"] * 16)
        clock.advance(5)
    for _ in range(19):
        held = engine.receive("q", max=16)
        assert engine.delete("q", [d.receipt for d in held]) == [None] * 16
    assert rows(engine, "leasebatches") <= 4  # those of the segments still kept


def _three_held_the_second_changed(open_engine: Any) -> tuple[Any, list[Any], Any]:
    """An engine holding a, b, c from one receive (one batch row), b's lease changed to 100 s."""
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"a", b"b", b"c"])
    held = engine.receive("q", max=3)
    (changed,) = engine.change_visibility("q", [[held[1].receipt, 100]])
    return engine, held, changed


def test_a_batch_whose_delete_passes_gone_seq_is_not_written_again_and_stays_deleted(
        open_engine, clock, tmp_path):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%d" % i for i in range(20)])
    clock.advance(1)  # the messages of the current ms are kept (rewind 0 reaches them)
    held = engine.receive("q", max=16)
    stored = dict(Store.items(engine._store.leasebatches, *keys.queue_bounds(1)))
    assert engine.delete("q", [d.receipt for d in held]) == [None] * 16
    # gone_seq passed the whole batch in the same write: its row, which opening no longer
    # reads, is left as the receive wrote it until its segment is reclaimed.
    assert dict(Store.items(engine._store.leasebatches, *keys.queue_bounds(1))) == stored
    # As a kill -9 leaves it: the directory of the running engine, copied.
    shutil.copytree(tmp_path / "data", tmp_path / "killed")
    clock.advance(31_000)  # past the leases' deadline: a lease read back would be Active
    for path in (tmp_path / "killed", tmp_path / "data"):
        if path.name == "data":
            engine.close()
        again = Engine.open(path, clock=clock)
        try:
            assert [d.body for d in again.receive("q", max=20)] == [b"m%d" % i
                                                                   for i in range(16, 20)]
            assert sum(day["deleted"] for day in again.stats("q")) == 16
        finally:
            again.close()
    with Snapshot(tmp_path / "killed") as snapshot:
        assert not verify(snapshot).findings


def test_deletes_in_a_batch_of_sparse_seqs_mark_their_own_entries(open_engine, clock):
    """A lane's seqs interleave with another lane's: its batch row's seqs have gaps, and a
    delete finds each entry by its seq, not by its offset from the first."""
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [{1: b"h%d" % i, 4: 1} if i % 3 == 0 else b"m%d" % i for i in range(24)])
    high = engine.receive("q", max=8)  # lane 1: seqs 0, 3, 6 ...
    held = engine.receive("q", max=16)  # lane 8: seqs 1, 2, 4, 5, 7 ...
    assert [d.body for d in high] == [b"h%d" % i for i in range(0, 24, 3)]
    assert [d.body for d in held] == [b"m%d" % i for i in range(24) if i % 3]
    assert engine.delete("q", [held[i].receipt for i in (5, 2, 9)]) == [None] * 3
    assert engine.delete("q", [high[i].receipt for i in (1, 7)]) == [None] * 2
    engine.close()
    clock.advance(10_000)
    engine = open_engine()
    deleted = {5, 2, 9}
    assert states(engine, held) == [("deleted" if i in deleted else "inflight", 1)
                                    for i in range(16)]
    assert states(engine, high) == [("deleted" if i in (1, 7) else "inflight", 1)
                                    for i in range(8)]
    clock.advance(21_000)
    again = engine.receive("q", max=24)
    assert sorted(d.body for d in again) == sorted(
        [d.body for i, d in enumerate(held) if i not in deleted]
        + [d.body for i, d in enumerate(high) if i not in (1, 7)])


def test_one_delete_of_two_batches_and_a_lease_row_interleaved_ends_exactly_those(
        open_engine, clock):
    """Receipts of two receives of different deadlines and of a receive of one (a lease row),
    interleaved in one delete with a receipt it refuses: the deleted ones never come back,
    before or after a restart, and the others come back each at its own deadline."""
    engine = open_engine()
    engine.create_queue("q")
    engine.send("q", [b"m%d" % i for i in range(17)])
    first = engine.receive("q", max=8, visibility_timeout=30)
    (one,) = engine.receive("q", max=1, visibility_timeout=60)
    second = engine.receive("q", max=8, visibility_timeout=90)
    receipts = [first[0].receipt, one.receipt, first[1].receipt, second[0].receipt,
                b"\0" * len(one.receipt), first[2].receipt, second[1].receipt]
    results = engine.delete("q", receipts)
    assert [type(r).__name__ if r else None for r in results] == \
        [None] * 4 + ["InvalidReceipt"] + [None] * 2
    deleted = [one, second[0], second[1]]  # first[:3] are gone: below gone_seq
    assert states(engine, deleted) == [("deleted", 1)] * 3
    engine.close()
    clock.advance(10_000)
    engine = open_engine()
    assert states(engine, deleted) == [("deleted", 1)] * 3
    assert states(engine, first[3:4]) == [("inflight", 1)]
    clock.advance(21_000)
    again = engine.receive("q", max=17)
    assert [d.body for d in again] == [d.body for d in first[3:]]
    assert engine.delete("q", [d.receipt for d in again]) == [None] * 5
    clock.advance(30_000)
    assert engine.receive("q", max=17) == []
    clock.advance(30_000)
    assert [d.body for d in engine.receive("q", max=17)] == [d.body for d in second[2:]]


def test_receipts_of_a_batch_out_of_order_repeated_or_altered_are_each_judged_alone(
        open_engine, clock):
    """A delete that names a batch's receipts out of order, one twice, or altered (a
    bytearray copy, cut short, lengthened, not bytes) ends exactly the genuine current
    ones and refuses the rest, each with its own error."""
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%d" % i for i in range(20)])
    held = engine.receive("q", max=16)
    r = [d.receipt for d in held]
    results = engine.delete("q", [r[0], bytearray(r[1]), "x", r[2], r[2], r[4], r[3], r[1],
                                  None, r[5][:-1], r[6] + b"\0", r[7]])
    assert [type(x).__name__ if x else None for x in results] == [
        None, "InvalidReceipt", "InvalidReceipt", None, "StaleReceipt", None, None, None,
        "InvalidReceipt", "InvalidReceipt", "InvalidReceipt", None]
    deleted = {0, 1, 2, 3, 4, 7}
    assert states(engine, held[5:]) == [("deleted" if i in deleted else "inflight", 1)
                                        for i in range(5, 16)]
    engine.close()
    clock.advance(31_000)
    engine = open_engine()
    again = engine.receive("q", max=20)
    assert sorted(d.body for d in again) == sorted(
        [d.body for i, d in enumerate(held) if i not in deleted] + [b"m16", b"m17", b"m18",
                                                                   b"m19"])
