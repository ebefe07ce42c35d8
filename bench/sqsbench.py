"""The SQS workloads: boto3 clients against any SQS endpoint (256-byte bodies by default).

==========  ==================================================================================
sqs-send    4 processes send 20,000 messages with ``SendMessageBatch`` of 10
sqs-consume a queue pre-filled with 20,000; 4 processes ``ReceiveMessage`` up to 10 (long poll
            of 1 s) and delete each batch with one ``DeleteMessageBatch``, until the queue is
            empty
sqs-rounds  one client, 2,000 unbatched rounds: ``SendMessage``, ``ReceiveMessage`` of 1,
            ``DeleteMessage`` (a round trip each)
sqs-fifo    a FIFO queue, 100 message groups: 4 processes send 20,000 in batches of 10 (each
            batch spans several groups), then 4 processes receive 10 + batch delete; the
            consumers count messages seen out of their group's order
==========  ==================================================================================

Each phase reports messages per second (first request to last answer), the p50 and p99 of a
request (a batch; a whole round for sqs-rounds), and when the server's pid is known its CPU
per message: utime + stime from ``/proc`` of the server and every process under it, so a
server that works in child processes or threads (a JVM) is counted whole.

The client processes run ``sqsclient.py`` (standard library and boto3 only) with a given
interpreter, so that the same workload drives a server that speaks only the older Query
protocol from an environment with an older boto3. Set-up (queues, pre-fill, counts) goes
through the same script, so this process needs no boto3 of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .loadgen import BenchError, SeriesFigures, first_start, summarize
from .workers import share
from .workloads import Figure, WorkloadResult

__all__ = ["Endpoint", "SQS_WORKLOADS", "SqsParams", "SqsUnsupported", "tree_cpu_seconds"]

CLIENT_SCRIPT = Path(__file__).with_name("sqsclient.py")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SQS_BATCH = 10
#: How long a client process may take to start boto3 and reach the server before the start.
_READY_TIMEOUT_S = 60.0


class SqsUnsupported(BenchError):
    """The endpoint refused what a workload needs (a FIFO queue on a server without them)."""


@dataclass(frozen=True)
class Endpoint:
    """An SQS endpoint and how to drive it: the clients' interpreter and credentials."""

    name: str
    url: str
    python: str
    server_pid: int | None = None
    region: str = "us-east-1"
    access_key: str = "test"
    secret_key: str = "test"

    def job(self, **fields: Any) -> dict[str, Any]:
        return {"endpoint": self.url, "region": self.region, "access_key": self.access_key,
                "secret_key": self.secret_key, **fields}


@dataclass(frozen=True)
class SqsParams:
    """Workload sizes; None: the workload's default."""

    processes: int = 4
    messages: int | None = None
    body_bytes: int = 256
    groups: int = 100
    wait_s: int = 1
    timeout_s: float = 600.0
    client_nice: int = 0
    client_cpus: frozenset[int] | None = None  # --client-cpus


# --- The server's CPU ---------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; fields[0] is the state


def process_tree(pid: int) -> set[int]:
    """Process ``pid`` and every live process under it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat_fields(int(entry.name))[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier.extend(children)
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (utime + stime, and the waited-for children's cutime + cstime) of process
    ``pid`` and of every live process under it."""
    total = 0
    for member in process_tree(pid):
        try:
            fields = _stat_fields(member)
        except OSError:
            if member == pid:
                raise BenchError(f"the server (pid {pid}) is gone") from None
            continue
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / _CLOCK_TICKS


# --- Client processes ---------------------------------------------------------------------------


