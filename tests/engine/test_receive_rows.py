"""What a receive writes (docs/STORAGE.md, schema version 4): a receive of first deliveries
writes their lease rows alone; its received counts are held back and found again at open
from those rows, so the daily figures stay exact after a kill."""

from __future__ import annotations

import json
import struct

import pytest

from lamina.engine import Engine, keys
from lamina.engine.store import Store
from lamina.engine.core import SCHEMA_VERSION
from tests.engine.test_lease_deadlines import raw_store
from tests.support.stores import run_killed

DAY_MS = 86_400_000
FIGURES = ("received", "bytes_out", "deleted")


@pytest.fixture
def counted(monkeypatch):
    """``counted(operation)`` -> the rows the batches written by ``operation`` held."""
    written: list[int] = []
    flush = Store.flush

    def counting_flush(self: Store) -> None:
        written.append(self.batch.len())  # the rows (puts and deletes) in the batch
        flush(self)

    monkeypatch.setattr(Store, "flush", counting_flush)

    def rows_of(operation) -> int:
        written.clear()
        operation()
        return sum(written)

    return rows_of


def figures(engine: Engine, tag: str | None = None) -> list[tuple[str, int, int, int]]:
    return [(day["day"], *(day[name] for name in FIGURES))
            for day in engine.stats("q", tag=tag, days=31)]


def test_a_receive_of_first_deliveries_writes_only_its_lease_rows(engine, clock, counted):
    engine.create_queue("q")
    engine.send("q", [b"m%02d" % i for i in range(60)])
    got = engine.receive("q")  # the tag's first counter row (with its mark)
    for count in (1, 2, 16):  # a lease row; then one lease batch row each
        clock.advance(1)
        assert counted(lambda: got.extend(engine.receive("q", max=count))) == 1
    # Held back, counted all the same.
    assert figures(engine)[0][1:3] == (20, sum(len(d.record) for d in got))


def test_held_receives_reach_the_rows_with_the_next_other_write(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"m%02d" % i for i in range(20)])
        first = engine.receive("q")
        held = engine.receive("q", max=4)
        engine.delete("q", [first[0].receipt])  # writes the day's row with the held figures
        before = figures(engine)
        assert not engine._counters.unsaved
        assert before[0][1:] == (5, sum(len(d.record) for d in first + held), 1)
    with Engine.open(path, clock=clock) as engine:
        assert figures(engine) == before


def test_a_version_3_directory_opens_unchanged_and_its_tags_count_on(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"m%02d" % i for i in range(10)])
        engine.receive("q", max=3)
        before = figures(engine)
        queue_id = engine._queue_names["q"]
    with raw_store(path) as db:  # the rows as version 3 wrote them: no mark
        meta = db.get_column_family("meta")
        meta[keys.META_VERSION] = keys.u32(3)
        lower, upper = keys.day_bounds(queue_id)
        for key, value in list(meta.items(from_key=lower)):
            if key >= upper:
                break
            meta[key] = value[:56]
        del meta
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION) == keys.u32(5)
        assert figures(engine) == before
        engine.receive("q", max=2)  # counted at once (no mark yet), then held back
        engine.receive("q", max=2)
        after = figures(engine)
        assert after[0][1] == 7 and after[0][2] > before[0][2]
    with Engine.open(path, clock=clock) as engine:
        assert figures(engine) == after


def test_a_receive_finding_nothing_still_sees_what_fell_due(engine, clock):
    engine.create_queue("q", {"visibility_timeout": 5})
    engine.send("q", [b"now", {1: b"later", 5: 2}])  # the second delayed by 2 s
    (leased,) = engine.receive("q")
    assert engine.receive("q") == []  # cursors at the tail, nothing due
    clock.advance(2000)
    assert [d.body for d in engine.receive("q")] == [b"later"]  # its delay ended
    assert engine.receive("q") == []
    clock.advance(3000)
    (again,) = engine.receive("q")  # the first lease ran out
    assert again.body == b"now" and again.dequeue_count == 2 and leased.body == b"now"


