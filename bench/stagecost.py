"""Stage costs of a request in process (no sockets): decode, apply (dispatch + engine), encode,
and the engine alone — the table of docs/PERFORMANCE.md, "Where a request's time goes now".

    python -m lamina.bench.stagecost                 # this tree
    python -m lamina.bench.stagecost --against DIR   # alternated with the source tree DIR
                                                     # (a checkout holding engine/, server/,
                                                     # wire/, client/), for a before/after

Each tree runs in a child process of its own with a fresh data directory (a queue of
256-byte bodies, pre-filled); the parent asks the children for one round at a time, in turn,
so both see the same machine drift. A round times ``calls`` requests of each kind with
``time.process_time_ns()``; the best of ``rounds`` rounds is reported, in µs. ``delete1.*``
is a delete of one message received just before; ``engine.delete1`` deletes of one, in order;
the ``*_new_ms`` figures put each operation in a millisecond of its own (as W4's requests,
a round trip apart, are), ``engine.receive_delete1_new_ms`` among them a receive of one and
its delete (W4's consumer, its lease held alone); ``engine.w3_cycle`` is W3's cycle (a long poll's empty receive of
up to 16, the send of one that wakes it, the retry that finds it, its delete) on an empty
queue.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable

BODY_BYTES = 256
BATCH = 16
PACKAGES = ("engine", "server", "wire", "client")
STAGES = ("decode", "apply", "encode")


def _import_tree(root: Path) -> None:
    """Make ``lamina.<package>`` import from ``root/<package>`` (a checkout's folders)."""
    shadow = Path(tempfile.mkdtemp(prefix="lamina-tree-")) / "lamina"
    shadow.mkdir()
    for name in PACKAGES:
        (shadow / name).symlink_to(root / name)
    package = types.ModuleType("lamina")
    package.__path__ = [str(shadow)]
    sys.modules["lamina"] = package


class _SteppingClock:
    """The wall clock in epoch ms, moved ``step_ms`` further ahead at every reading while
    stepping: the ``*_new_ms`` figures put each operation in a millisecond of its own, as
    requests arriving a round trip apart do (W4), instead of many sharing one."""

    def __init__(self) -> None:
        self.step_ms = 0
        self._ahead_ms = 0

    def __call__(self) -> int:
        self._ahead_ms += self.step_ms
        return time.time_ns() // 1_000_000 + self._ahead_ms


class _Child:
    """One tree: an engine, a protocol connection and the requests of each kind."""

    def __init__(self, data: Path, prefill: int) -> None:
        from lamina.engine import Engine
        from lamina.server import dispatch
        from lamina.wire.protocol import ClientConnection, ServerConnection

        self.dispatch = dispatch
        self.clock = _SteppingClock()
        self.engine = Engine.open(data, clock=self.clock)
        self.engine.create_queue("q")
        bodies = [(b"%016d" % i).ljust(BODY_BYTES, b"x") for i in range(1000)]
        for _ in range(prefill // 1000):
            self.engine.send("q", bodies)
        self.server = ServerConnection(auth_required=False)
        self.server.greeting(version="bench", idle_timeout_s=60)
        self.client = ClientConnection()
        self.one = [bodies[0]]
        self.sixteen = bodies[:BATCH]
        # A queue whose consumer is waiting: its messages in flight, nothing to deliver (the
        # receive a long poll makes again after each answer).
        self.engine.create_queue("idle")
        self.engine.send("idle", self.sixteen)
        self.engine.receive("idle", max=BATCH, visibility_timeout=43_200)
        self.engine.create_queue("w3")  # kept empty by W3's cycles (``_w3_cycle``)

    def _frames(self, op: str, args_of: Callable[[int], dict[str, Any]], count: int
                ) -> list[bytes]:
        return [self.client.encode_request(op, args_of(i))[1] for i in range(count)]

    def _stages(self, frames: list[bytes], apply: Callable[[Any], Any]
                ) -> tuple[float, float, float]:
        """Decode every frame, apply every request, encode every answer: µs a request each."""
        clock = time.process_time_ns
        server = self.server
        started = clock()
        requests = [server.receive_data(frame)[0] for frame in frames]
        decoded = clock()
        answers = [apply(request) for request in requests]
        applied = clock()
        for request, answer in zip(requests, answers):
            server.respond_answer(request.id, answer)
        encoded = clock()
        count = len(frames) * 1000
        return ((decoded - started) / count, (applied - decoded) / count,
                (encoded - applied) / count)

    def _apply(self, request: Any) -> Any:
        dispatch = self.dispatch
        if request.op == "ping":
            dispatch.check_request(request.op, request.args)
            return dispatch.MapAnswer({"time": 0})
        operation = dispatch.check_request(request.op, request.args)
        if request.op == "receive":
            return dispatch.receive_call(self.engine, request.args, None, request.id, 1 << 21)
        return dispatch.apply_operation(operation, self.engine, request.args, None, request.id,
                                        1 << 21)

    def round(self, calls: int) -> dict[str, float]:
        """One round: ``calls`` requests of each kind -> {"kind.stage": µs}; "engine.*"
        figures call the engine alone."""
        clock = time.process_time_ns
        engine, figures = self.engine, {}
        for kind, op, args in (("ping", "ping", lambda i: {}),
                               ("send1", "send", lambda i: {"queue": "q", "messages": self.one}),
                               ("send16", "send",
                                lambda i: {"queue": "q", "messages": self.sixteen})):
            frames = self._frames(op, args, calls)
            for stage, value in zip(STAGES, self._stages(frames, self._apply)):
                figures[f"{kind}.{stage}"] = value
        # receive 16 then delete them, request by request (16 in flight, as a consumer does).
        totals = dict.fromkeys(("receive16", "delete16"), (0, 0, 0))
        for _ in range(calls):
            frames = self._frames("receive", lambda i: {"queue": "q", "max": BATCH}, 1)
            received: list[Any] = []

            def receive(request: Any) -> Any:
                answer = self._apply(request)
                deliveries = answer.deliveries
                received.extend(getattr(deliveries, "receipts", None)  # columns, or either tree
                                or [getattr(delivery, "receipt", None) or delivery[1]
                                    for delivery in deliveries])
                return answer

            stages = self._stages(frames, receive)
            totals["receive16"] = tuple(a + b for a, b in zip(totals["receive16"], stages))
            frames = self._frames("delete", lambda i: {"queue": "q", "receipts": received}, 1)
            stages = self._stages(frames, self._apply)
            totals["delete16"] = tuple(a + b for a, b in zip(totals["delete16"], stages))
        # receive 1 then delete it (a consumer of one message at a time: W4).
        totals["receive1"] = (0, 0, 0)
        for _ in range(calls):
            frames = self._frames("receive", lambda i: {"queue": "q", "max": 1}, 1)
            received = []
            stages = self._stages(frames, receive)
            totals["receive1"] = tuple(a + b for a, b in zip(totals["receive1"], stages))
            engine.delete("q", received)
        frames = self._frames("receive", lambda i: {"queue": "idle", "max": BATCH}, calls)
        for stage, value in zip(STAGES, self._stages(frames, self._apply)):
            figures[f"receive_empty.{stage}"] = value
        # receive 1 (not timed) then delete it, request by request.
        sums: tuple[float, ...] = (0, 0, 0)
        for _ in range(calls):
            (delivery,) = engine.receive("q", max=1)
            frames = self._frames("delete", lambda i: {"queue": "q",
                                                       "receipts": [delivery.receipt]}, 1)
            sums = tuple(a + b for a, b in zip(sums, self._stages(frames, self._apply)))
        totals["delete1"] = sums
        for kind, sums in totals.items():
            for stage, value in zip(STAGES, sums):
                figures[f"{kind}.{stage}"] = value / calls
        # The engine alone.
        started = clock()
        for _ in range(calls):
            engine.send("q", self.one)
        figures["engine.send1"] = (clock() - started) / calls / 1000
        started = clock()
        for _ in range(calls):
            receipts = [d.receipt for d in engine.receive("q", max=BATCH)]
            engine.delete("q", receipts)
        figures["engine.receive_delete_per_msg"] = (clock() - started) / calls / BATCH / 1000
        receipts = []
        started = clock()
        for _ in range(calls):
            receipts.append(engine.receive("q")[0].receipt)
        figures["engine.receive1"] = (clock() - started) / calls / 1000
        for receipt in receipts:
            engine.delete("q", [receipt])
        figures.update(self._engine_singles(calls))
        figures.update(self._w3_cycle(calls))
        return figures

    def _w3_cycle(self, calls: int) -> dict[str, float]:
        """The engine alone, W3's cycle: the long poll's receive of up to 16 that finds
        nothing (and waits), the send of one that wakes it, the waiter's retry (a receive
        of up to 16 that finds that one), its delete."""
        engine, one = self.engine, self.one
        receive = getattr(engine, "receive_columns", engine.receive)
        clock = time.process_time_ns
        started = clock()
        for _ in range(calls):
            receive("w3", max=BATCH, max_bytes=1 << 21)
            engine.send("w3", one)
            got = receive("w3", max=BATCH, max_bytes=1 << 21)
            engine.delete("w3", getattr(got, "receipts", None)
                          or [delivery.receipt for delivery in got])
        return {"engine.w3_cycle": (clock() - started) / calls / 1000}

    def _engine_singles(self, calls: int) -> dict[str, float]:
        """The engine alone, one message an operation: deletes of 1 (of messages received
        one at a time, in order), and sends and deletes of 1 each in a new millisecond; and
        receives of 1 each followed by its delete, in a new millisecond each."""
        clock, engine, figures = time.process_time_ns, self.engine, {}
        for suffix, step_ms in (("", 0), ("_new_ms", 1)):
            self.clock.step_ms = step_ms
            if step_ms:
                started = clock()
                for _ in range(calls):
                    engine.send("q", self.one)
                figures["engine.send1_new_ms"] = (clock() - started) / calls / 1000
            receipts = [engine.receive("q", max=1)[0].receipt for _ in range(calls)]
            started = clock()
            for receipt in receipts:
                engine.delete("q", [receipt])
            figures[f"engine.delete1{suffix}"] = (clock() - started) / calls / 1000
            if step_ms:  # W4's consumer: a receive of 1 and its delete, the lease held alone
                started = clock()
                for _ in range(calls):
                    engine.delete("q", [engine.receive("q", max=1)[0].receipt])
                figures["engine.receive_delete1_new_ms"] = (clock() - started) / calls / 1000
        self.clock.step_ms = 0
        return figures


def _child_main(root: str, data: str, prefill: int) -> None:
    if root:
        _import_tree(Path(root))
    child = _Child(Path(data), prefill)
    for line in sys.stdin:
        calls = int(line)
        print(json.dumps(child.round(calls)), flush=True)
    child.engine.close()


def best_of_trees(trees: dict[str, str], child_argv: Callable[[str, str], list[str]],
                  rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """Each tree in a child process of its own (``child_argv(root, data directory)``), asked
    in turn for a round of ``calls`` calls (it answers one JSON line of figures), the order
    swapped every round -> each figure's best over the rounds, by tree."""
    with tempfile.TemporaryDirectory(prefix="lamina-trees-") as scratch:
        children = {name: subprocess.Popen(child_argv(root, os.path.join(scratch, str(index))),
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True)
                    for index, (name, root) in enumerate(trees.items())}
        best: dict[str, dict[str, float]] = {name: {} for name in trees}
        for turn in range(rounds):
            for name, child in sorted(children.items(), reverse=bool(turn % 2)):
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write(f"{calls}\n")
                child.stdin.flush()
                for figure, value in json.loads(child.stdout.readline()).items():
                    best[name][figure] = min(value, best[name].get(figure, value))
        for child in children.values():
            assert child.stdin is not None
            child.stdin.close()
            child.wait()
    return best


def main(argv: list[str] | None = None) -> None:
    from lamina.tools.cmdvalues import parse_count

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="DIR", help="a source tree to alternate with")
    parser.add_argument("--rounds", type=parse_count, default=5)
    parser.add_argument("--calls", type=parse_count, default=600)
    parser.add_argument("--prefill", type=int, default=110_000)
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "DATA"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        _child_main(options.child[0], options.child[1], options.prefill)
        return
    trees = {"this tree": ""}
    if options.against:
        trees = {"against": str(Path(options.against).resolve()), "this tree": ""}
    best = best_of_trees(trees, lambda root, data: [
        sys.executable, "-m", "lamina.bench.stagecost", "--prefill", str(options.prefill),
        "--child", root, data], options.rounds, options.calls)
    names = list(trees)
    print(f"best of {options.rounds} rounds x {options.calls} calls, µs "
          f"({', '.join(names)})")
    for figure in best[names[0]]:
        print(f"{figure:<34}" + "".join(f"{best[name][figure]:>12.2f}" for name in names))


if __name__ == "__main__":
    main()
