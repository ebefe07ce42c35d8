"""Settling ``gone_seq`` is told without the floors when a tag holds ``gone_seq`` (leased
there, or a cursor resting on it), and not asked at all when every message is gone: the
engine must answer and store exactly what settling by the floors alone does, in every
scenario (Hypothesis), with rewinds, retention, delays, lanes, topics, a second tag and
dead letters."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock
from lamina.engine.core import EngineCore
from lamina.engine.errors import LaminaError
from lamina.engine.floors import delayed_floor, tag_floor
from lamina.engine.state import QueueState
from lamina.engine.store import COLUMN_FAMILIES
from tests.engine.batchrows import noting_batch_rows
from tests.engine.test_lease_deadlines import raw_store

START_MS = 1_700_000_000_000

entries = st.sampled_from([b"plain", b"plain", {1: b"late", 5: 1}, {1: b"high", 4: 2},
                           {1: b"topical", 3: "t"}, {1: b"low", 4: 16}])
steps = st.one_of(
    st.tuples(st.just("send"), st.lists(entries, min_size=1, max_size=4)),
    st.tuples(st.just("receive"), st.sampled_from([1, 16])),
    st.tuples(st.just("delete"), st.integers(0, 7)),
    st.tuples(st.just("advance"), st.sampled_from([1, 700, 1_100, 31_000, 61_000])),
    st.tuples(st.just("tag"), st.just(None)),
    st.tuples(st.just("rewind"), st.sampled_from([0, 1_000, 29_000, 40_000])),
    st.tuples(st.just("purge"), st.just(None)),
    st.tuples(st.just("dead letters"), st.integers(0, 3)),
    st.tuples(st.just("again"), st.integers(0, 7)),  # a receipt deleted before
)


def settle_by_the_floors(self: EngineCore, q: QueueState, now: int) -> None:
    """``EngineCore._settle_queue`` as it was before its short cuts: the floors of the delay
    index and of every tag, then the rewind window's bound."""
    if q.gone_seq >= q.next_seq:
        return
    floor = delayed_floor(self._store, q) if q.delayseq_from < q.next_seq else q.next_seq
    for t in q.tags.values():
        held_from = tag_floor(self._store, self._queues, self._now, q, t)
        if held_from < floor:
            floor = held_from
            if floor <= q.gone_seq:
                return
    bound = self._first_seq_at(q, now - q.attributes["rewind"] * 1000)
    gone = max(q.gone_seq, q.expired_seq, q.purge_seq, min(floor, bound))
    if gone > q.gone_seq:
        self._raise_gone(q, gone)
        self._persist_watermarks(q)


def settle_always(self: EngineCore, q: QueueState, now: int) -> None:
    """``EngineCore._settle`` without its test of a queue whose every message is gone."""
    self._settle_queue(q, now)
    sources = self._dead_sources.get(q.id)
    if sources:
        self._dead_letters.settle_sources(q, sources, now)


def play(path: Path, scenario: list[tuple[str, Any]], redrive: bool
         ) -> tuple[list[Any], dict[str, Any]]:
    """Play ``scenario`` -> (the answers, with the rows each batch wrote; every stored row)."""
    clock = FakeClock(START_MS)
    answers: list[Any] = []
    held: list[bytes] = []
    done: list[bytes] = []
    tags: list[str | None] = [None]
    with noting_batch_rows(answers):
        with Engine.open(path, clock=clock) as engine:
            for op, arg in scenario:
                if op == "send":
                    answers.append([type(sent).__name__ for sent in engine.send("q", arg)])
                elif op == "receive":
                    for tag in tags:
                        got = engine.receive("q", tag, max=arg)
                        answers.append([(d.record, d.receipt, d.dequeue_count,
                                         d.next_visible_time) for d in got])
                        held.extend(d.receipt for d in got if tag is None)
                elif op == "delete" and held:
                    receipt = held.pop(arg % len(held))
                    answers.append([repr(e) for e in engine.delete("q", [receipt])])
                    done.append(receipt)
                elif op == "again" and done:
                    receipt = done[arg % len(done)]
                    answers.append([repr(e) for e in engine.delete("q", [receipt])])
                elif op == "advance":
                    clock.advance(arg)
                elif op == "tag" and len(tags) == 1:
                    engine.create_tag("q", "second", start="oldest")
                    tags.append("second")
                elif op == "rewind":
                    try:
                        answers.append(repr(engine.rewind("q", clock.now_ms - arg)))
                    except LaminaError as exc:  # no window, or out of it: refused alike
                        answers.append(repr(exc))
                elif op == "purge":
                    answers.append(engine.purge_queue("q"))
                elif op == "dead letters" and redrive:  # a copy's end lets the original go
                    receipts = [d.receipt for d in engine.receive("dlq", max=4)][:arg]
                    if receipts:
                        answers.append(engine.delete("dlq", receipts))
                answers.append(engine.peek("q", max=4))
            answers.append(engine.stats("q", days=2))
            answers.append(engine.get_queue("q"))
    with raw_store(path) as db:
        rows = {name: list(db.get_column_family(name).items()) for name in COLUMN_FAMILIES}
    return answers, rows


