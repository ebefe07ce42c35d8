"""The ``lamina`` command line.

``lamina serve`` runs the server (options in ``lamina.server.config``); ``lamina demo`` runs a
short embedded tour through the engine (create, send, receive, delete) against a local data
directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lamina.engine import Engine
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args


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


def _serve(args: argparse.Namespace) -> int:
    from lamina.server.run import run_server  # trio and the server only when serving
    return run_server(args.config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lamina", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a short embedded tour through the engine")
    demo.add_argument("--data", default="./lamina-data", help="data directory")
    demo.set_defaults(run=_demo)
    serve = commands.add_parser("serve", help="run the Lamina server")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    if args.run is _serve:
        try:
            args.config = config_from_args(args)
        except ConfigError as exc:
            serve.error(str(exc))
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
