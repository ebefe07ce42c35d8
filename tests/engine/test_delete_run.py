"""A consumer's delete of a receive's batch takes a shorter path (``messaging.delete_run``):
it must answer, store and hold in memory exactly what ``_delete_receipts``' loop does, and
leave it to the loop whenever any receipt is not, in order, the current one of the batch's
next lease (Hypothesis: batches deleted whole, in part, out of order, repeated, altered,
not bytes, another tag's; several consumers' batches in flight; rewinds, redeliveries)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock, messaging
from lamina.engine.errors import LaminaError
from lamina.engine.state import LEASED
from lamina.engine.store import COLUMN_FAMILIES
from tests.engine.batchrows import noting_batch_rows
from tests.engine.test_lease_deadlines import raw_store
from tests.support import shortpaths
from tests.engine.test_settle_short import START_MS, two_copies

#: How a delete names a receive's receipts: whole, from its second, reversed, twice, the
#: first twice, one altered, one a bytearray, with a stale receipt after them.
SHAPES = ("whole", "tail", "reversed", "twice", "first twice", "altered", "bytearray",
          "stale after")

steps = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 40)),
    st.tuples(st.just("receive"), st.sampled_from([2, 5, 16, 16, 40])),
    st.tuples(st.just("delete"), st.tuples(st.integers(0, 5), st.sampled_from(SHAPES))),
    st.tuples(st.just("delete oldest"), st.just(None)),
    st.tuples(st.just("advance"), st.sampled_from([1, 400, 1_100])),
    st.tuples(st.just("tag"), st.just(None)),
    st.tuples(st.just("rewind"), st.sampled_from([0, 2_000])),
    st.tuples(st.just("visibility"), st.integers(0, 5)),
    st.tuples(st.just("foreign"), st.just(None)),  # the second tag's batch, on the default
)


def _named(batch: list[bytes], shape: str, stale: list[bytes]) -> list[Any]:
    if shape == "tail":
        return batch[1:] or batch
    if shape == "reversed":
        return batch[::-1]
    if shape == "twice":
        return batch + batch
    if shape == "first twice":
        return batch[:1] + batch
    if shape == "altered":
        return batch[:-1] + [batch[-1][:-1] + bytes([batch[-1][-1] ^ 1])]
    if shape == "bytearray":
        return batch[:-1] + [bytearray(batch[-1])]
    if shape == "stale after":
        return batch + stale[-1:]
    return batch


def _memory(engine: Engine) -> list[Any]:
    """What a delete changes in memory, by tag: leases, batch states, the due index and the
    heads of the heaps that their readers see (the first entry naming a lease held)."""
    found: list[Any] = []
    for q in engine._queues.values():
        found.append((q.gone_seq, dict(q.unsaved_deletes), q.unsaved_day))
        for t in q.tags.values():
            leases = t.leases
            found.append(sorted((seq, lease.state, lease.due_ms, lease.number, lease.receipt,
                                 None if lease.batch is None else bytes(lease.batch.states))
                                for seq, lease in leases.items()))
            found.append(sorted(t.due_index))
            found.append(sorted({seq for seq in t.lease_heap
                                 if seq in leases and leases[seq].state == LEASED}))
            found.append(sorted({seq for seq in t.row_heap if seq in leases}))
    return found


def play(path: Path, scenario: list[tuple[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
    """Play ``scenario`` -> (the answers, with the rows each batch wrote and the state in
    memory after each delete; every stored row)."""
    clock = FakeClock(START_MS)
    answers: list[Any] = []
    batches: list[list[bytes]] = []  # the receipts of each receive not deleted yet
    stale: list[bytes] = []
    foreign: list[list[bytes]] = []  # the second tag's batches
    tags: list[str | None] = [None]
    with noting_batch_rows(answers):
        with Engine.open(path, clock=clock) as engine:
            for op, arg in scenario:
                if op == "send":
                    engine.send("q", [b"body %d" % i for i in range(arg)])
                elif op == "receive":
                    for tag in tags:
                        got = engine.receive("q", tag, max=arg)
                        answers.append([(d.record, d.receipt, d.dequeue_count,
                                         d.next_visible_time) for d in got])
                        if got:
                            (batches if tag is None else foreign).append(
                                [d.receipt for d in got])
                elif op in ("delete", "delete oldest") and batches:
                    index, shape = arg if op == "delete" else (0, "whole")
                    batch = batches.pop(index % len(batches))
                    answers.append([repr(e) for e in engine.delete(
                        "q", _named(batch, shape, stale))])
                    stale.extend(batch)
                    answers.append(_memory(engine))
                elif op == "foreign" and foreign:
                    answers.append([repr(e) for e in engine.delete("q", foreign.pop())])
                    answers.append(_memory(engine))
                elif op == "advance":
                    clock.advance(arg)
                elif op == "tag" and len(tags) == 1:
                    engine.create_tag("q", "second", start="oldest")
                    tags.append("second")
                elif op == "rewind":
                    try:
                        answers.append(repr(engine.rewind("q", clock.now_ms - arg)))
                    except LaminaError as exc:
                        answers.append(repr(exc))
                elif op == "visibility" and batches:
                    batch = batches[arg % len(batches)]
                    changed = engine.change_visibility("q", [[batch[0], 5]])[0]
                    if not isinstance(changed, LaminaError):
                        stale.append(batch[0])
                        batch[0] = changed.receipt
                answers.append(engine.peek("q", max=4))
            answers.append(engine.stats("q", days=2))
            answers.append(engine.get_queue("q"))
    with raw_store(path) as db:
        rows = {name: list(db.get_column_family(name).items()) for name in COLUMN_FAMILIES}
    return answers, rows


def both_paths(tmp_path: Path, scenario: list[tuple[str, Any]], rewind_s: int = 0
               ) -> tuple[Any, Any, int]:
    """The scenario played from copies of one directory (the same receipt key): with the
    short path, then with the loop alone -> (short's result, the loop's, deletes taken)."""
    base = two_copies(tmp_path, "loop", rewind_s, False)
    return shortpaths.both_paths(messaging, "delete_run", lambda: play(base, scenario),
                                 lambda: play(tmp_path / "loop", scenario))


def test_four_consumers_batches_deleted_oldest_first_take_the_short_path(tmp_path):
    scenario: list[tuple[str, Any]] = [("send", 40), ("send", 40), ("send", 40)]
    scenario += [("receive", 16)] * 4
    scenario += [("delete oldest", None), ("receive", 16), ("advance", 1)] * 4
    scenario += [("delete", (2, "whole")), ("delete oldest", None), ("delete oldest", None)]
    fast, loop, taken = both_paths(tmp_path, scenario)
    assert taken == 7
    assert fast == loop


def test_receipts_not_a_batchs_in_order_are_left_to_the_loop(tmp_path):
    scenario: list[tuple[str, Any]] = [("send", 40), ("receive", 16), ("receive", 5)]
    for shape in SHAPES[2:]:
        scenario += [("delete", (0, shape)), ("receive", 16)]
    scenario += [("visibility", 0), ("delete", (0, "whole")),  # a lease left its batch
                 ("receive", 5), ("advance", 1_100), ("delete", (0, "whole")),  # ran out
                 ("tag", None), ("receive", 16), ("foreign", None)]  # the other tag's
    fast, loop, taken = both_paths(tmp_path, scenario)
    assert taken == 0
    assert fast == loop


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=20), st.sampled_from([0, 0, 30]))
def test_a_delete_of_several_answers_stores_and_holds_the_same_on_either_path(
        tmp_path, scenario, rewind_s):
    fast, loop, _ = both_paths(tmp_path, scenario, rewind_s)
    assert fast[0] == loop[0]  # answers, memory, peeks, stats, watermarks
    assert fast[1] == loop[1]  # every row of every column family
