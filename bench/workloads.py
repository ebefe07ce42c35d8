"""The benchmark workloads (256-byte bodies; the server and the clients share the machine):

====  =======================================================================================
w1    produce: 4 processes send 200,000 messages in batches of 16        target ≥ 100,000 msg/s
w2    consume: a pre-filled queue (200,000); 4 processes receive up to 16 and delete each
      batch with one request, sent with the next receive (one round trip per batch;
      ``--sequential``: two)                                             target ≥ 70,000 msg/s
w3    latency: one producer sends 2,000 msg/s for 10 s (one message per send, paced open
      loop: a send is not held back by earlier answers), one consumer long-polls (receive
      up to 16, deletes on the side); end-to-end = receive time - send time, the send
      time carried in the body                        target p99 ≤ 1.5 ms, p99.9 ≤ 5 ms
w4    round trips: one client, 20,000 unbatched awaited sends            target ≥ 8,000/s
      then receive 1 + delete 1, 20,000 times                            target ≥ 5,000 msg/s
      (first 5,000 pings, for scale: a round trip with no engine work)
idle  1,000 idle connections: the server's RSS before and after       target ≤ 100 MB more
cost  (beside the four) the server's CPU µs per request of each kind: ping, send / receive /
      delete of 1 and of 16, one request at a time — what a server optimization moves
====  =======================================================================================

With ``--fsync`` (a server acknowledging only synced writes) the targets of w1 and w2 are
45,000 and 35,000 msg/s. The server's peak RSS in w1-w4 (since it started, so w2's pre-fill
of 200,000 messages and w1's 200,000 sent count): target ≤ 100 MB; ``--backlog N`` adds N
messages in a queue of their own, sent before each run, beside any workload.

This module sets each workload up (queues, pre-fill), runs its client processes (the
functions of ``workers.py``) through ``loadgen`` and turns their samples into figures against
the targets.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lamina.engine.errors import LaminaError, QueueNotFound
from lamina.client import Client

from .loadgen import BenchError, SeriesFigures, WorkerSpec, first_start, run_workers, summarize
from .placement import Cpus, describe, pinned
from .spawn import ProcessStats, rss_bytes
from .workers import (
    check_results,
    consume_worker,
    latency_consumer_worker,
    paced_producer_worker,
    produce_worker,
    round_trip_worker,
    share,
)

__all__ = ["Figure", "Params", "Run", "WORKLOADS", "Workload", "WorkloadResult",
           "drop_after_failure", "drop_backlog", "fill_backlog", "measure", "new_result",
           "score_w1", "score_w2", "score_w3", "score_w4", "start_w1", "start_w2", "start_w3",
           "start_w4"]

_PREFILL_BATCH = 1000
#: The server's peak RSS over a workload run, since it started (a backlog included).
PEAK_RSS_TARGET_MB = 100.0
#: The queue ``--backlog`` fills.
BACKLOG_QUEUE = "bench-backlog"


@dataclass
class Params:
    """What a workload may be told on the command line; None: the workload's default."""

    processes: int | None = None
    messages: int | None = None
    batch: int | None = None
    body_bytes: int = 256
    inflight: int = 1
    rate: float | None = None
    duration_s: float | None = None
    connections: int | None = None
    #: w4's client: poll for each answer this long before sleeping (``Client`` busy_poll_us;
    #: 0, the default: it sleeps on its socket at once, as users' clients do).
    client_poll_us: int = 0
    #: w2's consumers: receive, then delete, in two round trips (not ``delete_and_receive``).
    sequential: bool = False
    #: Messages sent to a queue of their own before the workload (not measured) and kept
    #: there while it runs: the server holds that backlog beside the workload's own queue.
    backlog: int = 0


@dataclass
class Run:
    """Where and how: the server's address, its pid (CPU, RSS, profiling) when known."""

    address: tuple[str, int]
    server_pid: int | None = None
    fsync: bool = False
    timeout_s: float = 600.0
    client_nice: int = 0
    on_start: Callable[[], None] | None = None
    on_stop: Callable[[], None] | None = None
    #: ``--client-cpus``: the CPUs of the client processes (and of the bench's own client in
    #: ``idle`` and ``cost``); ``--server-cpus``: the server's, reported with the figures.
    client_cpus: Cpus | None = None
    server_cpus: Cpus | None = None

    def client(self) -> Client:
        return Client.connect(*self.address, timeout=30)


