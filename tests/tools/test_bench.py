"""``lamina bench`` end to end with tiny sizes: every workload against servers it starts itself,
one against a running server, the PNG plots, the JSON report, the Redis comparator; and its
measuring parts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hdrh")
pytest.importorskip("matplotlib")

from lamina.bench.loadgen import Recorder, summarize  # noqa: E402
from lamina.bench.profiler import by_area, top_functions  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--processes", "2", "--messages", "320", "--rate", "400", "--duration", "0.5",
        "--connections", "20"]


@pytest.mark.slow
def test_every_workload_scaled_down_with_plots(tmp_path: Path, lamina: Any) -> None:
    plot = tmp_path / "plots" / "bench.png"
    ran = lamina(None, "bench", "all", *TINY, "--plot", str(plot), "--json")
    assert ran.code == 0, ran.err
    results = {r["workload"]: r for r in ran.json()["results"]}
    assert set(results) == {"w1", "w2", "w3", "w4", "idle"}

    def figure(workload: str, label: str) -> dict[str, Any]:
        return next(f for f in results[workload]["figures"] if f["label"].startswith(label))

    assert figure("w1", "produce")["value"] > 0 and figure("w1", "produce")["target"] == 100_000
    assert results["w1"]["series"][0]["messages"] == 320
    assert results["w2"]["series"][0]["messages"] == 320
    assert results["w2"]["params"]["round_trips_per_batch"] == 1  # delete_and_receive
    assert figure("w2", "consume")["target"] == 70_000
    e2e = next(s for s in results["w3"]["series"] if s["series"] == "end-to-end")
    assert e2e["messages"] == 200 and e2e["latency_ms"]["p99"] >= e2e["latency_ms"]["p50"] > 0
    assert figure("w3", "end-to-end p99")["target"] == 1.5
    assert {s["series"] for s in results["w4"]["series"]} == {"ping", "send", "receive+delete"}
    assert results["w4"]["params"]["client_poll_us"] == 0  # the client sleeps unless told
    assert figure("w4", "unbatched awaited sends")["target"] == 8_000
    idle = figure("idle", "server RSS growth")
    assert idle["target"] == 100 and idle["value"] < 100
    assert figure("idle", "connections the server reported")["value"] >= 20
    assert figure("w1", "server CPU per message")["value"] >= 0  # 10 ms ticks: may be 0

    for workload in ("w1", "w2", "w3", "w4"):
        png = plot.with_name(f"bench-{workload}.png")
        assert png.read_bytes()[:8] == PNG_MAGIC, workload
    assert not plot.with_name("bench-idle.png").exists()


@pytest.mark.slow
def test_fsync_server_and_table_output(tmp_path: Path, lamina: Any) -> None:
    plot = tmp_path / "w1.png"
    ran = lamina(None, "bench", "w1", *TINY, "--fsync", "--repeat", "2", "--plot", str(plot))
    assert ran.code == 0, ran.err
    assert "45,000" in ran.out  # the --fsync target
    assert "w1 --fsync" in ran.out and "best of 2 runs" in ran.out
    assert plot.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_round_trips_with_polling_off_on_both_sides(lamina: Any) -> None:
    ran = lamina(None, "bench", "w4", "--messages", "200", "--busy-poll-us", "0",
                 "--client-poll-us", "0", "--json")
    assert ran.code == 0, ran.err
    result = ran.json()["results"][0]
    assert result["params"]["client_poll_us"] == 0
    assert {s["series"]: s["operations"] for s in result["series"]} == {
        "ping": 200, "send": 200, "receive+delete": 200}


@pytest.mark.slow
def test_sequential_consumers(lamina: Any) -> None:
    ran = lamina(None, "bench", "w2", "--processes", "2", "--messages", "320", "--sequential",
                 "--json")
    assert ran.code == 0, ran.err
    result = ran.json()["results"][0]
    assert result["params"]["round_trips_per_batch"] == 2
    assert result["series"][0]["messages"] == 320 and result["notes"] == []


@pytest.mark.parametrize("option", ["--busy-poll-us", "--client-poll-us"])
def test_poll_windows_are_checked(lamina: Any, capsys: pytest.CaptureFixture[str],
                                  option: str) -> None:
    for bad in ("-1", "10001", "x"):
        with pytest.raises(SystemExit) as exc:
            lamina(None, "bench", "w4", option, bad)
        assert exc.value.code == 2
        assert option in capsys.readouterr().err


@pytest.mark.slow
def test_against_a_running_server(server: Any, lamina: Any) -> None:
    ran = lamina(server, "bench", "w2", "--processes", "2", "--messages", "100", "--json")
    assert ran.code == 0, ran.err
    result = ran.json()["results"][0]
    assert result["series"][0]["messages"] == 100
    # the bench cleans up after itself on a server it does not own
    listed = lamina(server, "queue", "list", "--json")
    assert listed.lines() == []


@pytest.mark.slow
def test_cost_per_request_kind(lamina: Any) -> None:
    ran = lamina(None, "bench", "cost", "--messages", "40", "--json")
    assert ran.code == 0, ran.err
    figures = {f["label"]: f["value"] for f in ran.json()["results"][0]["figures"]}
    for kind in ("ping", "send 1", "receive 1", "delete 1", "receive 1 + its delete",
                 "send 16", "receive 16", "delete 16"):
        assert figures[f"{kind}: server CPU"] >= 0
        assert figures[f"{kind}: round trip (mean)"] > 0


def test_server_cpu_is_read_to_the_nanosecond_from_every_thread() -> None:
    from lamina.bench.spawn import cpu_seconds, threads_cpu_ns
    burner = subprocess.Popen([sys.executable, "-c", _BURN_IN_TWO_THREADS],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout is not None and burner.stdout.readline().strip() == "burnt"
        threads = threads_cpu_ns(burner.pid)
        assert threads is not None
        # both threads' CPU, not the main thread's alone (each burnt 50 ms)
        main_ns = int(Path(f"/proc/{burner.pid}/schedstat").read_text().split()[0])
        assert threads - main_ns >= 40_000_000
        assert threads % 10_000_000 != 0  # not in clock ticks
        assert cpu_seconds(burner.pid) == pytest.approx(threads / 1e9, abs=0.05)
    finally:
        burner.kill()
        burner.wait()


_BURN_IN_TWO_THREADS = """
import threading, time
burnt = threading.Event()
def burn():
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
def worker():
    burn()
    burnt.set()
    time.sleep(60)  # alive: a server's threads are
