"""A receive that moves a tag's cursors only over what the log and the lease rows tell at
open does not write the tag's row (docs/STORAGE.md "Tags"): opening finds the cursors
again, and the lease counter the row holds is a ceiling no issued number reaches."""

from __future__ import annotations

import json

import pytest

from lamina.engine import Engine, StaleReceipt
from lamina.engine.receipts import unpack_body
from tests.support.stores import run_killed

CHILD = r"""
import json, os, signal, sys
from lamina.engine import Engine

engine = Engine.open(sys.argv[1])
engine.create_queue("q")
# Two lanes, a delayed message among them, then receives of one: the cursors run ahead of
# the tag's row.
engine.send("q", [{1: b"m%03d" % i, 4: 8 if i % 3 else 2, 5: 600 if i == 7 else 0}
                  for i in range(40)])
held = [engine.receive("q")[0] for _ in range(12)]
deleted = held[:4] + held[6:8]
for delivery in deleted:
    assert engine.delete("q", [delivery.receipt]) == [None]
inflight = [d for d in held if d not in deleted]
print(json.dumps({"deleted": [d.body.decode() for d in deleted],
                  "inflight": [[d.body.decode(), d.receipt.hex()] for d in inflight]}),
      flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_cursors_ahead_of_their_row_are_found_again_after_a_killed_process(tmp_path):
    path = tmp_path / "data"
    before = json.loads(run_killed(CHILD, path))
    numbers_before = [unpack_body(bytes.fromhex(receipt))[4]
                      for _, receipt in before["inflight"]]
    with Engine.open(path) as engine:
        rest = engine.receive("q", max=100)
        got = sorted(d.body.decode() for d in rest)
        expected = sorted({f"m{i:03d}" for i in range(40)} - {"m007"}
                          - set(before["deleted"]) - {body for body, _ in before["inflight"]})
        assert got == expected  # no deleted nor in-flight message again, none skipped
        assert min(unpack_body(d.receipt)[4] for d in rest) > max(numbers_before)
        for _, receipt in before["inflight"]:  # receipts survive the killed process
            assert engine.delete("q", [bytes.fromhex(receipt)]) == [None]


def test_receives_of_one_leave_the_row_and_reopening_goes_on_where_they_stopped(
        tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"m%d" % i for i in range(10)])
        first = [engine.receive("q")[0] for _ in range(3)]
        engine.delete("q", [first[0].receipt])
    with Engine.open(path, clock=clock) as engine:
        assert [d.body for d in engine.receive("q", max=10)] == [b"m%d" % i
                                                                for i in range(3, 10)]
        assert engine.delete("q", [first[1].receipt, first[0].receipt]) == [
            None, StaleReceipt("receipt: the lease is no longer current")]

def test_a_clean_close_stores_the_lease_counter_exact(tmp_path, clock):
    from lamina.tools.snapshot import Snapshot

    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"m%d" % i for i in range(5)])
        for _ in range(5):
            engine.receive("q")
    with Snapshot(path) as snapshot:
        [t] = snapshot.queue("q").tags.values()
        assert (t.lease_counter, t.cursors[8]) == (5, 5)


@pytest.mark.parametrize("start", [0, 3, 6, 9, 12])
def test_a_lane_walk_by_point_reads_meets_what_an_iterator_meets(tmp_path, start):
    from lamina.engine import keys
    from lamina.engine.store import LaneWalk, Store

    store = Store(tmp_path / "db")
    try:
        present = [seq for seq in range(12) if seq not in (5, 6, 10)]  # gaps: it must not stop
        for seq in present:
            store.put(store.log_h, keys.log_key(1, 8, seq), b"v%d" % seq)
        store.put(store.log_h, keys.log_key(1, 9, 0), b"other lane")
        store.flush()

        def walked(it) -> list[tuple[bytes, bytes]]:
            seen = []
            while it.valid():
                seen.append((it.key(), it.value()))
                it.next()
            return seen

        expected = walked(Store.scan(store.log, *keys.log_lane_bounds(1, 8, start)))
        assert walked(LaneWalk(store.log, 1, 8, start, 11)) == expected
        assert len(expected) == len([seq for seq in present if seq >= start])
    finally:
        store.close()
