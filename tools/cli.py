"""The ``lamina`` command line.

``lamina serve`` runs the server (options in ``lamina.server.config``); ``lamina demo`` runs a
short embedded tour through the engine (create, send, receive, delete) against a local data
directory. The client commands (``queue``, ``tag``, ``send``, ``receive``, ``peek``, ``rewind``,
``redrive``, ``stats``) are in ``commands.py``; ``lamina bench`` is in ``lamina.bench``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lamina.bench.cli import add_bench_command
from lamina.engine import Engine
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args
from lamina.tools.inspect import add_inspect_command
from lamina.tools.commands import add_client_commands


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
    add_inspect_command(commands)
    add_client_commands(commands)  # queue, tag, send, receive, ... (tools/commands.py)
    add_bench_command(commands)  # the load generator (bench/cli.py)
    args = parser.parse_args(argv)
    if args.run is _serve:
        try:
            args.config = config_from_args(args)
        except ConfigError as exc:
            serve.error(str(exc))
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
