"""The file descriptor budget checked at start: ``--max-connections`` plus the store's and the
server's own files must fit the hard open-file limit, or ``lamina serve`` refuses to start."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lamina.server.files import files_needed


def serve_with_limit(data: Path, soft: int, hard: int, *args: str) -> subprocess.Popen[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.Popen(
        [sys.executable, "-m", "lamina.tools.cli", "serve", "--data", str(data), "--port", "0",
         *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=limit)


def first_event(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stderr is not None
    for line in process.stderr:
        event = json.loads(line)
        if event.get("event") in ("start", "config_error"):
            return event
    raise AssertionError("no start or config_error event")


def test_the_budget_counts_connections_and_the_store_and_server_files() -> None:
    assert files_needed(1000) - files_needed(0) == 1000
    assert files_needed(0) >= 512  # the store's table cache alone


@pytest.mark.slow
def test_a_hard_limit_below_the_budget_refuses_to_start_naming_the_flag(tmp_path: Path) -> None:
    process = serve_with_limit(tmp_path / "data", 256, 256, "--max-connections", "1000")
    event = first_event(process)
    assert process.wait(30) == 2
    message = str(event["message"])
    assert event["event"] == "config_error"
    assert "--max-connections 1000" in message and "256" in message
    assert not (tmp_path / "data").exists()  # refused before anything was opened


@pytest.mark.slow
def test_the_message_says_how_many_connections_fit(tmp_path: Path) -> None:
    hard = files_needed(0) + 100
    process = serve_with_limit(tmp_path / "data", hard, hard, "--max-connections", "500")
    event = first_event(process)
    assert process.wait(30) == 2
    assert "at most 100" in str(event["message"])


@pytest.mark.slow
def test_the_soft_limit_is_raised_to_a_hard_limit_that_covers_the_budget(
        tmp_path: Path) -> None:
    hard = files_needed(300)
    process = serve_with_limit(tmp_path / "data", 64, hard, "--max-connections", "300")
    try:
        assert first_event(process)["event"] == "start"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