#: The start of a child process that a test kills: an engine on a fake clock a few ms before
#: midnight, queue ``q`` with a second tag ``other`` and 300 messages of 1-40 bytes. The
#: script goes on from there and ends with ``CHILD_END``.
CHILD_START = r"""
import json, os, signal, sys
from lamina.engine import Engine, FakeClock

DAY_MS = 86_400_000
clock = FakeClock(1_700_000_000_000 // DAY_MS * DAY_MS + DAY_MS - 50)  # 50 ms to midnight
engine = Engine.open(sys.argv[1], clock=clock)
engine.create_queue("q", {"visibility_timeout": 60})
engine.create_tag("q", "other")
engine.send("q", [b"x" * (i % 40 + 1) for i in range(300)])
"""
#: Its end: every tag's figures, the clock and what is held back printed, then a SIGKILL.
CHILD_END = r"""
stats = {tag or "queue": engine.stats("q", tag=tag) for tag in (None, "default", "other")}
q = engine._queues[engine._queue_names["q"]]
print(json.dumps({"stats": stats, "now": clock(), "in_watermarks": len(q.unsaved_received),
                  "held": sum(v[0] for v in engine._counters.unsaved.values())}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_child_figures(body: str, path) -> dict:
    """Run ``CHILD_START + body + CHILD_END`` on ``path`` until it kills itself; check that
    reopening shows every figure it printed (across midnight) -> what it printed."""
    from lamina.engine import FakeClock

    before = json.loads(run_killed(CHILD_START + body + CHILD_END, path))
    assert len(before["stats"]["queue"]) == 2  # across midnight
    with Engine.open(path, clock=FakeClock(before["now"])) as engine:
        assert {tag or "queue": engine.stats("q", tag=tag)
                for tag in (None, "default", "other")} == before["stats"]
    return before


CHILD = r"""
receipts = []
for index in range(40):  # receives of 1, 2 and 16 across midnight, some deletes between
    for tag in ("default", "other"):
        got = engine.receive("q", tag, max=(1, 2, 16)[index % 3])
        if index % 7 == 3:
            assert engine.delete("q", [d.receipt for d in got], tag) == [None] * len(got)
        elif tag == "default":
            receipts += [d.receipt for d in got]
    clock.advance(3)
# A lease renumbered by change_visibility while nothing is held back, then more held back.
engine.delete("q", receipts[:1])
(changed,) = engine.change_visibility("q", [[receipts[1], 30]])
engine.receive("q", max=3)
engine.receive("q", "other")
"""


@pytest.mark.slow
def test_received_counts_are_exact_after_a_killed_process(tmp_path):
    assert killed_child_figures(CHILD, tmp_path / "data")["held"] > 0


def test_stored_rows_of_a_tag_carry_its_mark(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"a", b"b"])
        engine.receive("q", max=2)
        queue_id, tag_id = engine._queue_names["q"], 1
        counter = engine._queues[queue_id].tags[tag_id].lease_counter
    with raw_store(path) as db:
        meta = db.get_column_family("meta")
        value = meta[keys.day_key(queue_id, tag_id, clock() // DAY_MS)]
        del meta
    assert struct.unpack(">8Q", value)[1] == 2 and struct.unpack(">8Q", value)[7] == counter


def test_a_receive_of_many_with_few_records_left_reads_them_by_point_reads(
        engine, clock, monkeypatch):
    engine.create_queue("q")
    engine.send("q", [b"a", {1: b"delayed", 5: 1}, b"b"])
    scans = []
    real_scan = Store.scan

    def counting_scan(*args, **kwargs):
        scans.append(args)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(Store, "scan", staticmethod(counting_scan))
    assert [d.body for d in engine.receive("q", max=16)] == [b"a", b"b"]
    engine.send("q", [b"c"])  # as a long poll is woken: one new record
    assert [d.body for d in engine.receive("q", max=16)] == [b"c"]
    lanes = [args for args in scans if args[0] is engine._store.log]
    assert lanes == []  # no iterator over the log: the records were read by key
    clock.advance(1000)
    assert [d.body for d in engine.receive("q", max=16)] == [b"delayed"]
    assert engine.receive("q", max=16) == []
