"""``lamina bench sqs-...``: the SQS workloads against one endpoint, or two side by side.

    lamina bench sqs                                   # all four against a Lamina it starts
    lamina bench sqs-send --endpoint URL [--server-pid PID] [--python PATH]
    lamina bench sqs --start elasticmq                 # a peer server started by its script
    lamina bench sqs --against elasticmq --repeat 3    # Lamina and the peer, alternately

The systems are started once for the whole command (a JVM is measured warm: each is first
given a short unmeasured warm-up) and stopped at its end; every run uses fresh queues. With two
systems the runs alternate (A B, then B A, ...), so that a change of the machine's load falls
on both, and the report shows each system's median run and the ratio of the two.

Peer servers (elasticmq, localstack, moto) are started and stopped by a shell script
(``--peers-script``; ``start NAME`` prints ``NAME PID PORT``), here with a state directory
and port of the bench's own, so that a peer someone else runs is left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Iterator

from .loadgen import BenchError
from .sqsbench import SQS_WORKLOADS, Endpoint, SqsParams, SqsUnsupported
from .workloads import WorkloadResult

__all__ = ["DEFAULT_PEERS_SCRIPT", "PEERS", "Outcome", "print_sqs_json", "print_sqs_tables",
           "run_sqs"]

#: Peer servers the script knows, with the environment variable naming each one's port.
PEERS = {"elasticmq": "ELASTICMQ_PORT", "localstack": "LOCALSTACK_PORT", "moto": "MOTO_PORT"}
#: Beside the repository, as a checkout of the project lays it out.
DEFAULT_PEERS_SCRIPT = Path(__file__).resolve().parents[1].parent / "shared/peers/sqs/servers.sh"
_PEERS_STATE = Path(os.environ.get("SQS_PEERS_STATE", "/tmp/sqs-peers"))
#: The set-up the script makes once (venvs, the jar), shared with its other users.
_PEER_SETUP = {"EMQ_DIR": "elasticmq", "BOTO3Q_VENV": "venv-boto3-query",
               "MOTO_VENV": "venv-moto", "LS_VENV": "venv-localstack"}
_PORT_TIMEOUT_S = 30.0
_WARMUP_WORKLOADS = ("sqs-send", "sqs-consume")


def _log(message: str) -> None:
    sys.stderr.write(f"lamina bench: {message}\n")
    sys.stderr.flush()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, alive: Any) -> None:
    deadline = time.monotonic() + _PORT_TIMEOUT_S
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError(f"the server exited before its SQS port {port} opened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"nothing answers on the SQS port {port} after {_PORT_TIMEOUT_S:.0f} s")


# --- Starting the systems -------------------------------------------------------------------------


@contextmanager
def started_lamina(args: argparse.Namespace) -> Iterator[Endpoint]:
    """``lamina serve --sqs-port P`` on a fresh data directory (``--server-python``'s lamina)."""
    from .spawn import SpawnedServer
    port = _free_port()
    extra = ("--sqs-port", str(port)) + (() if args.busy_poll_us is None
                                         else ("--busy-poll-us", str(args.busy_poll_us)))
    try:
        server = SpawnedServer.start(fsync=args.fsync, data=args.data, python=args.server_python,
                                     extra_args=extra)
    except (RuntimeError, OSError) as exc:  # it exited, or its interpreter is missing
        if "--sqs-port" in str(exc):
            raise BenchError("this lamina has no SQS gateway (lamina serve --sqs-port); give "
                             "--server-python PATH of an interpreter whose lamina has one") \
                from None
        raise BenchError(str(exc)) from None
    try:
        _wait_for_port(port, lambda: server.process.poll() is None)
        _place(server.pid, args)
        _log(f"lamina: pid {server.pid}, SQS on 127.0.0.1:{port}")
        yield _endpoint(args, "lamina", f"http://127.0.0.1:{port}", server.pid, args.python)
    finally:
        code = server.stop()
        if code not in (0, None):
            _log(f"lamina exited with code {code}: "
                 + " | ".join(str(line.get("message")) for line in server.log[-5:]))


def _peer_environment(name: str, port: int, state: Path) -> dict[str, str]:
    environment = {**os.environ, "SQS_PEERS_STATE": str(state), PEERS[name]: str(port)}
    for variable, folder in _PEER_SETUP.items():
        environment.setdefault(variable, str(_PEERS_STATE / folder))
    return environment


def _peer_python(name: str, given: str | None) -> str:
    if given:
        return given
    if name == "elasticmq":  # it speaks only the Query protocol: an older boto3
        venv = Path(os.environ.get("BOTO3Q_VENV", _PEERS_STATE / _PEER_SETUP["BOTO3Q_VENV"]))
        return str(venv / "bin" / "python")
    return sys.executable


@contextmanager
def started_peer(name: str, args: argparse.Namespace, python: str | None) -> Iterator[Endpoint]:
    script = Path(args.peers_script)
    if not script.is_file():
        raise BenchError(f"no script to start {name}: {script} is missing (--peers-script PATH "
                         "of a script taking 'start NAME' and 'stop NAME')")
    state = Path(tempfile.mkdtemp(prefix=f"lamina-bench-{name}-"))
    environment = _peer_environment(name, _free_port(), state)
    ran = subprocess.run(["bash", str(script), "start", name], env=environment, text=True,
                         capture_output=True, stdin=subprocess.DEVNULL)
    words = (ran.stdout.strip().splitlines() or [""])[-1].split()
    try:
        if ran.returncode != 0 or len(words) != 3 or words[0] != name:
            raise BenchError(f"{name} did not start: {(ran.stdout + ran.stderr).strip()[-1500:]}")
        pid, port = int(words[1]), int(words[2])
        _place(pid, args)
        _log(f"{name}: pid {pid}, SQS on 127.0.0.1:{port}")
        yield _endpoint(args, name, f"http://127.0.0.1:{port}", pid, _peer_python(name, python))
    finally:
        subprocess.run(["bash", str(script), "stop", name], env=environment,
                       capture_output=True, stdin=subprocess.DEVNULL)
        shutil.rmtree(state, ignore_errors=True)


def _place(pid: int, args: argparse.Namespace) -> None:
    """``--server-cpus``: a server the bench started, with every process under it (a peer's
    script may start it under a launcher), onto those CPUs."""
    if args.server_cpus is not None:
        from .placement import pin_process
        from .sqsbench import process_tree
        for member in process_tree(pid):
            pin_process(member, args.server_cpus)


def _endpoint(args: argparse.Namespace, name: str, url: str, pid: int | None,
              python: str | None) -> Endpoint:
    return Endpoint(name, url, python or sys.executable, pid, region=args.region,
                    access_key=args.access_key or os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                    secret_key=args.secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY",
                                                                 "test"))


