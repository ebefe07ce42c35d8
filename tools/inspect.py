"""``lamina inspect DATA_DIR ...``: look at a data directory without a server (DESIGN.md §6).

    lamina inspect DATA_DIR queues                       queues and their watermarks
    lamina inspect DATA_DIR segments QUEUE               the segment table
    lamina inspect DATA_DIR tags QUEUE                   tags: scope, cursors, leases
    lamina inspect DATA_DIR leases QUEUE [--tag T]       leases, one line a message
    lamina inspect DATA_DIR dump QUEUE [--segment N | --since T --until T] [--tag T]
    lamina inspect DATA_DIR verify [QUEUE ...]           re-check the log; exit 1 on damage

Tables by default, ``--json`` for JSON lines (one object per row). ``dump`` always writes JSON
lines, one per message in production order. Times are epoch ms or ISO-8601.

The directory is opened read-only without its LOCK (``Snapshot``; why not a secondary instance:
tools/snapshot.py): safe beside a running server, fine on an offline copy, never writes under
DATA_DIR, never reads ``receipt.key``.
Progress bars go to stderr when it is a terminal (``--progress`` forces them).

``dump`` shows every log row physically present in the range, including rows below the
queue's gone_seq that wait for their segment to be reclaimed; ``--tag`` says which (state
``gone``). Message fields: ``id``, ``seq``, ``time`` (production, ms), ``visible_time``,
``priority``, ``topic``, ``attributes`` (a bytes value becomes ``{"$base64": ...}`` as in
every ``lamina`` JSON output, tools/output.py), ``body`` with ``body_encoding`` ``"utf-8"`` or
``"base64"``, ``md5``
(hex), ``dead`` (null, or the dead-letter source as an object); with ``--tag``: ``state``,
``dequeue_count``, ``first_dequeue_time``, ``next_visible_time`` (``tools/tagstate.py``).
"""

from __future__ import annotations

import argparse
import base64
import json
from json.encoder import encode_basestring_ascii as _esc  # C, as json.dumps uses
import sys
from contextlib import contextmanager
from itertools import islice
from typing import Any, Callable, Iterator, TextIO

import cbor2

from lamina.engine import keys
from lamina.engine.errors import LaminaError
from lamina.engine.records import PREFIX_SIZE
from lamina.engine.state import ENDED_AHEAD, ENDED_DEAD, ENDED_DELETED, LEASED, QueueState

from .cmdvalues import parse_count
from .output import to_json
from .snapshot import Snapshot, SnapshotError, SnapshotReadError
from .tagstate import TagStates
from .timefmt import iso_ms, parse_time_ms

__all__ = ["add_inspect_command", "message_json", "message_line", "run_inspect"]

EXIT_OK, EXIT_DAMAGE, EXIT_USAGE = 0, 1, 2
DESCRIPTION = """\
Look at a data directory without a server: read-only, without taking its lock, so it is
safe beside a running server and on an offline copy; it never writes under DATA_DIR and
never reads the receipt key.

  lamina inspect DATA_DIR queues                       queues and their watermarks
  lamina inspect DATA_DIR segments QUEUE               the segment table
  lamina inspect DATA_DIR tags QUEUE                   tags: scope, cursors, leases
  lamina inspect DATA_DIR leases QUEUE [--tag T]       leases, one line a message
  lamina inspect DATA_DIR dump QUEUE [--segment N | --since T --until T] [--tag T]
  lamina inspect DATA_DIR verify [QUEUE ...]           re-check the log; exit 1 on damage

Tables by default, --json for JSON lines (one object per row); dump always writes JSON
lines, one per message in production order. Times are epoch ms or ISO-8601.
"""
_PIPE_WIDTH = 200  # tables are not squeezed to 80 columns in pipes (as tools/output.py)
_LEASE_STATES = {LEASED: "leased", ENDED_AHEAD: "ended_ahead", ENDED_DEAD: "dead",
                 ENDED_DELETED: "deleted"}
_DEAD_FIELDS = ("source_queue", "source_tag", "dead_time", "original_id",
                "original_dequeue_count")


