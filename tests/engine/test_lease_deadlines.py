"""Lease deadlines: the in-memory (due, seq) index, its rebuild at open, and the migration
from schema version 1 (which kept them in a ``timers`` family) and 2 (a ``leases`` row per
leased message, where version 3 keeps a receive's leases in one ``leasebatches`` row)."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from hypothesis import given
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from lamina.engine import Engine, keys, leasebatch
from lamina.engine.core import SCHEMA_VERSION
from lamina.engine.dueindex import DueIndex
from lamina.engine.store import COLUMN_FAMILIES

@contextmanager
def raw_store(path: Path) -> Iterator[Rdict]:
    """The data directory's RocksDB, opened directly (to make an older or newer layout)."""
    families = {name: Options(raw_mode=True) for name in COLUMN_FAMILIES}
    db = Rdict(str(path / "db"), Options(raw_mode=True), column_families=families)
    try:
        yield db
    finally:
        db.close()
        del db
        gc.collect()


pairs = st.lists(st.tuples(st.integers(0, 2**48), st.integers(0, 2**64 - 1)), max_size=40)


@given(pairs, pairs)
def test_due_index_orders_pairs_by_due_then_seq(added, removed):
    index = DueIndex()
    for due, seq in added:
        index.add(due, seq)
        index.add(due, seq)  # adding again changes nothing
    for due, seq in removed:
        index.discard(due, seq)
    expected = sorted(set(added) - set(removed))
    assert list(index) == expected
    assert len(index) == len(expected)


small_pairs = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=30)


@given(small_pairs, small_pairs, st.data())
def test_due_index_discards_runs_of_seqs_by_due_as_pair_by_pair(added, removed, data):
    index = DueIndex()
    index.add_all(1, [0, 1, 2])  # a group made whole, as a receive of several makes it
    for due, seq in added:
        index.add(due, seq)
    runs: dict[int, list[int]] = {}
    for due, seq in dict.fromkeys(removed):  # a delete names each lease once
        runs.setdefault(due, []).append(seq)
    if data.draw(st.booleans()):  # the whole of some group, as a delete of a receive's batch
        whole = data.draw(st.sampled_from(sorted(index.buckets)))
        runs[whole] = sorted(set(runs.get(whole, [])) | {s for d, s in index if d == whole})
    expected = sorted(set(index) - {(due, seq) for due, seqs in runs.items() for seq in seqs})
    index.discard_runs(runs)
    assert list(index) == expected
    assert list(index.dues) == sorted({due for due, _ in expected})


@given(pairs, st.integers(0, 2**48), st.integers(0, 2**48))
def test_due_index_bounded_reads(added, low, high):
    index = DueIndex()
    for due, seq in added:
        index.add(due, seq)
    entries = sorted(set(added))
    after = [due for due, _ in entries if due > low]
    assert index.first_due_after(low) == (after[0] if after else None)
    assert index.between((low, 0), high) == [(d, s) for d, s in entries if low <= d <= high]
    walk, walked = index.walk(low, high), []
    while walk.current is not None:
        walked.append(walk.current)
        index.discard(*walk.current)  # dropping the current entry keeps the walk valid
        walk.next()
    assert walked == [(d, s) for d, s in entries if low <= d <= high]


def test_due_index_walk_sees_entries_added_ahead_of_it():
    index = DueIndex()
    index.add(10, 1)
    walk = index.walk(0, 100)
    index.add(50, 2)  # ahead of the position: met
    index.add(5, 3)  # behind it: not met
    seen = []
    while walk.current is not None:
        seen.append(walk.current)
        walk.next()
    assert seen == [(10, 1), (50, 2)]


def test_a_lease_runs_out_while_the_engine_is_closed(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 30})
    engine.send("q", [b"a", b"b"])
    first = engine.receive("q", max=2)
    engine.close()
    clock.advance(31_000)
    engine = open_engine()
    again = engine.receive("q", max=2)
    assert [d.body for d in again] == [b"a", b"b"]
    assert [d.dequeue_count for d in again] == [2, 2]
    assert engine.delete("q", [d.receipt for d in first]) != [None, None]  # stale now


def as_version_2(db: Rdict) -> None:
    """Rewrite a data directory's lease batches as version 2 wrote the same leases: a
    ``leases`` row per message (LEASED, or ENDED_DELETED once deleted), no ``leasebatches``
    family."""
    leases = db.get_column_family("leases")
    batches = db.get_column_family("leasebatches")
    for key, value in list(batches.items()):
        queue, tag, lane, _ = keys.batch_key_decode(key)
        for seq, lease in leasebatch.as_leases(lane, key, value, 0):
            leases[keys.lease_key(queue, tag, seq)] = lease.encode()
    del leases, batches
    db.drop_column_family("leasebatches")
    db.get_column_family("meta")[keys.META_VERSION] = keys.u32(2)


def test_schema_2_directory_is_migrated_on_open(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30})
        engine.send("q", [b"a", b"b", b"c"])
        held = engine.receive("q", max=3)
        assert engine.delete("q", [held[1].receipt]) == [None]
    with raw_store(path) as db:
        as_version_2(db)
        assert "leasebatches" not in Rdict.list_cf(str(path / "db"))
    clock.advance(10_000)
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION)
        assert "leasebatches" in Rdict.list_cf(str(path / "db"))
        assert engine.receive("q") == []  # still Inflight: their deadlines were read
        peeked = engine.peek("q", ids=[d.id for d in held]).messages
        assert [(p.state, p.dequeue_count) for p in peeked] == [
            ("inflight", 1), ("deleted", 1), ("inflight", 1)]
        assert engine.delete("q", [held[0].receipt]) == [None]  # receipts stay valid
        clock.advance(21_000)
        (again,) = engine.receive("q")
        assert (again.body, again.dequeue_count) == (b"c", 2)
    with Engine.open(path, clock=clock) as engine:  # and the migrated layout reopens
        (peeked,) = engine.peek("q", ids=[again.id]).messages
        assert (peeked.state, peeked.dequeue_count) == ("inflight", 2)
        assert engine.delete("q", [again.receipt]) == [None]


def test_schema_1_directory_is_migrated_on_open(tmp_path, clock):
    path = tmp_path / "data"
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q", {"visibility_timeout": 30})
        engine.send("q", [b"a"])
        (delivery,) = engine.receive("q")
    # Make it a version 1 directory: the version row, and a ``timers`` family with a row.
    with raw_store(path) as db:
        as_version_2(db)
        timers = db.create_column_family("timers", Options(raw_mode=True))
        timers[b"\x00\x00\x00\x01" * 2 + b"\x00" * 16] = b"\x08"
        db.get_column_family("meta")[keys.META_VERSION] = keys.u32(1)
        del timers
    with Engine.open(path, clock=clock) as engine:
        assert engine._store.meta[keys.META_VERSION] == keys.u32(SCHEMA_VERSION)
        assert "timers" not in Rdict.list_cf(str(path / "db"))
        assert engine.receive("q") == []  # still Inflight: its deadline was rebuilt
        clock.advance(31_000)
        (again,) = engine.receive("q")
        assert (again.body, again.dequeue_count) == (b"a", 2)
        assert engine.delete("q", [delivery.receipt]) != [None]


def test_a_newer_schema_is_refused(tmp_path, clock):
    path = tmp_path / "data"
    Engine.open(path, clock=clock).close()
    with raw_store(path) as db:
        db.get_column_family("meta")[keys.META_VERSION] = keys.u32(SCHEMA_VERSION + 1)
    with pytest.raises(RuntimeError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Engine.open(path, clock=clock)
