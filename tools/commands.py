"""The client commands of ``lamina``: everything a person or a script does to a running server,
through :class:`lamina.client.Client` (DESIGN.md §5)::

    lamina queue create|delete|list|info|set|purge ...
    lamina tag create|delete|list QUEUE ...
    lamina send QUEUE [BODY...|-]      lamina receive QUEUE      lamina peek QUEUE
    lamina rewind QUEUE TIME           lamina redrive DLQ        lamina stats [QUEUE]

Every command takes the connection options (``--server host:port``, ``--key``/``--secret`` or
``LAMINA_KEY``/``LAMINA_SECRET``, ``--tls``, ``--ca FILE``) and ``--json``; the output formats
are described in ``output.py``.

Exit codes: 0 done; 1 the server refused a request, or some entries of a batch failed (each
is printed); 2 the server could not be reached or the connection failed, or the command line is
wrong; 130 interrupted.

Values on the command line:

- attributes (``name=value``): the value is read as JSON when it parses (``60``, ``true``,
  ``null``, ``{"dlq": "dead", "max_receives": 5}``), else taken as text: ``color=red``; quote to
  force text: ``code='"007"'``; a queue attribute's field may be set by a dotted name:
  ``redrive.dlq=dead redrive.max_receives=5``;
- times (``rewind``, ``peek --start``, ``redrive --since/--until``, ``tag create --start``):
  milliseconds since the epoch, an ISO 8601 date-time (UTC unless it has an offset), or a
  duration ago by the server's clock: ``90s``, ``15m``, ``2h``, ``1d``, ``500ms``.

Registered into the ``lamina`` parser by :func:`add_client_commands`.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import ssl
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, TextIO

from lamina.engine.errors import LaminaError

from .cmdvalues import (
    DEFAULT_SERVER,
    UsageError,
    named_values,
    nest_assignments,
    parse_assignment,
    parse_count,
    parse_seconds,
    parse_server,
    parse_tag_start,
    parse_time,
)
from .output import Output, body_text, format_time_ms

if TYPE_CHECKING:  # the client (and trio) are imported when a command runs, not to parse
    from lamina.client import Client

__all__ = ["add_client_commands"]

#: PROTOCOL §5: batch operations take at most this many entries per request.
MAX_BATCH = 1000
#: A send request is cut before its bodies pass this many bytes (far below any max_frame).
_SEND_CHUNK_BYTES = 1 << 20
#: ``send`` prints a row per message up to this many; past it, a summary.
_SEND_TABLE_ROWS = 100

Handler = Callable[["Client", argparse.Namespace, Output], "int | None"]


# --- Connecting and running -------------------------------------------------------------------


def _tls_option(args: argparse.Namespace) -> bool | ssl.SSLContext:
    if args.ca is not None:
        try:
            return ssl.create_default_context(cafile=args.ca)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--ca {args.ca}: {getattr(exc, 'strerror', None) or exc}") from None
    return bool(args.tls)


def connect(args: argparse.Namespace) -> Client:
    """The client of the connection options in ``args``."""
    from lamina.client import Client
    host, port = args.server
    return Client.connect(host, port, key=args.key or os.environ.get("LAMINA_KEY"),
                          secret=args.secret or os.environ.get("LAMINA_SECRET"),
                          tls=_tls_option(args), timeout=args.timeout)


def _runner(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Connect, run ``handler``, and turn what went wrong into a message and an exit code."""

    def run(args: argparse.Namespace) -> int:
        from lamina.client import LaminaConnectionError
        out = Output(args.json)
        try:
            with connect(args) as client:
                return int(handler(client, args, out) or 0)
        except LaminaConnectionError as exc:
            out.error(f"connection error: {exc.message}")
            return 2
        except UsageError as exc:
            out.error(exc.message)
            return 2
        except LaminaError as exc:
            out.error(f"{exc.code}: {exc.message}")
            return 1
        except ssl.SSLError as exc:
            out.error(f"connection error: TLS: {exc}")
            return 2
        except KeyboardInterrupt:
            out.error("interrupted")
            return 130
        except BrokenPipeError:  # the reader went away (piped into head): not an error
            _silence_stdout()
            return 0
        except OSError as exc:  # anything else the socket layer raises
            out.error(f"connection error: {exc}")
            return 2

    run.__name__ = handler.__name__
    return run


