"""What a server's operation produces, before it becomes bytes (``ServerConnection.respond_answer``).

An :data:`Answer` is a result map, per-entry results, deliveries or a peek page to splice into a
frame around stored records (``splicing.py``), or the ``LaminaError`` that failed the whole
request. The server computes answers on its engine thread and encodes them once the group
commit is durable.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, TypeAlias

from lamina.engine.errors import LaminaError
from lamina.engine.results import SentColumns

from .splicing import Deliverable

__all__ = ["Answer", "EntriesAnswer", "MapAnswer", "PeekAnswer", "ReceiveAnswer", "SendAnswer"]


@dataclass(slots=True)
class MapAnswer:
    """``[id, null, result]`` with an ordinary result map."""

    result: dict[str, Any]


@dataclass(slots=True)
class SendAnswer:
    """A ``send`` result: per entry a ``Sent`` or the LaminaError that failed it, or the
    ``SentColumns`` of a batch all accepted (spliced: ``splicing.encode_send_response``)."""

    results: list[Any] | SentColumns


@dataclass(slots=True)
class EntriesAnswer:
    """A ``delete``, ``dead`` or ``delete_by_id`` result: per entry None or the LaminaError
    that failed it (``splicing.encode_entries_response``)."""

    results: list[LaminaError | None]


@dataclass(slots=True)
class ReceiveAnswer:
    """A ``receive`` result: the engine's deliveries (or DeliveryFrame tuples) to splice."""

    deliveries: Sequence[Deliverable]


@dataclass(slots=True)
class PeekAnswer:
    """A ``peek`` result: peeked tuples (or per-id errors) to splice, and the next cursor."""

    entries: list[Any]
    next: Any


Answer: TypeAlias = (MapAnswer | SendAnswer | EntriesAnswer | ReceiveAnswer | PeekAnswer
                     | LaminaError)