def _systems(args: argparse.Namespace, stack: ExitStack) -> list[Endpoint]:
    if args.endpoint is not None:
        if args.server_cpus is not None:
            raise BenchError("--server-cpus places the servers the bench starts; place a "
                             "running server yourself (taskset -a -c -p LIST PID)")
        first = _endpoint(args, args.endpoint, args.endpoint, args.server_pid, args.python)
    elif args.start in (None, "lamina"):
        first = stack.enter_context(started_lamina(args))
    else:
        first = stack.enter_context(started_peer(args.start, args, args.python))
    if args.against is None:
        return [first]
    return [first, stack.enter_context(started_peer(args.against, args, args.peer_python))]


# --- Running and reporting ----------------------------------------------------------------------


@dataclass
class Outcome:
    """One system's runs of one workload (or why it could not run there)."""

    system: str
    workload: str
    runs: list[WorkloadResult]
    unsupported: str | None = None

    def median(self) -> WorkloadResult | None:
        """The run with the median throughput (of its first figure, a msg/s)."""
        if not self.runs:
            return None
        ordered = sorted(self.runs, key=lambda r: r.figures[0].value)
        return ordered[(len(ordered) - 1) // 2]


def _params(args: argparse.Namespace) -> SqsParams:
    return SqsParams(processes=args.processes or 4, messages=args.messages,
                     body_bytes=args.body_bytes, groups=args.groups, timeout_s=args.timeout,
                     client_nice=args.client_nice, client_cpus=args.client_cpus)


def run_sqs(args: argparse.Namespace, names: list[str]) -> int:
    params = _params(args)
    if args.against is not None and args.start == args.against:
        raise BenchError(f"--start and --against name the same server: {args.against}")
    with ExitStack() as stack:
        systems = _systems(args, stack)
        if args.warmup > 0:
            for endpoint in systems:
                warm = replace(params, messages=args.warmup)
                for name in _WARMUP_WORKLOADS:
                    SQS_WORKLOADS[name].run(endpoint, warm)
                _log(f"{endpoint.name}: warmed up ({args.warmup} messages sent and consumed)")
        outcomes = {(e.name, n): Outcome(e.name, n, []) for e in systems for n in names}
        for attempt in range(args.repeat):
            for name in names:
                order = systems if attempt % 2 == 0 else systems[::-1]
                for endpoint in order:
                    _run_one(endpoint, name, params, outcomes[endpoint.name, name],
                             f"{name} on {endpoint.name} (run {attempt + 1}/{args.repeat})")
    chosen = list(outcomes.values())
    if args.json:
        print_sqs_json(chosen, [e.name for e in systems], sys.stdout)
    else:
        print_sqs_tables(chosen, [e.name for e in systems], sys.stdout)
    return 0


def _run_one(endpoint: Endpoint, name: str, params: SqsParams, outcome: Outcome,
             label: str) -> None:
    if outcome.unsupported is not None:
        return
    try:
        result = SQS_WORKLOADS[name].run(endpoint, params)
    except SqsUnsupported as exc:
        outcome.unsupported = str(exc)
        _log(f"{label}: not run: {exc}")
        return
    headline = result.figures[0]
    _log(f"{label}: {headline.label} {headline.value:,.0f}")
    outcome.runs.append(result)


def _comparison(outcomes: list[Outcome], systems: list[str]) -> list[dict[str, Any]]:
    """With two systems: per figure, each one's median-run value, and the first's standing."""
    if len(systems) != 2:
        return []
    rows = []
    by_key = {(o.system, o.workload): o for o in outcomes}
    for workload in dict.fromkeys(o.workload for o in outcomes):
        ours, theirs = (by_key[s, workload].median() for s in systems)
        if ours is None or theirs is None:
            continue
        values = {f.label: f for f in theirs.figures}
        for figure in ours.figures:
            other = values.get(figure.label)
            if other is None or "load generator" in figure.label or not figure.unit:
                continue
            ahead = (figure.value > other.value if figure.at_least
                     else figure.value < other.value)
            rows.append({"workload": workload, "figure": figure.label, "unit": figure.unit,
                         systems[0]: figure.value, systems[1]: other.value,
                         "ratio": figure.value / other.value if other.value else None,
                         "ahead": ahead})
    return rows


def print_sqs_json(outcomes: list[Outcome], systems: list[str], stream: IO[str]) -> None:
    results: list[dict[str, Any]] = []
    for outcome in outcomes:
        median = outcome.median()
        results.append({
            "system": outcome.system, "workload": outcome.workload,
            "unsupported": outcome.unsupported,
            "median": median.to_json() if median is not None else None,
            "runs_msg_s": [r.figures[0].value for r in outcome.runs]})
    document = {"systems": systems, "results": results,
                "comparison": _comparison(outcomes, systems)}
    stream.write(json.dumps(document, indent=2) + "\n")


def print_sqs_tables(outcomes: list[Outcome], systems: list[str], stream: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    from .report import _number
    console = Console(file=stream, width=None if stream.isatty() else 160, highlight=False)
    table = Table("workload", "system", "figure", "median run", "all runs", title="lamina bench "
                  "(SQS)", title_justify="left")
    for outcome in outcomes:
        median = outcome.median()
        if median is None:
            table.add_row(outcome.workload, outcome.system, "not run",
                          outcome.unsupported or "", "")
            continue
        for index, figure in enumerate(median.figures):
            spread = ""
            if index == 0 and len(outcome.runs) > 1:
                spread = ", ".join(f"{r.figures[0].value:,.0f}" for r in outcome.runs)
            table.add_row(outcome.workload if index == 0 else "",
                          outcome.system if index == 0 else "", figure.label,
                          f"{_number(figure.value, figure.unit)} {figure.unit}".strip(), spread)
    console.print(table)
    rows = _comparison(outcomes, systems)
    if rows:
        versus = Table("workload", "figure", *systems, f"{systems[0]} / {systems[1]}", "",
                       title=f"{systems[0]} against {systems[1]} (median runs)",
                       title_justify="left")
        for row in rows:
            versus.add_row(row["workload"], row["figure"],
                           *(f"{_number(row[s], row['unit'])} {row['unit']}" for s in systems),
                           "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}",
                           "[green]ahead[/]" if row["ahead"] else "[red]behind[/]")
        console.print(versus)
    for outcome in outcomes:
        median = outcome.median()
        for note in median.notes if median is not None else []:
            console.print(f"note ({outcome.workload} on {outcome.system}): {note}", markup=False)