threading.Thread(target=worker, daemon=True).start()
burn()
burnt.wait()
print("burnt", flush=True)
time.sleep(60)
"""


def test_idle_needs_the_server_pid(server: Any, lamina: Any) -> None:
    ran = lamina(server, "bench", "idle", "--connections", "5")
    assert ran.code == 1 and "--server-pid" in ran.err


def test_percentiles_and_throughput_from_samples() -> None:
    recorder = Recorder()
    recorder.start("op", 100.0)
    for i in range(1, 1001):  # 1000 ops of 2 messages over 1 s, latency i µs
        recorder.add("op", 100.0 + i / 1000, i / 1e6, 2)
    figures = summarize("op", [recorder.series["op"]])
    assert figures.operations == 1000 and figures.messages == 2000
    assert figures.messages_per_s == pytest.approx(2000)
    assert figures.percentiles_ms["p50"] == pytest.approx(0.5, rel=0.01)
    assert figures.percentiles_ms["p99"] == pytest.approx(0.99, rel=0.01)
    assert figures.percentiles_ms["max"] == pytest.approx(1.0)
    assert sum(figures.timeline["msg_s"]) > 0


def test_profile_function_totals(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text("main (a.py:1);handle (b.py:5);send (c.py:9) 30\n"
                   "main (a.py:1);handle (b.py:6) 10\n"
                   "main (a.py:2);receive (c.py:20) 60\n")
    total, rows = top_functions(raw)
    assert total == 100
    by_name = {name: (own, inclusive) for name, own, inclusive in rows}
    assert by_name["main (a.py)"] == (0, 100)
    assert by_name["handle (b.py)"] == (10, 40)
    assert by_name["receive (c.py)"] == (60, 60)


def test_profile_lines_cut_or_holding_a_carriage_return_are_read_or_skipped(tmp_path: Path
                                                                            ) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_bytes(b"main (a.py:1);send (odd\rname.py:9) 30\n"
                    b"main (a.py:1);handle (b.py:6) 10\n"
                    b"main (a.py:1);handle (b.py:")  # cut off mid-line
    total, rows = top_functions(raw)
    assert total == 40
    assert {name: own for name, own, _ in rows}["send (odd\rname.py)"] == 30
    assert by_area(raw)[0] == 40


def test_profile_areas_name_the_server_parts(tmp_path: Path) -> None:
    raw = tmp_path / "server.txt"
    raw.write_text(
        "run (trio/_core/_run.py:1);BusyPoll._poll (lamina/server/busypoll.py:2) 2\n"
        "run (trio/_core/_run.py:1);GroupApplier.apply_lone_now (lamina/server/applier.py:3)"
        " 1\n")
    assert by_area(raw)[1] == [("server: busy polling", 2),
                               ("server: applier and group commit", 1)]


def test_profile_areas(tmp_path: Path) -> None:
    raw = tmp_path / "server.txt"
    raw.write_text(
        "run (trio/_core/_run.py:1);GroupApplier._commit_group (lamina/server/applier.py:2);"
        "EngineCore._write_pending (lamina/engine/core.py:3);Store.flush (lamina/engine/"
        "store.py:4) 3\n"
        "run (trio/_core/_run.py:1);Connection._reader (lamina/server/connection.py:5);"
        "ServerConnection.receive_data (lamina/server/protocol.py:6) 1\n"
        "run (trio/_core/_run.py:1) 1\n")
    total, areas = by_area(raw)
    assert total == 5
    assert areas == [("engine: db.write (Store.flush)", 3),
                     ("server: parse requests (framing, CBOR decode)", 1),
                     ("trio: scheduler, cancel scopes, epoll", 1)]


def test_missing_hdrhistogram_is_a_clear_error(lamina: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    monkeypatch.setitem(sys.modules, "hdrh", None)
    monkeypatch.setitem(sys.modules, "hdrh.histogram", None)
    ran = lamina(None, "bench", "w1")
    assert ran.code == 1 and "pip install" in ran.err and "hdrhistogram" in ran.err


def test_json_report_is_one_document(tmp_path: Path) -> None:
    from lamina.bench.report import print_json
    from lamina.bench.workloads import Figure, WorkloadResult
    result = WorkloadResult("w1", "W1", {"messages": 1}, False, [Figure("produce", 1.0, "msg/s",
                                                                       100_000)])
    out = tmp_path / "out.json"
    with out.open("w") as stream:
        print_json([result], stream)
    doc = json.loads(out.read_text())
    assert doc["results"][0]["figures"][0]["met"] is False


# -- --against redis: the comparator's plumbing on a tiny run --------------------------------------

needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server is not on PATH (apt-get install redis-server): the Redis comparator "
           "cannot run")


@pytest.mark.slow
@needs_redis
def test_against_redis_runs_every_workload_on_both_and_compares_them(lamina: Any) -> None:
    pytest.importorskip("hiredis")
    ran = lamina(None, "bench", "all", "--against", "redis", *TINY, "--sequential",
                 "--client-poll-us", "200", "--json")  # w4's clients poll: both ways tried
    assert ran.code == 0, ran.err
    doc = ran.json()
    assert doc["peer"]["name"] == "redis" and doc["peer"]["title"].startswith("Redis")
    results = {(r["workload"], r["system"]): r for r in doc["results"]}
    assert set(results) == {(w, s) for w in ("w1", "w2", "w3", "w4")
                            for s in ("lamina", "redis")}  # "all": no idle against a peer
    for system in ("lamina", "redis"):
        series = {(r, s["series"]): s for (r, sys_), res in results.items() if sys_ == system
                  for s in res["series"]}
        assert series["w1", "send"]["messages"] == 320
        assert series["w2", "receive+delete"]["messages"] == 320
        assert series["w3", "end-to-end"]["messages"] == 200
        assert series["w4", "receive+delete"]["messages"] == 320
        assert results["w2", system]["params"]["round_trips_per_batch"] == 2
        assert results["w4", system]["params"]["client_poll_us"] == 200
        assert results["w1", system]["notes"] == []  # every entry sent is retained
    lines = {(c["workload"], c["figure"]): c for c in doc["comparison"]}
    for workload, headline in (("w1", "produce"), ("w2", "consume (receive + delete)"),
                               ("w3", "end-to-end p99"), ("w4", "unbatched awaited sends")):
        line = lines[workload, headline]
        assert line["lamina"] > 0 and line["redis"] > 0
        assert line["ratio"] == pytest.approx(line["lamina"] / line["redis"], rel=1e-3)
        assert line["better"] in ("lamina", "redis")
        peak = lines[workload, "server peak RSS"]
        assert peak["lamina"] > 1 and peak["redis"] > 1  # MB, read from /proc for both servers
        assert (workload, "server CPU per message" if workload != "w4"
                else "server CPU per request") in lines
    assert lines["w3", "end-to-end p50"]["better"] in ("lamina", "redis")
    assert lines["w4", "ping p99"]["unit"] == "ms"


@pytest.mark.slow
@needs_redis
def test_a_backlog_stays_beside_the_workload_on_both_systems_and_counts_in_peak_rss(
        lamina: Any) -> None:
    pytest.importorskip("hiredis")
    ran = lamina(None, "bench", "w4", "--against", "redis", "--messages", "50",
                 "--backlog", "3000", "--json")
    assert ran.code == 0, ran.err
    doc = ran.json()
    for result in doc["results"]:
        assert result["params"]["backlog"] == 3000
        peak = next(f for f in result["figures"] if f["label"] == "server peak RSS")
        assert peak["target"] == 100 and peak["at_least"] is False


@pytest.mark.slow
@needs_redis
def test_against_redis_alternates_the_systems_and_syncs_with_fsync(lamina: Any) -> None:
    pytest.importorskip("hiredis")
    ran = lamina(None, "bench", "w1", "--against", "redis", *TINY, "--fsync", "--repeat", "2")
    assert ran.code == 0, ran.err
    order = [line.split("(run ")[1][:3] + (" redis" if ") redis" in line else " lamina")
             for line in ran.err.splitlines() if "msg/s" in line]
    assert order == ["1/2 lamina", "1/2 redis", "2/2 redis", "2/2 lamina"]
    assert "Lamina beside Redis" in ran.out and "w1 --fsync" in ran.out
    assert "best of 2 runs" in ran.out


def test_against_refuses_workloads_a_peer_does_not_run(lamina: Any) -> None:
    ran = lamina(None, "bench", "idle", "--against", "redis")
    assert ran.code == 1 and "idle" in ran.err and "without --against" in ran.err
    ran = lamina(None, "bench", "w1", "--against", "redis", "--inflight", "2")
    assert ran.code == 1 and "--inflight" in ran.err


def test_against_redis_without_redis_server_says_how_to_install_it(
        lamina: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nowhere to find redis-server
    ran = lamina(None, "bench", "w1", "--against", "redis")
    assert ran.code == 1
    assert "redis-server" in ran.err and "apt-get install redis-server" in ran.err


@pytest.mark.slow
def test_a_redis_server_that_does_not_start_is_a_clear_error(
        lamina: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("hiredis")
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    ran = lamina(None, "bench", "w1", "--against", "redis", *TINY)
    assert ran.code == 1
    assert "redis-server did not start" in ran.err and "FATAL CONFIG FILE ERROR" in ran.err


@pytest.mark.parametrize(("option", "bad"), [
    ("--processes", "0"), ("--processes", "-1"), ("--messages", "0"), ("--messages", "-5"),
    ("--batch", "0"), ("--batch", "-3"), ("--inflight", "0"), ("--repeat", "0"),
    ("--connections", "0"), ("--rate", "-5"), ("--rate", "0"), ("--duration", "-1"),
    ("--timeout", "0"), ("--timeout", "nan"), ("--body-bytes", "-1"), ("--backlog", "-1"),
    ("--groups", "0"), ("--warmup", "-1"), ("--server-pid", "0"), ("--processes", "x"),
    ("--client-nice", "20"), ("--client-nice", "-21"), ("--batch", "1001")])
def test_bad_sizes_are_refused_naming_the_option(lamina: Any, capsys: pytest.CaptureFixture[str],
                                                 option: str, bad: str) -> None:
    with pytest.raises(SystemExit) as exc:
        lamina(None, "bench", "w1", option, bad)
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


def _serving_children() -> list[int]:
    """Pids of ``lamina serve`` processes this test process started and that still run."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == os.getpid() and b"serve" in cmdline and stat[stat.rindex(")") + 2] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_profile_without_py_spy_is_a_clear_error_and_stops_the_started_server(
        lamina: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lamina.bench.profiler.shutil.which", lambda *_a, **_k: None)
    ran = lamina(None, "bench", "w4", "--messages", "50", "--profile", "out.svg")
    assert ran.code == 1 and "py-spy" in ran.err and "Traceback" not in ran.err
    assert _serving_children() == []


