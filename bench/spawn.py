"""The server under test: a ``lamina serve`` subprocess the bench starts (the default), or one
already running (``--server``), and what the bench reads about its process from ``/proc``.

A spawned server gets a fresh data directory (a temporary one unless ``--data`` is given), any
free port, and the options given (``--fsync``); it is stopped with SIGTERM (a graceful
shutdown) when the bench is done with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .placement import threads

__all__ = ["ProcessStats", "SpawnedServer", "cpu_seconds", "peak_rss_bytes", "rss_bytes",
           "stop_process"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: How long a spawned server may take to say it listens.
_START_TIMEOUT_S = 30.0


def _status_bytes(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {name[:-1]} for process {pid}")


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (``VmRSS`` of ``/proc/PID/status``)."""
    return _status_bytes(pid, "VmRSS:")


def peak_rss_bytes(pid: int) -> int:
    """The highest resident set size process ``pid`` has had (``VmHWM``)."""
    return _status_bytes(pid, "VmHWM:")


def threads_cpu_ns(pid: int) -> int | None:
    """CPU time the live threads of process ``pid`` have used, in ns: the scheduler's own
    count (``/proc/PID/task/*/schedstat``); None where the kernel keeps none."""
    total_ns, counted = 0, False
    for tid in threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total_ns += int(f.read().split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile, or no schedstat
            continue
        counted = True
    return total_ns if counted else None


def cpu_seconds(pid: int) -> float:
    """CPU time process ``pid`` has used: its live threads' to the ns (``threads_cpu_ns``;
    threads that ended are not in it, and the servers measured keep theirs), else user +
    system time in clock ticks (10 ms: 2 µs a request over 5,000 requests)."""
    threads_ns = threads_cpu_ns(pid)
    if threads_ns is not None:
        return threads_ns / 1e9
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


@dataclass
class ProcessStats:
    """CPU and memory of the server process over one measured phase."""

    pid: int
    cpu_start_s: float = 0.0
    cpu_s: float | None = None
    rss_end_bytes: int | None = None
    #: The process's peak RSS so far (since it started: a server the bench started for this
    #: run has run nothing else).
    peak_rss_bytes: int | None = None

    def start(self) -> None:
        self.cpu_start_s = cpu_seconds(self.pid)

    def stop(self) -> None:
        self.cpu_s = cpu_seconds(self.pid) - self.cpu_start_s
        self.rss_end_bytes = rss_bytes(self.pid)
        self.peak_rss_bytes = peak_rss_bytes(self.pid)


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> int | None:
    """SIGTERM, wait for the graceful shutdown (SIGKILL after ``timeout_s``); -> exit code."""
    code = process.poll()
    if code is None:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    return code


@dataclass
class SpawnedServer:
    """A ``lamina serve`` subprocess; use as a context manager (stops it and removes a
    temporary data directory)."""

    process: subprocess.Popen[str]
    host: str
    port: int
    data: Path
    temporary: bool
    log: list[dict[str, Any]] = field(default_factory=list)
    _drain: threading.Thread | None = None

    @classmethod
    def start(cls, *, fsync: bool = False, data: Path | None = None,
              extra_args: tuple[str, ...] = (), python: str | None = None) -> SpawnedServer:
        """``python``: the interpreter whose ``lamina`` to run (default: this one's)."""
        temporary = data is None
        folder = Path(tempfile.mkdtemp(prefix="lamina-bench-")) if data is None else data
        command = [python or sys.executable, "-m", "lamina.tools.cli", "serve", "--data", str(folder),
                   "--host", "127.0.0.1", "--port", "0", *(["--fsync"] if fsync else []),
                   *extra_args]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        server = cls(process, "127.0.0.1", 0, folder, temporary)
        timer = threading.Timer(_START_TIMEOUT_S, process.kill)
        timer.start()
        try:
            server.port = server._wait_for_start()
        except BaseException:
            server.stop()
            raise
        finally:
            timer.cancel()
        server._drain = threading.Thread(target=server._read_log, daemon=True)
        server._drain.start()
        return server

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def _wait_for_start(self) -> int:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = self._parse(raw)
            if line.get("event") == "start":
                return int(line["port"])
        raise RuntimeError(f"lamina serve did not start (exit code {self.process.wait()}): "
                           + " | ".join(str(line.get("message", line)) for line in self.log))

    def _parse(self, raw: str) -> dict[str, Any]:
        try:
            line = json.loads(raw)
        except ValueError:
            line = {"message": raw.rstrip()}
        self.log.append(line)
        del self.log[:-200]  # keep the tail; a long run logs little, but bound it anyway
        return line

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            self._parse(raw)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait for the graceful shutdown (SIGKILL after ``timeout_s``); -> exit code."""
        code = stop_process(self.process, timeout_s)
        if self._drain is not None:
            self._drain.join(5)
        if self.temporary:
            shutil.rmtree(self.data, ignore_errors=True)
        return code

    def __enter__(self) -> SpawnedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
