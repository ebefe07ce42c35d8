"""Engine micro-benchmarks, in-process: 256-byte bodies, batches of 16, WAL without fsync
(unless named). Targets (bench/RESULTS.md): send >= 200,000 msg/s; receive + delete >= 100,000
msg/s; time lookup <= 1 ms; reopen of 1M messages <= 2 s with RSS <= 300 MB.

    /tmp/venv/bin/python -m pytest bench/micro -q --benchmark-only
"""

from __future__ import annotations

import itertools
import random
import statistics

from lamina.engine import Engine, keys
from lamina.engine.store import Store

BODY_BYTES = 256
BATCH = 16
STORE_MESSAGES = 1_000_000  # the ``store_1m`` fixture
SEND_ROUNDS = 5000
RECEIVE_ROUNDS = 6000
WARMUP_ROUNDS = 200


def body(index: int = 0) -> bytes:
    """A 256-byte body (distinct per index, so MD5s differ)."""
    return (b"%016d" % index).ljust(BODY_BYTES, b"x")


def _msgs_per_s(benchmark, messages: int) -> float:
    return messages / benchmark.stats.stats.mean


def test_send(benchmark, engine, report):
    """(a) ``send`` of 16 messages per call."""
    batch = [body(i) for i in range(BATCH)]

    def send():
        engine.send("q", batch)

    benchmark.pedantic(send, rounds=SEND_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    assert engine._queue("q").next_seq == BATCH * (SEND_ROUNDS + WARMUP_ROUNDS)
    report("msgs_per_s", _msgs_per_s(benchmark, BATCH), ">= 200,000")
    report("msgs_per_s_median", BATCH / benchmark.stats.stats.median)
    report("us_per_msg", benchmark.stats.stats.mean / BATCH * 1e6)


def test_send_one(benchmark, engine, report):
    """(a1) ``send`` of 1 message per call: an operation's fixed cost (frame, counters,
    watermarks, one write), what single awaited sends pay."""
    one = [body()]

    def send():
        engine.send("q", one)

    benchmark.pedantic(send, rounds=SEND_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    assert engine._queue("q").next_seq == SEND_ROUNDS + WARMUP_ROUNDS
    report("us_per_call", benchmark.stats.stats.mean * 1e6)
    report("us_per_call_median", benchmark.stats.stats.median * 1e6)


def test_send_one_dispatched(benchmark, engine, report):
    """(a2) the same ``send`` of 1 as the server applies it: the op's argument check and
    dispatch (``check_request``, ``apply_operation``) around the engine call."""
    from lamina.server.dispatch import apply_operation, check_request

    one = [body()]
    request_ids = itertools.count(1)

    def send():
        args = {"queue": "q", "messages": one}
        operation = check_request("send", args)
        apply_operation(operation, engine, args, None, next(request_ids), 1 << 21)

    benchmark.pedantic(send, rounds=SEND_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    assert engine._queue("q").next_seq == SEND_ROUNDS + WARMUP_ROUNDS
    report("us_per_call", benchmark.stats.stats.mean * 1e6)
    report("us_per_call_median", benchmark.stats.stats.median * 1e6)


def _prefill(engine, messages: int) -> None:
    bodies = [body(i) for i in range(1000)]
    for _ in range(messages // 1000 + 10):
        engine.send("q", bodies)


def test_receive_delete(benchmark, engine, report):
    """(b) ``receive(max=16)`` then ``delete`` of those 16 receipts, on a pre-filled queue."""
    _prefill(engine, BATCH * (RECEIVE_ROUNDS + WARMUP_ROUNDS))

    def receive_delete():
        deliveries = engine.receive("q", max=BATCH)
        results = engine.delete("q", [d.receipt for d in deliveries])
        assert len(results) == BATCH

    benchmark.pedantic(receive_delete, rounds=RECEIVE_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    report("msgs_per_s", _msgs_per_s(benchmark, BATCH), ">= 100,000")
    report("msgs_per_s_median", BATCH / benchmark.stats.stats.median)
    report("us_per_msg", benchmark.stats.stats.mean / BATCH * 1e6, "<= 3 us")
    report("us_per_msg_median", benchmark.stats.stats.median / BATCH * 1e6)


def test_receive_part(benchmark, engine, report):
    """(b1) the ``receive(max=16)`` half of (b); the previous round's delete runs untimed in
    the setup, so in-flight leases stay at 16 as in (b)."""
    _prefill(engine, BATCH * (RECEIVE_ROUNDS + WARMUP_ROUNDS))
    held: list = []

    def delete_previous():
        if held:
            engine.delete("q", [d.receipt for d in held.pop()])

    def receive():
        held.append(engine.receive("q", max=BATCH))

    benchmark.pedantic(receive, setup=delete_previous, rounds=RECEIVE_ROUNDS,
                       warmup_rounds=WARMUP_ROUNDS)
    assert len(held[-1]) == BATCH
    report("msgs_per_s", _msgs_per_s(benchmark, BATCH))
    report("us_per_msg", benchmark.stats.stats.mean / BATCH * 1e6)


def test_delete_part(benchmark, engine, report):
    """(b2) the ``delete`` half of (b): 16 current receipts; their receive runs untimed."""
    _prefill(engine, BATCH * (RECEIVE_ROUNDS + WARMUP_ROUNDS))

    def receive():
        return ([d.receipt for d in engine.receive("q", max=BATCH)],), {}

    def delete(receipts):
        assert engine.delete("q", receipts) == [None] * BATCH

    benchmark.pedantic(delete, setup=receive, rounds=RECEIVE_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    report("msgs_per_s", _msgs_per_s(benchmark, BATCH))
    report("us_per_msg", benchmark.stats.stats.mean / BATCH * 1e6)


def test_send_with_50k_in_flight(benchmark, engine, report):
    """(a') ``send`` of 16 while 50,000 messages are leased (received, not deleted), for
    information: how per-operation cost grows with the in-flight count."""
    _prefill(engine, 60_000)
    for _ in range(50_000 // BATCH):
        engine.receive("q", max=BATCH)
    batch = [body(i) for i in range(BATCH)]

    def send():
        engine.send("q", batch)

    benchmark.pedantic(send, rounds=300, warmup_rounds=10)
    report("msgs_per_s", _msgs_per_s(benchmark, BATCH))
    report("us_per_call", benchmark.stats.stats.mean * 1e6)


def test_time_lookup_1m(benchmark, store_1m, report):
    """(c) position for a production time (``_first_seq_at``) in a 1,000,000-message queue,
    at uniformly random times between the first and the last production time."""
    engine = Engine.open(store_1m.path)
    try:
        q = engine._queue("q")
        first_ms, last_ms = q.segments[0].first_ms, q.last_time_ms
        rng = random.Random(1)
        times = itertools.cycle([rng.randint(first_ms, last_ms) for _ in range(10_000)])
        lookup = engine._first_seq_at
        # Sanity: the answer is the first seq produced at or after the time.
        assert lookup(q, first_ms) == 0 and lookup(q, last_ms + 1) == STORE_MESSAGES

        benchmark.pedantic(lookup, setup=lambda: ((q, next(times)), {}), rounds=20_000,
                           warmup_rounds=1000)
        lower, upper = keys.time_key(q.id, 0, 0), keys.time_queue_upper(q.id)
        entries = sum(1 for _ in Store.keys(engine._store.time, lower, upper))
    finally:
        engine.close()
    report("mean_ms", benchmark.stats.stats.mean * 1e3, "<= 1 ms")
    report("max_ms", benchmark.stats.stats.max * 1e3)
    report("time_index_entries", entries)


def test_reopen_1m(benchmark, store_1m, report):
    """(d) ``Engine.open`` of the 1M-message store, in this process (page cache warm)."""
    opened: list[Engine] = []

    benchmark.pedantic(lambda: opened.append(Engine.open(store_1m.path)),
                       teardown=lambda: opened.pop().close(), rounds=5)
    report("open_s", benchmark.stats.stats.mean, "<= 2 s")
    report("build_msgs_per_s", STORE_MESSAGES / store_1m.build_s)
    report("builder_rss_mb", store_1m.builder_rss_mb)
    report("builder_peak_rss_mb", store_1m.builder_peak_rss_mb)


def test_reopen_1m_fresh_process_rss(benchmark, store_1m, report, measure_open):
    """(d') open of the 1M-message store in a fresh interpreter: the open time measured inside
    the child, and its resident memory after the open. The benchmark's own time is the whole
    child (interpreter start, imports, open, close)."""
    runs: list[dict] = []
    benchmark.pedantic(lambda: runs.append(measure_open(store_1m.path)), rounds=3)
    report("open_s_median", statistics.median(r["open_s"] for r in runs), "<= 2 s")
    report("rss_after_open_mb", max(r["rss_after_mb"] for r in runs), "<= 300 MB")
    report("rss_before_open_mb", max(r["rss_before_mb"] for r in runs))
    report("peak_rss_mb", max(r["peak_rss_mb"] for r in runs))
    # The first open after the builder was killed: WAL replay (see ``store_1m``).
    first = store_1m.first_open
    report("crash_open_s", first["open_s"], "<= 2 s")
    report("crash_open_rss_after_mb", first["rss_after_mb"], "<= 300 MB")
    report("crash_open_peak_rss_mb", first["peak_rss_mb"])


def test_send_fsync(benchmark, fsync_engine, report):
    """(e) ``send`` of 16 messages per call with ``fsync=True`` (one WAL sync per call), for
    information: no target."""
    batch = [body(i) for i in range(BATCH)]

    def send():
        fsync_engine.send("q", batch)

    benchmark.pedantic(send, rounds=1000, warmup_rounds=50)
    report("msgs_per_s", _msgs_per_s(benchmark, BATCH))
    report("syncs_per_s", 1 / benchmark.stats.stats.mean)