def two_copies(tmp_path: Path, other: str, rewind_s: int, redrive: bool) -> Path:
    """A fresh directory with the scenarios' queues, and its copy (the same receipt key)
    named ``other`` beside it -> the directory."""
    shutil.rmtree(tmp_path, ignore_errors=True)
    base = tmp_path / "base"
    with Engine.open(base, clock=FakeClock(START_MS)) as engine:
        # Retention of a minute (gone_seq also rises with time), a rewind window perhaps, a
        # DLQ perhaps (a dead letter holds gone_seq while its copy lives).
        engine.create_queue("dlq")
        engine.create_queue("q", {"retention": 60, "rewind": rewind_s, "visibility_timeout": 1,
                                  "redrive": {"dlq": "dlq", "max_receives": 2} if redrive
                                  else None})
    shutil.copytree(base, tmp_path / other)
    return base


def both_ways(tmp_path: Path, scenario: list[tuple[str, Any]], rewind_s: int = 0,
              redrive: bool = False) -> tuple[Any, Any]:
    """The scenario played from copies of one directory (the same receipt key): as the
    engine settles, then settling by the floors alone, every time."""
    base = two_copies(tmp_path, "general", rewind_s, redrive)
    short = play(base, scenario, redrive)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineCore, "_settle_queue", settle_by_the_floors)
        patch.setattr(EngineCore, "_settle", settle_always)
        general = play(tmp_path / "general", scenario, redrive)
    return short, general


def test_a_backlogs_sends_and_an_in_order_consumer_settle_alike_either_way(tmp_path):
    # W4: sends onto a backlog (the tag's cursor rests on gone_seq), then receive 1 +
    # delete 1 in order (the lease at gone_seq, then gone_seq raised).
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 3)] * 3
    scenario += [("receive", 1), ("delete", 0), ("advance", 1)] * 5
    scenario += [("receive", 16), ("send", [b"plain"]), ("delete", 3), ("advance", 1_100)]
    short, general = both_ways(tmp_path, scenario)
    assert short == general


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=16), st.sampled_from([0, 0, 30]), st.booleans())
def test_settling_answers_and_stores_the_same_as_settling_by_the_floors(tmp_path, scenario,
                                                                        rewind_s, redrive):
    short, general = both_ways(tmp_path, scenario, rewind_s, redrive)
    assert short[0] == general[0]  # answers, peeks, stats, watermarks
    assert short[1] == general[1]  # every row of every column family


def test_a_dead_letter_at_gone_seq_settles_alike_either_way_once_its_copy_ends(tmp_path):
    # The message at gone_seq is a dead letter (ENDED_DEAD): it holds gone_seq only while
    # its DLQ copy lives, so the tag's row there is no floor by itself.
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 2)]
    scenario += [("receive", 1), ("advance", 1_100)] * 2
    scenario += [("receive", 16), ("dead letters", 1), ("send", [b"plain"]),
                 ("dead letters", 3), ("receive", 1), ("delete", 0)]
    short, general = both_ways(tmp_path, scenario, redrive=True)
    assert short == general
