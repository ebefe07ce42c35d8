"""``lamina inspect verify``: a healthy store passes; each kind of damage written straight into a
copy (rocksdict raw mode, through the engine's ``Store``) is caught and named."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from lamina.engine import Engine, keys, leasebatch
from lamina.engine.records import PREFIX, PREFIX_SIZE
from lamina.engine.state import LANES, LEASED, Lease, Segment
from lamina.engine.store import Store
from lamina.tools.inspect import main as inspect_main
from lamina.tools.snapshot import Snapshot
from lamina.tools.verify import verify

from tests.support import stores
from tests.support.stores import START_MS, body, build_mixed, build_plain

ORDERS = 2  # queue ids in build_mixed: dlq 1, orders 2
DEFAULT_LANE = 8


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify") / "data"
    build_mixed(path)
    return path


def checks(path: Path) -> tuple[set[str], set[str], bool]:
    """-> (damage checks, warning checks, damaged) of a verify run."""
    with Snapshot(path) as snapshot:
        report = verify(snapshot)
    damage = {f.check for f in report.findings if f.severity == "damage"}
    warnings = {f.check for f in report.findings if f.severity == "warning"}
    return damage, warnings, report.damaged


def corrupted(mixed: Path, tmp_path: Path, change: Callable[[Store], None]) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(mixed, copy)
    store = Store(copy / "db")
    change(store)
    store.flush()
    store.close()
    return copy


def log_value(store: Store, seq: int, lane: int = DEFAULT_LANE) -> bytes:
    value = store.log.get(keys.log_key(ORDERS, lane, seq))
    assert value is not None
    return value


def a_leased_row(store: Store) -> tuple[int, int, Lease]:
    lower, upper = keys.queue_bounds(ORDERS)
    for key, value in Store.items(store.leases, lower, upper):
        lease = Lease.decode(value)
        if lease.state == LEASED:
            _, tag, seq = keys.lease_key_decode(key)
            return tag, seq, lease
    raise AssertionError("no LEASED row")


def test_a_healthy_store_passes(mixed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert checks(mixed) == (set(), set(), False)
    assert inspect_main([str(mixed), "verify"]) == 0
    assert capsys.readouterr().out.startswith("OK: 2 queues, 38 messages")


# -- each kind of damage ------------------------------------------------------------------------

def _md5(store: Store) -> None:  # one body byte changed, the CBOR still valid
    value = log_value(store, 0)
    store.put(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 0),
              value.replace(body(0)[:9], b"00000000+", 1))


def _cbor(store: Store) -> None:  # a record cut short
    value = log_value(store, 0)
    store.put(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 0), value[:PREFIX_SIZE + 9])


def _id(store: Store) -> None:  # seq 0's value stored under seq 6
    store.put(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 6), log_value(store, 0))


def _prefix(store: Store) -> None:  # the prefix's visible time moved by 1 ms
    value = log_value(store, 0)
    enqueue, visible, topic, priority = PREFIX.unpack_from(value)
    store.put(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 0),
              PREFIX.pack(enqueue, visible + 1, topic, priority) + value[PREFIX_SIZE:])


def _prefix_topic(store: Store) -> None:  # a topic message's prefix names another topic id
    value = log_value(store, 3)  # "topic a 0"
    enqueue, visible, topic, priority = PREFIX.unpack_from(value)
    store.put(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 3),
              PREFIX.pack(enqueue, visible, topic + 1, priority) + value[PREFIX_SIZE:])


def _time_entry_deleted(store: Store) -> None:  # the entry of the last send's ms, which
    # the sparse index needs (more than EVERY_MS after the one before)
    store.delete(store.time_h, keys.time_key(ORDERS, START_MS + 31_018, 36))


def _time_entry_wrong(store: Store) -> None:  # an entry naming a seq of another ms
    store.put(store.time_h, keys.time_key(ORDERS, START_MS + 4, 7), b"")


def _time_entry_not_first(store: Store) -> None:  # seq 7 is not the first seq of its ms
    store.delete(store.time_h, keys.time_key(ORDERS, START_MS + 3, 6))
    store.put(store.time_h, keys.time_key(ORDERS, START_MS + 3, 7), b"")


def _segment_count(store: Store) -> None:
    key = keys.segment_key(ORDERS, 8)
    segment = Segment.decode(8, store.segments.get(key))
    segment.count += 1
    store.put(store.segments_h, key, segment.encode())


def _segment_row_deleted(store: Store) -> None:
    store.delete(store.segments_h, keys.segment_key(ORDERS, 8))


def _log_row_deleted(store: Store) -> None:
    store.delete(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 0))


def _log_row_outside(store: Store) -> None:  # a row in a lane no message can have
    store.put(store.log_h, keys.log_key(ORDERS, LANES + 1, 0), log_value(store, 0))


def _log_row_past_the_end(store: Store) -> None:
    # The open segment's row may lag the log (a send does not rewrite it), so reading the queue
    # takes rows past it as the open segment's: a far one leaves seqs without rows.
    store.put(store.log_h, keys.log_key(ORDERS, DEFAULT_LANE, 10_000), log_value(store, 0))


def _lease_without_message(store: Store) -> None:
    tag, _, lease = a_leased_row(store)
    store.put(store.leases_h, keys.lease_key(ORDERS, tag, 30), Lease(
        LEASED, 2, lease.due_ms, 1, START_MS, 99).encode())  # seq 30 is in lane 8, not 2


def a_batch_row(store: Store) -> tuple[bytes, bytes]:
    lower, upper = keys.queue_bounds(ORDERS)
    for key, value in Store.items(store.leasebatches, lower, upper):
        return key, value
    raise AssertionError("no lease batch row")


def _batch_without_message(store: Store) -> None:
    key, value = a_batch_row(store)
    _, tag, lane, _ = keys.batch_key_decode(key)
    _, first_ms, _, _, _ = leasebatch.decode(key, value)
    wrong_lane = 2 if lane != 2 else 3
    store.put(store.leasebatches_h, keys.batch_key(ORDERS, tag, wrong_lane, 30),
              leasebatch.encode_head(START_MS, first_ms, [30], [99]) + b"\x01")


def _batch_overlap(store: Store) -> None:
    key, value = a_batch_row(store)
    _, tag, lane, last = keys.batch_key_decode(key)
    _, first_ms, seqs, _, _ = leasebatch.decode(key, value)
    store.put(store.leasebatches_h, keys.batch_key(ORDERS, tag, lane, last + 1),
              leasebatch.encode_head(START_MS, first_ms, [seqs[0], last + 1], [98, 99])
              + b"\x01\x01")


def _batch_undecodable(store: Store) -> None:
    key, value = a_batch_row(store)
    store.put(store.leasebatches_h, key, value[:-3])


def _unknown_queue(store: Store) -> None:
    store.put(store.log_h, keys.log_key(99, DEFAULT_LANE, 0), log_value(store, 0))


def _unknown_tag(store: Store) -> None:
    store.put(store.leases_h, keys.lease_key(ORDERS, 77, 0), Lease(
        LEASED, 8, START_MS, 1, START_MS, 1).encode())


DAMAGE = {
    "md5": (_md5, "record.md5"),
    "cbor": (_cbor, "record.decode"),
    "id": (_id, "record.id"),
    "prefix": (_prefix, "record.prefix"),
    "prefix_topic": (_prefix_topic, "record.prefix"),
    "time_entry_deleted": (_time_entry_deleted, "time.missing"),
    "time_entry_wrong": (_time_entry_wrong, "time.entry"),
    "time_entry_not_first": (_time_entry_not_first, "time.entry"),
    "segment_count": (_segment_count, "segment.summary"),
    "segment_row_deleted": (_segment_row_deleted, "segment.table"),
    "log_row_deleted": (_log_row_deleted, "segment.missing"),
    "log_row_outside": (_log_row_outside, "log.orphan"),
    "log_row_past_the_end": (_log_row_past_the_end, "segment.missing"),
    "lease_without_message": (_lease_without_message, "lease.message"),
    "batch_without_message": (_batch_without_message, "lease.message"),
    "batch_overlap": (_batch_overlap, "lease.batch_overlap"),
    "batch_undecodable": (_batch_undecodable, "lease.decode"),
    "unknown_queue": (_unknown_queue, "orphan"),
    "unknown_tag": (_unknown_tag, "orphan"),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_damage_is_caught(name: str, mixed: Path, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    change, check = DAMAGE[name]
    copy = corrupted(mixed, tmp_path, change)
    damage, _, damaged = checks(copy)
    assert damaged and check in damage, damage
    capsys.readouterr()
    assert inspect_main([str(copy), "verify"]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGE  {check}" in out and out.rstrip().splitlines()[-1].startswith("DAMAGED")


def test_damage_as_json_lines(mixed: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    import json
    copy = corrupted(mixed, tmp_path, _md5)
    capsys.readouterr()
    assert inspect_main([str(copy), "verify", "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["check"] == "record.md5" and rows[0]["queue"] == "orders"
    assert rows[-1]["summary"]["damage"] == 1


def test_rewind_over_expired_leases_leaves_a_clean_store(tmp_path: Path) -> None:
    path = tmp_path / "data"
    clock = build_plain(path, 100, segment=30)
    with Engine.open(path, clock=clock) as engine:
        engine.set_queue_attributes("q", {"rewind": 3600})
        engine.receive("q", max=10)
        clock.advance(31_000)  # the leases run out: Active again
        engine.rewind("q", START_MS)  # drops their lease rows
    assert checks(path) == (set(), set(), False)


def test_verify_beside_a_writing_process(tmp_path: Path) -> None:
    path = tmp_path / "data"
    writer = subprocess.Popen(
        [sys.executable, stores.__file__, "write", str(path),
         "live", "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        seen = []
        for _ in range(3):
            time.sleep(0.5)
            with Snapshot(path) as snapshot:
                report = verify(snapshot)
                seen.append(report.messages)
            assert not report.damaged, [str(f) for f in report.findings]
        assert seen[-1] > seen[0] > 0
    finally:
        writer.wait(30)
