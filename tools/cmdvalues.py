"""Values of the ``lamina`` command line: server addresses, ``name=value`` attributes and
times (milliseconds since the epoch, ISO 8601, or a duration ago such as ``15m``).

Shared by the client commands and ``lamina bench``; imports nothing heavy, so parsing a
command line stays quick.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from lamina.engine.errors import LaminaError
from lamina.server.config import DEFAULT_PORT

__all__ = ["DEFAULT_SERVER", "ServerClock", "TimeSpec", "UsageError", "named_values",
           "nest_assignments", "parse_assignment", "parse_count", "parse_seconds",
           "parse_server", "parse_tag_start", "parse_time", "whole_number"]

DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"


class ServerClock(Protocol):
    """What resolving a time needs of a client: the server's clock (``ping``)."""

    def ping(self) -> int: ...


def parse_server(text: str) -> tuple[str, int]:
    """``host:port``, ``host``, ``:port`` or ``[v6]:port`` -> (host, port)."""
    match = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:]*)(?::(\d+))?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not host:port: {text!r}")
    host = match.group(1) or match.group(3) or "127.0.0.1"
    port = int(match.group(2) or match.group(4) or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {port}")
    return host, port


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` and, if given, at most
    ``maximum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            within = f"{minimum}..{maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {within}, got {value}")
        return value
    return parse


#: A count of at least 1 (``--max``, ``--limit``): 0 or less is refused, never taken as
#: "none" or "no limit".
parse_count = whole_number(1)


def parse_seconds(text: str) -> float:
    """A positive, finite number of seconds (``--timeout``)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds and finite, got {text}")
    return seconds


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_assignment(text: str) -> tuple[str, Any]:
    """``name=value`` -> (name, value read as JSON, else text)."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    return name, _json_or_text(value)


class UsageError(LaminaError):
    """A command line that parsed but cannot be carried out (exit code 2, like argparse's)."""

    code = "Usage"


def nest_assignments(assignments: list[tuple[str, Any]]) -> dict[str, Any]:
    """Queue attributes from ``name=value`` pairs, a dotted name setting a field of a map:
    ``redrive.dlq=errors redrive.max_receives=5`` -> ``{"redrive": {"dlq": "errors",
    "max_receives": 5}}``. A name given twice, or a field of a name whose value is not a map,
    is a ``UsageError`` naming it."""
    nested: dict[str, Any] = {}
    for name, value in assignments:
        *parents, last = name.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"{name}: {part} is given a value that is not a map")
        if last in node:
            raise UsageError(f"{name}: given more than once")
        node[last] = value
    return nested


def named_values(assignments: list[tuple[str, Any]], option: str) -> dict[str, Any]:
    """Repeated ``option NAME=VALUE`` as a map; a name given twice is a ``UsageError`` (a
    map holds one value a name)."""
    named = dict(assignments)
    if len(named) < len(assignments):
        names = Counter(name for name, _ in assignments)
        raise UsageError(f"{option}: given more than once: "
                         + ", ".join(name for name, count in names.items() if count > 1))
    return named


_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True)
class TimeSpec:
    """A time from the command line: absolute (``ms``) or that long before the server's now
    (``ago_ms``); ``word`` for the names ``oldest`` / ``now`` where a command takes them."""

    ms: int | None = None
    ago_ms: int | None = None
    word: str | None = None

    def resolve(self, client: ServerClock) -> int | str:
        if self.word is not None:
            return self.word
        if self.ms is not None:
            return self.ms
        assert self.ago_ms is not None
        return client.ping() - self.ago_ms


def parse_time(text: str, words: tuple[str, ...] = ()) -> TimeSpec:
    """See the module docstring: ms, ISO 8601, or a duration ago (``15m``)."""
    text = text.strip()
    if text in words:
        return TimeSpec(word=text)
    if text.isdigit():
        return TimeSpec(ms=int(text))
    duration = re.fullmatch(r"-?(\d+(?:\.\d+)?)(ms|s|m|h|d)(?: ago)?", text)
    if duration:
        return TimeSpec(ago_ms=round(float(duration.group(1)) * _DURATION_MS[duration.group(2)]))
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        expected = "ms since the epoch, an ISO 8601 time or a duration ago (15m)"
        if words:
            expected = " or ".join(words) + ", " + expected
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (expected {expected})") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return TimeSpec(ms=round(stamp.timestamp() * 1000))


def parse_tag_start(text: str) -> TimeSpec:
    return parse_time(text, words=("oldest", "now"))
