"""What a delete writes (docs/STORAGE.md "Leases", engine/counters.py): a delete that
``gone_seq`` passes in the same write leaves the message's ``leases`` row as it was (opening
reads a ``leases`` row below ``gone_seq`` as deleted) and its count goes into the watermarks
row, not the tag's counter row; one that it does not pass writes the row ``ENDED_DELETED``
and counts in the counter row."""

from __future__ import annotations

import json
import shutil

import pytest

from lamina.engine import Engine, keys
from lamina.engine.state import ENDED_DELETED, LEASED, Lease
from lamina.engine.store import Store
from lamina.tools.snapshot import Snapshot
from lamina.tools.verify import verify
from tests.support.stores import run_killed


def rows_written(engine: Engine, operation) -> int:
    """Rows in the batches ``operation`` writes (counted as each batch is flushed)."""
    store = engine._store
    flush, counted = store.flush, [0]

    def counting_flush() -> None:
        if store.pending:
            counted[0] += store.batch.len()
        flush()

    store.flush = counting_flush  # type: ignore[method-assign]
    try:
        operation()
    finally:
        del store.flush
    return counted[0]


def lease_row(engine: Engine, seq: int) -> Lease | None:
    value = engine._store.leases.get(keys.lease_key(1, 1, seq))
    return None if value is None else Lease.decode(value)


def test_an_in_order_delete_of_one_writes_only_what_it_must_and_stays_deleted(tmp_path, clock):
    path = tmp_path / "data"
    engine = Engine.open(path, clock=clock)
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%d" % i for i in range(6)])
    clock.advance(1)
    held = [engine.receive("q")[0] for _ in range(4)]
    clock.advance(1)
    # In order: gone_seq passes each message as it is deleted. The watermarks row is
    # written, holding the delete's count and its delivery's figures held back
    # (counters.py); the lease row is left as the receive wrote it, the receives still
    # held keep theirs.
    assert rows_written(engine, lambda: engine.delete("q", [held[0].receipt])) == 1
    assert rows_written(engine, lambda: engine.delete("q", [held[1].receipt])) == 1
    assert lease_row(engine, 0).state == LEASED  # type: ignore[union-attr]
    # Out of order: gone_seq stays below it, so its row says deleted (peek's count).
    assert engine.delete("q", [held[3].receipt]) == [None]
    assert lease_row(engine, 3).state == ENDED_DELETED  # type: ignore[union-attr]
    stats = engine.stats("q")
    assert [(day["received"], day["deleted"]) for day in stats] == [(4, 3)]
    shutil.copytree(path, tmp_path / "killed")  # as a kill -9 leaves it
    engine.close()
    clock.advance(31_000)  # past the leases' deadline: a lease read back would be Active
    for directory in (tmp_path / "killed", path):
        with Engine.open(directory, clock=clock) as again:
            assert again.stats("q") == stats  # the figures held back, exact
            assert [d.body for d in again.receive("q", max=10)] == [b"m2", b"m4", b"m5"]
            assert sum(day["deleted"] for day in again.stats("q")) == 3
            peeked = again.peek("q", start=0, max=10).messages
            assert [(p.message.body, p.state) for p in peeked][:2] == [
                (b"m2", "inflight"), (b"m3", "deleted")]
            assert peeked[1].dequeue_count == 1
        with Snapshot(directory) as snapshot:
            assert not verify(snapshot).findings


def test_a_lease_row_below_gone_seq_is_read_as_deleted_with_its_count(tmp_path, clock):
    from lamina.engine.loading import lease_rows

    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30})
        engine.send("q", [b"a", b"b"])
        clock.advance(1)
        [first] = engine.receive("q")
        engine.delete("q", [first.receipt])
        assert engine.get_queue("q").stats["messages"] == 1
        rows = dict(lease_rows(engine._store, 1, 1, 1))
        assert (rows[0].state, rows[0].count, rows[0].first_ms) == (
            ENDED_DELETED, 1, first.first_dequeue_time)
        assert dict(Store.items(engine._store.leases, *keys.queue_bounds(1)))


