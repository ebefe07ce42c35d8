"""Tools benchmarks on the 1M-message store (``store_1m``: one queue, 1,000,000 messages of 256
bytes, 16 segments of 65,536). Targets (bench/RESULTS.md, "Tools"):

- ``lamina inspect DATA dump q > /dev/null``  >= 100,000 messages/s
- ``lamina inspect DATA verify``               >= 200,000 messages/s
- Spark, local[2], ``count()`` and ``groupBy("priority").count()`` over the whole queue:
  >= 500,000 rows/s once the session is up: ``SPARK_WARMUP_ROUNDS`` start the Python workers
  and let the JVM's JIT compile its Arrow-to-row path (the JVM's CPU per scan, measured: ~7 s
  in the first, workers starting; ~2.7 s in the second; ~1.1 s from about the sixth on)

    /tmp/venv/bin/python -m pytest bench/micro/test_tools_bench.py -q --benchmark-only

The CLI runs are whole processes (interpreter start included), timed by wall clock; their CPU
time (``RUSAGE_CHILDREN``) is reported too, since the machine may be shared. So is the CPU time
of a Spark query: the JVM's and its Python workers' (``/proc``, so Linux only).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

STORE_MESSAGES = 1_000_000
ROUNDS = 3
SPARK_WARMUP_ROUNDS = 5


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _descendants_cpu_s() -> float:
    """CPU seconds used by this process's live descendants (the Spark JVM, its Python daemons
    and workers), with the children they reaped (Python workers that exited)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent_of: dict[int, int] = {}
    cpu_of: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parent_of[int(entry)] = int(fields[1])
        cpu_of[int(entry)] = sum(int(ticks) for ticks in fields[11:15]) / tick  # u, s, cu, cs
    total, parents = 0.0, [os.getpid()]
    while parents:
        parent = parents.pop()
        for pid, ppid in parent_of.items():
            if ppid == parent:
                total += cpu_of[pid]
                parents.append(pid)
    return total


def _inspect(benchmark: Any, report: Any, path: Path, *command: str) -> None:
    argv = [sys.executable, "-m", "lamina.tools.cli", "inspect", str(path), *command]
    cpu: list[float] = []

    def run() -> None:
        before = _children_cpu_s()
        with open(os.devnull, "w") as sink:
            subprocess.run(argv, stdout=sink, check=True)
        cpu.append(_children_cpu_s() - before)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    report("msgs_per_s", STORE_MESSAGES / benchmark.stats.stats.mean,
           ">= 100,000" if command[0] == "dump" else ">= 200,000")
    report("msgs_per_s_best", STORE_MESSAGES / benchmark.stats.stats.min)
    report("msgs_per_cpu_s", STORE_MESSAGES / min(cpu[1:] or cpu))
    report("load_average_1m", os.getloadavg()[0])


def test_inspect_dump(benchmark: Any, report: Any, store_1m: Any) -> None:
    """``lamina inspect DATA dump q > /dev/null``: every message as a JSON line."""
    _inspect(benchmark, report, store_1m.path, "dump", "q")


def test_inspect_verify(benchmark: Any, report: Any, store_1m: Any) -> None:
    """``lamina inspect DATA verify``: MD5, CBOR, prefix, time index, segments, leases."""
    _inspect(benchmark, report, store_1m.path, "verify")


@pytest.fixture(scope="module")
def spark() -> Any:
    pytest.importorskip("pyspark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from lamina.tools.spark import register

    session = (SparkSession.builder.master("local[2]").appName("lamina-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.mark.parametrize("query", ["count", "group_by_priority"])
def test_spark_scan(benchmark: Any, report: Any, store_1m: Any, spark: Any, query: str) -> None:
    """A full scan of the queue through the ``lamina`` source (16 partitions)."""
    df = spark.read.format("lamina").option("path", str(store_1m.path)).option(
        "queue", "q").load()
    assert df.rdd.getNumPartitions() == 16

    cpu: list[float] = []

    def run() -> None:
        before = _descendants_cpu_s()
        if query == "count":
            assert df.count() == STORE_MESSAGES
        else:
            rows = df.groupBy("priority").count().collect()
            assert sum(row["count"] for row in rows) == STORE_MESSAGES
        cpu.append(_descendants_cpu_s() - before)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=SPARK_WARMUP_ROUNDS)
    report("rows_per_s", STORE_MESSAGES / benchmark.stats.stats.mean, ">= 500,000")
    report("rows_per_s_best", STORE_MESSAGES / benchmark.stats.stats.min)
    timed_cpu_s = cpu[SPARK_WARMUP_ROUNDS:]
    report("spark_cpu_s_per_round", sum(timed_cpu_s) / len(timed_cpu_s))
    report("load_average_1m", os.getloadavg()[0])
