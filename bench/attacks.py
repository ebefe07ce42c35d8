"""Greedy and careless clients against a real ``lamina serve``: the server's memory and a
bystander's ping latency while they attack (docs/LIMITS.md).

Attacks (each on a fresh server; ``--attack`` picks them):

- ``greedy``: 8 clients each pipeline 2,000 peeks of 16 messages of ~1 MB (answers of ~16 MB)
  in one write and never read; they stay connected and silent until the end.
- ``partial``: 40 clients each send a 15 MiB frame but its last KiB, then stay silent.

During each, a bystander pings every 10 ms on its own connection. Reported per attack: the
server's peak RSS (VmHWM), its RSS at the end (held), the bystander's ping p50/p99/max, how
many pings it got answered, and how many attacking connections the server still holds at the
end (server_info ``connections`` minus the bystander).

Run::

    python -m lamina.bench.attacks                     # this checkout's server
    python -m lamina.bench.attacks --pythonpath DIR    # a server from another checkout
                                                       # (DIR holds the lamina package)
    python -m lamina.bench.attacks --rounds 2 --compare DIR   # both, alternating

Options: ``--seconds`` each attack lasts (default 20), ``--idle-timeout`` of the server
(default 8), ``--serve-arg`` extra ``lamina serve`` options (repeatable).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import cbor2

__all__ = ["main", "run_attack"]

GREEDY_CLIENTS = 8
GREEDY_REQUESTS = 2000
BIG_MESSAGES = 16
BIG_MESSAGE_BYTES = 1_000_000
PARTIAL_CLIENTS = 40
PARTIAL_FRAME_BYTES = 15 * 1024 * 1024
PING_INTERVAL_S = 0.01


def _frame(item: Any) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


class _Connection:
    """A blocking client of the wire protocol: enough for setup, pings and attacks."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._buffer = b""
        self._next_id = 1
        self.read_frame()  # the greeting

    def read_frame(self) -> list[Any]:
        while True:
            if len(self._buffer) >= 4:
                (length,) = struct.unpack_from(">I", self._buffer)
                if len(self._buffer) >= 4 + length:
                    body, self._buffer = self._buffer[4:4 + length], self._buffer[4 + length:]
                    return cbor2.loads(body)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the server")
            self._buffer += chunk

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        request_id, self._next_id = self._next_id, self._next_id + 1
        self.sock.sendall(_frame([request_id, op, args or {}]))
        while True:
            answer = self.read_frame()
            if answer[0] == request_id:
                if answer[1] is not None:
                    raise RuntimeError(f"{op}: {answer[1]}")
                return answer[2]

    def close(self) -> None:
        self.sock.close()


class _Server:
    def __init__(self, pythonpath: str | None, idle_timeout_s: float,
                 serve_args: list[str]) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="lamina-attack-"))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lamina.tools.cli", "serve", "--data", str(self.data),
             "--port", "0", "--idle-timeout", str(idle_timeout_s), *serve_args],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        assert self.process.stderr is not None
        self.port = 0
        for line in self.process.stderr:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "start":
                self.port = int(record["port"])
                break
        if not self.port:
            raise RuntimeError("the server did not start")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for _ in self.process.stderr:
            pass

    def memory_kib(self) -> tuple[int, int]:
        """(VmHWM, VmRSS) of the server process, in KiB."""
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            fields[name] = value.split()[0] if value.split() else "0"
        return int(fields["VmHWM"]), int(fields["VmRSS"])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def _bystander(port: int, stop: threading.Event, latencies: list[float]) -> None:
    connection = _Connection(port)
    while not stop.is_set():
        started = time.perf_counter()
        connection.call("ping")
        latencies.append(time.perf_counter() - started)
        time.sleep(PING_INTERVAL_S)
    connection.close()


def _greedy(port: int) -> list[socket.socket]:
    setup = _Connection(port)
    setup.call("create_queue", {"queue": "big", "attributes": {"max_message_size": 1048576}})
    for _ in range(BIG_MESSAGES):
        setup.call("send", {"queue": "big", "messages": [b"x" * BIG_MESSAGE_BYTES]})
    setup.close()
    sockets = []
    pipeline = b"".join(_frame([n, "peek", {"queue": "big", "start": 0, "max": BIG_MESSAGES}])
                        for n in range(1, GREEDY_REQUESTS + 1))
    for _ in range(GREEDY_CLIENTS):
        greedy = _Connection(port)
        greedy.sock.sendall(pipeline)  # ~100 KB: the kernel takes it all
        sockets.append(greedy.sock)
    return sockets


def _partial(port: int) -> list[socket.socket]:
    body = b"\x00" * (PARTIAL_FRAME_BYTES - 1024)
    head = struct.pack(">I", PARTIAL_FRAME_BYTES)
    sockets = []

    def send(sock: socket.socket) -> None:
        try:
            sock.sendall(head + body)  # blocks while the server does not read
        except OSError:
            pass  # closed at the end

    for _ in range(PARTIAL_CLIENTS):
        connection = _Connection(port)
        threading.Thread(target=send, args=(connection.sock,), daemon=True).start()
        sockets.append(connection.sock)
    return sockets


ATTACKS: dict[str, Callable[[int], list[socket.socket]]] = {
    "greedy": _greedy, "partial": _partial}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def run_attack(name: str, pythonpath: str | None, seconds: float, idle_timeout_s: float,
               serve_args: list[str]) -> dict[str, Any]:
    """One attack on a fresh server; -> its figures."""
    server = _Server(pythonpath, idle_timeout_s, serve_args)
    try:
        _, rss_before_kib = server.memory_kib()
        stop = threading.Event()
        latencies: list[float] = []
        pinger = threading.Thread(target=_bystander, args=(server.port, stop, latencies))
        pinger.start()
        time.sleep(0.5)
        sockets = ATTACKS[name](server.port)
        time.sleep(seconds)
        stop.set()
        pinger.join(60)
        probe = _Connection(server.port)
        held_connections = probe.call("server_info")["connections"] - 1
        probe.close()
        peak_kib, rss_end_kib = server.memory_kib()
        for sock in sockets:
            sock.close()
    finally:
        server.stop()
    return {
        "attack": name, "server": pythonpath or "this checkout",
        "rss_before_mib": round(rss_before_kib / 1024), "peak_rss_mib": round(peak_kib / 1024),
        "rss_end_mib": round(rss_end_kib / 1024),
        "ping_p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
        "ping_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "ping_max_ms": round(max(latencies, default=0.0) * 1000, 2),
        "pings": len(latencies), "attackers_still_connected": held_connections,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lamina.bench.attacks",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack", choices=sorted(ATTACKS), action="append",
                        help="attack to run (repeatable; default: all)")
    parser.add_argument("--pythonpath", help="run the server from this directory's lamina")
    parser.add_argument("--compare", metavar="DIR",
                        help="also run a server from DIR's lamina, alternating with this one")
    parser.add_argument("--rounds", type=int, default=1, help="times each run is repeated")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each attack")
    parser.add_argument("--idle-timeout", type=float, default=8.0, help="the server's, seconds")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="an extra `lamina serve` option (repeatable)")
    args = parser.parse_args(argv)
    servers = [args.pythonpath] + ([args.compare] if args.compare else [])
    for _ in range(args.rounds):
        for attack in args.attack or sorted(ATTACKS):
            for pythonpath in servers:
                figures = run_attack(attack, pythonpath, args.seconds, args.idle_timeout,
                                     args.serve_arg)
                print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
