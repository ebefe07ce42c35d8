"""The ``lamina`` command line.

Until the network server lands, ``lamina demo`` runs a short embedded tour through the engine
(create, send, receive, delete) against a local data directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lamina.engine import Engine


def _demo(args: argparse.Namespace) -> int:
    with Engine.open(Path(args.data)) as engine:
        engine.create_queue("demo")
        sent = engine.send("demo", [b"hello", {1: "urgent", 4: 1}, {1: "later", 5: 0.5}])
        print(f"sent {len(sent)} messages to 'demo' in {args.data}")
        for delivery in engine.receive("demo", max=10):
            message = delivery.message
            print(f"received {message.id} priority={message.priority} body={message.body!r}")
            engine.delete("demo", [delivery.receipt])
        stats = engine.get_queue("demo").stats or {}
        print(f"retained: {stats['messages']} (the delayed one becomes visible in 0.5 s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lamina", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a short embedded tour through the engine")
    demo.add_argument("--data", default="./lamina-data", help="data directory")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