def _spawn(endpoint: Endpoint, job: dict[str, Any], nice: int, cpus: frozenset[int] | None
           ) -> tuple[subprocess.Popen[str], Any]:
    log = tempfile.TemporaryFile("w+")
    try:
        process = subprocess.Popen([endpoint.python, str(CLIENT_SCRIPT)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log, text=True)
    except OSError as exc:
        log.close()
        raise BenchError(f"cannot run the client interpreter {endpoint.python}: {exc}") from None
    assert process.stdin is not None
    placement = {} if cpus is None else {"cpus": sorted(cpus)}
    process.stdin.write(json.dumps({**job, "nice": nice, **placement}) + "\n")
    process.stdin.flush()
    return process, log


def _answer(process: subprocess.Popen[str], log: Any, what: str) -> Any:
    """The next line the client writes, or a BenchError saying why there is none."""
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        answer = json.loads(line) if line else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "error" in answer:
        if answer["error"].startswith("ModuleNotFoundError") and "boto" in answer["error"]:
            raise BenchError(f"the SQS workloads need boto3 in the clients' interpreter "
                             f"({answer['error']}): pip install boto3, or --python PATH of "
                             "one that has it")
        code = f" [{answer['code']}]" if answer.get("code") else ""
        raise _client_error(f"{what}: {answer['error']}{code}", answer.get("code"))
    if not isinstance(answer, dict):
        log.seek(0)
        tail = log.read()[-2000:].strip()
        raise BenchError(f"{what}: the client process ended (exit code {process.wait()}): "
                         f"{tail or line!r}")
    return answer


def _client_error(message: str, code: str | None) -> BenchError:
    return (SqsUnsupported if code in ("InvalidParameterValue", "InvalidAttributeName",
                                       "UnsupportedOperation") else BenchError)(message)


def admin(endpoint: Endpoint, ops: list[dict[str, Any]], timeout_s: float = 600.0) -> list[Any]:
    """Run set-up operations (``create``, ``count``, ``delete``) in one client process."""
    process, log = _spawn(endpoint, endpoint.job(mode="admin", ops=ops), 0, None)
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    try:
        return list(_answer(process, log, f"{endpoint.name}: {ops[0]['op']}")["ok"])
    finally:
        timer.cancel()
        process.wait()
        log.close()


@dataclass
class ClientRun:
    """What a set of client processes measured: samples by series, their CPU, FIFO order."""

    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    out_of_order: int = 0


def run_clients(endpoint: Endpoint, jobs: list[dict[str, Any]], params: SqsParams) -> ClientRun:
    """Start one client process per job, wait until all are ready, release them together and
    collect their samples; the server's CPU is read at the release and after the last answer."""
    started = [_spawn(endpoint, endpoint.job(mode="worker", **job), params.client_nice,
                      params.client_cpus)
               for job in jobs]
    timed_out = threading.Event()

    def kill_all() -> None:
        timed_out.set()
        for process, _ in started:
            process.kill()

    timer = threading.Timer(params.timeout_s + _READY_TIMEOUT_S, kill_all)
    timer.start()
    run = ClientRun()
    try:
        for process, log in started:
            _answer(process, log, f"{endpoint.name}: client start")
        cpu_before = (tree_cpu_seconds(endpoint.server_pid)
                      if endpoint.server_pid is not None else None)
        for process, _ in started:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        answers = [_answer(process, log, f"{endpoint.name}: {job['kind']}")["ok"]
                   for (process, log), job in zip(started, jobs)]
        if cpu_before is not None and endpoint.server_pid is not None:
            run.server_cpu_s = tree_cpu_seconds(endpoint.server_pid) - cpu_before
    except BenchError:
        if timed_out.is_set():
            raise BenchError(f"{endpoint.name}: the clients did not finish within "
                             f"{params.timeout_s:.0f} s (--timeout)") from None
        raise
    finally:
        timer.cancel()
        for process, log in started:
            if process.poll() is None:
                process.kill()
            process.wait()
            log.close()
    for answer in answers:
        for name, samples in answer["series"].items():
            run.samples.setdefault(name, []).append(samples)
        run.client_cpu_s += answer["cpu_s"]
        run.out_of_order += answer.get("out_of_order", 0)
    return run


# --- The workloads ------------------------------------------------------------------------------


def _queue_name(workload: str, fifo: bool = False) -> str:
    return f"bench-{workload}-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")


