"""Fixtures for the engine micro-benchmarks (not part of the test suite; run explicitly):

    /tmp/venv/bin/python -m pytest bench/micro -q --benchmark-only

Every benchmark stores its headline figures (messages/s, ms, MB) in ``benchmark.extra_info``
through ``report``; they are also printed as one table at the end of the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lamina.engine import Engine

BODY_BYTES = 256
BATCH = 16
STORE_MESSAGES = 1_000_000
STORE_BATCH = 1000

# (benchmark name, figure, value, target) rows for the summary table.
_FIGURES: list[tuple[str, str, Any, str]] = []


@pytest.fixture
def report(benchmark):
    """``report(figure, value, target="")`` records one headline figure of the benchmark (in
    ``extra_info`` and in the summary table)."""

    def _report(figure: str, value: Any, target: str = "") -> None:
        benchmark.extra_info[figure] = value
        _FIGURES.append((benchmark.name, figure, value, target))

    return _report


def open_queue(path: Path, **options: Any) -> Engine:
    engine = Engine.open(path, **options)
    engine.create_queue("q")
    return engine


@pytest.fixture
def engine(tmp_path):
    """A fresh engine (wall clock, WAL without fsync) with an empty queue ``q``."""
    engine = open_queue(tmp_path / "data")
    yield engine
    engine.close()


@pytest.fixture
def fsync_engine(tmp_path):
    """Like ``engine``, with ``fsync=True``: every commit syncs the WAL."""
    engine = open_queue(tmp_path / "data", fsync=True)
    yield engine
    engine.close()


# The child of ``measure_open``: opens a store in a fresh interpreter and prints what it cost.
OPEN_CHILD = r"""
import json, sys, time

def status_mb(field):  # VmRSS: resident now; VmHWM: peak resident of this process image
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024

from lamina.engine import Engine
before = status_mb("VmRSS")
started = time.perf_counter()
engine = Engine.open(sys.argv[1])
open_s = time.perf_counter() - started
after = status_mb("VmRSS")
q = engine._queue("q")
print(json.dumps({
    "open_s": open_s, "rss_before_mb": before, "rss_after_mb": after,
    "peak_rss_mb": status_mb("VmHWM"), "messages": q.next_seq - q.gone_seq,
}))
engine.close()
"""


def measure_open(path: Path) -> dict[str, Any]:
    """Open ``path`` in a fresh interpreter: open time, RSS before/after (imports done), peak.

    (Not ``ru_maxrss``: Linux carries it across ``execve``, so a child forked from a big
    pytest process would report the parent's size.)"""
    out = subprocess.run([sys.executable, "-c", OPEN_CHILD, str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


@pytest.fixture(name="measure_open")
def measure_open_fixture():
    """``measure_open(path)`` -> figures of an open in a fresh interpreter."""
    return measure_open


# The child of ``store_1m``: sends the 1M messages, prints its time and memory, and dies
# without closing.
BUILD_CHILD = r"""
import os, signal, sys, time
from lamina.engine import Engine

path, total, batch, size = sys.argv[1], *map(int, sys.argv[2:])
engine = Engine.open(path)
engine.create_queue("q")
bodies = [(b"%016d" % i).ljust(size, b"x") for i in range(batch)]
started = time.perf_counter()
for _ in range(total // batch):
    engine.send("q", bodies)
build_s = time.perf_counter() - started
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(build_s, int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024,
      flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close(): the next open replays the WAL
"""


@dataclass
class Store1M:
    path: Path
    build_s: float
    builder_rss_mb: float  # resident memory of the builder after its 1M sends
    builder_peak_rss_mb: float
    first_open: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="session")
def store_1m(tmp_path_factory) -> Store1M:
    """A data directory holding one queue ``q`` of 1,000,000 messages of 256 bytes, sent in
    batches of 1000 with the wall clock; built once per session.

    The builder (a child process) is killed after its last send, without ``close()``, so the
    first open replays the WAL into memtables and flushes them, as a restart after a crash
    does: the fixture does that first open at once, in a fresh process, and keeps its figures
    apart (``first_open``). Later opens find everything in SST files."""
    path = tmp_path_factory.mktemp("store_1m") / "data"
    child = subprocess.run(
        [sys.executable, "-c", BUILD_CHILD, str(path), str(STORE_MESSAGES), str(STORE_BATCH),
         str(BODY_BYTES)], capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    build_s, rss, peak = map(float, child.stdout.split())
    store = Store1M(path, build_s, rss, peak)
    store.first_open = measure_open(path)
    assert store.first_open["messages"] == STORE_MESSAGES
    return store


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _FIGURES:
        return
    terminalreporter.section("Lamina engine figures")
    width = max(len(name) for name, *_ in _FIGURES)
    for name, figure, value, target in _FIGURES:
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        terminalreporter.write_line(
            f"{name:<{width}}  {figure:<24} {shown:>14}  {('target ' + target) if target else ''}")
    if os.environ.get("LAMINA_BENCH_FIGURES"):
        Path(os.environ["LAMINA_BENCH_FIGURES"]).write_text(json.dumps(_FIGURES, indent=1))
