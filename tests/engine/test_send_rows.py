"""What a send writes besides its log rows (docs/STORAGE.md, schema version 3): no watermarks
row, the open segment's row only now and then; opening derives both from the log, exactly."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from lamina.engine import Engine, Unavailable, keys
from lamina.engine.core import SCHEMA_VERSION
from lamina.engine.state import SEGMENT_SAVE_MESSAGES, Segment
from tests.engine.test_lease_deadlines import raw_store

STORAGE = ("messages", "bytes", "segments", "oldest", "newest", "rewindable")


def storage(engine: Engine, queue: str) -> dict[str, object]:
    stats = engine.get_queue(queue).stats
    return {key: stats[key] for key in STORAGE}


def stored_segments(path: Path, queue_id: int) -> list[Segment]:
    with raw_store(path) as db:
        lower, upper = keys.queue_bounds(queue_id)
        family = db.get_column_family("segments")
        rows = [Segment.decode(keys.segment_key_decode(key)[1], value)
                for key, value in family.items(from_key=lower) if key < upper]
        del family  # a family keeps the database open
        return rows


def test_reopening_derives_next_seq_and_the_open_segment_from_the_log(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        sends = SEGMENT_SAVE_MESSAGES + 300
        for index in range(sends):  # two lanes
            engine.send("q", [{1: b"urgent", 4: 1} if index % 2 else b"m%d" % index])
            clock.advance(1)
        before = storage(engine, "q")
        queue_id = engine._queue_names["q"]
    # The row was written with the first message and again SEGMENT_SAVE_MESSAGES later.
    (row,) = stored_segments(path, queue_id)
    assert row.count == SEGMENT_SAVE_MESSAGES + 1 and before["messages"] == sends
    with Engine.open(path, clock=clock) as engine:
        assert storage(engine, "q") == before
        (sent,) = engine.send("q", [b"next"])
        assert sent.id == f"{queue_id:08x}{sends:016x}7"  # seqs go on, none reused


def test_a_sealed_segment_gets_its_final_row(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock, segment_max_messages=3) as engine:
        engine.create_queue("q")
        for index in range(7):
            engine.send("q", [b"m%d" % index])
        queue_id = engine._queue_names["q"]
    rows = stored_segments(path, queue_id)
    assert [(s.first_seq, s.last_seq, s.count) for s in rows[:2]] == [(0, 2, 3), (3, 5, 3)]
    assert (rows[2].first_seq, rows[2].count) == (6, 1)


def test_a_failed_send_write_changes_nothing_even_when_no_row_of_the_queue_was_put(
        engine, monkeypatch):
    engine.create_queue("q")
    engine.send("q", [b"first"])  # the open segment's row is written now, not by the next
    before = storage(engine, "q")

    def failing_flush() -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(engine._store, "flush", failing_flush)
    with pytest.raises(Unavailable):
        engine.send("q", [b"lost"])
    monkeypatch.undo()
    assert storage(engine, "q") == before
    (sent,) = engine.send("q", [b"second"])
    assert sent.id.endswith(f"{1:016x}7")  # seq 1: the lost send's seq was not kept


def test_a_version_2_directory_opens_unchanged_and_is_marked_version_3(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        for index in range(5):
            engine.send("q", [b"m%d" % index])
        queue_id = engine._queue_names["q"]
        q = engine._queues[queue_id]
        watermarks, segment = q.encode_watermarks(), q.segments[-1].encode()
        before = storage(engine, "q")
    # Version 2 wrote the watermarks and the open segment's row with every send.
    with raw_store(path) as db:
        meta, segments = db.get_column_family("meta"), db.get_column_family("segments")
        meta[keys.META_VERSION] = keys.u32(2)
        meta[keys.watermarks_key(queue_id)] = watermarks
        segments[keys.segment_key(queue_id, 0)] = segment
        del meta, segments  # a family keeps the database open
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION) == keys.u32(3)
        assert storage(engine, "q") == before
        assert [d.body for d in engine.receive("q", max=10)] == [b"m%d" % i for i in range(5)]


DAY_MS = 86_400_000


def test_a_tag_without_filter_counts_the_queue_sends_from_its_start(engine, clock):
    engine.create_queue("q")
    engine.send("q", [b"before the tag"])
    engine.create_tag("q", "later", start=clock.now_ms + 10)
    engine.send("q", [b"before its start"])
    clock.advance(10)
    engine.send("q", [b"one", b"two"])
    clock.advance(DAY_MS)
    engine.send("q", [b"next day"])
    later = engine.stats("q", tag="later")
    assert [(day["sent"], day["bytes_in"]) for day in later] == [(1, 8), (2, 6)]
    everything = engine.stats("q")
    assert [(day["sent"], day["bytes_in"]) for day in everything] == [(1, 8), (4, 36)]
    assert [day["sent"] for day in engine.stats("q", tag="default")] == [1, 4]


def test_version_2_counter_rows_are_migrated(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"early"])
        clock.advance(1)
        engine.create_tag("q", "late")
        engine.create_tag("q", "eu", filter={"attributes": {"region": "eu"}})
        engine.send("q", [b"new", {1: b"eu", 2: {"region": "eu"}}])
        engine.receive("q", "late")
        clock.advance(DAY_MS)
        engine.send("q", [b"next day"])
        queue_id = engine._queue_names["q"]
        tags = {name: engine._queues[queue_id].tag_named(name).id  # type: ignore[union-attr]
                for name in ("default", "late", "eu")}
        before = {name: engine.stats("q", tag=name) for name in (None, *tags)}
    # Version 2 counted every tag's sends in its own row.
    with raw_store(path) as db:
        meta = db.get_column_family("meta")
        meta[keys.META_VERSION] = keys.u32(2)
        for name in ("default", "late"):
            for day in before[name]:
                day_number = clock.now_ms // DAY_MS - (day["day"] != before[None][0]["day"])
                key = keys.day_key(queue_id, tags[name], day_number)
                row = [day[field] for field in ("sent", "received", "deleted", "dead",
                                                "expired", "bytes_in", "bytes_out")]
                meta[key] = struct.pack(">7Q", *row)
        del meta
    with Engine.open(path, clock=clock) as engine:
        assert {name: engine.stats("q", tag=name) for name in (None, *tags)} == before
    assert before["late"][1]["sent"] == 2 and before["default"][1]["sent"] == 3
