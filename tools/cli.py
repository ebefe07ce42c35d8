"""The ``lamina`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lamina.bench.cli import add_bench_command
from lamina.engine import DataDirectoryError, Engine
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args
from lamina.tools.commands import add_client_commands
from lamina.tools.helptext import Parser
from lamina.tools.inspect import add_inspect_command

DESCRIPTION = """\
Lamina: a self-hosted message queue server and its command-line client.

  lamina serve                  run the server (lamina serve --help for its options)
  lamina queue create orders    the client commands talk to a server (--server HOST:PORT)
  lamina send orders hello      ...
  lamina receive orders --delete
  lamina inspect DATA_DIR ...   look at a data directory offline
  lamina demo                   a short tour through an embedded engine, no server needed
"""


def _demo(args: argparse.Namespace) -> int:
    try:
        engine = Engine.open(Path(args.data))
    except DataDirectoryError as exc:  # e.g. a lamina serve holds it
        print(f"lamina demo: {exc}", file=sys.stderr)
        return 1
    with engine:
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


def build_parser() -> argparse.ArgumentParser:
    """The ``lamina`` parser with every command."""
    parser = Parser(prog="lamina", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run a short tour through an embedded engine",
                               description="Create queue 'demo' in DATA, send, receive and "
                                           "delete a few messages, without a server.")
    demo.add_argument("--data", default="./lamina-data", metavar="DIR",
                      help="data directory (created if missing)")
    demo.set_defaults(run=_demo)
    serve = commands.add_parser("serve", help="run the Lamina server",
                                description="Run the Lamina server until SIGTERM or SIGINT "
                                            "(SIGHUP re-reads the keys file).")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve, serve_parser=serve)
    add_inspect_command(commands)
    add_client_commands(commands)  # queue, tag, send, receive, ...
    add_bench_command(commands)  # the load generator
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run is _serve:
        try:
            args.config = config_from_args(args)
        except ConfigError as exc:
            args.serve_parser.error(str(exc))
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
