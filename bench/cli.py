"""``lamina bench``: the load generator's command line.

    lamina bench w1 [w2 w3 w4 idle | all] [--fsync] [--repeat N] [--plot out.png] [--json]
    lamina bench w3 --server 127.0.0.1:7766      # against a running server instead
    lamina bench all --against redis --repeat 2  # beside Redis Streams, runs alternated

By default each run of each workload starts its own ``lamina serve`` (a fresh temporary data
directory, any free port, ``--fsync`` if asked) and stops it afterwards, so runs do not see
each other's data and the bench knows the server's pid (for its CPU time, its memory and
``--profile``). With ``--server`` the bench uses that server (``--server-pid`` to get the same
figures from it). Workload options override the default sizes (for quick runs and tests).

``--against PEER`` runs the same workloads on a peer (``peers/``) too, each run of Lamina
followed or preceded by one of the peer (the order alternates, so drift of the machine weighs
on both alike), and prints the two side by side (``compare.py``).

This module only registers the command; the workloads, hdrhistogram and matplotlib are
imported when it runs (a clear error names what is missing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .placement import cpus_option

__all__ = ["add_bench_command", "run_bench"]

_DESCRIPTION = """\
Run the benchmark workloads against a Lamina server and report throughput, latency percentiles
(HdrHistogram) and CPU per message; --plot writes throughput and latency over time.

  w1    produce: 4 processes, batches of 16, 200,000 messages       (target 100,000 msg/s)
  w2    consume: 4 processes, receive up to 16 + delete, pre-filled (target  70,000 msg/s)
        (each delete goes with the next receive; --sequential: a round trip each)
  w3    latency: 2,000 msg/s paced for 10 s, one long-polling consumer (p99 1.5 ms)
  w4    round trips: 20,000 awaited sends, then receive 1 + delete 1 (8,000 / 5,000 per s)
  idle  1,000 idle connections: the server's memory growth             (100 MB)
  cost  the server's CPU per request of each kind (ping, send/receive/delete of 1 and 16,
        and a receive of 1 with its delete: a pair)

By default every run starts its own `lamina serve` on a fresh temporary directory (with
--fsync if given) and stops it after; --server HOST:PORT uses a running one instead.

--against redis runs w1-w4 on Redis Streams as well, through a client of the same care (the
hiredis parser, one round trip per batch), on a private redis-server started for each run on a
free loopback port: in memory, or with --fsync an append-only file synced before every answer
(appendfsync always). Runs alternate between the two; the report shows each figure of both and
the ratio. redis-server must be on PATH (Debian, Ubuntu: apt-get install redis-server; Fedora:
dnf install redis; macOS: brew install redis).

The clients sleep on their sockets while waiting for answers, as applications' clients do;
--client-poll-us makes w4's client poll instead (faster round trips, a core spent polling).
Where the processes run is the scheduler's choice unless --server-cpus and --client-cpus place
them; on a virtual machine a server on a CPU of its own is woken from a halt for every awaited
request, and that is charged to its CPU time.

SQS workloads (boto3 clients, against any SQS endpoint; 256-byte bodies):
  sqs-send     4 processes, SendMessageBatch of 10, 20,000 messages
  sqs-consume  4 processes, ReceiveMessage 10 + DeleteMessageBatch, pre-filled 20,000
  sqs-rounds   one client: SendMessage, ReceiveMessage 1, DeleteMessage, 2,000 rounds
  sqs-fifo     a FIFO queue, 100 message groups: batches of 10 sent, then consumed
  sqs          those four
