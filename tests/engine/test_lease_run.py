"""A receive of a batch from a backlog takes a shorter path (``leaserun.lease_run``); it must
answer and store exactly what the general path (``Lessor``) does, and leave it to the general
path, having changed nothing, whenever the case is not that one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock, keys, messaging
from lamina.engine.state import DEFAULT_LANE
from lamina.engine.store import COLUMN_FAMILIES
from tests.engine.batchrows import noting_batch_rows
from tests.engine.test_lease_deadlines import raw_store
from tests.support import shortpaths

START_MS = 1_700_000_000_000

#: Send entries: plain, delayed, in another priority lane, with a topic.
entries = st.sampled_from([b"plain", b"plain", b"plain", {1: b"late", 5: 1},
                           {1: b"high", 4: 2}, {1: b"topical", 3: "t"}])
steps = st.one_of(
    st.tuples(st.just("send"), st.lists(entries, min_size=1, max_size=12)),
    st.tuples(st.just("send"), st.just([b"plain"] * 20)),
    st.tuples(st.just("receive"), st.sampled_from([(16, None, None), (16, 30, None),
                                                   (5, None, None), (16, None, 700),
                                                   (3, None, None), (70, None, None)])),
    st.tuples(st.just("delete"), st.sampled_from(["all", "first", "last"])),
    st.tuples(st.just("advance"), st.sampled_from([1, 1_100, 31_000])),
    st.tuples(st.just("tag"), st.sampled_from(["oldest", "now"])),
    st.tuples(st.just("rewind"), st.sampled_from([0, 1_000, 40_000])),
)


def run(path: Path, scenario: list[tuple[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
    """Play ``scenario`` on the data directory at ``path`` -> (answers and the rows each
    batch wrote, every stored row at the end)."""
    clock = FakeClock(START_MS)
    answers: list[Any] = []
    with noting_batch_rows(answers):
        held: list[bytes] = []
        tags: list[str | None] = [None]
        with Engine.open(path, clock=clock) as engine:
            for op, arg in scenario:
                if op == "send":
                    answers.append([type(sent).__name__ for sent in engine.send("q", arg)])
                elif op == "receive":
                    count, timeout, max_bytes = arg
                    for tag in tags:
                        got = engine.receive("q", tag, max=count, visibility_timeout=timeout,
                                             max_bytes=max_bytes)
                        answers.append([(d.record, d.receipt, d.dequeue_count,
                                         d.first_dequeue_time, d.next_visible_time)
                                        for d in got])
                        held.extend(d.receipt for d in got if tag is None)
                elif op == "delete" and held:
                    if arg == "all":
                        chosen, held[:] = held[:], []
                    else:
                        chosen = [held.pop(0 if arg == "first" else -1)]
                    answers.append([repr(e) for e in engine.delete("q", chosen)])
                elif op == "advance":
                    clock.advance(arg)
                elif op == "tag" and len(tags) == 1:
                    engine.create_tag("q", "second", start=arg)
                    tags.append("second")
                elif op == "rewind":
                    answers.append(repr(engine.rewind("q", clock.now_ms - arg)))
                # What memory holds of each tag besides its rows: the cursors, as the
                # general path leaves them (on a record the tag has to do with).
                answers.append([(t.name, list(t.cursors), t.lease_counter, t.row_behind)
                                for t in engine._queue("q").tags.values()])
                answers.append([memory_of(t) for t in engine._queue("q").tags.values()])
            answers.append(engine.stats("q", days=2))
            answers.append(repr(engine.peek("q", max=50)))
    with raw_store(path) as db:
        rows = {name: list(db.get_column_family(name).items()) for name in COLUMN_FAMILIES}
    return answers, rows


def memory_of(t: Any) -> tuple[Any, ...]:
    """What a tag holds of its leases in memory: each lease's fields (its batch by the row it
    stands for), the heaps as they are laid out and the due index's pairs."""
    def batch_of(lease: Any) -> Any:
        batch = lease.batch
        return None if batch is None else (batch.key, batch.head, list(batch.seqs),
                                           bytes(batch.states))
    leases = [(seq, lease.state, lease.lane, lease.due_ms, lease.count, lease.first_ms,
               lease.number, lease.receipt, batch_of(lease))
              for seq, lease in sorted(t.leases.items())]
    return (leases, list(t.lease_heap), list(t.row_heap), list(t.due_index),
            t.min_due_ms, t.next_wake_ms)


def copies(tmp_path: Path, sends: list[Any] | None = None) -> tuple[Path, Path]:
    """Two copies of one data directory (the same receipt key) holding queue ``q``."""
    base = tmp_path / "base"
    shutil.rmtree(tmp_path, ignore_errors=True)
    with Engine.open(base, clock=FakeClock(START_MS)) as engine:
        engine.create_queue("q", {"rewind": 3_600})
        if sends:
            engine.send("q", sends)
    shutil.copytree(base, tmp_path / "general")
    return base, tmp_path / "general"


def both_paths(tmp_path: Path, scenario: list[tuple[str, Any]],
               dirs: tuple[Path, Path] | None = None) -> tuple[Any, Any, int]:
    """The scenario played twice from copies of one directory: with the short path, then
    with the general path alone -> (short's result, general's, receives the short path did)."""
    fast_dir, general_dir = dirs or copies(tmp_path)
    return shortpaths.both_paths(messaging, "lease_run", lambda: run(fast_dir, scenario),
                                 lambda: run(general_dir, scenario))


