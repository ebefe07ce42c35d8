"""The rows each batch the engine writes holds, noted in a list beside the answers: the
comparisons of a short path with the general one check both write the same batches."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

from lamina.engine.store import Store


@contextlib.contextmanager
def noting_batch_rows(notes: list[Any]) -> Iterator[None]:
    """While inside, each ``Store.flush`` appends ``("rows", N)`` to ``notes`` first."""
    flush = Store.flush

    def noting_flush(self: Store) -> None:
        notes.append(("rows", self.batch.len()))
        flush(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Store, "flush", noting_flush)
        yield