They run against a `lamina serve --sqs-port` the bench starts, --endpoint URL, or a peer
server (--start elasticmq|localstack|moto); --against NAME runs a peer alternately beside the
first system and compares them.
"""

#: The workloads a peer runs (``--against``); idle and cost measure Lamina alone.
PEER_WORKLOADS = ("w1", "w2", "w3", "w4")

WORKLOAD_NAMES = ("w1", "w2", "w3", "w4", "idle")  # "all"; "cost" only by name
SQS_WORKLOAD_NAMES = ("sqs-send", "sqs-consume", "sqs-rounds", "sqs-fifo")  # "sqs": the four
SQS_PEERS = ("elasticmq", "localstack", "moto")


def _poll_window(text: str) -> int:
    """A busy-poll window in µs, checked here (the server and the client check it too)."""
    from lamina.server.busypoll import MAX_BUSY_POLL_US
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= MAX_BUSY_POLL_US:
        raise argparse.ArgumentTypeError(f"must be 0..{MAX_BUSY_POLL_US} µs")
    return value


def _pid(text: str) -> int:
    """The pid of a running process (``--server-pid``)."""
    from lamina.tools.cmdvalues import parse_count
    pid = parse_count(text)
    if not Path(f"/proc/{pid}").exists():
        raise argparse.ArgumentTypeError(f"no process has pid {pid}")
    return pid


def _rate(text: str) -> float:
    """Messages per second: more than 0 and finite."""
    from lamina.tools.cmdvalues import parse_seconds
    try:
        return parse_seconds(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a number more than 0 and finite, got "
                                         f"{text!r}") from None


def add_bench_command(commands: Any) -> None:
    """Add ``bench`` to the ``lamina`` parser's subparsers."""
    from lamina.engine.validation import MAX_BATCH
    from lamina.tools.cmdvalues import (  # cheap: no client import
        parse_seconds, parse_server, whole_number)

    from .peers import PEER_NAMES  # cheap: the names only
    parser = commands.add_parser(
        "bench", help="run the load-generator workloads against a server",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+",
                        choices=(*WORKLOAD_NAMES, "cost", "all", *SQS_WORKLOAD_NAMES, "sqs"),
                        metavar="WORKLOAD",
                        help="w1 w2 w3 w4 idle (or all: those five), cost; sqs-send sqs-consume "
                             "sqs-rounds sqs-fifo (or sqs: those four)")
    where = parser.add_argument_group("the server")
    where.add_argument("--server", type=parse_server, metavar="HOST:PORT",
                       help="use this running server (default: start one per run)")
    where.add_argument("--server-pid", type=_pid, metavar="PID",
                       help="with --server or --endpoint: its pid, for CPU, memory and "
                            "--profile (default none: no server figures)")
    where.add_argument("--fsync", action="store_true",
                       help="start the server with --fsync and use the --fsync targets "
                            "(default off)")
    where.add_argument("--busy-poll-us", type=_poll_window, metavar="US",
                       help="start the server with --busy-poll-us US (default: the server's "
                            "default, 100)")
    where.add_argument("--data", type=Path, metavar="DIR",
                       help="data directory of the started server (default: a temporary one)")
    where.add_argument("--server-cpus", type=cpus_option, metavar="LIST",
                       help="run the servers the bench starts (Lamina's and the peer's) on "
                            "these CPUs, e.g. 1 or 0-1 (default: where the scheduler puts "
                            "them)")
    sqs = parser.add_argument_group("the SQS workloads")
    sqs.add_argument("--endpoint", metavar="URL",
                     help="an SQS endpoint to use (--server-pid: its server's pid, for CPU; "
                          "default: start one)")
    sqs.add_argument("--start", choices=("lamina", *SQS_PEERS),
                     help="start this server for the command (default without --endpoint: "
                          "lamina serve --sqs-port)")
    sqs.add_argument("--python", metavar="PATH",
                     help="interpreter of the SQS client processes (it needs boto3; default: "
                          "this one)")
    sqs.add_argument("--peer-python", metavar="PATH",
                     help="interpreter of the clients of --against's server (default: the "
                          "Query-protocol boto3 of the peers' set-up for elasticmq, else this "
                          "one)")
    sqs.add_argument("--server-python", metavar="PATH",
                     help="interpreter whose lamina to start, for any workload (another "
                          "checkout's to compare two versions; default: this one)")
    sqs.add_argument("--peers-script", type=Path, metavar="PATH",
                     help="script that starts and stops the peer servers (default: "
                          "shared/peers/sqs/servers.sh beside the repository)")
    sqs.add_argument("--region", default="us-east-1", metavar="REGION",
                     help="SigV4 region (default us-east-1)")
    sqs.add_argument("--access-key", metavar="ID",
                     help="access key id (default: $AWS_ACCESS_KEY_ID, else 'test')")
    sqs.add_argument("--secret-key", metavar="SECRET",
                     help="secret access key (default: $AWS_SECRET_ACCESS_KEY, else 'test')")
    sqs.add_argument("--groups", type=whole_number(1), default=100, metavar="N",
                     help="sqs-fifo message groups (default 100)")
    sqs.add_argument("--warmup", type=whole_number(0), default=2000, metavar="N",
                     help="messages each started system first sends and consumes unmeasured "
                          "(default 2000; 0: none)")
    where.add_argument("--against", choices=(*PEER_NAMES, *SQS_PEERS), metavar="PEER",
                       help="run the workloads on PEER too, alternating runs, and show both "
                            f"side by side: {', '.join(PEER_NAMES)} for w1-w4 (a private "
                            "server on a free loopback port, started and stopped by the bench), "
                            f"{', '.join(SQS_PEERS)} for the SQS workloads (started by "
                            "--peers-script); default none")
    sizes = parser.add_argument_group("workload sizes (default: the sizes listed above)")
    sizes.add_argument("--processes", type=whole_number(1), metavar="N",
                       help="client processes (w1, w2, sqs-send, sqs-consume, sqs-fifo; "
                            "default 4)")
    sizes.add_argument("--messages", type=whole_number(1), metavar="N",
                       help="messages (default w1, w2: 200,000; w4: 20,000; sqs-send, "
                            "sqs-consume, sqs-fifo: 20,000; rounds of sqs-rounds: 2,000)")
    sizes.add_argument("--batch", type=whole_number(1, MAX_BATCH), metavar="N",
                       help=f"messages per send (w1) or receive (w2, w3), 1-{MAX_BATCH}; "
                            "default 16")
    sizes.add_argument("--body-bytes", type=whole_number(0), default=256, metavar="BYTES",
                       help="body size (default 256)")
    sizes.add_argument("--inflight", type=whole_number(1), default=1, metavar="N",
                       help="requests in flight per process (w1, w2; default 1)")
    sizes.add_argument("--sequential", action="store_true",
                       help="w2: each consumer receives, then deletes, in two round trips "
                            "(default: each delete goes with the next receive, one round "
                            "trip per batch: Client.delete_and_receive)")
    sizes.add_argument("--backlog", type=whole_number(0), default=0, metavar="N",
                       help="before each run send N messages to a queue of their own and "
                            "keep them there while the workload runs, on each system (not "
                            "measured; the server's peak RSS includes them; default 0)")
    sizes.add_argument("--rate", type=_rate, metavar="PER_SECOND",
                       help="w3 messages per second (default 2000)")
    sizes.add_argument("--duration", type=parse_seconds, metavar="SECONDS",
                       help="w3 run time (default 10)")
    sizes.add_argument("--connections", type=whole_number(1), metavar="N",
                       help="idle connections (default 1000)")
    sizes.add_argument("--client-poll-us", type=_poll_window, default=0, metavar="US",
                       help="w4: the client busy-polls this long for each answer before "
                            "sleeping (Client busy_poll_us; default 0: it sleeps on its "
                            "socket at once, as applications' clients do)")
    sizes.add_argument("--client-nice", type=whole_number(-20, 19), default=0, metavar="N",
                       help="run the client processes at nice N (default 0: as the server)")
    sizes.add_argument("--client-cpus", type=cpus_option, metavar="LIST",
                       help="run the client processes on these CPUs, e.g. 0 (default: where "
                            "the scheduler puts them; with --server-cpus, a CPU of their own "
                            "makes every awaited request wake the server's)")
    output = parser.add_argument_group("runs and output")
    output.add_argument("--repeat", type=whole_number(1), default=1, metavar="N",
                        help="run each workload N times; report the best (SQS workloads: the "
                             "median run by msg/s, the lower middle one of an even count; with "
                             "--against, N runs of each system, alternated; default 1)")
    output.add_argument("--plot", type=Path, metavar="OUT.png",
                        help="write throughput and latency over time (several workloads: "
                             "OUT-w1.png, ...; default none)")
    output.add_argument("--profile", type=Path, metavar="FILE",
                        help="py-spy the server during each measured phase (.svg flame graph, "
                             ".json speedscope, else raw collapsed stacks; default none)")
    output.add_argument("--profile-gil", action="store_true",
                        help="with --profile: only samples holding the GIL (default off)")
    output.add_argument("--json", action="store_true",
                        help="print the results as JSON (default a table)")
    output.add_argument("--timeout", type=parse_seconds, default=600.0, metavar="SECONDS",
                        help="give up on a workload after this long (default 600)")
    parser.set_defaults(run=run_bench)


