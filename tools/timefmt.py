"""Times as the tools take and show them: epoch milliseconds or ISO-8601 in, ISO-8601 UTC out."""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["iso_ms", "parse_time_ms"]


def parse_time_ms(value: str | int | float | datetime) -> int:
    """Epoch milliseconds from an int / digit string (already ms), a ``datetime``, or an
    ISO-8601 string (``2026-11-22T10:00:00Z``, ``2026-11-22 10:00:00.250+01:00``, a date);
    a time without a zone is UTC."""
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, datetime):
        moment = value
    else:
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return int(text)
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not a time (epoch ms or ISO-8601): {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000)


def iso_ms(ms: int | None) -> str:
    """``2026-11-22T10:00:00.250Z`` (empty for None)."""
    if ms is None:
        return ""
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
