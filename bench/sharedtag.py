"""Several consumers of one tag, in process: each receives a batch and later deletes it, so
several batches are in flight at once (W2's four consumer processes), timed in the engine.

    python -m lamina.bench.sharedtag                  # this tree
    python -m lamina.bench.sharedtag --against DIR    # alternated with the source tree DIR
    python -m lamina.bench.sharedtag --against DIR --one-process   # both in one process
    python -m lamina.bench.sharedtag --count          # bytecodes a delete and a receive

``--consumers`` consumers (4) take turns on one queue of 256-byte bodies: each holds the
receipts of its last receive of ``--batch`` (16); in its turn it deletes them and receives
again. So every delete names the oldest batch in flight while the others stay leased, as
W2's consumers do. Each tree runs in a child process of its own (as ``stagecost``); the
parent asks the children for one round at a time, in turn, their order swapped every round;
a round times ``--calls`` turns with ``time.process_time_ns()``; the best of ``--rounds``
rounds is reported, µs a delete and a receive. ``--one-process`` runs both trees' engines
in this one process instead, alternated the same way (best and median): two children of one
tree can differ by a quarter on a busy machine, one process cannot. ``--count`` counts the
bytecodes a turn executes (``sys.settrace`` with opcode events), deterministic for a tree.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

from lamina.bench.stagecost import BODY_BYTES, _import_tree, best_of_trees


class _Consumers:
    """One tree's engine and the consumers' receipts in flight."""

    def __init__(self, data: Path, consumers: int, batch: int,
                 engine_class: Any = None) -> None:
        if engine_class is None:
            from lamina.engine import Engine as engine_class

        self.engine = engine_class.open(data)
        self.engine.create_queue("q")
        self.batch = batch
        self.bodies = [(b"%016d" % i).ljust(BODY_BYTES, b"x") for i in range(1000)]
        self.top_up(consumers)
        self.held = [self._receive() for _ in range(consumers)]
        self.turn = consumers - 1  # the next turn is the oldest batch's: consumer 0

    def _receive(self) -> list[bytes]:
        return [d.receipt for d in self.engine.receive("q", max=self.batch)]

    def top_up(self, turns: int) -> None:
        """Enough messages for ``turns`` receives, sent before the timing."""
        for _ in range(turns * self.batch // len(self.bodies) + 1):
            self.engine.send("q", self.bodies)

    def round(self, turns: int) -> dict[str, float]:
        clock, engine, held = time.process_time_ns, self.engine, self.held
        self.top_up(turns)
        deleting = receiving = 0
        for _ in range(turns):
            turn = self.turn = (self.turn + 1) % len(held)
            started = clock()
            engine.delete("q", held[turn])
            middle = clock()
            held[turn] = self._receive()
            receiving += clock() - middle
            deleting += middle - started
        return {"delete": deleting / turns / 1000, "receive": receiving / turns / 1000}

    def count(self, turns: int) -> dict[str, float]:
        """Bytecodes a delete and a receive, by function of the engine's (the top ten)."""
        engine, held = self.engine, self.held
        self.top_up(turns * 2)
        for _ in range(turns):  # unmeasured: the steady state
            self.turn = (self.turn + 1) % len(held)
            engine.delete("q", held[self.turn])
            held[self.turn] = self._receive()
        opcodes: Counter[str] = Counter()
        part = "delete"

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            frame.f_trace_opcodes = True
            if event == "opcode":
                opcodes[part] += 1
                opcodes[f"{part} {frame.f_code.co_name}"] += 1
            return tracer

        for _ in range(turns):
            turn = self.turn = (self.turn + 1) % len(held)
            part = "delete"
            sys.settrace(tracer)
            engine.delete("q", held[turn])
            part = "receive"
            got = engine.receive("q", max=self.batch)
            sys.settrace(None)
            held[turn] = [d.receipt for d in got]
        return {name: value / turns for name, value in opcodes.most_common(14)}


def _child_main(root: str, data: str, consumers: int, batch: int, count: bool) -> None:
    if root:
        _import_tree(Path(root))
    child = _Consumers(Path(data), consumers, batch)
    for line in sys.stdin:
        turns = int(line)
        print(json.dumps(child.count(turns) if count else child.round(turns)), flush=True)
    child.engine.close()


def _engine_of(root: Path) -> Any:
    """The ``Engine`` class of the source tree ``root``, imported as ``lamina_other.engine``
    beside this tree's (the engine imports nothing of lamina but itself)."""
    shadow = Path(tempfile.mkdtemp(prefix="lamina-other-")) / "lamina_other"
    shadow.mkdir()
    (shadow / "engine").symlink_to(root / "engine")
    package = types.ModuleType("lamina_other")
    package.__path__ = [str(shadow)]
    sys.modules["lamina_other"] = package
    return importlib.import_module("lamina_other.engine").Engine


def _one_process(against: Path, options: argparse.Namespace) -> None:
    """Both trees' engines in this process, alternated round by round (the order swapped
    every round): the two children of the other mode may run on differently loaded cores."""
    classes = {"against": _engine_of(against), "this tree": None}
    with tempfile.TemporaryDirectory(prefix="lamina-sharedtag-") as scratch:
        shapes = {name: _Consumers(Path(scratch) / str(index), options.consumers,
                                   options.batch, engine_class)
                  for index, (name, engine_class) in enumerate(classes.items())}
        figures: dict[str, dict[str, list[float]]] = {name: {} for name in shapes}
        for turn in range(options.rounds):
            for name, shape in sorted(shapes.items(), reverse=bool(turn % 2)):
                for figure, value in shape.round(options.calls).items():
                    figures[name].setdefault(figure, []).append(value)
        for shape in shapes.values():
            shape.engine.close()
    names = list(shapes)
    print(f"{options.consumers} consumers of one tag, batches of {options.batch}, one "
          f"process: best / median of {options.rounds} rounds x {options.calls} turns, µs "
          f"({', '.join(names)})")
    for figure in figures[names[0]]:
        print(f"{figure:<12}" + "".join(
            f"{min(figures[name][figure]):>10.2f} / {statistics.median(figures[name][figure]):.2f}"
            for name in names))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="DIR", help="a source tree to alternate with")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=600, help="turns a round")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--count", action="store_true", help="bytecodes instead of µs")
    parser.add_argument("--one-process", action="store_true",
                        help="with --against: both engines in this process")
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "DATA"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    shape = ["--consumers", str(options.consumers), "--batch", str(options.batch)]
    if options.count:
        shape.append("--count")
    if options.child:
        _child_main(options.child[0], options.child[1], options.consumers, options.batch,
                    options.count)
        return
    if options.against and options.one_process:
        _one_process(Path(options.against).resolve(), options)
        return
    trees = {"this tree": ""}
    if options.against:
        trees = {"against": str(Path(options.against).resolve()), "this tree": ""}
    rounds = 1 if options.count else options.rounds
    best = best_of_trees(trees, lambda root, data: [
        sys.executable, "-m", "lamina.bench.sharedtag", *shape, "--child", root, data],
        rounds, options.calls)
    if options.count:
        print(json.dumps(best))
        return
    names = list(trees)
    print(f"{options.consumers} consumers of one tag, batches of {options.batch}: best of "
          f"{rounds} rounds x {options.calls} turns, µs ({', '.join(names)})")
    for figure in best[names[0]]:
        print(f"{figure:<12}" + "".join(f"{best[name][figure]:>12.2f}" for name in names))


if __name__ == "__main__":
    main()
