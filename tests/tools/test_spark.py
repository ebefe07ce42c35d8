"""The ``lamina`` Spark data source against a real local[2] session (the ``spark`` fixture)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import datasource as ds  # noqa: E402

from lamina.engine import Engine  # noqa: E402
from lamina.engine.records import PREFIX_SIZE, Message  # noqa: E402
from lamina.tools import spark as lamina_spark  # noqa: E402
from lamina.tools import sparkscan, sparkstream  # noqa: E402
from lamina.tools.snapshot import Snapshot, SnapshotError  # noqa: E402
from lamina.tools.tagstate import TagStates  # noqa: E402

from tests.support import stores  # noqa: E402
from tests.support.stores import START_MS, body, build_mixed, build_plain  # noqa: E402

pytestmark = pytest.mark.slow


def read(spark: Any, path: Path, **options: Any) -> Any:
    reader = spark.read.format("lamina").option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spark-mixed") / "data"
    build_mixed(path)
    return path


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Queue ``q``: 1000 messages in 10 segments of 100; 20 sends 10 ms apart."""
    path = tmp_path_factory.mktemp("spark-plain") / "data"
    build_plain(path, 1000, segment=100, batch=50, step_ms=10)
    return path


def _attribute_text(value: Any) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value if isinstance(value, str) else json.dumps(value)


def test_rows_equal_what_the_engine_holds(spark: Any, mixed: Path, tmp_path: Path) -> None:
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(mixed, copy)
    expected: dict[str, list[Any]] = {}
    with Engine.open(copy) as engine:  # now: applies the dead-letter moves that are due
        for name in ("orders", "dlq"):
            expected[name] = [p.message for p in engine.peek(name, start=0, max=1000).messages]
            assert engine.get_queue(name).stats["messages"] == len(expected[name])
    rows = read(spark, copy).collect()
    for name, messages in expected.items():
        got = sorted((r for r in rows if r.queue == name), key=lambda r: r.seq)
        assert len(got) == len(messages)
        for row, message in zip(got, messages):
            body_bytes = message.body.encode() if isinstance(message.body, str) \
                else message.body
            assert row.id == message.id
            assert bytes(row.body) == body_bytes
            assert bytes(row.md5) == message.md5
            assert row.priority == message.priority and row.topic == message.topic
            # Spark hands timestamps back as naive local datetimes
            assert round(row.enqueue_time.timestamp() * 1000) == message.enqueue_time
            expected_attributes = {k: _attribute_text(v)
                                   for k, v in (message.attributes or {}).items()}
            assert (row.attributes or {}) == expected_attributes
    assert {r.segment for r in rows if r.queue == "orders"} == {0, 8, 16, 24, 32}


def test_one_partition_per_segment(spark: Any, plain: Path) -> None:
    df = read(spark, plain, queue="q")
    assert df.rdd.getNumPartitions() == 10
    pairs = df.groupBy(F.spark_partition_id().alias("p"), "segment").count().collect()
    assert sorted(p.segment for p in pairs) == list(range(0, 1000, 100))
    assert len({p.p for p in pairs}) == 10  # each partition holds exactly one segment
    assert {p["count"] for p in pairs} == {100}


def test_time_options_prune_segments(spark: Any, plain: Path) -> None:
    # sends every 10 ms, 50 messages each: [START+30, START+50) holds seqs 150..249
    df = read(spark, plain, since=START_MS + 30, until=START_MS + 50)
    assert df.rdd.getNumPartitions() == 2  # segments 100 and 200 only
    assert sorted(r.seq for r in df.select("seq").collect()) == list(range(150, 250))
    iso = datetime.fromtimestamp((START_MS + 180) / 1000, tz=timezone.utc).isoformat()
    late = read(spark, plain, since=iso)
    assert late.rdd.getNumPartitions() == 1 and late.count() == 100


def test_pushed_down_filters_prune_segments(spark: Any, plain: Path) -> None:
    df = read(spark, plain)
    since = datetime.fromtimestamp((START_MS + 120) / 1000, tz=timezone.utc)
    filtered = df.filter((F.col("enqueue_time") >= F.lit(since)) & (F.col("seq") < 700))
    assert filtered.rdd.getNumPartitions() == 1  # seqs 600..699: segment 600 only
    assert sorted(r.seq for r in filtered.select("seq").collect()) == list(range(600, 700))
    exact = df.filter((F.col("enqueue_time") == F.lit(since)) & F.col("queue").isin("q", "x"))
    assert exact.rdd.getNumPartitions() == 1
    assert df.filter(F.col("queue") == "nope").rdd.getNumPartitions() == 1  # an empty one
    counts = exact.agg(F.count("*"), F.min("seq"), F.max("seq")).first()
    assert tuple(counts) == (50, 600, 649)


