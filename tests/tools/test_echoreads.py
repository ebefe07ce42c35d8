"""``python -m lamina.bench.echoreads``: bare echo servers' CPU a read, alternated."""

from __future__ import annotations

import re
import shutil

import pytest

from lamina.bench import echoreads


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