def test_w2s_consumer_receiving_16_and_deleting_them_takes_the_short_path_alike(tmp_path):
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 20)] * 5
    for _ in range(5):
        scenario += [("receive", (16, None, None)), ("delete", "all"), ("advance", 1)]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken == 4  # the tag's first receive writes its row: the general path's case
    assert fast == general


def test_batches_in_flight_delayed_messages_and_a_byte_budget_take_the_short_path_alike(
        tmp_path):
    delayed = {1: b"late", 5: 1}
    scenario: list[tuple[str, Any]] = [
        ("send", [b"plain"] * 20), ("receive", (3, None, None)),  # the tag's row, generally
        ("send", [b"plain", delayed] * 12),
        ("receive", (16, None, None)), ("receive", (16, None, 700)),
        ("receive", (16, 30, None)), ("delete", "first"), ("delete", "all"),
        ("advance", 1), ("receive", (16, None, None)),
    ]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken >= 3
    assert fast == general


def drop_log_record(path: Path, seq: int) -> None:
    """Delete the log record of ``seq`` (of the default lane) straight from the store."""
    with raw_store(path) as db:
        log = db.get_column_family("log")
        key = next(key for key in log.keys() if keys.log_seq(key) == seq)
        assert keys.log_key(keys.log_key_decode(key)[0], DEFAULT_LANE, seq) == key
        del log[key]
        del log


def test_a_lane_missing_a_record_is_left_to_the_general_path(tmp_path):
    # One lane in use keeps its seqs dense; should a record be missing all the same, the
    # short path, which counts seqs instead of reading keys, finds out before leasing.
    fast_dir, general_dir = copies(tmp_path, [b"plain"] * 30)
    for path in (fast_dir, general_dir):
        drop_log_record(path, 7)
    scenario: list[tuple[str, Any]] = [("receive", (3, None, None))]  # the tag's row
    scenario += [("receive", (16, None, None)), ("delete", "all")] * 2
    fast, general, taken = both_paths(tmp_path, scenario, (fast_dir, general_dir))
    assert fast == general
    assert taken == 1  # the second receive starts past the gap
    bodies = [entry[0] for answer in fast[0] if isinstance(answer, list)
              for entry in answer if isinstance(entry, tuple) and len(entry) == 5]
    assert len(bodies) == 3 + 16 + 10  # 29 messages: the one missing is not delivered


def test_records_leased_ahead_of_a_rewound_cursor_and_delayed_ones_are_passed_alike(tmp_path):
    delayed = {1: b"late", 5: 1}
    scenario: list[tuple[str, Any]] = [
        ("send", [b"plain"] * 3), ("receive", (3, None, None)),  # the tag's row, generally
        ("send", [b"plain"] * 16 + [delayed] + [b"plain"] * 6),
        ("receive", (16, 30, None)),  # ends before a delayed record: the cursor passes it
        ("delete", "first"), ("delete", "first"), ("advance", 1),
        ("rewind", 1_000),  # the cursor goes back; the leases held stay ahead of it
        ("receive", (16, None, 120)),  # the delay index's walk: generally; one fits
        ("receive", (16, None, None)),  # passes the leases held and the delayed record
        ("advance", 1_100), ("receive", (16, None, None)),
    ]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken == 2
    assert fast == general
    passing = [a for a in fast[0] if isinstance(a, list) and len(a) == 7]
    assert len(passing) == 1  # 1 and 20-25: the leases held (2-18) and 19 (delayed) passed


def test_the_receive_that_passes_the_lease_counters_ceiling_writes_the_tags_row_alike(
        tmp_path):
    # The stored lease counter is a ceiling 4,096 ahead (docs/STORAGE.md): the receive whose
    # lease numbers pass it writes the tag's row.
    scenario: list[tuple[str, Any]] = [("send", [b"plain"] * 20), ("receive", (3, None, None))]
    for _ in range(260):
        scenario += [("send", [b"plain"] * 16), ("receive", (16, None, None)),
                     ("delete", "all")]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken == 260  # the receive that passes the ceiling as well
    assert fast == general


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=14))
def test_a_receive_of_a_batch_answers_and_stores_the_same_on_either_path(tmp_path, scenario):
    fast, general, _ = both_paths(tmp_path, scenario)
    assert fast[0] == general[0]  # answers, stats and peek included
    assert fast[1] == general[1]  # every row of every column family


def test_a_byte_budget_that_stops_a_run_of_plain_messages_leaves_the_cursor_alike(tmp_path):
    scenario: list[tuple[str, Any]] = [
        ("send", [b"plain"] * 20), ("receive", (3, None, None)),  # the tag's row, generally
        ("send", [b"plain"] * 20), ("receive", (16, None, 700)), ("receive", (16, None, 700)),
        ("delete", "first"), ("receive", (16, None, None)), ("delete", "all"),
        ("advance", 1), ("receive", (16, None, 700)),
    ]
    fast, general, taken = both_paths(tmp_path, scenario)
    assert taken >= 3
    assert fast == general
