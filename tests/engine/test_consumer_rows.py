"""What a consumer's receive of one and its in-order delete write (docs/STORAGE.md, schema
version 5): the receive its lease row, the delete the watermarks row alone — which holds
the delete's count and the receives held back until then, with a mark — so the daily
figures stay exact after a kill without the tag's counter row being written each time."""

from __future__ import annotations

import shutil

import pytest

from lamina.engine import Engine, Unavailable, keys
from lamina.engine.core import SCHEMA_VERSION
from lamina.engine.state import QueueState
from tests.engine.test_lease_deadlines import raw_store
from tests.engine.test_receive_rows import counted  # noqa: F401  (a fixture)
from tests.engine.test_receive_rows import killed_child_figures

FIGURES = ("received", "bytes_out", "deleted")


def figures(engine: Engine, tag: str | None = None) -> list[tuple[str, int, int, int]]:
    return [(day["day"], *(day[name] for name in FIGURES))
            for day in engine.stats("q", tag=tag, days=31)]


def test_a_consumer_receiving_one_and_deleting_it_writes_one_row_for_each(
        engine, clock, counted):
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%02d" % i for i in range(40)])
    clock.advance(1)  # past the sends' ms (a delete at it does not raise gone_seq)
    # The tag's first receive and its first delete of the day write its counter row.
    engine.delete("q", [d.receipt for d in engine.receive("q")])
    for _ in range(10):
        clock.advance(1)
        got: list = []
        assert counted(lambda: got.extend(engine.receive("q"))) == 1  # its lease row
        assert counted(lambda: engine.delete("q", [got[0].receipt])) == 1  # watermarks
    # Receives first, deletes after, in order: the first delete takes every receive held.
    held = [engine.receive("q")[0] for _ in range(4)]
    for delivery in held:
        assert counted(lambda: engine.delete("q", [delivery.receipt])) == 1
    assert not engine._counters.unsaved
    assert figures(engine)[0][1] == figures(engine)[0][3] == 15


def test_a_consumer_of_sixteen_at_a_time_writes_one_row_for_each_request(
        engine, clock, counted):
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%03d" % i for i in range(100)])
    clock.advance(1)
    engine.delete("q", [d.receipt for d in engine.receive("q")])
    for _ in range(5):
        clock.advance(1)
        got: list = []
        assert counted(lambda: got.extend(engine.receive("q", max=16))) == 1  # a batch row
        # The watermarks row alone: gone_seq passes the batch row, which is not rewritten.
        assert counted(lambda: engine.delete("q", [d.receipt for d in got])) == 1
    assert figures(engine)[0][1] == figures(engine)[0][3] == 81


def test_receives_held_by_the_watermarks_row_are_exact_after_reopening(tmp_path, clock):
    path = tmp_path / "data"
    engine = Engine.open(path, clock=clock)
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"x" * (i % 9 + 1) for i in range(30)])
    clock.advance(1)
    delivered = []
    for _ in range(6):
        delivered += engine.receive("q")
        engine.delete("q", [delivered[-1].receipt])
        clock.advance(1)
    leased = engine.receive("q", max=3)  # held back by their lease rows, still leased
    engine.delete("q", [leased[0].receipt])  # in order: all three to the watermarks row
    q = engine._queues[engine._queue_names["q"]]
    # The day's first delete wrote the counter row (and the first receive's figures).
    size = sum(len(d.record) for d in delivered[1:] + leased)
    assert q.unsaved_received[1][:2] == [8, size] and not engine._counters.unsaved
    before = figures(engine)
    assert before[0][1:] == (9, size + len(delivered[0].record), 7)
    shutil.copytree(path, tmp_path / "killed")  # as a kill -9 leaves it
    engine.close()
    for directory in (tmp_path / "killed", path):
        with Engine.open(directory, clock=clock) as again:
            assert figures(again) == before
            # The two still leased are counted once: the mark passes their numbers.
            assert again.delete("q", [d.receipt for d in leased[1:]]) == [None, None]
            assert figures(again)[0][1:] == (9, before[0][2], 9)


