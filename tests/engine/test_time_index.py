"""The time index is sparse (docs/STORAGE.md "The time index", engine/timeindex.py): a send
in a new millisecond writes an entry only every ``EVERY_MS`` ms or ``EVERY_MESSAGES`` seqs,
and a lookup reads the records between entries, so every time lookup stays exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock, keys
from lamina.engine.records import PREFIX
from lamina.engine.store import Store
from lamina.engine.timeindex import EVERY_MESSAGES, EVERY_MS
from tests.engine.test_lease_deadlines import raw_store
from tests.support.stores import run_killed

START = 1_700_000_000_000


def produced(engine: Engine, queue: str) -> dict[int, int]:
    """seq -> production ms, from the log."""
    q = engine._queues[engine._queue_names[queue]]
    times = {}
    for lane in q.lanes_used:
        for key, value in Store.items(engine._store.log, *keys.log_lane_bounds(q.id, lane)):
            times[keys.log_seq(key)] = PREFIX.unpack_from(value)[0]
    return times


def entries(engine: Engine, queue: str) -> list[tuple[int, int]]:
    q_id = engine._queue_names[queue]
    return [keys.time_key_decode(key)[1:] for key in Store.keys(
        engine._store.time, keys.time_key(q_id, 0, 0), keys.time_queue_upper(q_id))]


def assert_lookups_exact(engine: Engine, queue: str, times: list[int]) -> None:
    q = engine._queues[engine._queue_names[queue]]
    log = produced(engine, queue)
    for time_ms in times:
        expected = min((seq for seq, ms in log.items() if ms >= time_ms), default=q.next_seq)
        assert engine._first_seq_at(q, time_ms) == expected, time_ms


def send_at(engine: Engine, clock: FakeClock, gaps: list[tuple[int, int]]) -> None:
    """Per (gap ms, count): move the clock, then send ``count`` messages (two lanes)."""
    for index, (gap, count) in enumerate(gaps):
        clock.advance(gap)
        engine.send("q", [{1: b"m%d" % index, 4: 2} if i % 3 == 1 else b"m%d" % index
                          for i in range(count)])


def test_sends_in_new_milliseconds_write_an_entry_every_few(tmp_path, clock):
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        engine.create_queue("q")
        send_at(engine, clock, [(1, 1)] * (4 * EVERY_MS))
        assert entries(engine, "q") == [(START + 1 + i * EVERY_MS, i * EVERY_MS)
                                        for i in range(4)]
        # Many messages in a ms: the next new ms gets an entry even a ms later.
        send_at(engine, clock, [(1, EVERY_MESSAGES), (1, 1), (1, 1)])
        assert entries(engine, "q")[-2:] == [(START + 4 * EVERY_MS + 1, 4 * EVERY_MS),
                                             (START + 4 * EVERY_MS + 2,
                                              4 * EVERY_MS + EVERY_MESSAGES)]
        assert_lookups_exact(engine, "q", list(range(START - 2, clock() + 2)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=30),
       st.randoms(use_true_random=False))
def test_every_time_lookup_is_exact_before_and_after_reopening(tmp_path_factory, gaps, rnd):
    path = Path(tmp_path_factory.mktemp("time")) / "data"
    clock = FakeClock(START)
    times = list(range(START - 1, START + sum(gap for gap, _ in gaps) + 2))
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        send_at(engine, clock, gaps)
        assert_lookups_exact(engine, "q", times)  # ascending: the walk goes on from hints
        shuffled = times[:]
        rnd.shuffle(shuffled)
        assert_lookups_exact(engine, "q", shuffled)
    with Engine.open(path, clock=clock) as engine:
        assert_lookups_exact(engine, "q", list(reversed(times)))
        send_at(engine, clock, gaps[:3])  # entries go on from the newest one stored
        assert_lookups_exact(engine, "q", list(range(START - 1, clock() + 2)))


def test_a_rewind_to_a_time_between_entries_starts_at_its_first_message(tmp_path, clock):
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        engine.create_queue("q", {"rewind": 3600})
        send_at(engine, clock, [(1, 2)] * 40)  # m0 at START+1, m1 at START+2, ...
        engine.delete("q", [d.receipt for d in engine.receive("q", max=80)])
        assert len(entries(engine, "q")) < 10
        for index in (0, 5, EVERY_MS - 1, EVERY_MS, EVERY_MS + 1, 39):
            engine.rewind("q", START + 1 + index)
            received = engine.receive("q", max=100)
            assert sorted(d.body for d in received) == [
                b"m%d" % i for i in sorted(range(index, 40), key=str) for _ in range(2)]
            engine.delete("q", [d.receipt for d in received])


def test_a_dense_version_3_index_opens_unchanged(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        send_at(engine, clock, [(1, 1), (1, 3), (2, 1), (1, 2)] * 5)
        q_id = engine._queue_names["q"]
        log = produced(engine, "q")
    first_of = {}
    for seq, ms in sorted(log.items()):
        first_of.setdefault(ms, seq)
    with raw_store(path) as db:  # as version 3 wrote it: an entry for every ms
        family = db.get_column_family("time")
        for ms, seq in first_of.items():
            family[keys.time_key(q_id, ms, seq)] = b""
        del family
        db.get_column_family("meta")[keys.META_VERSION] = keys.u32(3)
    with Engine.open(path, clock=clock) as engine:
        assert len(entries(engine, "q")) == len(first_of)
        assert_lookups_exact(engine, "q", list(range(START - 1, clock() + 2)))
        send_at(engine, clock, [(1, 1)] * 3)
        assert_lookups_exact(engine, "q", list(range(START - 1, clock() + 2)))


CHILD = r"""
import os, signal, sys, time
from lamina.engine import Engine

engine = Engine.open(sys.argv[1])
engine.create_queue("q", {"rewind": 3600})
for index in range(150):  # sends in new milliseconds, one or a few messages each
    engine.send("q", [b"m%03d" % index] * (1 + index % 3))
    time.sleep(0.0007)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_lookups_are_exact_after_a_killed_process(tmp_path):
    path = tmp_path / "data"
    run_killed(CHILD, path)
    with Engine.open(path) as engine:
        log = produced(engine, "q")
        first, last = min(log.values()), max(log.values())
        assert len(entries(engine, "q")) < len(set(log.values()))  # sparse
        assert_lookups_exact(engine, "q", list(range(first - 1, last + 2)))
        everything = engine.receive("q", max=1000)
        assert engine.delete("q", [d.receipt for d in everything]) == [None] * len(log)
        middle = sorted(log.items())[len(log) // 2]
        engine.rewind("q", middle[1])
        received = engine.receive("q", max=1000)
        assert sorted(d.id for d in received) == sorted(
            f"{1:08x}{seq:016x}7" for seq, ms in log.items() if ms >= middle[1])
