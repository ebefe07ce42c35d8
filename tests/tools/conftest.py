"""Fixtures for the command-line tests: a server in a thread of the test process (the helpers
of ``tests/support/servers.py``) and ``lamina`` run in-process."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.servers import KEYS, ThreadServer, server_thread

from lamina.tools.cli import main


@dataclass
class Ran:
    """One in-process ``lamina`` run: its exit code and what it printed."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadServer]:
    with server_thread(tmp_path / "data") as running:
        yield running


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[ThreadServer]:
    with server_thread(tmp_path / "auth-data", keys=KEYS) as running:
        yield running


@pytest.fixture
def lamina(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``lamina(server, *argv, stdin=None)`` -> Ran; ``--server`` is added for ``server``."""

    def run(server: ThreadServer | None, *argv: str, stdin: str | None = None) -> Ran:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        args = list(argv)
        if server is not None:
            args += ["--server", f"127.0.0.1:{server.port}"]
        code = main(args)
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


# -- Spark (test_spark.py): one local[2] session for the whole test session ----------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with the ``lamina`` source registered (started once: ~15 s)."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    import os

    # Spark's Python workers must run this interpreter (FACTS.md).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from lamina.tools.spark import register

    session = (SparkSession.builder.master("local[2]").appName("lamina-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