def _log(message: str) -> None:
    sys.stderr.write(f"lamina bench: {message}\n")
    sys.stderr.flush()


def _numbered(base: Path, tag: str) -> Path:
    return base.with_name(f"{base.stem}-{tag}{base.suffix}")


def _headline(result: Any) -> Any:
    """The figure runs are compared by: the first with a target, else the first."""
    return next((f for f in result.figures if f.target is not None), result.figures[0])


def _score(result: Any) -> float:
    """How good a run was by its headline figure (higher is better; a figure without a
    target, such as the cost workload's CPU times, is better lower)."""
    figure = _headline(result)
    return figure.value if figure.target is not None and figure.at_least else -figure.value


def run_bench(args: argparse.Namespace) -> int:
    from .loadgen import BenchError, import_hdrhistogram
    try:
        import_hdrhistogram()
        sqs = [n for n in args.workloads if n == "sqs" or n in SQS_WORKLOAD_NAMES]
        if not sqs:
            return _run(args)
        if len(sqs) != len(args.workloads):
            raise BenchError("the SQS workloads run in a command of their own")
        return _run_sqs(args)
    except BenchError as exc:
        _log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        _log("interrupted")
        return 130


def _run_sqs(args: argparse.Namespace) -> int:
    from .loadgen import BenchError
    from .sqsrun import DEFAULT_PEERS_SCRIPT, run_sqs
    if args.server is not None or args.plot is not None or args.profile is not None:
        raise BenchError("--server, --plot and --profile are for the Lamina protocol workloads; "
                         "the SQS ones take --endpoint (or --start)")
    if args.against is not None and args.against not in SQS_PEERS:
        raise BenchError(f"--against {args.against} runs w1-w4; the SQS workloads compare with "
                         f"{', '.join(SQS_PEERS)}")
    if args.endpoint is not None and args.start is not None:
        raise BenchError("--endpoint and --start both name the system to measure: give one")
    if args.server_pid is not None and args.endpoint is None:
        raise BenchError("--server-pid is the pid of --endpoint's server (the servers the "
                         "bench starts are measured without it)")
    names = (list(SQS_WORKLOAD_NAMES) if "sqs" in args.workloads
             else list(dict.fromkeys(args.workloads)))
    args.peers_script = args.peers_script or DEFAULT_PEERS_SCRIPT
    return run_sqs(args, names)


