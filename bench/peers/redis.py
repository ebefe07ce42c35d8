"""The Redis peer (``lamina bench --against redis``): W1-W4 on Redis Streams.

The bench starts a private ``redis-server`` (found on PATH) for each run: a fresh temporary
directory, a free loopback port, no persistence (no RDB snapshots, no AOF), or with
``--fsync`` the append-only file synced before every answer (``appendonly yes``, ``appendfsync
always``: Redis's equivalent of acknowledging only synced writes). It is stopped with SIGTERM
after the run.

A queue is a stream with one consumer group (``redis_workers.py`` has the commands); the
clients are the counterparts of Lamina's, with the hiredis parser and one round trip per batch.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..loadgen import BenchError, WorkerSpec
from ..spawn import stop_process
from ..workers import share
from ..workloads import (
    Params,
    Run,
    WorkloadResult,
    measure,
    score_w1,
    score_w2,
    score_w3,
    score_w4,
    start_w1,
    start_w2,
    start_w3,
    start_w4,
)
from . import Peer
from . import redis_workers as workers
from .resp import RespConnection, import_hiredis

__all__ = ["INSTALL_HINT", "RedisServer", "load"]

INSTALL_HINT = ("install it with your package manager (Debian, Ubuntu: apt-get install "
                "redis-server; Fedora: dnf install redis; macOS: brew install redis) or put "
                "its directory on PATH")
_START_TIMEOUT_S = 15.0
_PREFILL_BATCH = 1000
_LOG = "redis.log"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class RedisServer:
    """A private ``redis-server`` subprocess (stop() also removes its directory)."""

    process: subprocess.Popen[bytes]
    port: int
    folder: Path
    output: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, fsync: bool) -> RedisServer:
        executable = shutil.which("redis-server")
        if executable is None:
            raise BenchError(f"--against redis needs redis-server on PATH: {INSTALL_HINT}")
        for _ in range(3):  # the free port may be taken before redis binds it: try another
            server = cls._spawn(executable, fsync)
            try:
                ready = server._wait_ready()
            except BaseException:  # interrupted, or something else answered on its port
                server.stop()
                raise
            if ready:
                return server
            server.stop()
        raise BenchError("redis-server did not start: " + " | ".join(server.output[-5:]))

    @classmethod
    def _spawn(cls, executable: str, fsync: bool) -> RedisServer:
        folder = Path(tempfile.mkdtemp(prefix="lamina-bench-redis-"))
        port = _free_port()
        durability = (["--appendonly", "yes", "--appendfsync", "always"] if fsync
                      else ["--appendonly", "no"])
        command = [executable, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                   "--save", "", *durability, "--daemonize", "no", "--logfile", "",
                   "--loglevel", "warning", "--protected-mode", "yes"]
        with (folder / _LOG).open("wb") as log:  # a file: a pipe left unread could fill up
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT)
        return cls(process, port, folder)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.output.extend((self.folder / _LOG).read_text(errors="replace")
                                   .splitlines())
                return False
            try:
                with RespConnection(self.address, timeout_s=1.0) as redis:
                    if redis.call(b"PING") == b"PONG":
                        return True
            except OSError:
                time.sleep(0.05)
        self.output.append(f"no answer on port {self.port} within {_START_TIMEOUT_S:.0f} s")
        return False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (redis-server exits at once, having synced its append-only file), then
        remove its directory; -> exit code."""
        code = stop_process(self.process, timeout_s)
        shutil.rmtree(self.folder, ignore_errors=True)
        return code


# --- The workloads -------------------------------------------------------------------------------


def _stream(name: str) -> bytes:
    return f"bench-{name}".encode()


def _fresh_stream(run: Run, stream: bytes, group: bool) -> None:
    with RespConnection(run.address) as redis:
        redis.call(b"DEL", stream)
        if group:
            redis.call(b"XGROUP", b"CREATE", stream, workers.GROUP, b"0", b"MKSTREAM")


