"""How long a big redrive keeps other clients waiting: a bystander pings in a loop while
another connection redrives a dead-letter queue of N messages (default 100,000).

    python -m lamina.bench.redrive_stall [--messages N] [--runs R] [--server-command CMD ...]

Each run copies one prepared data directory, starts ``lamina serve`` on it (``CMD serve ...``;
default this Python's ``-m lamina.tools.cli``), and reports the redrive's duration, the pings
answered meanwhile, the bystander's ping p99 and max, and how long a ``max=1, dry_run`` redrive
takes. Several ``--server-command`` values are run alternately, so their figures compare.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lamina.engine import Engine
from lamina.client import Client


def prepare(data: Path, messages: int, visibility_s: int) -> None:
    """A DLQ holding ``messages`` dead letters of queue ``src`` (received with a visibility
    timeout of ``visibility_s``, then dead-lettered), a second and a half before the redrive.
    With 1 s their leases would have ended by then: the rows RocksDB deleted for them lie in
    the past, as for any dead letter redriven later than its visibility timeout."""
    with Engine.open(data) as engine:
        engine.create_queue("dlq")
        engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1},
                                    "visibility_timeout": visibility_s})
        for start in range(0, messages, 1000):
            engine.send("src", [b"m%d" % n for n in range(start, min(start + 1000, messages))])
        while delivered := engine.receive("src", max=1000):
            engine.dead("src", [d.receipt for d in delivered])
    time.sleep(1.5)


def start_server(command: list[str], data: Path) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([*command, "serve", "--data", str(data), "--port", "0"],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        event = json.loads(line)
        if event.get("event") == "start":
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, int(event["port"])
    raise RuntimeError("the server did not start")


def measure(port: int, messages: int) -> dict[str, Any]:
    pings: list[tuple[float, float]] = []  # (sent, answered)
    done = threading.Event()

    def bystander() -> None:
        with Client.connect("127.0.0.1", port) as client:
            while not done.is_set():
                started = time.perf_counter()
                client.ping()
                pings.append((started, time.perf_counter()))

    with Client.connect("127.0.0.1", port, timeout=600) as client:
        started = time.perf_counter()
        client.redrive("dlq", max=1, dry_run=True)
        dry_run_s = time.perf_counter() - started
        thread = threading.Thread(target=bystander)
        thread.start()
        time.sleep(0.2)
        started = time.perf_counter()
        result = client.redrive("dlq", max=messages)
        ended = time.perf_counter()
        redrive_s = ended - started
        done.set()
        thread.join()
    # Every ping in flight at some time during the redrive (the one it held up included).
    during = sorted(answered - sent for sent, answered in pings
                    if sent < ended and answered > started)
    return {"moved": result.moved, "redrive_s": round(redrive_s, 2),
            "dry_run_max1_ms": round(dry_run_s * 1000, 1), "pings_during": len(during),
            "ping_p99_ms": round(during[int(len(during) * 0.99)] * 1000, 1) if during else None,
            "ping_max_ms": round(during[-1] * 1000, 1) if during else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lamina.bench.redrive_stall",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, metavar="N",
                        help="dead letters to redrive (default 100000)")
    parser.add_argument("--visibility-timeout", type=int, default=1, metavar="SECONDS",
                        help="of the receives that preceded the dead-lettering (default 1)")
    parser.add_argument("--runs", type=int, default=2, metavar="R",
                        help="runs of each server command (default 2)")
    parser.add_argument("--server-command", action="append", metavar="CMD",
                        help="a command line (split on spaces) that takes `serve ...` "
                             "(default this Python's -m lamina.tools.cli); repeatable")
    args = parser.parse_args(argv)
    commands = [c.split() for c in args.server_command or
                [f"{sys.executable} -m lamina.tools.cli"]]
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template"
        prepare(template, args.messages, args.visibility_timeout)
        for run in range(args.runs):
            for command in commands:
                data = Path(tmp) / f"run{run}"
                shutil.rmtree(data, ignore_errors=True)
                shutil.copytree(template, data)
                process, port = start_server(command, data)
                try:
                    figures = measure(port, args.messages)
                finally:
                    process.terminate()
                    process.wait(60)
                print(json.dumps({"server": " ".join(command), "run": run + 1, **figures}),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