@pytest.mark.slow
def test_a_lamina_server_that_does_not_start_is_a_clear_error(lamina: Any, tmp_path: Path
                                                              ) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    ran = lamina(None, "bench", "w4", "--messages", "50", "--data", str(not_a_folder))
    assert ran.code == 1 and "lamina serve did not start" in ran.err
    ran = lamina(None, "bench", "w4", "--messages", "50", "--server-python",
                 str(tmp_path / "no-python"))
    assert ran.code == 1 and "no-python" in ran.err
    ran = lamina(None, "bench", "sqs-rounds", "--messages", "50", "--warmup", "0",
                 "--server-python", str(tmp_path / "no-python"))
    assert ran.code == 1 and "no-python" in ran.err


def test_a_server_pid_of_no_process_is_refused(lamina: Any, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    with pytest.raises(SystemExit) as exc:
        lamina(None, "bench", "w4", "--server", "127.0.0.1:1", "--server-pid", str(gone.pid))
    assert exc.value.code == 2
    assert "--server-pid" in capsys.readouterr().err


def test_a_server_pid_without_the_server_it_belongs_to_is_refused(lamina: Any) -> None:
    ran = lamina(None, "bench", "w4", "--server-pid", str(os.getpid()))
    assert ran.code == 1 and "--server-pid" in ran.err and "--server" in ran.err
    ran = lamina(None, "bench", "sqs-rounds", "--server-pid", str(os.getpid()))
    assert ran.code == 1 and "--server-pid" in ran.err and "--endpoint" in ran.err


@pytest.mark.slow
def test_a_failed_run_against_a_running_server_leaves_no_queue_there(server: Any, lamina: Any
                                                                     ) -> None:
    ran = lamina(server, "bench", "w2", "--processes", "1", "--messages", "3000",
                 "--backlog", "10", "--timeout", "0.001")
    assert ran.code == 1 and "did not finish" in ran.err
    listed = lamina(server, "queue", "list", "--json")
    assert listed.lines() == []


@pytest.mark.slow
@needs_redis
def test_an_interrupt_while_redis_server_starts_stops_it(lamina: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hiredis")

    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt  # Ctrl-C while the bench waits for redis-server's first PONG

    monkeypatch.setattr("lamina.bench.peers.redis.RespConnection", interrupted)
    ran = lamina(None, "bench", "w4", "--against", "redis", "--messages", "20")
    assert ran.code == 130
    assert _serving_children() == []