def _silence_stdout() -> None:
    """After a broken pipe, send what is still buffered nowhere (else Python complains at
    exit)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _entry_failures(out: Output, labels: list[str], results: list[Any]) -> int:
    """Print each per-entry error, named by its label; -> how many there were."""
    failed = 0
    for label, result in zip(labels, results):
        if isinstance(result, LaminaError):
            failed += 1
            out.error(f"{label}: {result.code}: {result.message}")
    return failed


def _message_json(msg: Any) -> dict[str, Any]:
    return {"id": msg.id, "body": msg.body, "attributes": msg.attributes, "topic": msg.topic,
            "priority": msg.priority, "enqueue_time": msg.enqueue_time,
            "visible_time": msg.visible_time, "md5": msg.md5.hex(), "dead": msg.dead}


# --- queue ------------------------------------------------------------------------------------


def _queue_create(client: Client, args: argparse.Namespace, out: Output) -> None:
    info = client.create_queue(args.queue, nest_assignments(args.attributes) or None)
    if out.json_mode:
        out.document({"queue": info.queue, "attributes": info.attributes,
                      "created": info.created})
    else:
        out.text(f"created queue {info.queue}")
        out.fields(info.attributes, title="attributes")


def _queue_delete(client: Client, args: argparse.Namespace, out: Output) -> None:
    client.delete_queue(args.queue)
    if out.json_mode:
        out.document({"deleted": args.queue})
    else:
        out.text(f"deleted queue {args.queue}")


def _queue_names(client: Client, prefix: str | None, limit: int | None) -> Iterator[str]:
    after, count = None, 0
    while True:
        page = client.list_queues(prefix=prefix, after=after,
                                  limit=min(MAX_BATCH, limit - count) if limit else None)
        for name in page.queues:
            yield name
            count += 1
        if page.next is None or not page.queues or (limit and count >= limit):
            return
        after = page.next


def _queue_list(client: Client, args: argparse.Namespace, out: Output) -> None:
    names = _queue_names(client, args.prefix, args.limit)
    if out.json_mode:
        for name in names:
            out.line({"queue": name})
    else:
        out.table(("queue",), ([name] for name in names))


def _queue_info(client: Client, args: argparse.Namespace, out: Output) -> None:
    info = client.get_queue(args.queue)
    if out.json_mode:
        out.document({"queue": info.queue, "attributes": info.attributes,
                      "created": info.created, "stats": info.stats})
        return
    stats = dict(info.stats or {})
    tags = stats.pop("tags", {}) or {}
    for name in ("oldest", "newest"):
        if name in stats:
            stats[name] = format_time_ms(stats[name])
    out.fields({"queue": info.queue, "created": format_time_ms(info.created), **stats},
               title=f"queue {info.queue}")
    out.fields(info.attributes, title="attributes")
    if tags:
        columns = list(next(iter(tags.values())))
        rows = [[name, *(format_time_ms(figures.get(c)) if c == "lag" else figures.get(c)
                         for c in columns)] for name, figures in tags.items()]
        out.table(("tag", *columns), rows, title="tags")


def _queue_set(client: Client, args: argparse.Namespace, out: Output) -> None:
    if not args.attributes:
        raise UsageError("queue set needs at least one name=value")
    attributes = client.set_queue_attributes(args.queue, nest_assignments(args.attributes))
    if out.json_mode:
        out.document({"queue": args.queue, "attributes": attributes})
    else:
        out.fields(attributes, title=f"queue {args.queue} attributes")


def _queue_purge(client: Client, args: argparse.Namespace, out: Output) -> None:
    purged = client.purge_queue(args.queue)
    if out.json_mode:
        out.document({"queue": args.queue, "purged": purged})
    else:
        out.text(f"purged {purged} messages from {args.queue}")


# --- tag --------------------------------------------------------------------------------------


def _tag_create(client: Client, args: argparse.Namespace, out: Output) -> None:
    start = args.start.resolve(client) if args.start is not None else None
    tag_filter = None
    if args.match is not None and not args.filter:
        raise UsageError("--match goes with --filter (how several filters combine)")
    if args.filter:
        tag_filter = {"attributes": named_values(args.filter, "--filter"),
                      "match": args.match or "all"}
    info = client.create_tag(args.queue, args.tag, start=start, filter=tag_filter)
    if out.json_mode:
        out.document({"queue": args.queue, "tag": info.tag, "start": info.start,
                      "filter": info.filter, "created": info.created})
    else:
        out.text(f"created tag {info.tag} on {args.queue}, starting at {_start_text(info.start)}")


def _start_text(start_ms: int) -> str:
    return "oldest" if start_ms == 0 else format_time_ms(start_ms)


def _tag_delete(client: Client, args: argparse.Namespace, out: Output) -> None:
    client.delete_tag(args.queue, args.tag)
    if out.json_mode:
        out.document({"queue": args.queue, "deleted": args.tag})
    else:
        out.text(f"deleted tag {args.tag} of {args.queue}")


def _tag_list(client: Client, args: argparse.Namespace, out: Output) -> None:
    tags = client.list_tags(args.queue)
    if out.json_mode:
        for tag in tags:
            out.line({"tag": tag.tag, "start": tag.start, "filter": tag.filter,
                      "created": tag.created, "stats": tag.stats})
        return
    figures = ("active", "inflight", "delayed", "parked")
    out.table(("tag", "start", "filter", *figures, "lag"),
              ([tag.tag, _start_text(tag.start), tag.filter,
                *((tag.stats or {}).get(name) for name in figures),
                format_time_ms((tag.stats or {}).get("lag"))] for tag in tags),
              title=f"tags of {args.queue}")


# --- messages ---------------------------------------------------------------------------------


def _bodies(args: argparse.Namespace, stdin: TextIO) -> Iterator[bytes | str]:
    for body in args.bodies:
        if body == "-":
            for line in stdin:
                yield _decode_body(line.rstrip("\r\n"), args.base64)
        else:
            yield _decode_body(body, args.base64)


def _decode_body(text: str, is_base64: bool) -> bytes | str:
    if not is_base64:
        return text
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise UsageError(f"not base64: {text[:40]!r}") from None


def _send_chunks(entries: Iterator[Any]) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    size = 0
    for entry in entries:
        body = entry[1] if isinstance(entry, dict) else entry
        body_bytes = len(body.encode()) if isinstance(body, str) else len(body)
        if chunk and (len(chunk) >= MAX_BATCH or size + body_bytes > _SEND_CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += body_bytes
    if chunk:
        yield chunk


def _send(client: Client, args: argparse.Namespace, out: Output) -> int:
    from lamina.client import message
    if not args.bodies:
        raise UsageError("nothing to send: give bodies, or - to read one per line from stdin")
    attributes = named_values(args.attribute, "--attribute") or None
    entries = (message(body, attributes=attributes, topic=args.topic, priority=args.priority,
                       delay=args.delay) for body in _bodies(args, sys.stdin))
    rows: list[list[Any]] = []
    sent = failed = 0
    for chunk in _send_chunks(entries):
        results = client.send(args.queue, chunk)
        first = sent + failed
        failed += _entry_failures(out, [f"message {first + i}" for i in range(len(chunk))],
                                  results)
        for result in results:
            if isinstance(result, LaminaError):
                if out.json_mode:
                    out.line(result)
                continue
            sent += 1
            if out.json_mode:
                out.line({"id": result.id, "enqueue_time": result.enqueue_time,
                          "md5": result.md5.hex()})
            elif len(rows) <= _SEND_TABLE_ROWS:
                rows.append([result.id, format_time_ms(result.enqueue_time), result.md5.hex()])
    if not out.json_mode:
        if sent <= _SEND_TABLE_ROWS:
            out.table(("id", "enqueued", "md5"), rows, title=f"sent to {args.queue}")
        out.text(f"sent {sent} message{'s' * (sent != 1)}"
                 + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0


def _receive(client: Client, args: argparse.Namespace, out: Output) -> int:
    remaining, wait, failed = args.max, args.wait, 0
    rows: list[list[Any]] = []
    while remaining > 0:
        batch = min(remaining, MAX_BATCH)
        deliveries = client.receive(args.queue, tag=args.tag, max=batch, wait=wait,
                                    visibility_timeout=args.visibility_timeout)
        remaining -= len(deliveries)
        wait = 0  # only the first request waits; then take what is there
        deleted: list[Any] = [None] * len(deliveries)
        if args.delete and deliveries:
            deleted = client.delete(args.queue, deliveries, tag=args.tag)
            failed += _entry_failures(out, [f"delete of {d.id}" for d in deliveries], deleted)
        for delivery, error in zip(deliveries, deleted):
            if out.json_mode:
                out.line({**_message_json(delivery.message), "receipt": delivery.receipt,
                          "dequeue_count": delivery.dequeue_count,
                          "first_dequeue_time": delivery.first_dequeue_time,
                          "next_visible_time": delivery.next_visible_time,
                          "deleted": args.delete and error is None})
            else:
                rows.append([delivery.id, delivery.message.priority, delivery.dequeue_count,
                             format_time_ms(delivery.message.enqueue_time),
                             body_text(delivery.body)])
        if len(deliveries) < batch:
            break
    if not out.json_mode:
        got = len(rows)
        out.table(("id", "priority", "dequeues", "enqueued", "body"), rows,
                  title=f"received from {args.queue}" + (f" (tag {args.tag})" if args.tag else ""))
        out.text(f"{got} message{'s' * (got != 1)}"
                 + (" deleted" if args.delete else
                    " leased (they come back when the visibility timeout ends)"))
    return 1 if failed else 0


def _peek(client: Client, args: argparse.Namespace, out: Output) -> int:
    start = args.start.resolve(client) if args.start is not None else None
    page = client.peek(args.queue, tag=args.tag, max=args.max, start=start, after=args.after,
                       ids=args.ids)
    if out.json_mode:
        out.document({"messages": [entry if isinstance(entry, LaminaError) else
                                   {**_message_json(entry.message), "state": entry.state,
                                    "dequeue_count": entry.dequeue_count,
                                    "first_dequeue_time": entry.first_dequeue_time,
                                    "next_visible_time": entry.next_visible_time}
                                   for entry in page.messages],
                      "next": page.next})
        return 1 if any(isinstance(e, LaminaError) for e in page.messages) else 0
    failed = _entry_failures(out, [f"id {i}" for i in args.ids or ()], page.messages)
    out.table(("id", "state", "priority", "dequeues", "enqueued", "body"),
              ([entry.id, entry.state, entry.message.priority, entry.dequeue_count,
                format_time_ms(entry.message.enqueue_time), body_text(entry.body)]
               for entry in page.messages if not isinstance(entry, LaminaError)),
              title=f"peek at {args.queue}" + (f" (tag {args.tag})" if args.tag else ""))
    if page.next is not None:
        out.text(f"more: --after {page.next}")
    return 1 if failed else 0


def _rewind(client: Client, args: argparse.Namespace, out: Output) -> None:
    rewound = client.rewind(args.queue, args.time.resolve(client), tag=args.tag)
    if out.json_mode:
        out.document({"queue": args.queue, "time": rewound.time, "tags": rewound.tags})
    else:
        out.text(f"rewound {args.queue} to {format_time_ms(rewound.time)}: tags "
                 + (", ".join(rewound.tags) or "(none)"))


def _redrive(client: Client, args: argparse.Namespace, out: Output) -> None:
    since = args.since.resolve(client) if args.since is not None else None
    until = args.until.resolve(client) if args.until is not None else None
    result = client.redrive(args.queue, source=args.source, since=since, until=until,
                            max=args.max, dry_run=args.dry_run or None)
    if out.json_mode:
        out.document({"queue": args.queue, "moved": result.moved, "skipped": result.skipped,
                      "dry_run": args.dry_run})
    else:
        verb = "would move" if args.dry_run else "moved"
        out.text(f"{verb} {result.moved} messages from {args.queue} back to their queues, "
                 f"skipped {result.skipped}")


def _stats(client: Client, args: argparse.Namespace, out: Output) -> None:
    if args.queue is None:
        info = client.server_info()
        values = {"version": info.version, "uptime_s": round(info.uptime, 1),
                  "queues": info.queues, "connections": info.connections,
                  "data_bytes": info.data_bytes}
        if out.json_mode:
            out.document(values)
        else:
            out.fields(values, title=f"server {args.server[0]}:{args.server[1]}")
        return
    days = client.stats(args.queue, tag=args.tag, days=args.days)
    if out.json_mode:
        for day in days:
            out.line(day)
        return
    columns = list(days[0]) if days else ["day", "sent", "received", "deleted", "dead",
                                          "expired", "bytes_in", "bytes_out"]
    out.table(columns, ([day.get(c) for c in columns] for day in days),
              title=f"daily counters of {args.queue}" + (f" tag {args.tag}" if args.tag else ""))


# --- Registration -----------------------------------------------------------------------------


def connection_options() -> argparse.ArgumentParser:
    """The options every client command takes (an argparse parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument("--server", type=parse_server, default=parse_server(DEFAULT_SERVER),
                       metavar="HOST:PORT", help=f"server address (default {DEFAULT_SERVER})")
    group.add_argument("--key", help="key id (default $LAMINA_KEY)")
    group.add_argument("--secret", help="key secret (default $LAMINA_SECRET)")
    group.add_argument("--tls", action="store_true", help="use TLS (system CAs)")
    group.add_argument("--ca", metavar="FILE",
                       help="use TLS, trusting this CA bundle (default the system's CAs)")
    group.add_argument("--timeout", type=parse_seconds, default=10.0, metavar="SECONDS",
                       help="seconds to connect and authenticate (default 10)")
    group.add_argument("--json", action="store_true",
                       help="print JSON for scripts: lines for streams, else one document")
    return common


def add_client_commands(commands: Any) -> None:
    """Add the client commands to ``commands`` (the ``lamina`` parser's subparsers)."""
    common = connection_options()

    def command(parent: Any, name: str, handler: Handler, help_text: str) -> Any:
        parser = parent.add_parser(name, parents=[common], help=help_text,
                                   description=help_text)
        parser.set_defaults(run=_runner(handler))
        return parser

    assign = dict(type=parse_assignment, metavar="NAME=VALUE")

    queue = commands.add_parser("queue", help="create, delete, list, inspect or change queues")
    queues = queue.add_subparsers(dest="queue_command", required=True)
    p = command(queues, "create", _queue_create, "create a queue")
    p.add_argument("queue", help="queue name")
    p.add_argument("attributes", nargs="*", help="queue attributes, e.g. visibility_timeout=60 "
                   "redrive.dlq=errors redrive.max_receives=5", **assign)
    p = command(queues, "delete", _queue_delete, "delete a queue and its messages")
    p.add_argument("queue", help="queue name")
    p = command(queues, "list", _queue_list, "list queue names")
    p.add_argument("--prefix", help="only names starting with this (default all)")
    p.add_argument("--limit", type=parse_count, metavar="N", help="at most this many names "
                   "(default all)")
    p = command(queues, "info", _queue_info, "a queue's attributes and stats")
    p.add_argument("queue", help="queue name")
    p = command(queues, "set", _queue_set, "change queue attributes")
    p.add_argument("queue", help="queue name")
    p.add_argument("attributes", nargs="*", help="attributes to change", **assign)
    p = command(queues, "purge", _queue_purge, "delete every message of a queue")
    p.add_argument("queue", help="queue name")

    tag = commands.add_parser("tag", help="create, delete or list a queue's tags")
    tags = tag.add_subparsers(dest="tag_command", required=True)
    p = command(tags, "create", _tag_create, "create a tag (an independent reader)")
    p.add_argument("queue", help="queue name")
    p.add_argument("tag", help="tag name")
    p.add_argument("--start", type=parse_tag_start, metavar="TIME",
                   help="oldest, now (default) or a time (epoch ms or ISO-8601)")
    p.add_argument("--filter", action="append", default=[],
                   help="only messages with this attribute value; repeatable (default none: "
                        "every message)", **assign)
    p.add_argument("--match", choices=("all", "any"),
                   help="with several --filter: all (default) or any must match")
    p = command(tags, "delete", _tag_delete, "delete a tag")
    p.add_argument("queue", help="queue name")
    p.add_argument("tag", help="tag name")
    p = command(tags, "list", _tag_list, "a queue's tags and their figures")
    p.add_argument("queue", help="queue name")

    p = command(commands, "send", _send, "send messages (bodies as arguments, - for stdin lines)")
    p.add_argument("queue", help="queue name")
    p.add_argument("bodies", nargs="*", metavar="BODY", help="a body, or - for one per stdin line")
    p.add_argument("--priority", type=int, metavar="N",
                   help="1 (first) .. 16 (last), default 8")
    p.add_argument("--delay", type=float, metavar="SECONDS",
                   help="visible only after this long (default the queue's delay)")
    p.add_argument("--topic", help="deliver in order with the other messages of this topic, "
                   "one at a time (default none)")
    p.add_argument("--attribute", action="append", default=[],
                   help="a message attribute; repeatable (default none)", **assign)
    p.add_argument("--base64", action="store_true",
                   help="bodies are base64: send the bytes (default off: text)")

    p = command(commands, "receive", _receive, "receive (lease) messages")
    p.add_argument("queue", help="queue name")
    p.add_argument("--tag", help="the tag to read (default the tag 'default')")
    p.add_argument("--max", type=parse_count, default=1, metavar="N",
                   help="up to this many, asked for 1000 at a time (default 1)")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="long-poll this long for the first (0-30, default the queue's)")
    p.add_argument("--visibility-timeout", type=float, metavar="SECONDS",
                   help="hidden from other receives this long (default the queue's)")
    p.add_argument("--delete", action="store_true",
                   help="delete what was received (default off: it comes back after the "
                        "visibility timeout)")

    p = command(commands, "peek", _peek, "look at messages without changing anything")
    p.add_argument("queue", help="queue name")
    p.add_argument("--tag", help="the tag to look with (default the tag 'default')")
    p.add_argument("--max", type=int, default=10, metavar="N",
                   help="up to this many, 1-1000 (default 10)")
    p.add_argument("--start", type=parse_time, metavar="TIME",
                   help="messages produced from TIME on, with their states (default: what "
                        "a receive would get now)")
    p.add_argument("--after", metavar="CURSOR",
                   help="with --start: the page after this cursor (default the first page)")
    p.add_argument("--ids", nargs="+", metavar="ID",
                   help="these messages, by id (default: see --start)")

    p = command(commands, "rewind", _rewind, "make a queue's tags deliver again from TIME")
    p.add_argument("queue", help="queue name")
    p.add_argument("time", type=parse_time, metavar="TIME",
                   help="epoch ms or ISO-8601, within the queue's rewind window")
    p.add_argument("--tag", help="only this tag (default every tag)")

    p = command(commands, "redrive", _redrive,
                "move dead-lettered messages back to their source queues")
    p.add_argument("queue", metavar="DLQ", help="the dead-letter queue")
    p.add_argument("--source", help="only messages from this queue (default every source)")
    p.add_argument("--since", type=parse_time, metavar="TIME",
                   help="only messages dead-lettered at or after TIME (default no bound)")
    p.add_argument("--until", type=parse_time, metavar="TIME",
                   help="only messages dead-lettered at or before TIME (default no bound)")
    p.add_argument("--max", type=int, metavar="N",
                   help="at most this many, 1-100000 (default 1000)")
    p.add_argument("--dry-run", action="store_true",
                   help="only count what would move (default off)")

    p = command(commands, "stats", _stats,
                "a queue's daily counters, or without QUEUE the server's figures")
    p.add_argument("queue", nargs="?", help="queue name (default: the server's figures)")
    p.add_argument("--tag", help="only this tag (default the queue's totals)")
    p.add_argument("--days", type=int, metavar="N", help="days back, 1-31 (default 7)")