def add_inspect_command(commands: Any) -> argparse.ArgumentParser:
    """Register ``inspect`` on the ``lamina`` command's subparsers."""
    parser = commands.add_parser(
        "inspect", help="inspect a data directory offline (safe beside a running server)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", metavar="DATA_DIR", help="the server's data directory")
    parser.add_argument("--progress", action="store_true",
                        help="progress bars on stderr even when it is not a terminal "
                             "(default: only on a terminal)")
    sub = parser.add_subparsers(dest="inspect_command", required=True, metavar="COMMAND")

    def command(name: str, help: str, queue: bool = True, table: bool = True) -> Any:
        p = sub.add_parser(name, help=help)
        if queue:
            p.add_argument("queue", metavar="QUEUE", help="queue name")
        if table:
            p.add_argument("--json", action="store_true",
                           help="JSON lines, one per row (default a table)")
        return p

    command("queues", "queues and their watermarks", queue=False)
    command("segments", "the segment table of a queue")
    command("tags", "a queue's tags: scope, cursors, lease counts")
    leases = command("leases", "leases of a queue, one line a message")
    leases.add_argument("--tag", help="only this tag (default every tag)")
    leases.add_argument("--limit", type=parse_count, metavar="N", help="at most this many rows "
                        "(default all)")
    dump = command("dump", "messages as JSON lines", table=False)
    where = dump.add_mutually_exclusive_group()
    where.add_argument("--segment", type=int, metavar="SEQ",
                       help="the segment holding this seq, a first seq from `segments` "
                            "(default every segment)")
    where.add_argument("--since", metavar="TIME",
                       help="produced at or after, epoch ms or ISO-8601 (default no bound)")
    dump.add_argument("--until", metavar="TIME",
                      help="produced before, epoch ms or ISO-8601 (default no bound)")
    dump.add_argument("--tag", help="add each message's state for this tag (default none)")
    dump.add_argument("--at", metavar="TIME",
                      help="with --tag: states at this time (default: now, the later of the "
                           "wall clock and the engine clock)")
    dump.add_argument("--limit", type=parse_count, metavar="N",
                      help="at most this many messages (default all)")
    check = command("verify", "re-check records, time index, segments and leases; "
                    "exit 1 on damage", queue=False)
    check.add_argument("queues", nargs="*", metavar="QUEUE",
                       help="only these queues (default every queue)")
    check.add_argument("--quiet", action="store_true",
                       help="only the summary (default every finding)")
    parser.set_defaults(run=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    if args.inspect_command == "dump":
        misuse = ("--until goes with --since, not --segment"
                  if args.until is not None and args.segment is not None else
                  "--at goes with --tag (the time of the tag's states)"
                  if args.at is not None and args.tag is None else None)
        if misuse is not None:
            print(f"lamina inspect: {misuse}", file=sys.stderr)
            return EXIT_USAGE
    try:
        snapshot = Snapshot(args.data)
    except SnapshotError as exc:
        print(f"lamina inspect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with snapshot:
            handler = _COMMANDS[args.inspect_command]
            try:
                return handler(snapshot, args, out)
            except Exception as exc:  # a read of ``snapshot.store`` RocksDB failed on a file
                snapshot.raise_read_error(exc)
    except (LaminaError, SnapshotError, ValueError) as exc:
        print(f"lamina inspect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. `| head`: the reader is done
        sys.stderr.close()
        return EXIT_OK


# -- output helpers ------------------------------------------------------------------------------

def _emit(rows: list[dict[str, Any]], columns: list[tuple[str, str]], args: argparse.Namespace,
          out: TextIO, title: str) -> int:
    """``rows`` as JSON lines (``--json``) or a rich table of ``columns`` (key, header)."""
    if getattr(args, "json", False):
        out.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # cells and title as text: a filter "[/x]" is no markup
    table = Table(title=Text(title))
    for key, header in columns:
        numeric = rows and isinstance(rows[0].get(key), int)
        table.add_column(header, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(Text(_cell(row.get(key))) for key, _ in columns))
    terminal = hasattr(out, "isatty") and out.isatty()
    Console(file=out, width=None if terminal else _PIPE_WIDTH, highlight=False).print(table)
    return EXIT_OK


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@contextmanager
def _progress(args: argparse.Namespace, total: int, what: str) -> Iterator[Callable[[int], None]]:
    """``advance(n)``; a rich progress bar on stderr when it is a terminal (or --progress)."""
    if not (args.progress or sys.stderr.isatty()) or total <= 0:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeRemainingColumn)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(),
                  console=Console(stderr=True, force_terminal=args.progress or None),
                  transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


# -- queues, segments, tags, leases ---------------------------------------------------------------

def _queues(snapshot: Snapshot, args: argparse.Namespace, out: TextIO) -> int:
    rows = []
    for q in snapshot.queues():
        live = [s for s in q.segments if s.last_seq >= q.gone_seq]
        rows.append({
            "queue": q.name, "id": q.id, "messages": q.next_seq - q.gone_seq,
            "next_seq": q.next_seq, "gone_seq": q.gone_seq, "expired_seq": q.expired_seq,
            "purge_seq": q.purge_seq, "segments": len(q.segments),
            "bytes": sum(s.size_bytes for s in live),
            "oldest": q.segments[0].first_ms if q.segments else None,
            "newest": q.segments[-1].last_ms if q.segments else None,
            "lanes": q.lanes_used, "tags": sorted(t.name for t in q.tags.values()),
            "created": q.created, "attributes": q.attributes,
        })
    if not args.json:
        for row in rows:
            row["oldest"], row["newest"] = iso_ms(row["oldest"]), iso_ms(row["newest"])
            row["created"] = iso_ms(row["created"])
            row["tags"] = ", ".join(row["tags"])
    return _emit(rows, [("queue", "queue"), ("id", "id"), ("messages", "messages"),
                        ("next_seq", "next seq"), ("gone_seq", "gone seq"),
                        ("segments", "segments"), ("bytes", "bytes"), ("oldest", "oldest"),
                        ("newest", "newest"), ("tags", "tags"), ("created", "created")],
                 args, out, f"queues in {snapshot.data_dir}")


def _segments(snapshot: Snapshot, args: argparse.Namespace, out: TextIO) -> int:
    q = snapshot.queue(args.queue)
    rows = []
    for s in q.segments:
        rows.append({
            "first_seq": s.first_seq, "last_seq": s.last_seq, "count": s.count,
            "bytes": s.size_bytes, "first_ms": s.first_ms, "last_ms": s.last_ms,
            "retained": max(0, s.last_seq + 1 - max(s.first_seq, q.gone_seq)),
        })
    if not args.json:
        for row in rows:
            row["first_ms"], row["last_ms"] = iso_ms(row["first_ms"]), iso_ms(row["last_ms"])
    return _emit(rows, [("first_seq", "first seq"), ("last_seq", "last seq"),
                        ("count", "messages"), ("bytes", "bytes"), ("first_ms", "first time"),
                        ("last_ms", "last time"), ("retained", "retained")],
                 args, out, f"segments of {q.name!r} (gone_seq {q.gone_seq}, next_seq "
                            f"{q.next_seq})")


def _tags(snapshot: Snapshot, args: argparse.Namespace, out: TextIO) -> int:
    q = snapshot.queue(args.queue)
    now = snapshot.now()
    rows = []
    for t in sorted(q.tags.values(), key=lambda t: t.name.lower()):
        counts = {"inflight": 0, "active_again": 0, "ended_ahead": 0, "dead": 0}
        for _, lease in snapshot.leases(q, t):
            if lease.state == LEASED:
                counts["inflight" if lease.due_ms > now else "active_again"] += 1
            elif lease.state == ENDED_AHEAD:
                counts["ended_ahead"] += 1
            elif lease.state == ENDED_DEAD:
                counts["dead"] += 1
        rows.append({
            "tag": t.name, "id": t.id, "start_ms": t.start_ms, "start_seq": t.start_seq,
            "filter": t.filter, "created": t.created,
            "cursors": {str(lane): t.cursors[lane] for lane in q.lanes_used},
            "delay_position": [t.delay_vt, t.delay_seq], "lease_counter": t.lease_counter,
            **counts,
        })
    if not args.json:
        for row in rows:
            row["created"] = iso_ms(row["created"])
            row["cursors"] = " ".join(f"{lane}:{seq}" for lane, seq in row["cursors"].items())
    return _emit(rows, [("tag", "tag"), ("id", "id"), ("start_seq", "start seq"),
                        ("filter", "filter"), ("cursors", "cursors lane:seq"),
                        ("lease_counter", "lease ceiling"), ("inflight", "inflight"),
                        ("active_again", "active again"), ("ended_ahead", "ended ahead"),
                        ("dead", "dead"), ("created", "created")],
                 args, out, f"tags of {q.name!r}")


def _leases(snapshot: Snapshot, args: argparse.Namespace, out: TextIO) -> int:
    q = snapshot.queue(args.queue)
    now = snapshot.now()
    tags = [snapshot.tag(q, args.tag)] if args.tag else sorted(
        q.tags.values(), key=lambda t: t.name.lower())
    rows: list[dict[str, Any]] = []
    from lamina.engine.records import message_id
    for t in tags:
        for seq, lease in snapshot.leases(q, t):
            if args.limit is not None and len(rows) >= args.limit:
                break
            row: dict[str, Any] = {
                "tag": t.name, "seq": seq, "id": message_id(q.id, seq, lease.lane),
                "state": _LEASE_STATES.get(lease.state, str(lease.state)),
                "lane": lease.lane, "dequeue_count": lease.count,
                "first_dequeue_time": lease.first_ms or None,
            }
            if lease.state == LEASED:
                row["state"] = "inflight" if lease.due_ms > now else "active_again"
                row.update(due=lease.due_ms, lease_number=lease.number)
            elif lease.state == ENDED_DEAD:
                dlq = snapshot.queue_by_id(lease.due_ms)
                row.update(dlq=dlq.name if dlq else lease.due_ms, dlq_seq=lease.number)
            rows.append(row)
    if not args.json:
        for row in rows:
            row["first_dequeue_time"] = iso_ms(row["first_dequeue_time"])
            if "due" in row:
                row["due"] = iso_ms(row["due"])
            if "dlq" in row:
                row["due"] = f"-> {row['dlq']} seq {row['dlq_seq']}"
    return _emit(rows, [("tag", "tag"), ("seq", "seq"), ("id", "id"), ("state", "state"),
                        ("lane", "lane"), ("due", "due / dead letter"),
                        ("dequeue_count", "dequeues"), ("first_dequeue_time", "first dequeue"),
                        ("lease_number", "lease")],
                 args, out, f"leases of {q.name!r} (now {iso_ms(now)})")


# -- dump ------------------------------------------------------------------------------------------

def message_json(seq: int, value: bytes) -> dict[str, Any]:
    """A log value as the JSON-safe object ``dump`` writes (module docstring)."""
    msg_id, body, attributes, topic, priority, enqueue_ms, visible_ms, md5, dead = \
        cbor2.loads(value[PREFIX_SIZE:])[:9]
    text, encoding = _body_text(body)
    return {
        "id": msg_id, "seq": seq, "time": enqueue_ms, "visible_time": visible_ms,
        "priority": priority, "topic": topic,
        "attributes": to_json(attributes) if attributes is not None else None,
        "body": text, "body_encoding": encoding, "md5": md5.hex(),
        "dead": dict(zip(_DEAD_FIELDS, to_json(dead))) if dead is not None else None,
    }


def message_line(seq: int, value: bytes) -> str:
    """``message_json`` as one line of JSON, without its closing brace (so fields can be
    appended). Assembled by hand: ``json.dumps`` of the dict measured ~8x slower, and the dump
    is the hot path (``json.loads`` of the line equals ``message_json``: tested)."""
    fields = _loads(value[PREFIX_SIZE:])  # the record's times and priority are the prefix's
    msg_id, body, attributes, topic, priority, enqueue_ms, visible_ms, md5, dead = (
        fields if len(fields) == 9 else fields[:9])  # fields are only ever appended
    text, encoding = _body_text(body)
    return (
        f'{{"id": {_esc(msg_id)}, "seq": {seq}, "time": {enqueue_ms}, '
        f'"visible_time": {visible_ms}, "priority": {priority}, '
        f'"topic": {"null" if topic is None else _esc(topic)}, '
        f'"attributes": {"null" if attributes is None else _dumps(to_json(attributes))}, '
        f'"body": {_esc(text)}, "body_encoding": "{encoding}", "md5": "{md5.hex()}", '
        f'"dead": {"null" if dead is None else _dumps(dict(zip(_DEAD_FIELDS, to_json(dead))))}'
    )


def _body_text(body: bytes | str) -> tuple[str, str]:
    if type(body) is str:
        return body, "utf-8"
    try:
        return body.decode(), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"


_loads = cbor2.loads
_dumps = json.JSONEncoder(separators=(", ", ": ")).encode


def dump_range(snapshot: Snapshot, q: QueueState, args: argparse.Namespace) -> tuple[int, int]:
    """The seq range ``[first, end)`` selected by ``--segment`` / ``--since`` / ``--until``."""
    if args.segment is not None:
        segment = snapshot.segment_of(q, args.segment)
        if segment is None:
            raise ValueError(f"queue {q.name!r} has no segment holding seq {args.segment} "
                             "(see `segments`)")
        return segment.first_seq, segment.last_seq + 1
    first = q.segments[0].first_seq if q.segments else q.next_seq
    end = q.next_seq
    if args.since is not None:
        first = max(first, snapshot.first_seq_at(q, parse_time_ms(args.since)))
    if args.until is not None:
        end = min(end, snapshot.first_seq_at(q, parse_time_ms(args.until)))
    return first, max(first, end)


def _dump(snapshot: Snapshot, args: argparse.Namespace, out: TextIO) -> int:
    q = snapshot.queue(args.queue)
    states = None
    if args.tag is not None:
        now = parse_time_ms(args.at) if args.at is not None else snapshot.now()
        states = TagStates(snapshot, q, snapshot.tag(q, args.tag), now)
    first, end = dump_range(snapshot, q, args)
    total = end - first if args.limit is None else min(end - first, args.limit)
    rows = snapshot.message_rows(q, first, end)
    if args.limit is not None:
        rows = islice(rows, args.limit)
    decode_key = keys.log_key_decode
    lines: list[str] = []
    with _progress(args, total, f"dump {q.name}") as advance:
        for key, value in rows:
            seq = decode_key(key)[2]
            line = message_line(seq, value)
            if states is not None:
                state, count, first_time, next_visible = states.state(seq, value)
                line += (f', "state": "{state}", "dequeue_count": {count}, '
                         f'"first_dequeue_time": {_null(first_time)}, '
                         f'"next_visible_time": {_null(next_visible)}')
            lines.append(line)
            if len(lines) == 4096:
                out.write("}\n".join(lines) + "}\n")
                lines.clear()
                advance(4096)
        if lines:
            out.write("}\n".join(lines) + "}\n")
            advance(len(lines))
    return EXIT_OK


def _null(value: int | None) -> str:
    return "null" if value is None else str(value)


# -- verify ----------------------------------------------------------------------------------------

def _verify(snapshot: Snapshot, args: argparse.Namespace, out: TextIO) -> int:
    from .verify import DAMAGE, Finding, Report
    queues = args.queues or None
    try:
        report = _verify_pass(snapshot, args, queues)
    except Exception as exc:  # a file went beside the view since it opened, or is damaged
        if not isinstance(snapshot.read_error(exc), SnapshotError):
            raise
        snapshot.refresh()
        try:
            report = _verify_pass(snapshot, args, queues)
        except Exception as again:  # the directory as it is now: the file is damaged
            error = snapshot.read_error(again)
            if not isinstance(error, SnapshotReadError):
                raise
            report = Report([Finding(DAMAGE, "file", None, error.file or "db",
                                     f"{error.what}; the checks stopped there")])
    summary = report.summary()
    if args.json:
        if not args.quiet:
            for finding in report.findings:
                out.write(json.dumps(finding.as_dict(), ensure_ascii=False) + "\n")
        out.write(json.dumps({"summary": summary}) + "\n")
    else:
        if not args.quiet:
            for finding in report.findings:
                out.write(f"{finding}\n")
            for item in summary["suppressed"]:
                out.write(f"{item['severity'].upper():7} {item['check']:16} queue "
                          f"{item['queue']!r}: {item['count']} more not shown\n")
        verdict = "DAMAGED" if report.damaged else "OK"
        out.write(f"{verdict}: {summary['queues']} queues, {summary['messages']} messages, "
                  f"{summary['time_entries']} time entries, {summary['leases']} leases "
                  f"checked; {summary['damage']} damage, "
                  f"{summary['warnings']} warnings\n")
    return EXIT_DAMAGE if report.damaged else EXIT_OK


def _verify_pass(snapshot: Snapshot, args: argparse.Namespace, queues: list[str] | None) -> Any:
    from .verify import total_messages, verify
    total = total_messages(snapshot, queues)
    with _progress(args, total, "verify") as advance:
        return verify(snapshot, queues, progress=advance)


_COMMANDS: dict[str, Callable[[Snapshot, argparse.Namespace, TextIO], int]] = {
    "queues": _queues, "segments": _segments, "tags": _tags, "leases": _leases,
    "dump": _dump, "verify": _verify,
}


def main(argv: list[str] | None = None) -> int:
    """``lamina inspect`` on its own (``python -m lamina.tools.inspect DATA_DIR ...``)."""
    parser = argparse.ArgumentParser(prog="lamina")
    add_inspect_command(parser.add_subparsers(dest="command", required=True))
    return run_inspect(parser.parse_args(["inspect", *(sys.argv[1:] if argv is None
                                                          else argv)]))


if __name__ == "__main__":
    sys.exit(main())