def _length(run: Run, stream: bytes) -> int:
    with RespConnection(run.address) as redis:
        length: int = redis.call(b"XLEN", stream)
        redis.call(b"DEL", stream)
    return length


def _single_inflight(params: Params) -> None:
    """The command line refuses --inflight with --against; this guards other callers."""
    if params.inflight != 1:
        raise BenchError("the Redis peer runs one request in flight per client process")


def _mark(result: WorkloadResult) -> WorkloadResult:
    result.system = "redis"
    return result


def run_w1(run: Run, params: Params) -> WorkloadResult:
    _single_inflight(params)
    result, processes, messages, batch = start_w1(run, params)
    stream = _stream("w1")
    _fresh_stream(run, stream, group=False)
    specs = [WorkerSpec(workers.produce_worker, (run.address, stream,
                                                 share(messages, processes, i), batch,
                                                 params.body_bytes))
             for i in range(processes)]
    score_w1(result, run, *measure(run, specs))
    retained = _length(run, stream)
    if retained != messages:
        result.notes.append(f"the stream holds {retained} entries, {messages} were sent")
    return _mark(result)


def _prefill(run: Run, stream: bytes, messages: int, body_bytes: int) -> None:
    body = os.urandom(body_bytes)
    with RespConnection(run.address) as redis:
        left = messages
        while left > 0:
            count = min(_PREFILL_BATCH, left)
            redis.pipeline([(b"XADD", stream, b"*", workers.FIELD, body)] * count)
            left -= count


def fill_backlog(run: Run, messages: int, body_bytes: int) -> None:
    """``--backlog``: ``messages`` entries in a stream of their own, left there."""
    stream = _stream("backlog")
    _fresh_stream(run, stream, group=False)
    _prefill(run, stream, messages, body_bytes)


def run_w2(run: Run, params: Params) -> WorkloadResult:
    _single_inflight(params)
    result, processes, messages, batch = start_w2(run, params)
    stream = _stream("w2")
    _fresh_stream(run, stream, group=True)
    _prefill(run, stream, messages, params.body_bytes)
    specs = [WorkerSpec(workers.consume_worker, (run.address, stream, batch, params.sequential))
             for _ in range(processes)]
    score_w2(result, run, messages, *measure(run, specs))
    left = _length(run, stream)
    if left:
        result.notes.append(f"{left} entries were left in the stream")
    return _mark(result)


def run_w3(run: Run, params: Params) -> WorkloadResult:
    result, rate, duration_s, messages, batch = start_w3(run, params)
    stream = _stream("w3")
    _fresh_stream(run, stream, group=True)
    specs = [WorkerSpec(workers.latency_consumer_worker, (run.address, stream, messages, batch,
                                                          duration_s + 30)),
             WorkerSpec(workers.paced_producer_worker, (run.address, stream, rate, messages,
                                                        params.body_bytes))]
    score_w3(result, rate, *measure(run, specs))
    _length(run, stream)
    return _mark(result)


def run_w4(run: Run, params: Params) -> WorkloadResult:
    result, messages = start_w4(run, params)
    stream = _stream("w4")
    _fresh_stream(run, stream, group=True)
    specs = [WorkerSpec(workers.round_trip_worker, (run.address, stream, messages,
                                                    params.body_bytes, params.client_poll_us))]
    score_w4(result, messages, *measure(run, specs))
    _length(run, stream)
    return _mark(result)


def _version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except OSError:
        return ""
    word = next((w for w in out.split() if w.startswith("v=")), "")
    return word[2:]


def load() -> Peer:
    """The Redis peer, after checking that it can run here (redis-server, hiredis)."""
    if shutil.which("redis-server") is None:
        raise BenchError(f"--against redis needs redis-server on PATH: {INSTALL_HINT}")
    import_hiredis()
    version = _version()
    runs: dict[str, Any] = {"w1": run_w1, "w2": run_w2, "w3": run_w3, "w4": run_w4}
    return Peer("redis", f"Redis {version} (Streams)".replace("  ", " "), RedisServer.start,
                runs, fill_backlog)
