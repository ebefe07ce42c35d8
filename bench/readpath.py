"""A read of one request through the server's read loop, in process: what it executes and what
it costs, around the engine (docs/PERFORMANCE.md, "Where a request's time goes now").

    python -m lamina.bench.readpath count          # bytecodes and calls a read, by package
    python -m lamina.bench.readpath time           # µs a read, best of --rounds rounds

It runs the tree of the Python that runs it (each checkout's own venv, for a before/after).
A real ``Connection`` of a real server's applier (no listener; busy polling off) is fed by a
stub read that returns one request frame a call; the read loop (``Connection._socket_reads``)
parses, applies and answers each as it does over a socket, writing the answers to
``/dev/null``, and never waits in trio (the wait for a readable socket returns at once). The
kinds: ``ping``; a ``send``, ``receive`` and ``delete`` of 1; a ``send`` of 16 (256-byte
bodies, on a queue pre-filled with 60,000); a ``receive`` of 16 and a ``delete`` of the 16
receipts of one receive (W2's consumer; the receives of the deletes made before the reads, the
queue topped up beforehand so that every receive finds 16). ``count`` runs ``sys.settrace`` with opcode events
over 200 reads of each kind and divides: deterministic for a given tree. ``time`` times
``--reads`` reads of each kind with ``time.process_time_ns()``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import trio
import trio.testing

BODY_BYTES = 256
PREFILL = 60_000
COUNTED_READS = 200
WARM_READS = 300
KINDS = ("ping", "send1", "receive1", "delete1", "send16", "receive16", "delete16")


class _Reads:
    """The server side: one connection of a server's applier, read by a stub."""

    def __init__(self, connection: Any, engine: Any, inbox: Any) -> None:
        from lamina.wire.protocol import ClientConnection

        self.connection = connection
        self.engine = engine
        self.inbox = inbox
        self.client = ClientConnection()
        self.bodies = [(b"%016d" % i).ljust(BODY_BYTES, b"x") for i in range(16)]
        self.pending: list[bytes] = []  # frames still to read, the next one last

    def read(self, fd: int, size: int) -> bytes:
        """``os.read`` for the read loop: one frame a call, then a reset (the loop's end)."""
        if self.pending:
            return self.pending.pop()
        raise ConnectionResetError("no more frames")

    def load(self, kind: str, count: int) -> None:
        """Queue ``count`` request frames of ``kind`` for the next reads."""
        requests: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {
            "ping": lambda: ("ping", {}),
            "send1": lambda: ("send", {"queue": "q", "messages": self.bodies[:1]}),
            "send16": lambda: ("send", {"queue": "q", "messages": self.bodies}),
            "receive1": lambda: ("receive", {"queue": "q", "max": 1}),
            "delete1": lambda: ("delete", {"queue": "q", "receipts": [
                self.engine.receive("q", max=1)[0].receipt]}),
            "receive16": lambda: ("receive", {"queue": "q", "max": 16}),
            "delete16": lambda: ("delete", {"queue": "q", "receipts": [
                delivery.receipt for delivery in self.engine.receive("q", max=16)]}),
        }
        if kind in ("receive16", "delete16"):  # a backlog of 16 for each receive
            for _ in range(count * 16 // 1000 + 1):
                self.engine.send("q", [(b"%016d" % i).ljust(BODY_BYTES, b"x")
                                       for i in range(1000)])
        make = requests[kind]
        frames = [self.client.encode_request(*make())[1] for _ in range(count)]
        frames.reverse()
        self.pending = frames

    async def run(self) -> None:
        """Read until the frames run out."""
        self.connection._stop_reading = False
        await self.connection._socket_reads(self.inbox)


def _count(reads: _Reads, kind: str) -> Any:
    """Bytecodes and calls of ``COUNTED_READS`` reads of ``kind``, a read, by package."""
    here = __file__
    opcodes: Counter[str] = Counter()
    calls: Counter[str] = Counter()

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if filename == here:
            return None
        frame.f_trace_opcodes = True
        part = next((name for name in ("server", "wire", "engine")
                     if f"/{name}/" in filename), "other")
        if event == "call":
            calls[part] += 1
        elif event == "opcode":
            opcodes[part] += 1
        return tracer

    async def traced() -> None:
        reads.load(kind, COUNTED_READS)
        sys.settrace(tracer)
        try:
            await reads.run()
        finally:
            sys.settrace(None)

    return traced, opcodes, calls


def main(argv: list[str] | None = None) -> None:
    from lamina.tools.cmdvalues import parse_count

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("count", "time"))
    parser.add_argument("--reads", type=parse_count, default=2000,
                        help="reads of each kind a round")
    parser.add_argument("--rounds", type=parse_count, default=7)
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lamina-readpath-") as scratch:
        figures = trio.run(_measure, Path(scratch), options.mode, options.reads,
                           options.rounds)
    print(json.dumps(figures))


async def _measure(data: Path, mode: str, reads_a_round: int, rounds: int) -> dict[str, Any]:
    from lamina.engine import Engine
    from lamina.server import connection as connection_module
    from lamina.server.config import ServerConfig
    from lamina.server.server import Server

    engine = Engine.open(data)
    server = Server(ServerConfig(data=data, port=0, busy_poll_us=0), engine=engine)
    applier = server.applier
    applier.attach(engine)
    applier.open_inbox()
    engine.create_queue("q")
    for _ in range(PREFILL // 1000):
        engine.send("q", [(b"%016d" % i).ljust(BODY_BYTES, b"x") for i in range(1000)])
    figures: dict[str, Any] = {}
    mine, theirs = socket.socketpair()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(applier.run)
            await trio.testing.wait_all_tasks_blocked()  # the applier idles: reads apply now
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(mine))
            connection = connection_module.Connection(
                applier, server.limits, stream, "readpath", budget=server.budget, on_read=None)
            connection._nursery = nursery
            connection.proto.greeting(version="readpath", idle_timeout_s=60)
            connection.outbox.socket_fd = devnull  # answers written, to nowhere
            reads = _Reads(connection, engine, applier.inbox_clone())
            connection_module.os = types.SimpleNamespace(read=reads.read)  # type: ignore

            async def no_wait(fd: int) -> None:
                return None

            trio.lowlevel.wait_readable = no_wait  # type: ignore[assignment]
            for kind in KINDS:
                reads.load(kind, WARM_READS)
                await reads.run()
            for kind in KINDS:
                if mode == "count":
                    traced, opcodes, calls = _count(reads, kind)
                    await traced()
                    figures[kind] = {
                        "bytecodes": round(sum(opcodes.values()) / COUNTED_READS, 1),
                        "calls": round(sum(calls.values()) / COUNTED_READS, 1),
                        **{f"bytecodes.{part}": round(count / COUNTED_READS, 1)
                           for part, count in sorted(opcodes.items())}}
                else:
                    best = float("inf")
                    for _ in range(rounds):
                        reads.load(kind, reads_a_round)
                        started = time.process_time_ns()
                        await reads.run()
                        best = min(best, (time.process_time_ns() - started) / reads_a_round)
                    figures[kind] = round(best / 1000, 2)
            nursery.cancel_scope.cancel()
    finally:
        os.close(devnull)
        theirs.close()
        engine.close()
    return figures


if __name__ == "__main__":
    main()
