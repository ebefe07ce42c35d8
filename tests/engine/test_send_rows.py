"""What a send writes besides its log rows (docs/STORAGE.md, schema version 3): no watermarks
row, the open segment's row only now and then; opening derives both from the log, exactly."""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from pathlib import Path

import pytest

from lamina.engine import Engine, QueueFull, Unavailable, keys
from lamina.engine.core import SCHEMA_VERSION
from lamina.engine.state import SEGMENT_SAVE_MESSAGES, Segment
from tests.engine.test_lease_deadlines import raw_store
from tests.support.stores import run_killed

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
        sends = SEGMENT_SAVE_MESSAGES + SEGMENT_SAVE_MESSAGES // 2
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


def test_a_segment_sealed_by_a_send_that_refuses_every_message_keeps_its_counts(
        tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock, segment_max_messages=2) as engine:
        engine.create_queue("q", {"max_messages": 2})
        engine.send("q", [b"a"])  # the segment's row and the count written
        engine.send("q", [b"b"])  # neither: the segment is full
        (refused,) = engine.send("q", [b"c"])  # seals it, then refuses the message
        assert isinstance(refused, QueueFull)
    with Engine.open(path, clock=clock, segment_max_messages=2) as engine:
        assert [(d["sent"], d["bytes_in"]) for d in engine.stats("q")] == [(2, 2)]


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
        rows = version_2_rows(engine, "q")
        before = storage(engine, "q"), engine.stats("q")
    write_version_2(path, rows)
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION)
        assert (storage(engine, "q"), engine.stats("q")) == before
        assert [d.body for d in engine.receive("q", max=10)] == [b"m%d" % i for i in range(5)]
        engine.send("q", [b"m5"])
        assert engine.stats("q")[0]["sent"] == 6


FIELDS = ("sent", "received", "deleted", "dead", "expired", "bytes_in", "bytes_out")


def version_2_rows(engine: Engine, queue: str) -> dict[tuple[str, bytes], bytes]:
    """The rows of ``queue`` as version 2 wrote them, where version 3's may differ: the
    watermarks and segment rows complete, the counter rows of the queue (tag 0) holding every
    send, those of each tag without a filter the sends it received."""
    q = engine._queues[engine._queue_names[queue]]
    rows = {("meta", keys.watermarks_key(q.id)): q.encode_watermarks()}
    for segment in q.segments:
        rows["segments", keys.segment_key(q.id, segment.first_seq)] = segment.encode()
    tags = [(0, None)] + [(t.id, t.name) for t in q.tags.values() if t.filter is None]
    for tag_id, name in tags:
        for day in engine.stats(queue, tag=name, days=31):
            number = int(datetime.strptime(day["day"], "%Y-%m-%d").replace(
                tzinfo=timezone.utc).timestamp()) // 86400
            row = [day[field] if tag_id or field in ("sent", "bytes_in") else 0
                   for field in FIELDS]
            rows["meta", keys.day_key(q.id, tag_id, number)] = struct.pack(">7Q", *row)
    return rows


def write_version_2(path: Path, rows: dict[tuple[str, bytes], bytes]) -> None:
    with raw_store(path) as db:
        families = {name: db.get_column_family(name) for name in ("meta", "segments")}
        families["meta"][keys.META_VERSION] = keys.u32(2)
        for (family, key), value in rows.items():
            families[family][key] = value
        del families  # a family keeps the database open


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
        names = (None, "default", "late", "eu")
        before = {name: engine.stats("q", tag=name) for name in names}
        rows = version_2_rows(engine, "q")
    write_version_2(path, rows)
    with Engine.open(path, clock=clock) as engine:
        assert {name: engine.stats("q", tag=name) for name in names} == before
    assert before["late"][1]["sent"] == 2 and before["default"][1]["sent"] == 3


CHILD = """
import os, signal, sys
from lamina.engine import Engine
engine = Engine.open(sys.argv[1], segment_max_messages=700)
engine.create_queue("q")
sent = size = 0
for index in range(2500):
    if index == 1000:
        engine.create_tag("q", "later")
    bodies = [b"x" * (index % 300 + 1)] * (index % 3 + 1)
    engine.send("q", bodies)
    sent += len(bodies)
    size += sum(len(body) for body in bodies)
print(sent, size, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_counters_and_segments_are_exact_after_a_killed_process(tmp_path):
    path = tmp_path / "data"
    sent, size = map(int, run_killed(CHILD, path).split())
    with Engine.open(path) as engine:
        days = engine.stats("q")  # one day, or two across midnight
        assert (sum(d["sent"] for d in days), sum(d["bytes_in"] for d in days)) == (sent, size)
        stats = engine.get_queue("q").stats
        assert (stats["messages"], stats["segments"]) == (sent, -(-sent // 700))
        later = sum(d["sent"] for d in engine.stats("q", tag="later"))
        (next_id,) = engine.send("q", [b"after"])
    assert 0 < later < sent and next_id.id.endswith(f"{sent:016x}7")
