"""Where the bench runs its processes (``--server-cpus``, ``--client-cpus``): CPU lists read
as ``taskset`` writes them, every thread of a real process placed, the client processes and
the servers of a real bench run placed as asked, and what cannot be placed refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from lamina.bench.loadgen import Recorder, WorkerSpec, run_workers
from lamina.bench.placement import cpu_list, describe, pin_process, pinned, placement_of

USABLE = frozenset(os.sched_getaffinity(0))
ONE = min(USABLE)


def test_cpu_lists_are_read_as_taskset_writes_them() -> None:
    assert cpu_list(str(ONE)) == {ONE}
    assert cpu_list(describe(USABLE)) == USABLE
    if len(USABLE) > 1:
        assert cpu_list(",".join(map(str, sorted(USABLE)))) == USABLE


@pytest.mark.parametrize("text", ["", "x", "1-", "-1", "2-1", "0,,1", "0.5"])
def test_what_is_not_a_cpu_list_is_refused_with_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="write it as 1, 0,1 or 0-3"):
        cpu_list(text)


def test_a_cpu_this_process_may_not_use_is_refused_naming_it() -> None:
    outside = max(USABLE) + 1
    with pytest.raises(ValueError, match=f"CPU {outside} is not one"):
        cpu_list(f"{ONE},{outside}")


def test_describe_folds_runs() -> None:
    assert describe(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"
    assert describe(frozenset({3})) == "3"


_THREADED_CHILD = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


def test_every_thread_of_a_real_process_is_placed() -> None:
    child = subprocess.Popen([sys.executable, "-c", _THREADED_CHILD], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        threads = os.listdir(f"/proc/{child.pid}/task")
        assert len(threads) == 4
        pin_process(child.pid, frozenset({ONE}))
        for thread in threads:
            assert os.sched_getaffinity(int(thread)) == {ONE}
        assert placement_of(child.pid) == {ONE}
    finally:
        child.kill()
        child.wait()


def test_pinned_places_this_thread_for_the_block_only() -> None:
    before = os.sched_getaffinity(0)
    with pinned(frozenset({ONE})):
        assert os.sched_getaffinity(0) == {ONE}
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def report_placement(index: int, barrier: Any) -> Recorder:
    """A worker that records, as series names, the CPUs it may run on."""
    barrier.wait()
    recorder = Recorder()
    for cpu in sorted(os.sched_getaffinity(0)):
        recorder.start(f"cpu {cpu}")
    return recorder


def test_client_processes_run_on_the_cpus_given() -> None:
    specs = [WorkerSpec(report_placement) for _ in range(2)]
    samples, _ = run_workers(specs, timeout_s=60, cpus=frozenset({ONE}))
    assert set(samples) == {f"cpu {ONE}"} and len(samples[f"cpu {ONE}"]) == 2
    samples, _ = run_workers(specs, timeout_s=60)
    assert set(samples) == {f"cpu {cpu}" for cpu in USABLE}


@pytest.mark.slow
def test_a_bench_run_places_both_systems_and_reports_where(lamina: Any) -> None:
    args = ["--server-cpus", str(ONE), "--client-cpus", str(max(USABLE)), "--json"]
    with_redis = shutil.which("redis-server") is not None and _has_hiredis()
    against = ["--against", "redis"] if with_redis else []
    ran = lamina(None, "bench", "w4", "--messages", "40", *against, *args)
    assert ran.code == 0, ran.err
    for result in ran.json()["results"]:
        assert result["params"]["server_cpus"] == str(ONE)
        assert result["params"]["client_cpus"] == str(max(USABLE))
        assert f"server on CPUs {ONE}, clients on CPUs {max(USABLE)}" in result["notes"]
    assert len(ran.json()["results"]) == (2 if against else 1)


def test_a_running_server_is_not_placed_by_the_bench(server: Any, lamina: Any) -> None:
    ran = lamina(server, "bench", "w4", "--messages", "10", "--server-cpus", str(ONE))
    assert ran.code == 1 and "place a running server yourself" in ran.err
    assert lamina(server, "queue", "list", "--json").code == 0  # it serves on, untouched


def _has_hiredis() -> bool:
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return False
    return True
