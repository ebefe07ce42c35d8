"""``EngineCore._advance`` returns at once while a queue's ``quiet_until_ms`` says nothing
can be due (the oldest live message younger than ``retention``, no redrive policy); it must
answer and store exactly what the full tests do, every time (Hypothesis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock
from lamina.engine.core import EngineCore
from lamina.engine.state import QueueState
from tests.engine.test_settle_short import START_MS, play, steps, two_copies

_advance = EngineCore._advance


def advance_in_full(self: EngineCore, q: QueueState, now: int) -> None:
    """``_advance`` with its every test, never its quiet return."""
    q.quiet_until_ms = -1
    _advance(self, q, now)


def both_ways(tmp_path: Path, scenario: list[tuple[str, Any]], rewind_s: int,
              redrive: bool) -> tuple[Any, Any, int]:
    """The scenario played from copies of one directory: as the engine advances, then with
    every test every time -> (the one's result, the other's, quiet returns taken)."""
    base = two_copies(tmp_path, "full", rewind_s, redrive)
    quiet = 0

    def counting(self: EngineCore, q: QueueState, now: int) -> None:
        nonlocal quiet
        quiet += now <= q.quiet_until_ms
        _advance(self, q, now)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineCore, "_advance", counting)
        short = play(base, scenario, redrive)
        patch.setattr(EngineCore, "_advance", advance_in_full)
        full = play(tmp_path / "full", scenario, redrive)
    return short, full, quiet


def test_a_consumers_operations_within_retention_take_the_quiet_return_alike(tmp_path):
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 3)]
    scenario += [("receive", 1), ("delete", 0), ("advance", 1)] * 3
    scenario += [("advance", 61_000), ("send", [b"plain"]), ("receive", 1)]
    short, full, quiet = both_ways(tmp_path, scenario, 0, False)
    assert quiet >= 9
    assert short == full


def test_a_shorter_retention_set_later_expires_messages_at_once(tmp_path):
    clock = FakeClock(START_MS)
    with Engine.open(tmp_path, clock=clock) as engine:
        engine.create_queue("q", {"retention": 7200})
        engine.send("q", [b"old"])
        clock.advance(120_000)
        engine.get_queue("q")  # ``_advance``: quiet for two hours from the send now
        engine.set_queue_attributes("q", {"retention": 60})
        assert engine.receive("q", max=4) == []


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=16), st.sampled_from([0, 0, 30]), st.booleans())
def test_advancing_answers_and_stores_the_same_with_or_without_the_quiet_return(
        tmp_path, scenario, rewind_s, redrive):
    short, full, _ = both_ways(tmp_path, scenario, rewind_s, redrive)
    assert short[0] == full[0]  # answers, peeks, stats, the rows of each batch
    assert short[1] == full[1]  # every row of every column family