def test_filters_are_right_without_pushdown(spark: Any, plain: Path) -> None:
    lamina_spark.register(spark, filter_pushdown=False)
    try:
        df = read(spark, plain)
        since = datetime.fromtimestamp((START_MS + 120) / 1000, tz=timezone.utc)
        assert df.filter(F.col("enqueue_time") >= F.lit(since)).count() == 400
        assert df.rdd.getNumPartitions() == 10
    finally:
        lamina_spark.register(spark)


def test_tag_state_column(spark: Any, mixed: Path) -> None:
    rows = read(spark, mixed, queue="orders", tag="default").select("seq", "state").collect()
    with Snapshot(mixed) as snapshot:
        q = snapshot.queue("orders")
        states = TagStates(snapshot, q, snapshot.tag(q, "default"), snapshot.now())
        expected = {seq: states.state(seq, value)[0]
                    for seq, _, value in snapshot.messages(q, 0, q.next_seq)}
    assert {r.seq: r.state for r in rows} == expected
    assert "deleted" in expected.values() and "dead" in expected.values()
    eu = read(spark, mixed, queue="orders", tag="eu").select("state").distinct().collect()
    assert "out_of_scope" in {r.state for r in eu}


def test_scan_while_another_process_writes(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "live"
    writer = subprocess.Popen(
        [sys.executable, stores.__file__, "write", str(path),
         "live", "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        counts = []
        for _ in range(3):
            time.sleep(1)
            df = read(spark, path, queue="live")
            partitions = df.rdd.getNumPartitions()
            summary = df.agg(
                F.count("*").alias("rows"), F.min("seq").alias("first"),
                F.max("seq").alias("last"), F.countDistinct("segment").alias("segments"),
                # bodies are body(seq) and md5 is their MD5: nothing torn or mixed up
                F.sum((F.md5("body") != F.lower(F.hex("md5"))).cast("int")).alias("bad_md5"),
                F.sum((F.substring(F.col("body").cast("string"), 1, 8).cast("long")
                       != F.col("seq")).cast("int")).alias("bad_body"),
            ).first()
            assert summary.first == 0 and summary.last == summary.rows - 1  # no holes
            assert (summary.bad_md5, summary.bad_body) == (0, 0)
            assert summary.segments == partitions  # one partition per segment
            counts.append(summary.rows)
        assert counts[0] > 0 and counts == sorted(counts) and counts[-1] > counts[0]
    finally:
        writer.kill()
        writer.wait(30)


def test_stream_picks_up_new_messages(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "stream"
    with Engine.open(path, segment_max_messages=40) as engine:
        engine.create_queue("events")
        engine.send("events", [b"before %d" % i for i in range(30)])
        stream = (spark.readStream.format("lamina").option("path", str(path))
                  .option("queue", "events").load())
        query = (stream.select("seq", "body").writeStream.format("memory")
                 .queryName("lamina_events").trigger(processingTime="500 milliseconds")
                 .start())
        try:
            sent = 30
            deadline = time.monotonic() + 60
            seen: list[int] = []
            while time.monotonic() < deadline:
                if sent < 130:
                    engine.send("events", [b"after %d" % (sent + i) for i in range(25)])
                    sent += 25
                seen = [r.seq for r in spark.sql("select seq from lamina_events").collect()]
                if sent == 130 and len(seen) >= 130:
                    break
                time.sleep(0.5)
            from collections import Counter
            twice = sorted(seq for seq, n in Counter(seen).items() if n > 1)
            assert sorted(seen) == list(range(130)), (
                len(seen), twice, sorted(set(range(130)) - set(seen)),
                [p.get("sources", [{}])[0].get("endOffset") for p in query.recentProgress])
            assert query.exception() is None
        finally:
            query.stop()


def test_write_then_receive(spark: Any, server: Any) -> None:
    from lamina.client import Client
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("inbox")
    rows = [(b"first", {"k": "v"}, 1, None, None), (b"second", None, 8, "t", None),
            (b"third", None, 8, None, None)]
    df = spark.createDataFrame(
        rows, "body binary, attributes map<string,string>, priority int, topic string, "
              "delay double")
    (df.repartition(2).write.format("lamina").option("server", f"127.0.0.1:{server.port}")
     .option("queue", "inbox").mode("append").save())
    with Client.connect("127.0.0.1", server.port) as client:
        got = client.receive("inbox", max=10)
    by_body = {d.message.body: d.message for d in got}
    assert set(by_body) == {b"first", b"second", b"third"}
    assert by_body[b"first"].attributes == {"k": "v"} and by_body[b"first"].priority == 1
    assert by_body[b"second"].topic == "t"


def test_a_reclaimed_segment_fails_the_read(tmp_path: Path) -> None:
    path = tmp_path / "data"
    build_plain(path, 300, segment=100)
    options = sparkscan.ReadOptions.parse({"path": str(path)})
    with Snapshot(path) as snapshot:
        partitions = sparkscan.plan(snapshot, options, sparkscan._Bounds())
    assert [p.segment for p in partitions] == [0, 100, 200]
    with Engine.open(path) as engine:
        engine.purge_queue("q")  # gone_seq passes every segment: they are reclaimed
    with pytest.raises(lamina_spark.SegmentGone, match="segment 0 of queue 'q'"):
        list(sparkscan.read_partition(str(path), partitions[0], lamina_spark.SCHEMA))


def test_a_read_that_finds_a_file_of_its_view_gone_is_read_again_from_a_fresh_view(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data"
    build_plain(path, 300, segment=100)
    options = sparkscan.ReadOptions.parse({"path": str(path)})
    with Snapshot(path) as snapshot:
        partitions = sparkscan.plan(snapshot, options, sparkscan._Bounds())
    reads = []
    refreshes = []
    read = sparkscan._partition_values

    def read_once_failing(snapshot: Snapshot, partition: Any) -> Any:
        reads.append(partition.segment)
        if len(reads) == 1:  # as when the server beside removed a file this view was reading
            raise SnapshotError(f"{path}: a file this view was reading is gone")
        return read(snapshot, partition)

    monkeypatch.setattr(sparkscan, "_partition_values", read_once_failing)
    view = sparkscan.executor_snapshot(str(path))
    refresh = view.refresh
    monkeypatch.setattr(view, "refresh", lambda: (refreshes.append(1), refresh())[1])
    rows = [row["seq"] for batch in sparkscan.read_partition(str(path), partitions[0],
                                                             lamina_spark.SCHEMA)
            for row in batch.to_pylist()]
    assert rows == list(range(100))
    assert reads == [0, 0] and refreshes == [1]


def _read_all(path: Path) -> list[Any]:
    options = sparkscan.ReadOptions.parse({"path": str(path)})
    with Snapshot(path) as snapshot:
        partitions = sparkscan.plan(snapshot, options, sparkscan._Bounds())
    return [batch for p in partitions
            for batch in sparkscan.read_partition(str(path), p, lamina_spark.SCHEMA)]


def test_partitions_read_in_production_order(mixed: Path) -> None:
    # priorities and delays put messages in several lanes: each partition merges them by seq
    with Snapshot(mixed) as snapshot:
        expected = {q.name: [(seq, value) for seq, _, value in snapshot.messages(q, 0, q.next_seq)]
                    for q in snapshot.queues()}
        assert len(snapshot.queue("orders").lanes_used) > 1
    got: dict[str, list[tuple[int, str]]] = {}
    for batch in _read_all(mixed):
        for row in batch.to_pylist():
            got.setdefault(row["queue"], []).append((row["seq"], row["id"]))
    for name, messages in expected.items():
        assert [seq for seq, _ in got[name]] == [seq for seq, _ in messages]
        assert [id_ for _, id_ in got[name]] == [
            Message.decode(value[PREFIX_SIZE:]).id for _, value in messages]


def test_batches_hold_at_most_batch_rows_and_about_batch_bytes(
        plain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparkscan, "BATCH_ROWS", 30)
    assert [b.num_rows for b in _read_all(plain)] == [30, 30, 30, 10] * 10
    value_bytes = len(body(0)) + 90  # prefix and record around a 64-byte body
    monkeypatch.setattr(sparkscan, "BATCH_BYTES", 12 * value_bytes - 1)
    batches = _read_all(plain)  # a batch ends with the row that reaches BATCH_BYTES
    assert [b.num_rows for b in batches] == ([12] * 8 + [4]) * 10
    assert [r["seq"] for b in batches for r in b.select(["seq"]).to_pylist()] == list(
        range(1000))


def test_a_worker_freezes_its_heap_once(plain: Path) -> None:
    # in a fresh interpreter, as a Spark worker: gc.freeze changes the whole process
    script = f"""
import gc
from lamina.tools import spark
source = spark.LaminaDataSource({{"path": {str(plain)!r}, "queue": "q"}})
reader = source.reader(spark.SCHEMA)
first, second = reader.partitions()[:2]
assert gc.get_freeze_count() == 0
rows = sum(batch.num_rows for batch in reader.read(first))
frozen = gc.get_freeze_count()
rows += sum(batch.num_rows for batch in reader.read(second))
assert rows == 200 and frozen > 10_000 and gc.get_freeze_count() == frozen, frozen
"""
    subprocess.run([sys.executable, "-c", script], check=True)


@pytest.mark.parametrize("filter_, expected", [
    (ds.GreaterThanOrEqual(("enqueue_time",), 0), (0, None)),
    (ds.GreaterThan(("seq",), 5), (6, None)),
    (ds.LessThan(("seq",), 5), (None, 5)),
    (ds.LessThanOrEqual(("seq",), 5), (None, 6)),
    (ds.EqualTo(("seq",), 5), (5, 6)),
])
def test_comparisons_become_ranges(filter_: Any, expected: Any) -> None:
    assert sparkscan._compare_span(filter_, filter_.value, 1) == expected


def test_microsecond_bounds_round_to_whole_milliseconds() -> None:
    # enqueue_time is whole ms: > 1.0005 ms means >= 2 ms; <= 1.0005 ms means < 2 ms
    assert sparkscan._compare_span(ds.GreaterThan(("t",), 1000), 1500, 1000) == (2, None)
    assert sparkscan._compare_span(ds.GreaterThanOrEqual(("t",), 0), 1500, 1000) == (2, None)
    assert sparkscan._compare_span(ds.LessThan(("t",), 0), 1500, 1000) == (None, 2)
    assert sparkscan._compare_span(ds.LessThanOrEqual(("t",), 0), 1500, 1000) == (None, 2)
    assert sparkscan._compare_span(ds.EqualTo(("t",), 0), 1500, 1000) == (0, 0)
    bounds = sparkscan._Bounds()
    assert not sparkscan._push(ds.IsNotNull(("enqueue_time",)), bounds)
    assert not sparkscan._push(ds.StringContains(("topic",), "x"), bounds)


def test_stream_offsets_follow_the_log(tmp_path: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    path = tmp_path / "data"
    build_plain(path, 300, segment=100)
    reader = sparkstream.LaminaStreamReader({"path": str(path), "queue": "q"},
                                             lamina_spark.SCHEMA)
    start = reader.initialOffset()
    assert start == {"q": {"id": 1, "seq": 0}}
    capped = reader.latestOffset(start, ReadMaxRows(150))
    assert capped == {"q": {"id": 1, "seq": 150}}
    parts = reader.partitions(start, capped)
    assert [(p.segment, p.first_seq, p.end_seq) for p in parts] == [(0, 0, 100),
                                                                     (100, 100, 150)]
    rows = sum(b.num_rows for p in parts
               for b in sparkscan.read_partition(str(path), p, lamina_spark.SCHEMA))
    assert rows == 150
    with Engine.open(path) as engine:
        engine.send("q", [b"new"])
    latest = reader.latestOffset(capped, ReadAllAvailable())
    assert latest == {"q": {"id": 1, "seq": 301}}
    assert [(p.first_seq, p.end_seq) for p in reader.partitions(capped, latest)] == [
        (150, 200), (200, 300), (300, 301)]
    reader.stop()
    late = sparkstream.LaminaStreamReader(
        {"path": str(path), "queue": "q", "startingOffsets": "latest"}, lamina_spark.SCHEMA)
    assert late.initialOffset() == {"q": {"id": 1, "seq": 301}}
    late.stop()


@pytest.mark.parametrize("options, named", [
    ({"batchSize": "5000"}, "batchSize"), ({"batchSize": "0"}, "batchSize"),
    ({"batchSize": "many"}, "batchSize"), ({"server": "localhost:http"}, "server"),
])
def test_a_bad_write_option_is_refused_naming_it_not_clamped(options: dict[str, str],
                                                              named: str) -> None:
    from lamina.tools.sparkwrite import LaminaWriter
    with pytest.raises(ValueError, match=named):
        LaminaWriter({"server": "127.0.0.1:7766", "queue": "q", **options},
                     lamina_spark.SCHEMA)


def test_a_write_server_without_a_port_is_on_the_default_port_as_on_the_command_line() -> None:
    from lamina.tools.sparkwrite import LaminaWriter
    writer = LaminaWriter({"server": "localhost", "queue": "q"}, lamina_spark.SCHEMA)
    assert (writer.host, writer.port) == ("localhost", 7766)


@pytest.mark.parametrize("limit", ["0", "-5", "ten"])
def test_a_bad_stream_trigger_size_is_refused_naming_it(limit: str) -> None:
    with pytest.raises(ValueError, match="maxMessagesPerTrigger"):
        sparkstream.LaminaStreamReader({"path": "data", "maxMessagesPerTrigger": limit},
                                       lamina_spark.SCHEMA)
