"""RocksDB's memory bounds (docs/STORAGE.md "Memory"): one write buffer budget and one block
cache for every column family, read back from RocksDB through ``Engine.memory_usage``."""

from __future__ import annotations

import os

import pytest
from rocksdict import DBCompressionType, Options

import lamina.engine.store as store_module
from lamina.engine import Engine, MemoryBounds
from lamina.engine.store import COLUMN_FAMILIES

MIB = 1 << 20


def test_write_buffers_of_all_families_stay_within_the_budget(tmp_path, clock):
    bounds = MemoryBounds(write_buffer_bytes=4 * MIB, block_cache_bytes=MIB)
    with Engine.open(tmp_path / "data", clock=clock, memory=bounds) as engine:
        engine.create_queue("q", {"max_message_size": 4096})
        body = os.urandom(1000)
        for _ in range(24):  # 24 MiB of records: six times the budget
            engine.send("q", [body] * 1000)
        usage = engine.memory_usage()
    assert usage.write_buffer_limit_bytes == 4 * MIB
    # RocksDB's own count of every family's memtables, flushing ones included: without the
    # budget the log alone would hold all 24 MiB (its buffer was 64 MiB).
    assert 0 < usage.write_buffers_bytes <= 2 * 4 * MIB


def test_one_block_cache_bounded_and_shared_by_every_family(tmp_path, clock):
    bounds = MemoryBounds(write_buffer_bytes=4 * MIB, block_cache_bytes=2 * MIB)
    with Engine.open(tmp_path / "data", clock=clock, memory=bounds) as engine:
        engine.create_queue("q")
        body = os.urandom(500)
        for _ in range(16):
            engine.send("q", [body] * 1000)
        store = engine._store
        for name in COLUMN_FAMILIES:
            getattr(store, name).flush(True)  # every read below comes from table files
        received = 0
        while deliveries := engine.receive("q", max=1000):
            received += len(deliveries)
        usage = engine.memory_usage()
        capacities = {getattr(store, name).property_int_value("rocksdb.block-cache-capacity")
                      for name in COLUMN_FAMILIES}
    assert received == 16_000
    assert capacities == {2 * MIB}  # one cache (each family had a 32 MiB one of its own)
    assert usage.block_cache_limit_bytes == 2 * MIB
    # 8 MB of records read through it, indexes included: it holds some, never all of them.
    assert 0 < usage.block_cache_bytes <= 2 * MIB


def test_memory_bounds_below_their_minimum_are_refused(tmp_path):
    with pytest.raises(ValueError, match="write_buffer_bytes"):
        Engine.open(tmp_path / "a", memory=MemoryBounds(write_buffer_bytes=MIB))
    with pytest.raises(ValueError, match="block_cache_bytes"):
        Engine.open(tmp_path / "b", memory=MemoryBounds(block_cache_bytes=1000))


def _former_options(memory: object, name: str | None = None) -> Options:
    """The column family options before the memory bounds: a 64 MiB write buffer for the log,
    RocksDB's defaults (a block cache per family) elsewhere."""
    options = Options(raw_mode=True)
    options.set_compression_type(DBCompressionType.lz4())
    if name == "log":
        options.set_write_buffer_size(64 << 20)
        options.set_enable_blob_files(True)
        options.set_min_blob_size(4096)
        options.set_enable_blob_gc(True)
    if name in store_module.CHURN_FAMILIES:
        options.add_compact_on_deletion_collector_factory(1024, 256, 0.5)
    return options


def test_a_directory_written_with_the_former_options_opens_unchanged(tmp_path, clock,
                                                                     monkeypatch):
    path = tmp_path / "data"
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "_options", _former_options)  # the database's too
        with Engine.open(path, clock=clock) as engine:
            engine.create_queue("q", {"visibility_timeout": 30})
            engine.send("q", [b"big" * 2000] + [f"m{i}".encode() for i in range(99)])
            first = engine.receive("q", max=10)
            store = engine._store
            for name in COLUMN_FAMILIES:  # table files written with the former options too
                getattr(store, name).flush(True)
            engine.send("q", [b"late"])  # and a WAL to replay
    with Engine.open(path, clock=clock) as engine:
        rest = engine.receive("q", max=1000)
        assert [d.body for d in rest] == [f"m{i}".encode() for i in range(9, 99)] + [b"late"]
        assert engine.delete("q", [d.receipt for d in first]) == [None] * 10
        clock.advance(31_000)
        again = engine.receive("q", max=1000)
        assert {d.body for d in again} == {d.body for d in rest}
        assert engine.get_queue("q").stats["messages"] == 91
