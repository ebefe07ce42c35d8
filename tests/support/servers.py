"""Helpers for server tests over real loopback sockets (fixtures are in conftest.py).

Servers run three ways:

- ``running_server(...)``: inside the test's own trio run (async tests);
- ``server_thread(...)``: in a thread with its own trio run, for the blocking ``Client``;
- ``spawn_server(...)``: a real ``lamina serve`` subprocess (signals, kill -9).
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import trio

from lamina.client import Client, LaminaConnectionError
from lamina.engine import Engine
from lamina.engine.errors import LaminaError
from lamina.engine.results import Sent
from lamina.server.config import ServerConfig
from lamina.server.keyring import KeyRing, ServerKey
from lamina.server.server import Server

ADMIN = ServerKey("admin", "admin-secret", admin=True)
ALICE = ServerKey("alice", "alice-secret")
BOB = ServerKey("bob", "bob-secret")
KEYS = KeyRing({k.key_id: k for k in (ADMIN, ALICE, BOB)})


def make_config(data: Path, **overrides: Any) -> ServerConfig:
    overrides.setdefault("port", 0)
    return ServerConfig(data=data, **overrides)


@asynccontextmanager
async def running_server(data: Path, *, engine: Engine | None = None,
                         keys: KeyRing | None = None, keys_file: Path | None = None,
                         **overrides: Any) -> AsyncIterator[Server]:
    """A server in the current trio run; stopped (gracefully) when the block ends.
    ``keys`` is a KeyRing; ``keys_file`` the config's keys file."""
    server = Server(make_config(data, keys=keys_file, **overrides), engine=engine, keys=keys)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        try:
            yield server
        finally:
            server.request_stop()


def count_queued_work(server: Server) -> Callable[[], int]:
    """Count the ``Work`` items readers queue for ``server``'s applier from now on (none while
    they apply their requests themselves: server.py rule 6); -> how many so far."""
    queued = 0
    try_enqueue = server.applier.try_enqueue

    def counting(inbox: Any, item: object) -> bool:
        nonlocal queued
        queued += type(item).__name__ == "Work"
        return try_enqueue(inbox, item)

    server.applier.try_enqueue = counting  # type: ignore[method-assign]
    return lambda: queued


