"""The store's clock row holds a ceiling of the engine clock (docs/STORAGE.md "The clock"):
operations in new milliseconds write it only when ``now`` passes it, a clean close writes it
exact, and after a killed process time never goes back to before anything it acknowledged."""

from __future__ import annotations

import pytest

from lamina.engine import Engine, keys
from lamina.engine.clock import CLOCK_AHEAD_MS
from tests.support.stores import run_killed


def stored_clock(engine: Engine) -> int:
    return keys.read_u64(engine._store.meta[keys.META_CLOCK])


def test_new_milliseconds_write_the_clock_row_only_past_its_ceiling(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        start = clock.now_ms
        assert stored_clock(engine) == start + CLOCK_AHEAD_MS
        for _ in range(CLOCK_AHEAD_MS):
            clock.advance(1)
            engine.send("q", [b"x"])
            assert stored_clock(engine) == start + CLOCK_AHEAD_MS
        clock.advance(1)
        engine.send("q", [b"x"])
        assert stored_clock(engine) == clock.now_ms + CLOCK_AHEAD_MS
    with Engine.open(path, clock=clock) as engine:  # a clean close: exact
        assert stored_clock(engine) == clock.now_ms
        assert engine.send("q", [b"y"])[0].enqueue_time == clock.now_ms


CHILD = r"""
import sys
from lamina.engine import Engine

engine = Engine.open(sys.argv[1])
engine.create_queue("q")
for _ in range(200):
    sent = engine.send("q", [b"x"])[0]
print(sent.enqueue_time, flush=True)
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_after_a_killed_process_time_goes_on_from_past_what_was_acknowledged(tmp_path):
    path = tmp_path / "data"
    last = int(run_killed(CHILD, path))
    with Engine.open(path) as engine:
        assert engine.send("q", [b"after"])[0].enqueue_time >= last
        assert engine._clock.last_ms >= last
