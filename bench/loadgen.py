"""Running a workload's client processes and turning what they measured into figures.

Each worker process records, per *series* (``send``, ``receive+delete``, ``end-to-end``...),
one sample per completed operation: when it completed, how long it took and how many messages
it carried (:class:`Recorder`). Times come from ``CLOCK_MONOTONIC``, which Linux shares
between processes, so samples of different processes (and a send time carried in a message
body) are comparable.

The parent starts the workers (``spawn``: no state inherited from the bench process), lets
them all connect, releases them together through a barrier, and merges their samples
(:func:`run_workers`). :func:`summarize` turns the samples into a :class:`SeriesFigures`:
throughput over the series' whole span (first start to last completion across processes),
latency percentiles from an HdrHistogram, and a timeline for the plot.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import time
import traceback
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["BenchError", "Recorder", "SeriesFigures", "WorkerSpec", "clock_s", "first_start",
           "run_workers", "summarize"]

#: Latencies are recorded in µs, from 1 µs to 10 min, to 3 significant digits.
_HISTOGRAM_RANGE_US = (1, 600_000_000, 3)
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


class BenchError(RuntimeError):
    """The load generator could not run a workload (a worker failed, timed out...)."""


def clock_s() -> float:
    """The clock every sample uses: CLOCK_MONOTONIC, system-wide on Linux."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def import_hdrhistogram() -> Any:
    try:
        from hdrh.histogram import HdrHistogram
    except ImportError:
        raise BenchError("lamina bench needs hdrhistogram (and matplotlib for --plot): "
                         "pip install 'lamina[dev]' or pip install hdrhistogram matplotlib") \
            from None
    return HdrHistogram


class Recorder:
    """A worker's samples, by series: ``start(name)`` once, then ``add(name, ...)`` per
    operation. Plain arrays, so recording costs well under a µs and pickles compactly."""

    def __init__(self) -> None:
        self.series: dict[str, dict[str, Any]] = {}

    def start(self, name: str, at_s: float | None = None) -> None:
        self.series[name] = {"start": clock_s() if at_s is None else at_s,
                             "done": array("d"), "latency_us": array("d"),
                             "messages": array("l")}

    def add(self, name: str, done_s: float, latency_s: float, messages: int = 1) -> None:
        series = self.series[name]
        series["done"].append(done_s)
        series["latency_us"].append(latency_s * 1e6)
        series["messages"].append(messages)


@dataclass(frozen=True)
class WorkerSpec:
    """One client process: ``target(index, barrier, *args) -> Recorder``, a module-level
    function that connects, calls ``barrier.wait()``, then runs and records."""

    target: Callable[..., Recorder]
    args: tuple[Any, ...] = ()


def _worker_main(spec: WorkerSpec, index: int, barrier: Any, results: Any, nice: int,
                 cpus: frozenset[int] | None) -> None:
    """A worker process: connect (inside ``target``), wait at the barrier, run, report."""
    if nice:
        os.nice(nice)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    cpu_start = time.process_time()
    try:
        recorder = spec.target(index, barrier, *spec.args)
        results.put(("ok", index, recorder.series, time.process_time() - cpu_start))
    except BaseException:
        try:
            barrier.abort()  # release the others rather than leave them waiting
        except Exception:
            pass
        results.put(("error", index, traceback.format_exc(), 0.0))