@dataclass
class ThreadServer:
    server: Server
    token: trio.lowlevel.TrioToken
    thread: threading.Thread

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    def call(self, fn: Any, *args: Any) -> Any:
        """Run a sync function on the server's trio thread."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def engine_job(self, fn: Any) -> Any:
        """Run ``fn(engine)`` on the applier (safe while the server runs)."""
        return trio.from_thread.run(self.server.run_engine_job, fn, trio_token=self.token)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.call(self.server.request_stop)
            self.thread.join(timeout=30)


@contextmanager
def server_thread(data: Path, *, engine: Engine | None = None, keys: KeyRing | None = None,
                  **overrides: Any) -> Iterator[ThreadServer]:
    server = Server(make_config(data, **overrides), engine=engine, keys=keys)
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            holder["token"] = trio.lowlevel.current_trio_token()
            ready.set()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # surfaced by the fixture
            holder["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(30)
    if "error" in holder:
        raise holder["error"]
    running = ThreadServer(server, holder["token"], thread)
    try:
        yield running
    finally:
        running.stop()
    if "error" in holder:
        raise holder["error"]


# --- subprocesses ---------------------------------------------------------------------------


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    port: int
    lines: list[dict[str, Any]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout)
        if self._reader is not None:
            self._reader.join(5)
        return code

    def events(self) -> list[str]:
        return [line.get("event", "") for line in self.lines]


def spawn_server(data: Path, *args: str) -> ServerProcess:
    """``lamina serve --data DATA --port 0 ARGS...``; returns once it listens."""
    command = [sys.executable, "-m", "lamina.tools.cli", "serve", "--data", str(data),
               "--port", "0", *args]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stderr is not None
    lines: list[dict[str, Any]] = []
    port = None
    for raw in process.stderr:
        try:
            line = json.loads(raw)
        except ValueError:
            line = {"raw": raw}
        lines.append(line)
        if line.get("event") == "start":
            port = line["port"]
            break
    if port is None:
        process.kill()
        raise RuntimeError(f"lamina serve did not start: {lines}")
    spawned = ServerProcess(process, port, lines)

    def drain() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            try:
                spawned.lines.append(json.loads(raw))
            except ValueError:
                spawned.lines.append({"raw": raw})

    spawned._reader = threading.Thread(target=drain, daemon=True)
    spawned._reader.start()
    return spawned


# --- TLS ------------------------------------------------------------------------------------


@dataclass
class Certificates:
    cert: Path
    key: Path
    client_context: ssl.SSLContext


# --- A raw protocol client --------------------------------------------------------------------


class RawConnection:
    """Frames in, responses out, nothing checked or hidden: for pipelining and malformed-input
    tests (ids are ours to choose, so no request bookkeeping)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        from lamina.wire.framing import FrameReader
        self.stream = stream
        self.frames = FrameReader(64 * 1024 * 1024)
        self.events: list[Any] = []
        self.closed = False
        self.greeting: Any = None
        self._next_id = 1

    @classmethod
    async def open(cls, port: int) -> "RawConnection":
        from lamina.wire.protocol import _parse_greeting
        connection = cls(await trio.open_tcp_stream("127.0.0.1", port))
        first = await connection.next_event()
        connection.greeting = _parse_greeting(first.result)
        return connection

    async def send(self, op: str, args: dict[str, Any] | None = None) -> int:
        import cbor2
        import struct
        request_id = self._next_id = max(self._next_id, 1000) + 1
        body = cbor2.dumps([request_id, op, args or {}])
        await self.stream.send_all(struct.pack(">I", len(body)) + body)
        return request_id

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> bool:
        import cbor2
        from lamina.wire.protocol import Response
        try:
            data = await self.stream.receive_some(1 << 20)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.closed = True
            return False
        self.frames.feed(data)
        while (body := self.frames.next_frame()) is not None:
            self.events.append(Response(*cbor2.loads(body)))
        return True

    async def next_event(self) -> Any:
        """The next frame as a ``Response``; None once the server closed."""
        while not self.events:
            if self.closed or not await self._fill():
                return None
        return self.events.pop(0)

    async def response(self, request_id: int) -> Any:
        """The response to ``request_id``, keeping others for later."""
        while True:
            for index, event in enumerate(self.events):
                if event.id == request_id:
                    return self.events.pop(index)
            if self.closed or not await self._fill():
                raise AssertionError(f"closed before answering {request_id}")

    async def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        return await self.response(await self.send(op, args))

    async def wait_closed(self) -> None:
        while await self.next_event() is not None:
            pass

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def kill_under_load(process: ServerProcess, producer: Callable[[int], None],
                    consumer: Callable[[], None], stop: threading.Event,
                    load_s: float, join_s: float,
                    until: Callable[[], bool] = lambda: True, until_s: float = 0.0) -> None:
    """Two producers (given their number) and two consumers on threads for ``load_s`` (and
    then, at most ``until_s`` more, until ``until()``), then a kill -9 of ``process``; ``stop``
    tells the workers to end, each joined within ``join_s``."""
    workers = [threading.Thread(target=producer, args=(n,)) for n in range(2)]
    workers += [threading.Thread(target=consumer) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(load_s)
    deadline = time.monotonic() + until_s
    while not until() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.signal(signal.SIGKILL)
    process.wait()
    stop.set()
    for worker in workers:
        worker.join(join_s)


def assert_nothing_acknowledged_lost(port: int, queue: str, acked_sent: set[str],
                                     acked_deleted: set[str], received: set[str]) -> None:
    """After a kill -9 and a restart on ``port``: no acknowledged send of ``queue`` is lost
    and no acknowledged delete came back (by every retained message's peeked state)."""
    retained: dict[str, str] = {}
    with Client.connect("127.0.0.1", port) as client:
        after = None
        while True:
            page = client.peek(queue, start=0, after=after, max=1000)
            for peeked in page.messages:
                assert not isinstance(peeked, LaminaError)
                retained[peeked.id] = peeked.state
            if page.next is None:
                break
            after = page.next
    live = {message_id for message_id, state in retained.items()
            if state not in ("deleted", "dead")}
    assert not acked_deleted & live, "an acknowledged delete came back"
    missing = acked_sent - set(retained) - received
    assert not missing, f"acknowledged sends lost: {sorted(missing)[:5]}"
    assert acked_sent - received <= live


class AckedLoad:
    """Producers and consumers of ``queue`` (for ``kill_under_load``) that record what the
    server acknowledged: sends, deliveries and deletes. Bodies of ``body_bytes`` at least."""

    def __init__(self, port: int, queue: str, *, body_bytes: int = 0):
        self.port, self.queue, self.body_bytes = port, queue, body_bytes
        with Client.connect("127.0.0.1", port) as setup:
            setup.create_queue(queue, {"visibility_timeout": 1})
        self.stop = threading.Event()
        self.acked_sent: set[str] = set()
        self.received: set[str] = set()
        self.acked_deleted: set[str] = set()
        self._lock = threading.Lock()

    def producer(self, number: int) -> None:
        try:
            with Client.connect("127.0.0.1", self.port) as client:
                n = 0
                while not self.stop.is_set():
                    batch = [f"p{number}-{n + i}".encode().ljust(self.body_bytes, b".")
                             for i in range(8)]
                    n += 8
                    results = client.send(self.queue, batch)
                    with self._lock:
                        self.acked_sent.update(r.id for r in results if isinstance(r, Sent))
        except LaminaConnectionError:
            pass

    def consumer(self) -> None:
        try:
            with Client.connect("127.0.0.1", self.port) as client:
                while not self.stop.is_set():
                    deliveries = client.receive(self.queue, max=8, wait=0.2)
                    with self._lock:
                        self.received.update(d.id for d in deliveries)
                    if deliveries:
                        results = client.delete(self.queue, deliveries)
                        with self._lock:
                            self.acked_deleted.update(
                                d.id for d, r in zip(deliveries, results) if r is None)
        except LaminaConnectionError:
            pass

    def assert_nothing_lost(self, port: int) -> None:
        """After the kill and a restart on ``port``."""
        assert_nothing_acknowledged_lost(port, self.queue, self.acked_sent, self.acked_deleted,
                                         self.received)
