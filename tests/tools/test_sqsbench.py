"""``lamina bench sqs-...`` end to end with tiny sizes, over real SQS endpoints: moto's server
(a dev dependency), ElasticMQ when its set-up is on this machine (started by the peers'
script, driven by the Query-protocol boto3 of that set-up) and Lamina's own gateway when this
build has one; and how the server's CPU is counted."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("hdrh")

from lamina.bench.spawn import cpu_seconds  # noqa: E402
from lamina.bench.sqsbench import tree_cpu_seconds  # noqa: E402
from lamina.bench.sqsrun import DEFAULT_PEERS_SCRIPT  # noqa: E402

TINY = ["--processes", "2", "--messages", "60", "--groups", "4", "--warmup", "0", "--json"]
PEERS_STATE = Path(os.environ.get("SQS_PEERS_STATE", "/tmp/sqs-peers"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[tuple[str, int]]:
    """moto's SQS server in a process of its own: (URL, pid)."""
    pytest.importorskip("moto.server", reason="moto[server] (a dev dependency) is not installed")
    pytest.importorskip("boto3", reason="boto3 (a dev dependency) is not installed")
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(10)


def _document(ran: Any) -> dict[str, Any]:
    assert ran.code == 0, ran.err
    return json.loads(ran.out)


def _figures(document: dict[str, Any], system: str, workload: str) -> dict[str, float]:
    result = next(r for r in document["results"]
                  if r["system"] == system and r["workload"] == workload)
    assert result["unsupported"] is None, result["unsupported"]
    return {f["label"]: f["value"] for f in result["median"]["figures"]}


@pytest.mark.slow
def test_every_sqs_workload_against_a_real_endpoint(moto_endpoint: tuple[str, int],
                                                    lamina: Any) -> None:
    url, pid = moto_endpoint
    document = _document(lamina(None, "bench", "sqs", "--endpoint", url, "--server-pid",
                                str(pid), *TINY))
    assert document["systems"] == [url] and document["comparison"] == []
    results = {r["workload"]: r for r in document["results"]}
    assert set(results) == {"sqs-send", "sqs-consume", "sqs-rounds", "sqs-fifo"}
    for workload, series_messages in {"sqs-send": [60], "sqs-rounds": [60, 60, 60, 60]}.items():
        median = results[workload]["median"]
        assert [s["messages"] for s in median["series"]] == series_messages, workload
        assert median["notes"] == [], median["notes"]
    # moto now and then hands a message out twice under concurrent receives (its visibility
    # bookkeeping is not atomic): the bench counts what it was given
    consume = [s["messages"] for s in results["sqs-consume"]["median"]["series"]]
    assert len(consume) == 3 and consume[0] == 60 and min(consume) >= 60, consume
    # moto's FIFO queues now and then hand a message out twice under concurrent receives:
    # the bench reports it rather than hides it
    sent, consumed = (s["messages"] for s in results["sqs-fifo"]["median"]["series"][:2])
    assert sent == 60 and consumed >= 60
    assert (consumed == 60) == (results["sqs-fifo"]["median"]["notes"] == [])
    send = _figures(document, url, "sqs-send")
    assert send["send msg/s"] > 0 and send["send p99"] >= send["send p50"] > 0
    assert send["send server CPU per message"] > 0
    assert results["sqs-send"]["median"]["series"][0]["operations"] == 3 + 3  # 30 each, by 10
    rounds = _figures(document, url, "sqs-rounds")
    assert rounds["round p50"] >= rounds["receive request p50"] > 0
    fifo = _figures(document, url, "sqs-fifo")
    assert fifo["receive+delete msg/s"] > 0 and fifo["send server CPU per message"] > 0
    assert "messages out of their group's order" in fifo


def _elasticmq_ready() -> str | None:
    """Why ElasticMQ cannot run here, or None."""
    if not DEFAULT_PEERS_SCRIPT.is_file():
        return f"the peers' script is not at {DEFAULT_PEERS_SCRIPT}"
    if shutil.which("java") is None:
        return "no java on PATH"
    jar = Path(os.environ.get("EMQ_DIR", PEERS_STATE / "elasticmq")) / "package"
    venv = Path(os.environ.get("BOTO3Q_VENV", PEERS_STATE / "venv-boto3-query"))
    if not list(jar.glob("elasticmq-server-*.jar")) or not (venv / "bin" / "python").exists():
        return "ElasticMQ is not set up on this machine (servers.sh setup elasticmq)"
    return None


@pytest.mark.slow
def test_a_peer_started_by_its_script_runs_alternately_beside_an_endpoint(
        moto_endpoint: tuple[str, int], lamina: Any) -> None:
    missing = _elasticmq_ready()
    if missing:
        pytest.skip(missing)
    url, pid = moto_endpoint
    ran = lamina(None, "bench", "sqs-send", "sqs-fifo", "--endpoint", url, "--server-pid",
                 str(pid), "--against", "elasticmq", "--repeat", "2", *TINY)
    document = _document(ran)
    assert document["systems"] == [url, "elasticmq"]
    order = [line.split(" on ")[1].split(" (run")[0] for line in ran.err.splitlines()
             if "sqs-send on" in line]
    assert order == [url, "elasticmq", "elasticmq", url]  # A B, then B A
    elasticmq = _figures(document, "elasticmq", "sqs-send")
    assert elasticmq["send msg/s"] > 0 and elasticmq["send server CPU per message"] > 0
    fifo = next(r for r in document["results"]
                if r["system"] == "elasticmq" and r["workload"] == "sqs-fifo")
    assert "no FIFO queues" in fifo["unsupported"] and fifo["median"] is None
    rows = {(r["workload"], r["figure"]): r for r in document["comparison"]}
    assert ("sqs-send", "send msg/s") in rows and ("sqs-fifo", "send msg/s") not in rows
    assert isinstance(rows["sqs-send", "send msg/s"]["ahead"], bool)
    started = next(line for line in ran.err.splitlines() if "elasticmq: pid" in line)
    elasticmq_pid = int(started.split("pid ")[1].split(",")[0])
    assert not Path(f"/proc/{elasticmq_pid}").exists(), "the bench left its ElasticMQ running"


