"""The ``--fsync`` cycle in process: a group of one send of 16 × 256 B, then ``sync_wal``, on a
WAL that is a new file and on one written over a recycled WAL file; and RocksDB alone, a write
and its sync by each way to sync it (docs/PERFORMANCE-HISTORY.md, "The ``--fsync`` sync: WAL
files recycled"). Reports wall and CPU µs a cycle.

    /tmp/venv/bin/python -m pytest bench/micro/test_walsync_bench.py -q --benchmark-only
"""

from __future__ import annotations

import os
import resource

import pytest
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from lamina.engine.store import RECYCLED_WAL_FILES

ROUNDS = 2000
#: Sends before the measured cycles of the recycled case: past the write buffer budget (32 MiB)
#: of WAL, so that WALs are obsolete and the current one is written over one of them.
FILL_MIB = 50


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize("wal", ["new", "recycled"])
def test_send_and_sync(benchmark, report, tmp_path, fsync_engine, wal):
    engine = fsync_engine
    if wal == "recycled":
        filler = [os.urandom(1000)] * 1000
        for _ in range(FILL_MIB):
            engine.send("q", filler)
    log = (tmp_path / "data" / "db" / "LOG").read_text()
    assert ("reusing log" in log) == (wal == "recycled")
    bodies = [os.urandom(256)] * 16

    def cycle():
        with engine.group():
            engine.send("q", bodies)
        engine.sync_wal()

    cpu = _cpu_s()
    benchmark.pedantic(cycle, rounds=ROUNDS, warmup_rounds=20)
    cpu_us = (_cpu_s() - cpu) / (ROUNDS + 20) * 1e6
    report("us_per_cycle", benchmark.stats.stats.mean * 1e6)
    report("cpu_us_per_cycle", cpu_us)


@pytest.mark.parametrize("wal", ["new", "recycled"])
@pytest.mark.parametrize("call", ["flush_wal", "sync_write", "wal_bytes_per_sync"])
def test_wal_sync_call(benchmark, report, tmp_path, call, wal):
    """RocksDB alone: a 4,600-byte write and its sync, by the call that syncs it."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(4 << 20)
    if wal == "recycled":
        options.set_recycle_log_file_num(RECYCLED_WAL_FILES)
    if call == "wal_bytes_per_sync":
        options.set_wal_bytes_per_sync(1 << 20)
    db = Rdict(str(tmp_path / "db"), options)
    body = os.urandom(4600)
    keys = iter(range(1 << 40))
    for _ in range(2):  # two memtable flushes: obsolete WALs, reused when recycling
        for _ in range(3000):
            db.put(next(keys).to_bytes(8, "big"), body)
        db.flush()
    plain, synced = WriteOptions(), WriteOptions()
    synced.sync = True

    def write_and_sync():
        batch = WriteBatch(raw_mode=True)
        batch.put(next(keys).to_bytes(8, "big"), body)
        if call == "sync_write":
            db.write(batch, synced)
        else:
            db.write(batch, plain)
            db.flush_wal(True)

    cpu = _cpu_s()
    try:
        benchmark.pedantic(write_and_sync, rounds=1500, warmup_rounds=20)
        cpu_us = (_cpu_s() - cpu) / 1520 * 1e6
    finally:
        db.close()
    report("us_per_sync", benchmark.stats.stats.mean * 1e6)
    report("cpu_us_per_sync", cpu_us)