def run_workers(specs: list[WorkerSpec], *, timeout_s: float,
                on_start: Callable[[], None] | None = None,
                on_stop: Callable[[], None] | None = None,
                nice: int = 0, cpus: frozenset[int] | None = None
                ) -> tuple[dict[str, list[Any]], float]:
    """Run one process per spec, released together; -> (series name -> per-process samples,
    the workers' total CPU seconds). ``on_start`` runs as they are released (start the
    server's CPU count, the profiler), ``on_stop`` when the last one finished. ``nice``
    lowers the workers' scheduling priority (``--client-nice``); ``cpus`` places them
    (``--client-cpus``)."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(specs) + 1)
    results = context.Queue()
    processes = [context.Process(target=_worker_main, args=(spec, index, barrier, results, nice,
                                                             cpus),
                                 daemon=True) for index, spec in enumerate(specs)]
    for process in processes:
        process.start()
    collected: list[tuple[Any, ...]] = []
    try:
        try:
            barrier.wait(timeout=60)  # every worker connected (or one failed)
        except Exception:
            pass  # a failed worker broke the barrier: its report says why
        if on_start is not None and not barrier.broken:
            on_start()
        deadline = time.monotonic() + timeout_s
        while len(collected) < len(specs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"workers did not finish within {timeout_s:.0f} s")
            try:
                collected.append(results.get(timeout=min(remaining, 1.0)))
            except queue_module.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    try:  # its error report may still be on its way
                        collected.append(results.get(timeout=2.0))
                    except queue_module.Empty:
                        raise BenchError(f"a worker process died (exit code "
                                         f"{dead[0].exitcode})") from None
            failed = [item for item in collected if item[0] == "error"]
            if failed:
                raise BenchError(f"worker {failed[0][1]} failed:\n{failed[0][2]}")
        if on_stop is not None:
            on_stop()
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
    merged: dict[str, list[Any]] = {}
    for _, _, series, _ in sorted(collected, key=lambda item: item[1]):
        for name, samples in series.items():
            merged.setdefault(name, []).append(samples)
    return merged, sum(item[3] for item in collected)


@dataclass
class SeriesFigures:
    """One series over all processes."""

    name: str
    operations: int
    messages: int
    elapsed_s: float
    percentiles_ms: dict[str, float]  # "p50" ... "p99.9", "max", "mean"
    timeline: dict[str, list[float]] = field(default_factory=dict)  # t_s, msg_s, p50_ms, p99_ms

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def operations_per_s(self) -> float:
        return self.operations / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"series": self.name, "operations": self.operations, "messages": self.messages,
                "elapsed_s": round(self.elapsed_s, 4),
                "messages_per_s": round(self.messages_per_s, 1),
                "operations_per_s": round(self.operations_per_s, 1),
                "latency_ms": {k: round(v, 4) for k, v in self.percentiles_ms.items()}}


def first_start(samples: dict[str, list[dict[str, Any]]]) -> float:
    """The earliest start of any series: a common zero for the timelines of one workload."""
    return min(s["start"] for series in samples.values() for s in series)


def summarize(name: str, samples: list[dict[str, Any]], t0_s: float | None = None,
              bucket_s: float | None = None) -> SeriesFigures:
    """Merge per-process samples of one series; ``t0_s`` is the zero of the timeline
    (default: the series' start; give :func:`first_start` to share one axis)."""
    HdrHistogram = import_hdrhistogram()
    histogram = HdrHistogram(*_HISTOGRAM_RANGE_US)
    start = min(s["start"] for s in samples)
    done: list[float] = []
    latency: list[float] = []
    messages: list[int] = []
    for s in samples:
        done.extend(s["done"])
        latency.extend(s["latency_us"])
        messages.extend(s["messages"])
    low, high = _HISTOGRAM_RANGE_US[0], _HISTOGRAM_RANGE_US[1]
    for value in latency:
        histogram.record_value(min(max(int(round(value)), low), high))
    end = max(done) if done else start
    percentiles: dict[str, float] = {}
    if latency:
        highest = max(latency)
        for p in PERCENTILES:  # a bucket's top can pass the largest value; cap it there
            percentiles[f"p{p:g}"] = min(histogram.get_value_at_percentile(p), highest) / 1000
        percentiles["max"] = highest / 1000
        percentiles["mean"] = sum(latency) / len(latency) / 1000
    figures = SeriesFigures(name, len(done), sum(messages), end - start, percentiles)
    weights = messages if figures.messages else [1] * len(done)  # e.g. pings: count ops
    figures.timeline = _timeline(done, latency, weights, start if t0_s is None else t0_s,
                                 start, end, bucket_s)
    return figures


def _timeline(done: list[float], latency_us: list[float], messages: list[int], t0_s: float,
              start_s: float, end_s: float, bucket_s: float | None) -> dict[str, list[float]]:
    """Per bucket of time (by completion) from ``start_s`` on, ``t0_s`` being time 0:
    messages/s, and latency p50 / p99 in ms."""
    span = max(end_s - t0_s, 1e-3)
    if bucket_s is None:
        bucket_s = min(max(span / 100, 0.05), 1.0)
    buckets = int(span / bucket_s) + 1
    counts = [0] * buckets
    lat: list[list[float]] = [[] for _ in range(buckets)]
    for when, micros, count in zip(done, latency_us, messages):
        index = min(max(int((when - t0_s) / bucket_s), 0), buckets - 1)
        counts[index] += count
        lat[index].append(micros)
    out: dict[str, list[float]] = {"t_s": [], "msg_s": [], "p50_ms": [], "p99_ms": []}
    for index in range(min(max(int((start_s - t0_s) / bucket_s), 0), buckets - 1), buckets):
        values = sorted(lat[index])
        out["t_s"].append(round((index + 0.5) * bucket_s, 4))
        out["msg_s"].append(counts[index] / bucket_s)
        out["p50_ms"].append(values[len(values) // 2] / 1000 if values else float("nan"))
        out["p99_ms"].append(values[min(int(len(values) * 0.99), len(values) - 1)] / 1000
                             if values else float("nan"))
    return out