def _has_sqs_gateway() -> bool:
    from lamina.server.config import add_serve_arguments
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return "--sqs-port" in parser._option_string_actions


@pytest.mark.slow
def test_lamina_gateway_started_and_measured(lamina: Any) -> None:
    if not _has_sqs_gateway():
        pytest.skip("this build's lamina serve has no --sqs-port")
    pytest.importorskip("boto3", reason="boto3 (a dev dependency) is not installed")
    one = str(min(os.sched_getaffinity(0)))  # placed, as a run can be: the same figures come
    document = _document(lamina(None, "bench", "sqs", "--start", "lamina", *TINY,
                                "--server-cpus", one, "--client-cpus", one))
    assert document["systems"] == ["lamina"]
    for workload in ("sqs-send", "sqs-consume", "sqs-rounds"):
        figures = _figures(document, "lamina", workload)
        assert next(iter(figures.values())) > 0, workload
    fifo = _figures(document, "lamina", "sqs-fifo")
    assert fifo["messages out of their group's order"] == 0


def test_clients_without_boto3_are_a_clear_error(tmp_path: Path, lamina: Any) -> None:
    no_site = tmp_path / "python-without-site-packages"
    no_site.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_site.chmod(0o755)
    ran = lamina(None, "bench", "sqs-send", "--endpoint", "http://127.0.0.1:9", "--python",
                 str(no_site), "--warmup", "0")
    assert ran.code == 1
    assert "need boto3 in the clients' interpreter" in ran.err


def test_a_missing_peers_script_is_named(tmp_path: Path, lamina: Any) -> None:
    missing = tmp_path / "servers.sh"
    ran = lamina(None, "bench", "sqs-send", "--start", "elasticmq", "--peers-script",
                 str(missing))
    assert ran.code == 1
    assert f"{missing} is missing" in ran.err


def test_sqs_and_protocol_workloads_run_in_separate_commands(lamina: Any) -> None:
    ran = lamina(None, "bench", "w1", "sqs-send", "--endpoint", "http://127.0.0.1:9")
    assert ran.code == 1 and "SQS workloads run in a command of their own" in ran.err
    ran = lamina(None, "bench", "sqs", "--endpoint", "http://127.0.0.1:9", "--start", "moto")
    assert ran.code == 1 and "give one" in ran.err


def test_a_running_endpoint_is_not_placed_by_the_bench(lamina: Any) -> None:
    ran = lamina(None, "bench", "sqs-send", "--endpoint", "http://127.0.0.1:9",
                 "--server-cpus", str(min(os.sched_getaffinity(0))))
    assert ran.code == 1 and "place a running server yourself" in ran.err


def test_server_cpu_counts_the_processes_under_it() -> None:
    spin = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
            "time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               f"subprocess.run([sys.executable, '-c', {spin!r}])"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while tree_cpu_seconds(parent.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tree_cpu_seconds(parent.pid) >= 0.4
        assert cpu_seconds(parent.pid) < 0.3  # the parent itself only waited
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_text_report_compares_median_runs_and_names_what_did_not_run() -> None:
    import io

    from lamina.bench.sqsrun import Outcome, print_sqs_tables
    from lamina.bench.workloads import Figure, WorkloadResult

    def run(msg_s: float, cpu_us: float) -> WorkloadResult:
        return WorkloadResult("sqs-send", "SQS send", {}, False, figures=[
            Figure("send msg/s", msg_s, "msg/s"),
            Figure("send server CPU per message", cpu_us, "µs", at_least=False)])

    outcomes = [Outcome("lamina", "sqs-send", [run(900, 50), run(1000, 60), run(5000, 40)]),
                Outcome("elasticmq", "sqs-send", [run(800, 70)]),
                Outcome("lamina", "sqs-fifo", [run(10, 1)]),
                Outcome("elasticmq", "sqs-fifo", [], unsupported="elasticmq has no FIFO queues")]
    out = io.StringIO()
    print_sqs_tables(outcomes, ["lamina", "elasticmq"], out)
    text = out.getvalue()
    assert "900, 1,000, 5,000" in text  # every run listed, the median (1,000) reported
    assert "elasticmq has no FIFO queues" in text
    rows = [line for line in text.splitlines() if "send msg/s" in line and "1.25" in line]
    assert rows and "ahead" in rows[0]  # 1,000 against 800
    cpu = next(line for line in text.splitlines() if "server CPU" in line and "0.86" in line)
    assert "ahead" in cpu  # 60 µs against 70: lower is ahead