def _run(args: argparse.Namespace) -> int:
    from .loadgen import BenchError
    from .report import plot, plot_paths, print_json, print_tables
    from .workloads import Params

    names = list(WORKLOAD_NAMES) if "all" in args.workloads else list(dict.fromkeys(args.workloads))
    if args.server_pid is not None and args.server is None:
        raise BenchError("--server-pid is the pid of --server HOST:PORT's server (the servers "
                         "the bench starts are measured without it)")
    peer = None
    if args.against is not None:
        if args.against in SQS_PEERS:
            from .peers import PEER_NAMES
            raise BenchError(f"--against {args.against} is a peer for the SQS workloads; w1-w4 "
                             f"compare with {', '.join(PEER_NAMES)}")
        others = [n for n in names if n not in PEER_WORKLOADS]
        if "all" in args.workloads:
            names = [n for n in names if n in PEER_WORKLOADS]
        elif others:
            raise BenchError(f"--against runs {', '.join(PEER_WORKLOADS)}; {', '.join(others)} "
                             "measure Lamina alone (run them without --against)")
        if args.inflight != 1:
            raise BenchError("--against runs one request in flight per client process; leave "
                             "--inflight at 1")
        from .peers import load_peer
        peer = load_peer(args.against)
    params = Params(processes=args.processes, messages=args.messages, batch=args.batch,
                    body_bytes=args.body_bytes, inflight=args.inflight, rate=args.rate,
                    sequential=args.sequential, backlog=args.backlog,
                    duration_s=args.duration, connections=args.connections,
                    client_poll_us=args.client_poll_us)
    if args.server is not None and args.fsync:
        _log("--fsync with --server: the --fsync targets apply; whether the server syncs is "
             "its own setting")
    if args.server is not None and args.busy_poll_us is not None:
        _log("--busy-poll-us with --server: ignored (the running server has its own)")
    if args.server is not None and args.server_cpus is not None:
        raise BenchError("--server-cpus places the servers the bench starts; place a running "
                         "server yourself (taskset -a -c -p LIST PID)")
    many_profiles = len(names) * args.repeat > 1
    best: list[Any] = []
    pairs: list[tuple[Any, Any]] = []
    for name in names:
        runs: list[Any] = []
        peer_runs: list[Any] = []
        for attempt in range(1, args.repeat + 1):
            label = f"{name}{' --fsync' if args.fsync else ''} (run {attempt}/{args.repeat})"
            if peer is not None and attempt % 2 == 0:  # alternate which system goes first
                peer_runs.append(_run_peer(peer, name, label, args, params))
            runs.append(_run_lamina(name, attempt, label, args, params, many_profiles))
            if peer is not None and attempt % 2 == 1:
                peer_runs.append(_run_peer(peer, name, label, args, params))
        best.append(_best(runs))
        if peer is not None:
            pairs.append((best[-1], _best(peer_runs)))
    if args.plot is not None:
        for result, path in plot_paths(args.plot, best):
            plot(result, path)
            _log(f"plot written to {path}")
    if peer is not None:
        from .compare import print_comparison, print_comparison_json
        if args.json:
            print_comparison_json(pairs, peer.name, peer.title, sys.stdout)
        else:
            print_comparison(pairs, peer.name, peer.title, sys.stdout)
    elif args.json:
        print_json(best, sys.stdout)
    else:
        print_tables(best, sys.stdout)
    return 0