@dataclass
class Figure:
    """One row of the results table: a measured value and, when it has one, its target."""

    label: str
    value: float
    unit: str
    target: float | None = None
    at_least: bool = True  # the target is a floor (throughput) or a ceiling (latency, memory)

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"{'≥' if self.at_least else '≤'} {self.target:,g} {self.unit}"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "value": self.value, "unit": self.unit,
                "target": self.target, "at_least": self.at_least, "met": self.met}


@dataclass
class WorkloadResult:
    workload: str
    title: str
    params: dict[str, Any]
    fsync: bool
    figures: list[Figure] = field(default_factory=list)
    series: list[SeriesFigures] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What was measured: "lamina", or the peer of ``--against`` ("redis").
    system: str = "lamina"

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "system": self.system, "title": self.title,
                "fsync": self.fsync, "params": self.params, "figures": [f.to_json() for f in self.figures],
                "series": [s.to_json() for s in self.series], "notes": self.notes}


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    run: Callable[[Run, Params], WorkloadResult]


# --- The workloads (in the bench process) ----------------------------------------------------------


def _fresh_queue(run: Run, name: str) -> None:
    with run.client() as client:
        try:
            client.delete_queue(name)
        except QueueNotFound:
            pass
        client.create_queue(name)


def _retained(run: Run, name: str) -> int:
    with run.client() as client:
        return int((client.get_queue(name).stats or {}).get("messages", 0))


def _drop_queue(run: Run, name: str) -> None:
    with run.client() as client:
        try:
            client.delete_queue(name)
        except QueueNotFound:
            pass


def measure(run: Run, specs: list[WorkerSpec]) -> tuple[dict[str, list[Any]], ProcessStats | None,
                                                        float]:
    """Run a workload's client processes (released together); -> their samples, the server's
    CPU and memory over the measured phase (when its pid is known), the clients' CPU seconds."""
    stats = ProcessStats(run.server_pid) if run.server_pid is not None else None

    def on_start() -> None:
        if stats is not None:
            stats.start()
        if run.on_start is not None:
            run.on_start()

    def on_stop() -> None:
        if run.on_stop is not None:
            run.on_stop()
        if stats is not None:
            stats.stop()

    samples, client_cpu_s = run_workers(specs, timeout_s=run.timeout_s, on_start=on_start,
                                        on_stop=on_stop, nice=run.client_nice,
                                        cpus=run.client_cpus)
    return samples, stats, client_cpu_s


def _cost_figures(result: WorkloadResult, stats: ProcessStats | None, client_cpu_s: float,
                  count: int, wall_s: float, per: str = "message") -> None:
    """Where the CPU went: the server's and the load generator's µs per message (or per
    request), and the server's share of a core (one process: near 100 % it is CPU-bound)."""
    if count <= 0:
        return
    if stats is not None and stats.cpu_s is not None:
        result.figures.append(Figure(f"server CPU per {per}", stats.cpu_s / count * 1e6, "µs"))
        if wall_s > 0:
            result.figures.append(Figure("server CPU busy", stats.cpu_s / wall_s * 100, "%"))
    if stats is not None and stats.peak_rss_bytes is not None:
        result.figures.append(Figure("server peak RSS", stats.peak_rss_bytes / 1e6, "MB",
                                     PEAK_RSS_TARGET_MB, at_least=False))
    result.figures.append(Figure(f"load generator CPU per {per}", client_cpu_s / count * 1e6,
                                 "µs"))


def new_result(name: str, run: Run, params: Params, **used: Any) -> WorkloadResult:
    if run.client_nice:
        used["client_nice"] = run.client_nice
    if run.client_cpus is not None:
        used["client_cpus"] = describe(run.client_cpus)
    if run.server_cpus is not None:
        used["server_cpus"] = describe(run.server_cpus)
    if params.backlog:
        used["backlog"] = params.backlog
    result = WorkloadResult(name, WORKLOADS[name].title, {**used}, run.fsync)
    placed = [f"{who} on CPUs {describe(cpus)}" for who, cpus in
              (("server", run.server_cpus), ("clients", run.client_cpus)) if cpus is not None]
    if placed:  # the text report shows notes, not parameters
        result.notes.append(", ".join(placed))
    return result


def start_w1(run: Run, params: Params) -> tuple[WorkloadResult, int, int, int]:
    """W1's sizes as every system runs it: (its result to fill, processes, messages, batch)."""
    processes = params.processes or 4
    messages = params.messages or 200_000
    batch = params.batch or 16
    result = new_result("w1", run, params, processes=processes, messages=messages, batch=batch,
                        body_bytes=params.body_bytes, inflight=params.inflight)
    return result, processes, messages, batch


