"""``EngineCore._queue`` keeps the queues it found by the name as given (``_queue_cache``);
with queues created, deleted and looked up under any letter case and by names that are
not text, it must answer exactly as the lookup by lower-cased name does (Hypothesis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock
from lamina.engine.core import EngineCore
from lamina.engine.errors import LaminaError
from lamina.engine.state import QueueState

_queue = EngineCore._queue

names = st.sampled_from(["Orders", "orders", "ORDERS", "oRdErS", "other", "Other"])
steps = st.lists(st.tuples(st.sampled_from(["create", "delete", "send", "get", "odd"]), names),
                 min_size=1, max_size=24)


def queue_uncached(self: EngineCore, name: object, field: str = "queue") -> QueueState:
    """``_queue`` by the lower-cased name every time."""
    self._queue_cache.clear()
    return _queue(self, name, field)


def play(path: Path, scenario: list[tuple[str, str]]) -> list[Any]:
    answers: list[Any] = []
    with Engine.open(path, clock=FakeClock()) as engine:
        for op, name in scenario:
            try:
                if op == "create":
                    answers.append(engine.create_queue(name).queue)
                elif op == "delete":
                    answers.append(engine.delete_queue(name))
                elif op == "send":
                    answers.append(len(engine.send(name, [b"m"])))
                elif op == "get":
                    info = engine.get_queue(name)
                    answers.append((info.queue, info.stats))
                else:  # a name that is no text
                    engine.send(123, [b"m"])  # type: ignore[arg-type]
            except LaminaError as exc:
                answers.append(repr(exc))
    return answers


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps)
def test_queues_are_found_by_any_case_as_the_lookup_by_lower_case_finds_them(tmp_path,
                                                                            scenario):
    run = len(list(tmp_path.iterdir()))
    cached = play(tmp_path / f"cached{run}", scenario)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineCore, "_queue", queue_uncached)
        uncached = play(tmp_path / f"uncached{run}", scenario)
    assert cached == uncached


def test_a_deleted_queue_is_not_found_again_under_the_name_it_was_used_by(tmp_path):
    with Engine.open(tmp_path, clock=FakeClock()) as engine:
        engine.create_queue("Orders")
        engine.send("orders", [b"m"])  # found, and kept under "orders"
        engine.delete_queue("ORDERS")
        with pytest.raises(LaminaError, match="no queue named 'orders'"):
            engine.send("orders", [b"m"])
        engine.create_queue("orders")
        assert engine.get_queue("orders").stats["messages"] == 0
