"""A receive of one in the commonest case takes a shorter path (``lessor.lease_first``); it
must answer and store exactly what the general path (``Lessor``) does, and leave it to the
general path whenever the case is not that one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock, messaging
from lamina.engine.results import Delivery
from lamina.engine.store import COLUMN_FAMILIES
from tests.engine.batchrows import noting_batch_rows
from tests.engine.test_lease_deadlines import raw_store
from tests.support import shortpaths

START_MS = 1_700_000_000_000

#: Send entries: plain, delayed, in another priority lane, with a topic.
entries = st.sampled_from([b"plain", b"plain", {1: b"late", 5: 1}, {1: b"high", 4: 2},
                           {1: b"topical", 3: "t"}, {1: b"low", 4: 16}])
steps = st.one_of(
    st.tuples(st.just("send"), st.lists(entries, min_size=1, max_size=3)),
    st.tuples(st.just("receive"), st.sampled_from([None, 1, 30])),
    st.tuples(st.just("receive16"), st.sampled_from([None, 30])),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([1, 700, 1_100, 31_000])),
    st.tuples(st.just("tag"), st.just(None)),
)


def run(path: Path, scenario: list[tuple[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
    """Play ``scenario`` on the data directory at ``path`` -> (answers and the rows each
    batch wrote, every stored row at the end)."""
    clock = FakeClock(START_MS)
    answers: list[Any] = []
    with noting_batch_rows(answers):
        return play(path, clock, scenario, answers)


def play(path: Path, clock: FakeClock, scenario: list[tuple[str, Any]], answers: list[Any]
         ) -> tuple[list[Any], dict[str, Any]]:
    held: list[bytes] = []
    tags: list[str | None] = [None]
    with Engine.open(path, clock=clock) as engine:
        for op, arg in scenario:
            if op == "send":
                answers.append([type(sent).__name__ for sent in engine.send("q", arg)])
            elif op in ("receive", "receive16"):
                for tag in tags:
                    got = engine.receive("q", tag, max=16 if op == "receive16" else 1,
                                         visibility_timeout=arg)
                    answers.append([(d.record, d.receipt, d.dequeue_count,
                                     d.first_dequeue_time, d.next_visible_time) for d in got])
                    held.extend(d.receipt for d in got if tag is None)
            elif op == "delete" and held:
                receipt = held.pop(arg % len(held))
                answers.append([repr(e) for e in engine.delete("q", [receipt])])
            elif op == "advance":
                clock.advance(arg)
            elif op == "tag" and len(tags) == 1:
                engine.create_tag("q", "second", start="oldest")
                tags.append("second")
        answers.append(engine.stats("q", days=2))
    with raw_store(path) as db:
        rows = {name: list(db.get_column_family(name).items()) for name in COLUMN_FAMILIES}
    return answers, rows


def both_paths(tmp_path: Path, scenario: list[tuple[str, Any]]) -> tuple[Any, Any, int]:
    """The scenario played twice from the same directory (same receipt key): with the short
    path, then with the general path alone -> (short's result, general's, short-path leases)."""
    base = tmp_path / "base"
    shutil.rmtree(tmp_path, ignore_errors=True)
    with Engine.open(base, clock=FakeClock(START_MS)) as engine:
        engine.create_queue("q")
    shutil.copytree(base, tmp_path / "general")
    # lease_first answers False / True / None when it leased nothing there
    return shortpaths.both_paths(messaging, "lease_first", lambda: run(base, scenario),
                                 lambda: run(tmp_path / "general", scenario),
                                 lambda delivery: isinstance(delivery, Delivery))


def test_w4s_receive_one_delete_one_takes_the_short_path_with_the_general_paths_results(
        tmp_path):
    scenario = [("send", [b"plain"] * 5)]
    for _ in range(4):
        scenario += [("receive", None), ("delete", 0), ("advance", 1)]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken == 3  # the tag's first receive writes its row: the general path's case
    assert fast == general


def test_a_long_polls_receive_of_16_after_a_send_of_one_takes_the_short_path_alike(
        tmp_path):
    # W3: each send of one wakes a receive of up to 16, which finds that one message alone.
    scenario: list[tuple[str, Any]] = [("send", [b"plain"]), ("receive16", None)]
    for _ in range(4):
        scenario += [("delete", 0), ("send", [b"plain"]), ("receive16", None),
                     ("advance", 1)]
    scenario += [("send", [b"plain"] * 2), ("receive16", None)]  # two: the general path
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken == 4  # the tag's first receive writes its row: the general path's case
    assert fast == general


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=14))
def test_a_receive_of_one_answers_and_stores_the_same_on_either_path(tmp_path, scenario):
    fast, general, _ = both_paths(tmp_path, scenario)
    assert fast[0] == general[0]  # answers, stats included
    assert fast[1] == general[1]  # every row of every column family


def test_the_receive_that_reaches_the_lease_counters_ceiling_writes_the_tags_row_on_either_path(
        tmp_path):
    # The stored lease counter is a ceiling 4,096 ahead (docs/STORAGE.md): the receive whose
    # lease number reaches it must write the tag's row, which only the general path does.
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 3)]
    for _ in range(4_100):
        scenario += [("receive", None), ("delete", 0), ("send", [b"plain"])]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert 4_090 < taken < 4_100  # the first receive and the one at the ceiling go the general way
    assert fast == general
