"""``python -m lamina.bench.echoreads``: bare echo servers' CPU a read, alternated."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from lamina.bench import echoreads
from lamina.bench.placement import pin_process, placement_of


@pytest.mark.slow
def test_echoreads_reports_each_server_for_each_connection_count(capsys):
    echoreads.main(["--rounds", "2", "--requests", "200", "--connections", "1",
                    "--connections", "3"])
    out = capsys.readouterr().out
    assert out.count("connection(s)") == 2
    for name in echoreads.SERVERS:
        lines = [line for line in out.splitlines() if line.split()[:1] == [name]]
        assert len(lines) == 2, out
        for line in lines:
            cpu_min, cpu_median, cpu_max = (float(v) for v in re.findall(r"\d+\.\d", line)[:3])
            assert 0 < cpu_min <= cpu_median <= cpu_max, line


def test_echoreads_names_an_unknown_server(capsys):
    with pytest.raises(SystemExit):
        echoreads.main(["--servers", "task,reactor"])
    assert "--servers: unknown reactor" in capsys.readouterr().err


def test_echoreads_places_the_servers_and_the_client_where_asked(capsys, monkeypatch):
    one = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    placed: list[frozenset[int]] = []
    client: list[set[int]] = []

    def pin_and_look(pid: int, cpus: frozenset[int]) -> None:
        pin_process(pid, cpus)
        placed.append(placement_of(pid))
        client.append(os.sched_getaffinity(0))

    monkeypatch.setattr(echoreads, "pin_process", pin_and_look)
    echoreads.main(["--servers", "bare,task", "--rounds", "1", "--requests", "50",
                    "--connections", "1", "--server-cpus", str(one), "--client-cpus", str(one)])
    assert placed == [{one}, {one}] and client == [{one}, {one}]
    assert os.sched_getaffinity(0) == before  # the caller's own placement is given back
    assert capsys.readouterr().out.count("connection(s)") == 1


def _figures(out: str, name: str) -> tuple[float, float, float]:
    line = next(line for line in out.splitlines() if line.split()[:1] == [name])
    cpu_min, cpu_median, cpu_max = (float(v) for v in re.findall(r"\d+\.\d", line)[:3])
    return cpu_min, cpu_median, cpu_max


@pytest.mark.slow
def test_echoreads_measures_lamina_ping_beside_the_bare_echo(capsys):
    echoreads.main(["--servers", "bare,lamina", "--rounds", "2", "--requests", "200",
                    "--connections", "2"])
    out = capsys.readouterr().out
    for name in ("bare", "lamina"):
        cpu_min, cpu_median, cpu_max = _figures(out, name)
        assert 0 < cpu_min <= cpu_median <= cpu_max, out


@pytest.mark.slow
def test_echoreads_measures_redis_ping_when_redis_server_is_installed(capsys):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH")
    echoreads.main(["--servers", "redis", "--rounds", "2", "--requests", "200",
                    "--connections", "1"])
    cpu_min, _, _ = _figures(capsys.readouterr().out, "redis")
    assert cpu_min > 0