def _phase(result: WorkloadResult, label: str, series: SeriesFigures, run: ClientRun) -> None:
    """A measured phase's figures: msg/s, request p50 / p99, CPU per message."""
    result.series.append(series)
    p = series.percentiles_ms
    result.figures.extend([
        Figure(f"{label} msg/s", series.messages_per_s, "msg/s"),
        Figure(f"{label} p50", p.get("p50", float("nan")), "ms", at_least=False),
        Figure(f"{label} p99", p.get("p99", float("nan")), "ms", at_least=False),
    ])
    if series.messages and run.server_cpu_s is not None:
        result.figures.append(Figure(f"{label} server CPU per message",
                                     run.server_cpu_s / series.messages * 1e6, "µs",
                                     at_least=False))
    if series.messages:
        result.figures.append(Figure(f"{label} load generator CPU per message",
                                     run.client_cpu_s / series.messages * 1e6, "µs",
                                     at_least=False))


def _requests(result: WorkloadResult, run: ClientRun, names: tuple[str, ...],
              t0_s: float | None = None) -> None:
    """Each kind of request of a phase apart: its p50 and p99 (where a phase's time goes)."""
    for name in names:
        series = summarize(name, run.samples[name], t0_s=t0_s)
        result.series.append(series)
        result.figures.extend([
            Figure(f"{name} request p50", series.percentiles_ms.get("p50", float("nan")), "ms",
                   at_least=False),
            Figure(f"{name} request p99", series.percentiles_ms.get("p99", float("nan")), "ms",
                   at_least=False)])


def _senders(url: str, messages: int, params: SqsParams, **extra: Any) -> list[dict[str, Any]]:
    return [{"kind": "send", "url": url, "messages": share(messages, params.processes, i),
             "batch": _SQS_BATCH, "body_bytes": params.body_bytes, "index": i,
             "workers": params.processes, **extra} for i in range(params.processes)]


def _consumers(url: str, params: SqsParams, fifo: bool = False) -> list[dict[str, Any]]:
    return [{"kind": "consume", "url": url, "batch": _SQS_BATCH, "wait_s": params.wait_s,
             "fifo": fifo} for _ in range(params.processes)]


def _check_left(endpoint: Endpoint, url: str, expected: int, result: WorkloadResult,
                what: str) -> None:
    left = admin(endpoint, [{"op": "count", "url": url}])[0]
    if left != expected:
        result.notes.append(f"{what}: the endpoint counts {left} messages in the queue "
                            f"(visible + not visible), {expected} expected")


def _new(name: str, endpoint: Endpoint, **used: Any) -> WorkloadResult:
    return WorkloadResult(name, SQS_WORKLOADS[name].title, {"endpoint": endpoint.name, **used},
                          False)


@contextmanager
def _queue(endpoint: Endpoint, kind: str, fifo: bool = False) -> Iterator[str]:
    """A fresh queue for one run (its URL), deleted after it."""
    op: dict[str, Any] = {"op": "create", "name": _queue_name(kind, fifo=fifo)}
    if fifo:
        op["fifo"] = True
    try:
        url = admin(endpoint, [op])[0]
    except SqsUnsupported as exc:
        if not fifo:
            raise
        raise SqsUnsupported(f"{endpoint.name} has no FIFO queues ({exc})") from None
    try:
        yield url
    finally:
        admin(endpoint, [{"op": "delete", "url": url}])


def run_send(endpoint: Endpoint, params: SqsParams) -> WorkloadResult:
    messages = params.messages or 20_000
    result = _new("sqs-send", endpoint, processes=params.processes, messages=messages,
                  batch=_SQS_BATCH, body_bytes=params.body_bytes)
    with _queue(endpoint, "send") as url:
        run = run_clients(endpoint, _senders(url, messages, params), params)
        _phase(result, "send", summarize("send", run.samples["send"]), run)
        _check_left(endpoint, url, messages, result, "after the sends")
    return result


