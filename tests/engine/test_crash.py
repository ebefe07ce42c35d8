"""Crash safety (DESIGN.md §3 "Acknowledged means in the WAL (survives a killed process)").

A child process runs a stream of sends, receives and deletes on a data directory and prints
one line per acknowledged effect, *after* the engine call returned:

    S <id>   a send entry was accepted
    R <id>   a message was delivered (leased)
    P <id>   a delete is about to be requested for it (written before the call)
    D <id>   a delete returned None for it

The parent kills the child with SIGKILL mid-stream (no ``close()``), copies the directory,
reopens the copy and drains it. Several cycles run on the same directory (each child reopens
what the previous one left), so recovery is exercised repeatedly. After every cycle:

- every acknowledged send is still there: receivable again, or its delete was requested (a
  delete may take effect without its acknowledgement reaching the parent);
- no acknowledged-deleted message is ever delivered again (neither by the drain nor by a later
  child);
- nothing is delivered twice by one drain.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lamina.engine import Engine, FakeClock, wall_clock_ms

pytestmark = pytest.mark.slow

CYCLES = 5
CHILD_TIMEOUT_S = 60

CHILD = r"""
import os, random, sys
from lamina.engine import Engine

path, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
out = sys.stdout
engine = Engine.open(path)          # wall clock, no fsync: acked = in the WAL
engine.create_queue("q")            # idempotent on reopen
body = os.urandom(200)

def ack(tag, ids):
    if ids:
        out.write("".join(f"{tag} {i}\n" for i in ids))
        out.flush()

def send(count):
    if not count:
        return []
    results = engine.send("q", [body + b"%d" % k for k in range(count)])
    return [r.id for r in results if not isinstance(r, Exception)]

def receive_delete(count, keep):
    deliveries = engine.receive("q", max=count)
    ack("R", [d.id for d in deliveries])
    victims = deliveries[keep:]
    if not victims:
        return []
    # The intent goes out before the call: a delete that took effect although its "D" line
    # never reached the parent (killed in between) is still accounted for.
    ack("P", [d.id for d in victims])
    results = engine.delete("q", [d.receipt for d in victims])
    return [d.id for d, r in zip(victims, results) if r is None]

out.write("READY\n")
out.flush()
while True:
    step = rng.random()
    if step < 0.45:
        ack("S", send(rng.randint(1, 16)))
    elif step < 0.85:
        # Some receives leave a few messages in flight (leased, not deleted) at the kill.
        ack("D", receive_delete(rng.randint(1, 16), rng.choice((0, 0, 0, 1, 2))))
    else:
        # A group: several operations in one write batch, acknowledged after it is written.
        with engine.group():
            sent = send(rng.randint(1, 16))
            deleted = receive_delete(rng.randint(1, 16), 0)
            sent += send(rng.randint(1, 16))
        ack("S", sent)
        ack("D", deleted)
"""


class Acks:
    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.deleted: set[str] = set()
        self.deleting: set[str] = set()
        self.received: list[str] = []
        self.lines = 0

    def take(self, line: bytes) -> None:
        if not line.endswith(b"\n"):
            return  # a torn last line proves nothing (it cannot happen for short pipe writes)
        kind, _, msg_id = line.decode().strip().partition(" ")
        if kind == "S":
            self.sent.add(msg_id)
        elif kind == "D":
            self.deleted.add(msg_id)
        elif kind == "P":
            self.deleting.add(msg_id)
        elif kind == "R":
            self.received.append(msg_id)
        else:
            raise AssertionError(f"unexpected child line {line!r}")
        self.lines += 1


def run_child_and_kill(path: Path, seed: int, acks_wanted: int, stderr_path: Path) -> Acks:
    """Run one child on ``path`` until it acknowledged ``acks_wanted`` operations, SIGKILL it,
    and collect every acknowledgement it wrote (those still in the pipe included)."""
    acks = Acks()
    with open(stderr_path, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(seed)],
            stdout=subprocess.PIPE, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    watchdog = threading.Timer(CHILD_TIMEOUT_S, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"READY\n", stderr_path.read_text()
        while acks.lines < acks_wanted:
            line = child.stdout.readline()
            if not line:
                raise AssertionError(f"child ended early ({child.wait()}):\n"
                                     f"{stderr_path.read_text()}")
            acks.take(line)
        os.kill(child.pid, signal.SIGKILL)  # mid-stream: the child is running, not blocked
        for line in child.stdout:           # acks written before the kill still count
            acks.take(line)
        assert child.wait() == -signal.SIGKILL, stderr_path.read_text()  # not dead by itself
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    return acks


def drain(path: Path) -> list[str]:
    """Reopen ``path`` with a clock far past every lease of the child (but well within
    retention) and receive everything, leasing it for hours so nothing comes back."""
    clock = FakeClock(wall_clock_ms() + 10 * 60_000)  # >= the child's persisted clock
    engine = Engine.open(path, clock=clock)
    try:
        ids: list[str] = []
        empty = 0
        while empty < 3:  # a receive may return fewer than max even when more are Active
            deliveries = engine.receive("q", max=1000, visibility_timeout=43200)
            empty = 0 if deliveries else empty + 1
            ids += [d.id for d in deliveries]
        stats = engine.get_queue("q").stats["tags"]["default"]
        assert stats["active"] == 0, stats
        return ids
    finally:
        engine.close()


def test_acknowledged_operations_survive_sigkill(tmp_path):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    data = tmp_path / "data"
    sent: set[str] = set()
    deleted: set[str] = set()
    deleting: set[str] = set()  # deletes requested, acknowledged or not
    started = time.monotonic()
    for cycle in range(CYCLES):
        acks = run_child_and_kill(data, seed + cycle, rng.randint(3000, 8000),
                                  tmp_path / f"child{cycle}.err")
        context = f"seed {seed}, cycle {cycle}"
        # A later child never delivers what an earlier one deleted (and acknowledged).
        redelivered = deleted & set(acks.received)
        assert not redelivered, f"{context}: deleted messages delivered again: {redelivered}"
        sent |= acks.sent
        deleted |= acks.deleted
        deleting |= acks.deleting
        # (Not ``deleted <= sent``: a send whose acknowledgement the kill cut off may have
        # taken effect, and a later child may receive and delete it.)
        assert deleted <= deleting, f"{context}: inconsistent child stream"
        assert len(acks.sent) > 500 and len(acks.deleted) > 200, (
            f"{context}: stream not mixed enough: {len(acks.sent)} sends, "
            f"{len(acks.deleted)} deletes")

        copy = tmp_path / f"after-kill-{cycle}"
        shutil.copytree(data, copy)  # the next child continues on the untouched original
        drained = drain(copy)
        shutil.rmtree(copy)
        drained_set = set(drained)
        assert len(drained) == len(drained_set), f"{context}: a drain delivered an id twice"
        lost = (sent - deleting) - drained_set
        assert not lost, f"{context}: {len(lost)} acknowledged sends lost, e.g. {sorted(lost)[:5]}"
        resurrected = drained_set & deleted
        assert not resurrected, (f"{context}: {len(resurrected)} acknowledged deletes came "
                                 f"back, e.g. {sorted(resurrected)[:5]}")
    assert time.monotonic() - started < 60