def _best(runs: list[Any]) -> Any:
    """The best of a system's runs of one workload, the others' headlines in its notes."""
    chosen = max(runs, key=_score)
    if len(runs) > 1:
        others = "; ".join(f"{_headline(r).label} {_headline(r).value:,.4g} "
                           f"{_headline(r).unit}" for r in runs if r is not chosen)
        chosen.notes.append(f"best of {len(runs)} runs by "
                            f"{_headline(chosen).label}; the others: {others}")
    return chosen


def _place_server(server: Any, args: argparse.Namespace) -> frozenset[int] | None:
    """``--server-cpus``: every thread of a server the bench started (``pid``, ``stop()``)
    onto those CPUs; -> where the kernel now has it (reported with the figures). The server
    is stopped if that fails."""
    if args.server_cpus is None:
        return None
    from .loadgen import BenchError
    from .placement import describe, pin_process, placement_of
    try:
        pin_process(server.pid, args.server_cpus)
        placed = placement_of(server.pid)
        if placed != args.server_cpus:
            raise BenchError(f"the server (pid {server.pid}) runs on CPUs {describe(placed)}, "
                             f"not --server-cpus {describe(args.server_cpus)}")
    except BaseException:
        server.stop()
        raise
    return placed


def _log_headline(label: str, result: Any) -> None:
    headline = ", ".join(f"{f.label} {f.value:,.3g} {f.unit}" for f in result.figures
                         if f.target is not None)
    _log(f"{label}: {headline}")