def run_w1(run: Run, params: Params) -> WorkloadResult:
    result, processes, messages, batch = start_w1(run, params)
    queue = "bench-w1"
    _fresh_queue(run, queue)
    specs = [WorkerSpec(produce_worker, (run.address, queue, share(messages, processes, i),
                                         batch, params.body_bytes, params.inflight))
             for i in range(processes)]
    score_w1(result, run, *measure(run, specs))
    retained = _retained(run, queue)
    if retained != messages:
        result.notes.append(f"the queue retains {retained} messages, {messages} were sent")
    _drop_queue(run, queue)
    return result


def score_w1(result: WorkloadResult, run: Run, samples: dict[str, list[Any]],
             stats: ProcessStats | None, client_cpu: float) -> None:
    """W1's figures from its workers' ``send`` samples (Lamina's or a peer's)."""
    send = summarize("send", samples["send"])
    result.series.append(send)
    result.figures.append(Figure("produce", send.messages_per_s, "msg/s",
                                 45_000 if run.fsync else 100_000))
    _cost_figures(result, stats, client_cpu, send.messages, send.elapsed_s)


def prefill(run: Run, queue: str, messages: int, body_bytes: int) -> None:
    """Send ``messages`` in batches of 1000 (not measured)."""
    body = os.urandom(body_bytes)
    with run.client() as client:
        left = messages
        while left > 0:
            count = min(_PREFILL_BATCH, left)
            check_results(client.send(queue, [body] * count), "prefill")
            left -= count


def fill_backlog(run: Run, params: Params) -> None:
    """Send ``params.backlog`` messages to a queue of their own, to stay while the workload
    runs (not measured); ``drop_backlog`` removes them."""
    if params.backlog:
        _fresh_queue(run, BACKLOG_QUEUE)
        prefill(run, BACKLOG_QUEUE, params.backlog, params.body_bytes)


def drop_backlog(run: Run, params: Params) -> None:
    if params.backlog:
        _drop_queue(run, BACKLOG_QUEUE)


def drop_after_failure(run: Run, name: str, params: Params) -> None:
    """After workload ``name`` failed on a server the bench does not own: its queue and the
    backlog's gone, as a finished run leaves it (best effort: the server may be what failed)."""
    try:
        _drop_queue(run, f"bench-{name}")
        drop_backlog(run, params)
    except (LaminaError, OSError):
        pass


def start_w2(run: Run, params: Params) -> tuple[WorkloadResult, int, int, int]:
    """W2's sizes: (its result to fill, processes, messages, batch)."""
    processes = params.processes or 4
    messages = params.messages or 200_000
    batch = params.batch or 16
    result = new_result("w2", run, params, processes=processes, messages=messages, batch=batch,
                        body_bytes=params.body_bytes, inflight=params.inflight,
                        round_trips_per_batch=2 if params.sequential else 1)
    return result, processes, messages, batch


def run_w2(run: Run, params: Params) -> WorkloadResult:
    result, processes, messages, batch = start_w2(run, params)
    queue = "bench-w2"
    _fresh_queue(run, queue)
    prefill(run, queue, messages, params.body_bytes)
    specs = [WorkerSpec(consume_worker, (run.address, queue, batch, params.inflight,
                                         params.sequential))
             for _ in range(processes)]
    score_w2(result, run, messages, *measure(run, specs))
    _drop_queue(run, queue)
    return result


def score_w2(result: WorkloadResult, run: Run, messages: int, samples: dict[str, list[Any]],
             stats: ProcessStats | None, client_cpu: float) -> None:
    """W2's figures from its workers' ``receive+delete`` samples."""
    consume = summarize("receive+delete", samples["receive+delete"])
    result.series.append(consume)
    result.figures.append(Figure("consume (receive + delete)", consume.messages_per_s, "msg/s",
                                 35_000 if run.fsync else 70_000))
    if consume.messages != messages:
        result.notes.append(f"consumed {consume.messages} of {messages} messages")
    _cost_figures(result, stats, client_cpu, consume.messages, consume.elapsed_s)


def start_w3(run: Run, params: Params) -> tuple[WorkloadResult, float, float, int, int]:
    """W3's sizes: (its result to fill, rate, duration_s, messages, receive batch)."""
    rate = params.rate or 2000.0
    duration_s = params.duration_s or 10.0
    messages = max(int(rate * duration_s), 1)
    batch = params.batch or 16
    result = new_result("w3", run, params, rate=rate, duration_s=duration_s,
                        messages=messages, receive_max=batch, body_bytes=params.body_bytes)
    return result, rate, duration_s, messages, batch


