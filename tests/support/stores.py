"""Data directories for the inspection and Spark tests, built through the engine.

Also a script: ``python -m tests.support.stores write DATA_DIR QUEUE SECONDS`` keeps an engine open on
DATA_DIR sending batches to QUEUE for SECONDS (a writer process beside the readers), printing
``ready`` once the queue exists and ``sent N`` at the end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lamina.engine import Engine, FakeClock

#: A day ago, to the second: within every queue's retention, and before the wall clock (the
#: engine's ``now`` is the later of the two).
START_MS = (time.time_ns() // 1_000_000_000 - 86_400) * 1000


def body(index: int, size: int = 64) -> bytes:
    return (b"%08d-" % index).ljust(size, b"x")


def build_plain(path: Path, messages: int, *, segment: int = 100, batch: int = 50,
                step_ms: int = 10, clock: FakeClock | None = None) -> FakeClock:
    """Queue ``q``: ``messages`` plain bodies, ``batch`` per send, the clock moving ``step_ms``
    between sends; segments of ``segment`` messages."""
    clock = clock or FakeClock(START_MS)
    with Engine.open(path, clock=clock, segment_max_messages=segment) as engine:
        engine.create_queue("q", {"retention": 365 * 86400})
        for first in range(0, messages, batch):
            engine.send("q", [body(i) for i in range(first, min(first + batch, messages))])
            clock.advance(step_ms)
    return clock


def build_mixed(path: Path) -> tuple[FakeClock, dict[str, Any]]:
    """Two queues with every kind of record and lease: priorities, text and binary bodies,
    attributes (bytes values too), topics, delays, a filtered tag, deliveries, deletes, an
    expired lease, a dead letter (``orders`` -> ``dlq``), a pending delay. Segments of 8
    messages; ``orders`` holds 37."""
    clock = FakeClock(START_MS)
    info: dict[str, Any] = {}
    with Engine.open(path, clock=clock, segment_max_messages=8) as engine:
        engine.create_queue("dlq", {"retention": 365 * 86400})
        engine.create_queue("orders", {"retention": 365 * 86400, "rewind": 86400,
                                       "redrive": {"dlq": "dlq", "max_receives": 2}})
        engine.create_tag("orders", "eu", "oldest", {"attributes": {"region": "eu"}})
        for round_ in range(6):
            engine.send("orders", [
                body(round_),
                {1: f"text {round_} é", 2: {"region": "eu", "raw": b"\x00\xff", "n": round_}},
                {1: b"\xff\xfe binary", 4: 2, 2: {"region": "us"}},
                {1: b"topic a %d" % round_, 3: "a"},
                {1: b"topic b %d" % round_, 3: "b"},
                {1: b"delayed", 5: 30},
            ])
            clock.advance(3)
        first = engine.receive("orders", max=6)
        engine.delete("orders", [d.receipt for d in first[:2]])
        clock.advance(31_000)  # the rest of the leases run out, delays end
        second = engine.receive("orders", max=6)  # the ended delays first
        second += engine.receive("orders", max=6)  # then the expired leases (count 2)
        dead = [d for d in second if d.dequeue_count == 2]
        assert dead, "a message received twice"
        engine.dead("orders", [dead[0].receipt])
        engine.receive("orders", "eu", max=3)
        engine.send("orders", [{1: b"still delayed", 5: 120}])
        info["received"] = len(first) + len(second)
    return clock, info


def write_forever(path: Path, queue: str, seconds: float) -> None:
    """About 1000 messages/s in sends of 20, segments of 500."""
    with Engine.open(path, segment_max_messages=500) as engine:
        engine.create_queue(queue)
        print("ready", flush=True)
        sent = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            engine.send(queue, [body(sent + i) for i in range(20)])
            sent += 20
            time.sleep(0.02)
        print("sent", sent, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write_forever(Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))


def run_killed(script: str, path: Path) -> str:
    """Run ``script`` in a child Python with ``path`` as its argument; the script ends by
    killing itself with SIGKILL (as a crash would). Returns what it printed."""
    child = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    return child.stdout
