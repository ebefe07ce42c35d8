"""How the client commands print: rich tables for people, JSON for scripts.

Two shapes of JSON (``--json``), chosen by what a command returns:

- a **stream** of items (``send`` results, ``receive``d messages, ``stats`` days, queue
  names...): JSON lines, one object per item, so ``jq`` and ``while read`` work as the items
  arrive;
- **one thing** (a queue's info, a purge count, a peek page with its cursor): one JSON document.

Values that JSON cannot carry are converted the same way everywhere:

- ``bytes`` -> ``{"$base64": "<standard base64>"}`` (bodies, receipts, attribute values); text
  stays a JSON string, so a body's type survives the trip;
- MD5 digests -> lowercase hex strings (they are for comparing, not for decoding);
- ``LaminaError`` entries -> ``{"error": {"code": ..., "message": ...}}``.

Times are milliseconds since the epoch in JSON, and UTC ISO 8601 in tables.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import IO, Any, Iterable, Sequence

from lamina.engine.errors import LaminaError

from .timefmt import iso_ms

__all__ = ["BASE64_MARKER", "Output", "body_text", "format_time_ms", "to_json"]

#: The key of the one-entry object that stands for a byte string in JSON output.
BASE64_MARKER = "$base64"
#: Tables are not squeezed below this width when stdout is not a terminal (pipes, tests).
_PIPE_WIDTH = 200
#: Longest body shown in a table cell; ``--json`` always has the whole body.
_BODY_PREVIEW_CHARS = 80


def to_json(value: Any) -> Any:
    """``value`` with bytes, errors, tuples and dataclass-like results made JSON-ready."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BASE64_MARKER: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, LaminaError):
        return {"error": {"code": value.code, "message": value.message}}
    if isinstance(value, dict):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    return value


def format_time_ms(value: Any) -> str:
    """Epoch milliseconds -> ``2026-01-01T12:00:00.123Z``; anything else as itself."""
    if type(value) is not int:
        return "" if value is None else str(value)
    return iso_ms(value)


def body_text(body: bytes | str, limit: int = _BODY_PREVIEW_CHARS) -> str:
    """A body for a table cell: text as is, bytes as text when they are UTF-8, else
    ``<N bytes: hex...>``; cut to ``limit`` characters."""
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = f"<{len(body)} bytes: {body[:limit // 2].hex()}>"
    else:
        text = body
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (dict, list)):
        return json.dumps(to_json(value), separators=(",", ":"))
    return str(value)


class Output:
    """Where one command's results go: ``json`` picks the format; ``stdout``/``stderr``
    default to the current ``sys`` streams (looked up late, so captured output works)."""

    def __init__(self, json_mode: bool, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self._console: Any = None

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console  # only people need rich
            terminal = hasattr(self.stdout, "isatty") and self.stdout.isatty()
            self._console = Console(file=self.stdout, width=None if terminal else _PIPE_WIDTH,
                                    highlight=False, soft_wrap=not terminal)
        return self._console

    # -- JSON --------------------------------------------------------------------------------

    def document(self, value: Any) -> None:
        """One JSON document."""
        self.stdout.write(json.dumps(to_json(value), ensure_ascii=False) + "\n")

    def line(self, value: Any) -> None:
        """One JSON line (of a stream)."""
        self.stdout.write(json.dumps(to_json(value), ensure_ascii=False,
                                     separators=(",", ":")) + "\n")

    # -- people ------------------------------------------------------------------------------

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]],
              title: str | None = None) -> None:
        from rich.table import Table
        from rich.text import Text  # cells and titles as text: a body "[/x]" is no markup
        table = Table(*columns, title=Text(title) if title is not None else None,
                      title_justify="left")
        for row in rows:
            table.add_row(*(Text(_cell(value)) for value in row))
        self.console.print(table)

    def fields(self, values: dict[str, Any], title: str | None = None) -> None:
        """A two-column table of names and values."""
        self.table(("field", "value"), values.items(), title=title)

    def text(self, message: str) -> None:
        self.console.print(message, markup=False)

    def error(self, message: str) -> None:
        self.stderr.write(f"lamina: {message}\n")
        self.stderr.flush()
