"""Engine micro-benchmarks of the multi-reader features, in-process: 256-byte bodies,
receive(max=16), WAL without fsync. Targets (bench/RESULTS.md, "Multi-reader features"):

1. 8 tags on one queue (``default`` + 7 created with start ``"oldest"``): receive + delete,
   every delivery counted (each tag receives every message), >= 70% of the single-tag rate per
   delivered message measured in the same run (as two benchmarks, and interleaved: the fair
   comparison on a loaded machine);
2. a queue of 100,000 topics x 10 messages: receive + delete >= 30,000 msg/s (send order
   round-robin over the topics; the layout with a topic's 10 messages consecutive is reported
   too);
3. ``rewind`` of one tag of a 1,000,000-message queue, to the middle of its production range,
   with 1000 messages in flight: <= 5 ms.

    /tmp/venv/bin/python -m pytest bench/micro -q --benchmark-only

The 1M-message stores of 2. and 3. are built once per session, each by a child process
(batches of 1000, clean ``close()``); every store is consumed by exactly one benchmark.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lamina.engine import Engine
from lamina.engine.clock import FakeClock

BODY_BYTES = 256
BATCH = 16
STORE_BATCH = 1000
WARMUP_ROUNDS = 200

TAGS = 8                          # default + 7
TAG_PREFILL = 110_000             # messages in the queue of both the 1-tag and 8-tag runs
TAG_ROUNDS = 6000                 # calls of receive(16) + delete(16), one tag per call
INTERLEAVED_BLOCKS = 400          # blocks of 8 single-tag calls + 8 calls over the 8 tags

TOPICS = 100_000
PER_TOPIC = 10
TOPIC_ROUNDS = {"round_robin": 7000, "consecutive": 1500}  # rr: 7200 calls pass message 100k

REWIND_MESSAGES = 1_000_000
REWIND_CONSUMED = 520_000         # the tag's cursor before the first rewind
REWIND_IN_FLIGHT_AT = 510_000     # 1000 messages leased (never deleted) from here
IN_FLIGHT = 1000
REWIND_ROUNDS = 30

# Offset of the body in a stored record: array(9) head, 25-char id (2 + 25), bytes(256) head (3).
BODY_OFFSET = 1 + 2 + 25 + 3

_RATES: dict[str, float] = {}  # single-tag figures of this run, for the 8-tag ratio

# CPU time of the benchmark thread (RocksDB's background threads not included). On a shared,
# loaded machine wall time also counts the time the thread waited for a core; the CPU figures
# ("cpu_*") do not, and are the steadier way to compare runs.
cpu_clock = time.thread_time


def body(index: int) -> bytes:
    return (b"%016d" % index).ljust(BODY_BYTES, b"x")


def index_of(record: bytes) -> int:
    """The index a benchmark body carries (its first 16 bytes)."""
    return int(record[BODY_OFFSET:BODY_OFFSET + 16])


def _rate_figures(benchmark, report, messages_per_call: int, target: str = "") -> None:
    stats = benchmark.stats.stats
    report("msgs_per_s", messages_per_call / stats.mean, target)
    report("msgs_per_s_median", messages_per_call / stats.median)
    report("us_per_msg", stats.mean / messages_per_call * 1e6)


# -- 1. eight tags --------------------------------------------------------------------------


def _tagged_engine(path: Path, tags: int) -> tuple[Engine, list[str | None]]:
    engine = Engine.open(path)
    engine.create_queue("q")
    names: list[str | None] = [None] + [f"t{i}" for i in range(1, tags)]
    for name in names[1:]:
        engine.create_tag("q", name, "oldest")
    for first in range(0, TAG_PREFILL, STORE_BATCH):
        engine.send("q", [body(i) for i in range(first, first + STORE_BATCH)])
    return engine, names


def _check_in_order(per_tag: dict[str | None, list[bytes]], expected: int) -> None:
    """Every tag got messages 0, 1, 2, ... in order, each exactly once."""
    for name, heads in per_tag.items():
        assert [int(h) for h in heads] == list(range(expected)), name


def _tag_cycle(engine: Engine, names: list[str | None]):
    """-> (call, per-tag record heads): ``call()`` does receive(16) + delete(16) on the next
    tag in turn."""
    per_tag: dict[str | None, list[bytes]] = {name: [] for name in names}
    turn = [0]

    def call() -> None:
        name = names[turn[0] % len(names)]
        turn[0] += 1
        deliveries = engine.receive("q", name, max=BATCH)
        results = engine.delete("q", [d.receipt for d in deliveries], name)
        assert len(deliveries) == BATCH and results == [None] * BATCH
        per_tag[name].extend(d.record[BODY_OFFSET:BODY_OFFSET + 16] for d in deliveries)

    return call, per_tag


def test_tags_1_receive_delete(benchmark, tmp_path, report):
    """(1, baseline) one tag (``default``): receive(16) + delete(16), the same queue size as
    the 8-tag run."""
    engine, names = _tagged_engine(tmp_path / "data", 1)
    try:
        call, per_tag = _tag_cycle(engine, names)
        cpu = cpu_clock()
        benchmark.pedantic(call, rounds=TAG_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
        cpu = cpu_clock() - cpu
        _check_in_order(per_tag, (TAG_ROUNDS + WARMUP_ROUNDS) * BATCH)
    finally:
        engine.close()
    stats = benchmark.stats.stats
    _RATES["mean"], _RATES["median"] = BATCH / stats.mean, BATCH / stats.median
    _RATES["cpu"] = (TAG_ROUNDS + WARMUP_ROUNDS) * BATCH / cpu
    _rate_figures(benchmark, report, BATCH)
    report("cpu_msgs_per_s", _RATES["cpu"])


def test_tags_8_receive_delete(benchmark, tmp_path, report):
    """(1) 8 tags (``default`` + 7 from ``"oldest"``): each call is receive(16) + delete(16)
    on the next tag in turn, so every message is delivered 8 times; all 8 deliveries count.
    The ratio is per delivered message against ``test_tags_1_receive_delete`` of this run."""
    engine, names = _tagged_engine(tmp_path / "data", TAGS)
    try:
        call, per_tag = _tag_cycle(engine, names)
        cpu = cpu_clock()
        benchmark.pedantic(call, rounds=TAG_ROUNDS, warmup_rounds=WARMUP_ROUNDS)
        cpu = cpu_clock() - cpu
        _check_in_order(per_tag, (TAG_ROUNDS + WARMUP_ROUNDS) * BATCH // TAGS)
        # gone_seq follows the slowest tag: all 8 are at the same place.
        assert engine._queue("q").gone_seq == (TAG_ROUNDS + WARMUP_ROUNDS) * BATCH // TAGS
    finally:
        engine.close()
    stats = benchmark.stats.stats
    _rate_figures(benchmark, report, BATCH)
    cpu_rate = (TAG_ROUNDS + WARMUP_ROUNDS) * BATCH / cpu
    report("cpu_msgs_per_s", cpu_rate)
    if _RATES:
        report("ratio_vs_1_tag", BATCH / stats.mean / _RATES["mean"], ">= 0.70")
        report("ratio_vs_1_tag_median", BATCH / stats.median / _RATES["median"])
        report("ratio_vs_1_tag_cpu", cpu_rate / _RATES["cpu"])


def test_tags_ratio_interleaved(benchmark, tmp_path, report):
    """(1') the same two workloads interleaved, so that both see the same machine load: each
    round is 8 single-tag calls then 8 calls over the 8 tags (one each), timed apart. The
    benchmark's own time is the whole block; the figures come from the two sums."""
    single, single_names = _tagged_engine(tmp_path / "one", 1)
    multi, multi_names = _tagged_engine(tmp_path / "eight", TAGS)
    try:
        call_1, per_tag_1 = _tag_cycle(single, single_names)
        call_8, per_tag_8 = _tag_cycle(multi, multi_names)
        spent = {1: 0.0, 8: 0.0}
        cpu = {1: 0.0, 8: 0.0}
        clock = time.perf_counter

        def block() -> None:
            started, cpu_started = clock(), cpu_clock()
            for _ in range(TAGS):
                call_1()
            middle, cpu_middle = clock(), cpu_clock()
            for _ in range(TAGS):
                call_8()
            spent[1] += middle - started
            spent[8] += clock() - middle
            cpu[1] += cpu_middle - cpu_started
            cpu[8] += cpu_clock() - cpu_middle

        benchmark.pedantic(block, rounds=INTERLEAVED_BLOCKS, warmup_rounds=10)
        calls = (INTERLEAVED_BLOCKS + 10) * TAGS
        _check_in_order(per_tag_1, calls * BATCH)
        _check_in_order(per_tag_8, calls * BATCH // TAGS)
    finally:
        single.close()
        multi.close()
    delivered = (INTERLEAVED_BLOCKS + 10) * TAGS * BATCH
    report("msgs_per_s_1_tag", delivered / spent[1])
    report("msgs_per_s_8_tags", delivered / spent[8])
    report("ratio", spent[1] / spent[8], ">= 0.70")
    report("cpu_msgs_per_s_1_tag", delivered / cpu[1])
    report("cpu_msgs_per_s_8_tags", delivered / cpu[8])
    report("cpu_ratio", cpu[1] / cpu[8])


# -- 2. 100,000 topics ------------------------------------------------------------------------

TOPIC_CHILD = r"""
import json, sys, time
from lamina.engine import Engine

path, layout, topics, per_topic, batch, size = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
total = topics * per_topic
topic = (lambda j: j % topics) if layout == "round_robin" else (lambda j: j // per_topic)
engine = Engine.open(path)
engine.create_queue("q")
spent = 0.0
for first in range(0, total, batch):
    entries = [{1: (b"%016d" % j).ljust(size, b"x"), 3: f"topic-{topic(j)}"}
               for j in range(first, first + batch)]
    started = time.perf_counter()
    engine.send("q", entries)
    spent += time.perf_counter() - started
q = engine._queue("q")
assert q.next_seq == total and q.next_topic_id - 1 == topics, (q.next_seq, q.next_topic_id)
engine.close()
print(json.dumps({"build_s": spent}))
"""


@dataclass
class TopicStore:
    path: Path
    layout: str
    build_s: float


def _build_topic_store(tmp_path_factory, layout: str) -> TopicStore:
    path = tmp_path_factory.mktemp(f"topics_{layout}") / "data"
    out = subprocess.run(
        [sys.executable, "-c", TOPIC_CHILD, str(path), layout, str(TOPICS), str(PER_TOPIC),
         str(STORE_BATCH), str(BODY_BYTES)], check=True, capture_output=True, text=True).stdout
    return TopicStore(path, layout, json.loads(out)["build_s"])


@pytest.fixture(scope="session")
def topics_round_robin(tmp_path_factory) -> TopicStore:
    """1,000,000 messages over 100,000 topics, sent round-robin (message j has topic j mod
    100,000: consecutive messages are different topics), batches of 1000, wall clock."""
    return _build_topic_store(tmp_path_factory, "round_robin")


@pytest.fixture(scope="session")
def topics_consecutive(tmp_path_factory) -> TopicStore:
    """The same messages with the 10 of each topic consecutive (message j has topic j // 10)."""
    return _build_topic_store(tmp_path_factory, "consecutive")


def _topic_receive_delete(benchmark, report, store: TopicStore, target: str) -> None:
    rounds = TOPIC_ROUNDS[store.layout]
    warmup = WARMUP_ROUNDS if store.layout == "round_robin" else 50
    engine = Engine.open(store.path)
    heads: list[bytes] = []
    short_calls = [0]
    try:
        def receive_delete() -> None:
            deliveries = engine.receive("q", max=BATCH)
            results = engine.delete("q", [d.receipt for d in deliveries])
            assert results == [None] * len(deliveries)
            if len(deliveries) < BATCH:
                short_calls[0] += 1
            heads.extend(d.record[BODY_OFFSET:BODY_OFFSET + 16] for d in deliveries)

        cpu = cpu_clock()
        benchmark.pedantic(receive_delete, rounds=rounds, warmup_rounds=warmup)
        cpu = cpu_clock() - cpu
    finally:
        engine.close()
    # Each message once, each topic in production order.
    seen = [int(h) for h in heads]
    assert len(set(seen)) == len(seen)
    topic_of = (lambda j: j % TOPICS) if store.layout == "round_robin" else \
        (lambda j: j // PER_TOPIC)
    last: dict[int, int] = {}
    for j in seen:
        assert last.get(topic_of(j), -1) < j, j
        last[topic_of(j)] = j
    if store.layout == "round_robin":
        assert seen == list(range(len(seen)))  # round-robin: production order exactly
    delivered = len(seen)
    calls = rounds + warmup
    stats = benchmark.stats.stats
    per_call = delivered / calls
    report("msgs_per_s", per_call / stats.mean, target)
    report("msgs_per_s_median", per_call / stats.median)
    report("us_per_msg", stats.mean / per_call * 1e6)
    report("cpu_msgs_per_s", delivered / cpu)
    # Whether the cost per call grows as the run goes on: the first and the last 1000 calls.
    data = stats.data
    report("msgs_per_s_first_1000", per_call * 1000 / sum(data[:1000]))
    report("msgs_per_s_last_1000", per_call * 1000 / sum(data[-1000:]))
    report("msgs_per_call", per_call)
    report("short_calls", short_calls[0])
    report("build_msgs_per_s", TOPICS * PER_TOPIC / store.build_s)


def test_topics_100k_round_robin(benchmark, topics_round_robin, report):
    """(2) receive(16) + delete on 100,000 topics x 10 messages sent round-robin (a receive of
    16 finds 16 different topics); 7200 calls, so the run passes from the first message of
    each topic to the second."""
    _topic_receive_delete(benchmark, report, topics_round_robin, ">= 30,000")


def test_topics_100k_consecutive(benchmark, topics_consecutive, report):
    """(2') the same with each topic's 10 messages consecutive: a receive takes one message per
    topic, the other 9 are parked and come back through the topics index when it is deleted."""
    _topic_receive_delete(benchmark, report, topics_consecutive, "")


# -- 3. rewind ----------------------------------------------------------------------------------

REWIND_CHILD = r"""
import json, sys, time
from lamina.engine import Engine
from lamina.engine.clock import FakeClock

path, total, batch, size, consumed, in_flight_at, in_flight = sys.argv[1], *map(int, sys.argv[2:])
clock = FakeClock()
first_ms = clock()
engine = Engine.open(path, clock=clock)
engine.create_queue("q", {"rewind": 3600, "visibility_timeout": 43200})
build_s = 0.0
for first in range(0, total, batch):
    bodies = [(b"%016d" % i).ljust(size, b"x") for i in range(first, first + batch)]
    started = time.perf_counter()
    engine.send("q", bodies)
    build_s += time.perf_counter() - started
    clock.advance(1)                  # production times: first_ms .. first_ms + 999
last_ms = clock() - 1


t = engine._queue("q").tag_named("default")


def consume(upto):
    while t.cursors[8] < upto:  # the default lane
        deliveries = engine.receive("q", max=min(batch, upto - t.cursors[8]))
        assert engine.delete("q", [d.receipt for d in deliveries]) == [None] * len(deliveries)


started = time.perf_counter()
consume(in_flight_at)
leased = engine.receive("q", max=in_flight)   # leased for 12 h; the clock stands still
assert len(leased) == in_flight
consume(consumed)
consume_s = time.perf_counter() - started
assert t.cursors[8] == consumed and len(t.leases) == in_flight
engine.close()
print(json.dumps({"build_s": build_s, "consume_s": consume_s, "first_ms": first_ms,
                  "last_ms": last_ms, "now_ms": clock()}))
"""


@dataclass
class RewindStore:
    path: Path
    build_s: float
    consume_s: float
    first_ms: int
    last_ms: int
    now_ms: int


@pytest.fixture(scope="session")
def rewind_store(tmp_path_factory) -> RewindStore:
    """A queue with ``rewind`` 3600 s and 1,000,000 messages sent in batches of 1000 with a
    ``FakeClock`` advancing 1 ms per batch (so message i was produced at first_ms + i // 1000);
    its ``default`` tag has received and deleted messages 0 - 519,999 except 510,000 - 510,999,
    which are leased (in flight, for 12 h)."""
    path = tmp_path_factory.mktemp("rewind_1m") / "data"
    out = subprocess.run(
        [sys.executable, "-c", REWIND_CHILD, str(path), str(REWIND_MESSAGES), str(STORE_BATCH),
         str(BODY_BYTES), str(REWIND_CONSUMED), str(REWIND_IN_FLIGHT_AT), str(IN_FLIGHT)],
        check=True, capture_output=True, text=True).stdout
    return RewindStore(path, **json.loads(out))


def test_rewind_1m(benchmark, rewind_store, report):
    """(3) ``rewind`` of the default tag to the middle of the production range (message
    500,000), 1000 messages in flight above it. Between rounds (untimed) the tag receives and
    deletes 21,000 messages again, so every rewind moves the cursor back past the in-flight
    ones; the setup checks what the previous rewind did: delivery restarts at 500,000, the
    in-flight messages are not offered again."""
    store = rewind_store
    engine = Engine.open(store.path, clock=FakeClock(store.now_ms))
    middle_ms = (store.first_ms + store.last_ms + 1) // 2
    from_seq = (middle_ms - store.first_ms) * STORE_BATCH
    in_flight = range(REWIND_IN_FLIGHT_AT, REWIND_IN_FLIGHT_AT + IN_FLIGHT)
    rewound = [False]
    cpu: list[float] = []

    def consume() -> None:
        if rewound[0]:  # check the previous rewind, and move the cursor forward again
            seen: list[int] = []
            for _ in range(21):
                deliveries = engine.receive("q", max=STORE_BATCH)
                engine.delete("q", [d.receipt for d in deliveries])
                seen.extend(index_of(d.record) for d in deliveries)
            assert seen[0] == from_seq and not set(seen) & set(in_flight), seen[:3]
            assert seen == [i for i in range(from_seq, from_seq + len(seen) + IN_FLIGHT)
                            if i not in in_flight][:len(seen)]

    def rewind() -> None:
        started = cpu_clock()
        engine.rewind("q", middle_ms, "default")
        cpu.append(cpu_clock() - started)
        rewound[0] = True

    try:
        q = engine._queue("q")
        t = q.tag_named("default")
        assert engine._first_seq_at(q, middle_ms) == from_seq == 500_000
        benchmark.pedantic(rewind, setup=consume, rounds=REWIND_ROUNDS, warmup_rounds=1)
        consume()
        assert len(t.leases) == IN_FLIGHT and q.gone_seq == 0
    finally:
        engine.close()
    stats = benchmark.stats.stats
    report("mean_ms", stats.mean * 1e3, "<= 5 ms")
    report("median_ms", stats.median * 1e3)
    report("max_ms", stats.max * 1e3)
    report("cpu_median_ms", sorted(cpu)[len(cpu) // 2] * 1e3)
    report("build_msgs_per_s", REWIND_MESSAGES / store.build_s)
    report("consume_msgs_per_s", REWIND_CONSUMED / store.consume_s)