CHILD = r"""
import json, os, signal, sys
from lamina.engine import Engine

engine = Engine.open(sys.argv[1])
engine.create_queue("q", {"visibility_timeout": 1})
engine.send("q", [b"m%03d" % i for i in range(60)])
held = [engine.receive("q")[0] for _ in range(40)]
# Mostly in order (gone_seq passes each), some out of order, some left in flight.
deleted = held[:20] + held[24:30] + held[32:40]
for delivery in deleted:
    assert engine.delete("q", [delivery.receipt]) == [None]
print(json.dumps([d.body.decode() for d in deleted]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_no_delete_comes_back_after_a_killed_process(tmp_path):
    path = tmp_path / "data"
    deleted = set(json.loads(run_killed(CHILD, path)))
    from lamina.engine import FakeClock
    import time

    clock = FakeClock(time.time_ns() // 1_000_000 + 60_000)  # every lease ran out
    with Engine.open(path, clock=clock) as engine:
        got = sorted(d.body.decode() for d in engine.receive("q", max=100))
        assert got == sorted({f"m{i:03d}" for i in range(60)} - deleted)
        assert sum(day["deleted"] for day in engine.stats("q")) == len(deleted)
    with Snapshot(path) as snapshot:
        assert not verify(snapshot).findings


def test_a_version_3_directory_opens_unchanged_and_is_marked_the_current_version(tmp_path, clock):
    from lamina.engine.core import SCHEMA_VERSION
    from tests.engine.test_lease_deadlines import raw_store

    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30})
        engine.create_tag("q", "other", "oldest")  # a tag without a filter: its own row
        engine.send("q", [b"m%d" % i for i in range(5)])
        clock.advance(1)
        for tag in (None, "other"):
            engine.delete("q", [d.receipt for d in engine.receive("q", tag, max=2)], tag)
        before = [engine.stats("q", tag) for tag in (None, "default", "other")]
    with raw_store(path) as db:
        db.get_column_family("meta")[keys.META_VERSION] = keys.u32(3)
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION) == keys.u32(5)
        assert [engine.stats("q", tag) for tag in (None, "default", "other")] == before
        assert [d.body for d in engine.receive("q", max=10)] == [b"m2", b"m3", b"m4"]


def deleted_by_day(engine: Engine, tag: str | None = None) -> list[tuple[str, int]]:
    return [(day["day"], day["deleted"]) for day in engine.stats("q", tag)]


def test_deletes_counted_in_the_watermarks_row_go_to_the_counter_rows_the_next_day(
        tmp_path, clock):
    path = tmp_path / "data"
    clock.set(1_700_006_400_000 - 10)  # 10 ms before midnight (UTC)
    engine = Engine.open(path, clock=clock)
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.create_tag("q", "other", "oldest")
    engine.send("q", [b"m%d" % i for i in range(8)])
    clock.advance(1)
    for tag in (None, "other"):  # in order: into the watermarks row
        held = engine.receive("q", tag, max=3)
        for delivery in held:
            engine.delete("q", [delivery.receipt], tag)
    q = engine._queues[engine._queue_names["q"]]
    # The default tag's deletes did not raise gone_seq ("other" held the messages): its row.
    assert q.unsaved_deletes == {2: 3}
    day1 = [("2023-11-14", 3)]
    assert deleted_by_day(engine, "other") == day1 and deleted_by_day(engine) == [
        ("2023-11-14", 6)]
    shutil.copytree(path, tmp_path / "killed")
    clock.advance(10)  # the next day
    [late] = engine.receive("q", "other")
    [late_default] = engine.receive("q")
    # Counted in its row; the day before's unsaved deletes went to theirs.
    assert engine.delete("q", [late_default.receipt]) == [None]
    assert q.unsaved_deletes == {}
    assert engine.delete("q", [late.receipt], "other") == [None]  # raises gone_seq
    assert q.unsaved_deletes == {2: 1} and q.unsaved_day == 1_700_006_400_000 // 86_400_000
    expected = [("2023-11-15", 1), ("2023-11-14", 3)]
    assert deleted_by_day(engine, "other") == expected
    engine.close()
    for directory in (path, tmp_path / "killed"):
        with Engine.open(directory, clock=clock) as again:
            if directory == path:
                assert deleted_by_day(again, "other") == expected
                assert deleted_by_day(again, "default") == expected
                assert deleted_by_day(again) == [("2023-11-15", 2), ("2023-11-14", 6)]
            else:  # as a kill -9 left it before the next day's delete
                assert deleted_by_day(again, "other") == day1
                assert deleted_by_day(again) == [("2023-11-14", 6)]


def test_a_deleted_tag_takes_its_unsaved_deletes_with_it(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30})
        engine.create_tag("q", "other", "oldest")
        engine.send("q", [b"a", b"b"])
        clock.advance(1)
        engine.delete("q", [d.receipt for d in engine.receive("q", max=1)])
        # raises gone_seq: counted in the watermarks row
        engine.delete("q", [d.receipt for d in engine.receive("q", "other", max=2)], "other")
        assert engine._queues[1].unsaved_deletes == {2: 2}
        assert sum(day["deleted"] for day in engine.stats("q")) == 3
        engine.delete_tag("q", "other")
        assert sum(day["deleted"] for day in engine.stats("q")) == 1
    with Engine.open(path, clock=clock) as engine:
        assert sum(day["deleted"] for day in engine.stats("q")) == 1


def test_the_watermarks_row_holds_the_unsaved_deletes_of_any_number_of_tags():
    from lamina.engine.state import QueueState

    for unsaved in ({}, {3: 1}, {1: 2**40, 5: 7, 9: 1}):
        q = QueueState(1, "q", {}, 0, next_seq=10, gone_seq=4, next_topic_id=2)
        q.unsaved_deletes, q.unsaved_day = dict(unsaved), 19_000
        value = q.encode_watermarks()
        assert len(value) == 40 + (4 + 12 * len(unsaved) if unsaved else 0)
        read = QueueState(1, "q", {}, 0)
        read.decode_watermarks(value)
        assert (read.next_seq, read.gone_seq, read.next_topic_id, read.unsaved_deletes) == (
            10, 4, 2, unsaved)
        if unsaved:
            assert read.unsaved_day == 19_000


def test_unsaved_deletes_of_a_day_past_the_kept_ones_leave_no_counter_row(tmp_path, clock):
    from lamina.engine.counters import KEEP_DAYS

    with Engine.open(tmp_path / "data", clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30, "retention": 365 * 86400})
        engine.send("q", [b"a", b"b"])
        clock.advance(1)
        engine.delete("q", [d.receipt for d in engine.receive("q")])  # unsaved
        old_day = clock() // 86_400_000
        clock.advance(KEEP_DAYS * 86_400_000)
        engine.delete("q", [d.receipt for d in engine.receive("q")])
        assert not engine._store.meta.get(keys.day_key(1, 1, old_day))
        assert [day["deleted"] for day in engine.stats("q", days=KEEP_DAYS)] == [1]