def run_w3(run: Run, params: Params) -> WorkloadResult:
    result, rate, duration_s, messages, batch = start_w3(run, params)
    queue = "bench-w3"
    _fresh_queue(run, queue)
    specs = [WorkerSpec(latency_consumer_worker, (run.address, queue, messages, batch,
                                                  duration_s + 30)),
             WorkerSpec(paced_producer_worker, (run.address, queue, rate, messages,
                                                params.body_bytes))]
    score_w3(result, rate, *measure(run, specs))
    _drop_queue(run, queue)
    return result


def score_w3(result: WorkloadResult, rate: float, samples: dict[str, list[Any]],
             stats: ProcessStats | None, client_cpu: float) -> None:
    """W3's figures from its producer's ``send`` and consumer's ``end-to-end`` samples."""
    t0 = first_start(samples)
    send = summarize("send", samples["send"], t0_s=t0)
    e2e = summarize("end-to-end", samples["end-to-end"], t0_s=t0)
    result.series.extend([e2e, send])
    result.figures.extend([
        Figure("end-to-end p99", e2e.percentiles_ms.get("p99", float("nan")), "ms", 1.5,
               at_least=False),
        Figure("end-to-end p99.9", e2e.percentiles_ms.get("p99.9", float("nan")), "ms", 5.0,
               at_least=False),
        Figure("end-to-end p50", e2e.percentiles_ms.get("p50", float("nan")), "ms"),
        Figure(f"send rate achieved (paced at {rate:,g})", send.messages_per_s, "msg/s"),
    ])
    _cost_figures(result, stats, client_cpu, e2e.messages, send.elapsed_s)


def start_w4(run: Run, params: Params) -> tuple[WorkloadResult, int]:
    """W4's sizes: (its result to fill, messages)."""
    messages = params.messages or 20_000
    result = new_result("w4", run, params, messages=messages, body_bytes=params.body_bytes,
                        client_poll_us=params.client_poll_us)
    return result, messages


def run_w4(run: Run, params: Params) -> WorkloadResult:
    result, messages = start_w4(run, params)
    queue = "bench-w4"
    _fresh_queue(run, queue)
    specs = [WorkerSpec(round_trip_worker, (run.address, queue, messages, params.body_bytes,
                                            params.client_poll_us))]
    score_w4(result, messages, *measure(run, specs))
    _drop_queue(run, queue)
    return result


def score_w4(result: WorkloadResult, messages: int, samples: dict[str, list[Any]],
             stats: ProcessStats | None, client_cpu: float) -> None:
    """W4's figures from its worker's ``ping``, ``send`` and ``receive+delete`` samples."""
    t0 = first_start(samples)
    ping = summarize("ping", samples["ping"], t0_s=t0)
    send = summarize("send", samples["send"], t0_s=t0)
    pair = summarize("receive+delete", samples["receive+delete"], t0_s=t0)
    result.series.extend([ping, send, pair])
    result.figures.extend([
        Figure("unbatched awaited sends", send.operations_per_s, "sends/s", 8_000),
        Figure("receive 1 + delete 1", pair.messages_per_s, "msg/s", 5_000),
        Figure("pings (round trips without engine work)", ping.operations_per_s, "/s"),
    ])
    if pair.messages != messages:
        result.notes.append(f"received {pair.messages} of {messages} messages")
    requests = ping.operations + send.operations + 2 * pair.operations
    _cost_figures(result, stats, client_cpu, requests,
                  ping.elapsed_s + send.elapsed_s + pair.elapsed_s, per="request")


def _raise_open_files_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(needed + 64, soft), hard), hard))


def run_idle(run: Run, params: Params) -> WorkloadResult:
    """Open ``connections`` connections (greeting read, then nothing) and compare the
    server's RSS before and after."""
    connections = params.connections or 1000
    result = new_result("idle", run, params, connections=connections)
    if run.server_pid is None:
        raise BenchError("the idle workload reads the server's memory: let the bench start the "
                         "server, or pass --server-pid")
    _raise_open_files_limit(connections)
    with pinned(run.client_cpus):
        return _measure_idle(run, result, connections)


