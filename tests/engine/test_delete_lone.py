"""A consumer's delete of one message takes a shorter path (``messaging.delete_lone``); it
must answer and store exactly what ``_delete_receipts``' loop does, and leave it to the loop
whenever the receipt is not the current one of a lease of its own row (Hypothesis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import messaging
from tests.engine.test_settle_short import play, steps, two_copies
from tests.support import shortpaths


def both_paths(tmp_path: Path, scenario: list[tuple[str, Any]], rewind_s: int = 0
               ) -> tuple[Any, Any, int]:
    """The scenario played from copies of one directory (the same receipt key): with the
    short path, then with the loop alone -> (short's result, the loop's, deletes taken)."""
    base = two_copies(tmp_path, "loop", rewind_s, False)
    return shortpaths.both_paths(messaging, "delete_lone",
                                 lambda: play(base, scenario, False),
                                 lambda: play(tmp_path / "loop", scenario, False))


def test_w4s_deletes_of_one_take_the_short_path_with_the_loops_results(tmp_path):
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 5)]
    scenario += [("receive", 1), ("delete", 0), ("advance", 1)] * 3
    scenario += [("receive", 1), ("receive", 1), ("delete", 1), ("delete", 0), ("again", 0)]
    fast, loop, taken = both_paths(tmp_path, scenario)
    assert taken == 5  # the receipt deleted again: the loop's case
    assert fast == loop


def test_a_stale_or_batched_receipt_is_left_to_the_loop(tmp_path):
    scenario: list[tuple[str, Any]] = [("send", [b"plain"]), ("receive", 1),
                                       ("advance", 1_100), ("delete", 0),  # ran out: stale
                                       ("send", [b"plain"] * 4), ("receive", 16),
                                       ("delete", 0),  # its redelivery: a row of its own
                                       ("delete", 0),  # a lease of a batch row
                                       ("advance", 1_100), ("delete", 0)]  # stale
    fast, loop, taken = both_paths(tmp_path, scenario)
    assert taken == 1
    assert fast == loop


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=16), st.sampled_from([0, 0, 30]))
def test_a_delete_of_one_answers_and_stores_the_same_on_either_path(tmp_path, scenario,
                                                                     rewind_s):
    fast, loop, _ = both_paths(tmp_path, scenario, rewind_s)
    assert fast[0] == loop[0]  # answers, peeks, stats, watermarks
    assert fast[1] == loop[1]  # every row of every column family