def _run_lamina(name: str, attempt: int, label: str, args: argparse.Namespace, params: Any,
                many_profiles: bool) -> Any:
    """One run of workload ``name`` on Lamina (a server of its own unless ``--server``)."""
    from lamina.engine.errors import LaminaError

    from .loadgen import BenchError
    from .profiler import PySpy
    from .spawn import SpawnedServer
    from .workloads import WORKLOADS, Run, drop_after_failure, drop_backlog, fill_backlog

    spawned = None
    placed = None
    if args.server is None:
        extra = (() if args.busy_poll_us is None
                 else ("--busy-poll-us", str(args.busy_poll_us)))
        try:
            spawned = SpawnedServer.start(fsync=args.fsync, data=args.data, extra_args=extra,
                                          python=args.server_python)
        except (RuntimeError, OSError) as exc:  # it exited, or its interpreter is missing
            raise BenchError(str(exc)) from None
        address, pid = spawned.address, spawned.pid
        placed = _place_server(spawned, args)
        _log(f"{label}: server pid {pid} on {address[0]}:{address[1]}")
    else:
        address, pid = args.server, args.server_pid
        _log(f"{label}: server {address[0]}:{address[1]}")
    profiler = None
    run: Run | None = None
    try:
        if args.profile is not None and name not in ("idle", "cost"):
            if pid is None:
                raise BenchError("--profile needs the server's pid (--server-pid)")
            path = (_numbered(args.profile, f"{name}-{attempt}") if many_profiles
                    else args.profile)
            try:
                profiler = PySpy(pid, path, gil=args.profile_gil)
            except RuntimeError as exc:  # no py-spy
                raise BenchError(str(exc)) from None
        run = Run(address, pid, args.fsync, args.timeout, args.client_nice,
                  on_start=profiler.start if profiler else None,
                  on_stop=profiler.stop if profiler else None,
                  client_cpus=args.client_cpus, server_cpus=placed)
        fill_backlog(run, params)
        result = WORKLOADS[name].run(run, params)
        if args.server is not None:
            drop_backlog(run, params)
    except Exception as exc:
        if args.server is not None and run is not None:
            drop_after_failure(run, name, params)
        if isinstance(exc, LaminaError):
            raise BenchError(f"{name}: the server refused a request: {exc.code}: "
                             f"{exc.message}") from None
        raise
    finally:
        if spawned is not None:
            code = spawned.stop()
            if code not in (0, None):
                _log(f"the server exited with code {code}: "
                     + " | ".join(str(l.get("message")) for l in spawned.log[-5:]))
    if profiler is not None:
        _log(f"{label}: profile written to {profiler.output}")
    _log_headline(f"{label} lamina" if args.against else label, result)
    return result


def _run_peer(peer: Any, name: str, label: str, args: argparse.Namespace, params: Any) -> Any:
    """One run of workload ``name`` on a private server of ``peer``, started and stopped here."""
    from .workloads import Run

    server = peer.start(args.fsync)
    placed = _place_server(server, args)
    _log(f"{label} {peer.name}: server pid {server.pid} on "
         f"{server.address[0]}:{server.address[1]}")
    run = Run(server.address, server.pid, args.fsync, args.timeout, args.client_nice,
              client_cpus=args.client_cpus, server_cpus=placed)
    try:
        if params.backlog:
            peer.fill_backlog(run, params.backlog, params.body_bytes)
        result = peer.workloads[name](run, params)
    finally:
        code = server.stop()
        if code not in (0, None):
            _log(f"{peer.name} exited with code {code}")
    _log_headline(f"{label} {peer.name}", result)
    return result