def test_a_delete_that_does_not_raise_gone_seq_leaves_the_held_receives_held(
        tmp_path, clock):
    path = tmp_path / "data"
    engine = Engine.open(path, clock=clock)
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.create_tag("q", "other", "oldest")  # holds gone_seq: it receives nothing
    engine.send("q", [b"a", b"b", b"c"])
    engine.delete("q", [d.receipt for d in engine.receive("q")])  # the day's row
    (delivery,) = engine.receive("q")
    engine.delete("q", [delivery.receipt])
    q = engine._queues[engine._queue_names["q"]]
    assert q.gone_seq == 0 and q.unsaved_received == {} and q.unsaved_deletes == {}
    before = figures(engine, "default")
    assert before[0][1] == before[0][3] == 2
    shutil.copytree(path, tmp_path / "killed")
    engine.close()
    for directory in (tmp_path / "killed", path):
        with Engine.open(directory, clock=clock) as again:
            assert figures(again, "default") == before


def test_the_watermarks_row_holds_unsaved_receives_with_their_deletes():
    for deletes, received in (({3: 1}, {3: [1, 70, 12]}),
                              ({1: 2**40, 5: 7, 9: 1}, {5: [9, 900, 2**33], 9: [1, 1, 4]})):
        q = QueueState(1, "q", {}, 0, next_seq=10, gone_seq=4, next_topic_id=2)
        q.unsaved_deletes, q.unsaved_received, q.unsaved_day = (
            dict(deletes), {tag: list(value) for tag, value in received.items()}, 19_000)
        value = q.encode_watermarks()
        assert len(value) == 40 + 4 + 36 * len(deletes.keys() | received.keys())
        read = QueueState(1, "q", {}, 0)
        read.decode_watermarks(value)
        assert (read.gone_seq, read.unsaved_day, read.unsaved_deletes,
                read.unsaved_received) == (4, 19_000, deletes, received)


def test_a_version_4_directory_with_unsaved_deletes_opens_as_it_was(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30})
        engine.send("q", [b"m%d" % i for i in range(6)])
        clock.advance(1)
        engine.delete("q", [d.receipt for d in engine.receive("q")])  # the tag's row
    with Engine.open(path, clock=clock) as engine:
        # The first in-order delete since the open writes the counter row: the watermarks
        # row holds its count alone, in version 4's layout.
        engine.delete("q", [d.receipt for d in engine.receive("q")])
        before = figures(engine)
        queue_id = engine._queue_names["q"]
    with raw_store(path) as db:
        meta = db.get_column_family("meta")
        assert len(meta[keys.watermarks_key(queue_id)]) == 40 + 4 + 12
        meta[keys.META_VERSION] = keys.u32(4)
        del meta
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION) == keys.u32(5)
        assert figures(engine) == before


CHILD = r"""
clock.advance(10)  # midnight at the 40th pair
kept = []
for index in range(60):  # a consumer of one per tag across midnight, a few receives kept
    for tag in ("default", "other"):
        (got,) = engine.receive("q", tag)
        if index in (50, 53) and tag == "default":
            kept.append(got.receipt)
        else:
            assert engine.delete("q", [got.receipt], tag) == [None]
    clock.advance(1)
engine.delete("q", kept[:1])
engine.receive("q", max=2)
"""


@pytest.mark.slow
def test_a_consumers_figures_are_exact_after_a_killed_process(tmp_path):
    before = killed_child_figures(CHILD, tmp_path / "data")
    assert before["in_watermarks"] and before["held"]


def test_a_failed_in_order_delete_leaves_the_receives_held_as_they_were(tmp_path, clock):
    from tests.engine.test_write_failures import break_store

    path = tmp_path / "data"
    engine = Engine.open(path, clock=clock)
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"m%02d" % i for i in range(10)])
    clock.advance(1)
    engine.delete("q", [d.receipt for d in engine.receive("q")])
    (delivery,) = engine.receive("q")  # held back
    before = figures(engine)
    store = engine._store
    broken = store.db
    break_store(engine)
    with pytest.raises(Unavailable):
        engine.delete("q", [delivery.receipt])  # would take them into the watermarks row
    store.db = broken  # as if the store were reopened
    assert figures(engine) == before
    assert engine.delete("q", [delivery.receipt]) == [None]
    after = figures(engine)
    assert after[0][1:] == (2, before[0][2], 2)
    shutil.copytree(path, tmp_path / "killed")
    engine.close()
    for directory in (tmp_path / "killed", path):
        with Engine.open(directory, clock=clock) as again:
            assert figures(again) == after