def _measure_idle(run: Run, result: WorkloadResult, connections: int) -> WorkloadResult:
    assert run.server_pid is not None
    for _ in range(10):  # warm up the accept path, so its first-use costs are in the baseline
        run.client().close()
    time.sleep(0.5)
    before = rss_bytes(run.server_pid)
    opened: list[Client] = []
    try:
        begin = time.monotonic()
        for _ in range(connections):
            opened.append(run.client())
        open_s = time.monotonic() - begin
        time.sleep(0.5 + connections / 1000)  # let the server finish setting them up
        after = rss_bytes(run.server_pid)
        with run.client() as client:
            seen = client.server_info().connections
    finally:
        for client in opened:
            client.close()
    delta_mb = (after - before) / 1e6
    result.figures.extend([
        Figure(f"server RSS growth, {connections:,} idle connections", delta_mb, "MB", 100.0,
               at_least=False),
        Figure("per connection", (after - before) / connections / 1024, "KiB"),
        Figure("server RSS before", before / 1e6, "MB"),
        Figure("server RSS with the connections", after / 1e6, "MB"),
        Figure("connections the server reported", float(seen), ""),
        Figure("time to open them", open_s, "s"),
    ])
    return result


def run_cost(run: Run, params: Params) -> WorkloadResult:
    """Not one of the four workloads: the server's CPU time per request of each kind, one client,
    one request at a time (``ping`` is the floor: reading, parsing, answering, no engine)."""
    count = params.messages or 5000
    result = new_result("cost", run, params, requests_per_kind=count)
    if run.server_pid is None:
        raise BenchError("the cost workload reads the server's CPU time: let the bench start "
                         "the server, or pass --server-pid")
    with pinned(run.client_cpus):
        return _measure_cost(run, params, result, count)


def _measure_cost(run: Run, params: Params, result: WorkloadResult, count: int
                  ) -> WorkloadResult:
    from .spawn import cpu_seconds
    assert run.server_pid is not None
    queue = "bench-cost"
    _fresh_queue(run, queue)
    body = os.urandom(params.body_bytes)
    with run.client() as client:
        def measure(label: str, call: Callable[[], Any]) -> None:
            server_before, client_before = cpu_seconds(run.server_pid), time.process_time()
            begin = time.perf_counter()
            for _ in range(count):
                call()
            wall_s = time.perf_counter() - begin
            server_us = (cpu_seconds(run.server_pid) - server_before) / count * 1e6
            result.figures.append(Figure(f"{label}: server CPU", server_us, "µs/request"))
            result.figures.append(Figure(f"{label}: client CPU",
                                         (time.process_time() - client_before) / count * 1e6,
                                         "µs/request"))
            result.figures.append(Figure(f"{label}: round trip (mean)", wall_s / count * 1e6,
                                         "µs"))

        def receiving(size: int) -> Callable[[], Any]:
            return lambda: leased.extend(client.receive(queue, max=size, wait=0))

        def deleting(size: int) -> Callable[[], Any]:
            def delete() -> None:
                batch = [leased.pop() for _ in range(min(size, len(leased)))]
                check_results(client.delete(queue, batch), "delete")
            return delete

        def pair() -> None:  # a consumer of one message at a time (W3's, W4's)
            leased.extend(client.receive(queue, max=1, wait=0))
            check_results(client.delete(queue, [leased.pop()]), "delete")

        for size in (1, 16):
            entries = [body] * size
            leased: list[Any] = []
            measure("ping" if size == 1 else "ping (again)", client.ping)
            measure(f"send {size}", lambda: check_results(client.send(queue, entries), "send"))
            measure(f"receive {size}", receiving(size))
            measure(f"delete {size}", deleting(size))
            if size == 1:  # the receives above took the messages sent: send as many again
                for _ in range(0, count, 16):
                    check_results(client.send(queue, [body] * 16), "send")
                measure("receive 1 + its delete", pair)
    result.notes.append("CPU times are read from /proc before and after each kind; other "
                        "processes on the machine inflate them (caches, context switches)")
    _drop_queue(run, queue)
    return result


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("w1", "W1 produce: batches of 16", run_w1),
    Workload("w2", "W2 consume: receive up to 16, delete in batches", run_w2),
    Workload("w3", "W3 latency: paced sends, one long-polling consumer", run_w3),
    Workload("w4", "W4 round trips: unbatched awaited sends, receive 1 + delete 1", run_w4),
    Workload("idle", "Idle connections: server memory", run_idle),
    Workload("cost", "Server CPU per request, by kind", run_cost),
)}