def run_consume(endpoint: Endpoint, params: SqsParams) -> WorkloadResult:
    messages = params.messages or 20_000
    result = _new("sqs-consume", endpoint, processes=params.processes, messages=messages,
                  batch=_SQS_BATCH, wait_s=params.wait_s, body_bytes=params.body_bytes)
    with _queue(endpoint, "consume") as url:
        run_clients(endpoint, _senders(url, messages, params), params)  # the pre-fill
        run = run_clients(endpoint, _consumers(url, params), params)
        consume = summarize("receive+delete", run.samples["receive+delete"])
        _phase(result, "receive+delete", consume, run)
        _requests(result, run, ("receive", "delete"))
        if consume.messages != messages:
            result.notes.append(f"consumed {consume.messages} of {messages} messages")
        _check_left(endpoint, url, 0, result, "after the consumers")
    return result


def run_rounds(endpoint: Endpoint, params: SqsParams) -> WorkloadResult:
    rounds = params.messages or 2_000
    result = _new("sqs-rounds", endpoint, rounds=rounds, wait_s=params.wait_s,
                  body_bytes=params.body_bytes)
    with _queue(endpoint, "rounds") as url:
        run = run_clients(endpoint, [{"kind": "rounds", "url": url, "rounds": rounds,
                                      "wait_s": params.wait_s,
                                      "body_bytes": params.body_bytes}], params)
        _phase(result, "round", summarize("round", run.samples["round"]), run)
        _requests(result, run, ("send", "receive", "delete"))
    return result


def run_fifo(endpoint: Endpoint, params: SqsParams) -> WorkloadResult:
    messages = params.messages or 20_000
    result = _new("sqs-fifo", endpoint, processes=params.processes, messages=messages,
                  groups=params.groups, batch=_SQS_BATCH, body_bytes=params.body_bytes)
    if params.groups < params.processes:
        raise BenchError(f"sqs-fifo: {params.groups} message groups for {params.processes} "
                         "producers: each producer needs a group of its own")
    with _queue(endpoint, "fifo", fifo=True) as url:
        sent = run_clients(endpoint, _senders(url, messages, params, groups=params.groups,
                                              tag=uuid.uuid4().hex[:8]), params)
        received = run_clients(endpoint, _consumers(url, params, fifo=True), params)
        t0 = first_start(sent.samples)  # one time axis for both phases
        _phase(result, "send", summarize("send", sent.samples["send"], t0_s=t0), sent)
        consume = summarize("receive+delete", received.samples["receive+delete"], t0_s=t0)
        _phase(result, "receive+delete", consume, received)
        _requests(result, received, ("receive", "delete"), t0_s=t0)
        result.figures.append(Figure("messages out of their group's order",
                                     received.out_of_order, "", at_least=False))
        if consume.messages != messages:
            result.notes.append(f"consumed {consume.messages} of {messages} messages")
        _check_left(endpoint, url, 0, result, "after the consumers")
    return result


@dataclass(frozen=True)
class SqsWorkload:
    name: str
    title: str
    run: Callable[[Endpoint, SqsParams], WorkloadResult]


SQS_WORKLOADS: dict[str, SqsWorkload] = {w.name: w for w in (
    SqsWorkload("sqs-send", "SQS send: SendMessageBatch of 10", run_send),
    SqsWorkload("sqs-consume", "SQS consume: ReceiveMessage 10 + DeleteMessageBatch, "
                "pre-filled queue", run_consume),
    SqsWorkload("sqs-rounds", "SQS round trips: SendMessage, ReceiveMessage 1, DeleteMessage",
                run_rounds),
    SqsWorkload("sqs-fifo", "SQS FIFO: message groups, batches of 10 sent, then received and "
                "deleted", run_fifo),
)}
