"""RocksDB's memory: the bounds a store opens with, and what it holds now.

RocksDB holds three kinds of memory a store can bound (``docs/STORAGE.md``, "Memory"):

- **write buffers** (memtables): recent writes, until flushed to table files. One budget for
  all column families together (a write buffer manager shared by them): past 90 % of it, the
  family with the oldest write buffer is flushed. Each family's own buffer is a share of the
  budget (the log, written most, half of it; every other family a quarter), so one busy family
  flushes before it could take the whole budget. A buffer being flushed is still held, so
  the write buffers may reach the budget plus the one being flushed.
- **the block cache**: table blocks read, index blocks included (``cache_index_and_filter_blocks``),
  one LRU cache shared by every family. Without it each family would get RocksDB's default
  cache of its own (32 MiB each) and every open table file would hold its index outside any
  cache, growing with the backlog.
- **table readers**: what an open table file keeps besides cached blocks (small once indexes
  live in the cache); at most ``MAX_OPEN_FILES`` files are open.

Everything else of the server's memory is Python's (code, connections, in-flight leases).
"""

from __future__ import annotations

from dataclasses import dataclass

from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBufferManager

__all__ = ["DEFAULT_BLOCK_CACHE_BYTES", "DEFAULT_WRITE_BUFFER_BYTES", "MIN_BLOCK_CACHE_BYTES",
           "MIN_WRITE_BUFFER_BYTES", "MemoryBounds", "MemoryUsage", "StoreMemory"]

#: All write buffers together (memtables of every column family).
DEFAULT_WRITE_BUFFER_BYTES = 32 << 20
#: The block cache shared by every column family.
DEFAULT_BLOCK_CACHE_BYTES = 8 << 20
MIN_WRITE_BUFFER_BYTES = 4 << 20
MIN_BLOCK_CACHE_BYTES = 1 << 20


@dataclass(frozen=True)
class MemoryBounds:
    """How much memory a store's RocksDB may hold: its write buffers (all column families
    together) and its block cache."""

    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES
    block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES

    def check(self) -> MemoryBounds:
        """Raise ``ValueError`` naming the bound that is too small; returns self."""
        if self.write_buffer_bytes < MIN_WRITE_BUFFER_BYTES:
            raise ValueError(f"write_buffer_bytes must be at least {MIN_WRITE_BUFFER_BYTES} "
                             f"bytes, not {self.write_buffer_bytes}")
        if self.block_cache_bytes < MIN_BLOCK_CACHE_BYTES:
            raise ValueError(f"block_cache_bytes must be at least {MIN_BLOCK_CACHE_BYTES} "
                             f"bytes, not {self.block_cache_bytes}")
        return self


@dataclass(frozen=True)
class MemoryUsage:
    """What a store's RocksDB holds now, in bytes."""

    #: Memtables of every column family (flushing ones included).
    write_buffers_bytes: int
    write_buffer_limit_bytes: int
    #: Blocks in the shared block cache (index blocks and pinned blocks included).
    block_cache_bytes: int
    block_cache_limit_bytes: int
    #: Open table files' memory outside the block cache.
    table_readers_bytes: int


class StoreMemory:
    """The shared write buffer manager and block cache of one store, and the options that
    attach them to its column families."""

    __slots__ = ("bounds", "_write_buffers", "_cache")  # held as long as the store

    def __init__(self, bounds: MemoryBounds):
        self.bounds = bounds.check()
        self._write_buffers = WriteBufferManager(bounds.write_buffer_bytes, False)
        self._cache = Cache(bounds.block_cache_bytes)

    def apply(self, options: Options, family: str | None) -> None:
        """Bound ``options`` (of column family ``family``; None: the database's own)."""
        options.set_write_buffer_manager(self._write_buffers)
        share = 2 if family == "log" else 4
        options.set_write_buffer_size(self.bounds.write_buffer_bytes // share)
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        table.set_cache_index_and_filter_blocks(True)
        # Level-0 files are read by every lookup; their index blocks stay (counted in the
        # cache) while the files are at level 0.
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        options.set_block_based_table_factory(table)

    def usage(self, families: list[Rdict]) -> MemoryUsage:
        """What RocksDB holds now, as RocksDB reports it; ``families``: the store's open
        column families (they share the cache: any of them reports it)."""
        def total(name: str) -> int:
            return sum(family.property_int_value(name) or 0 for family in families)

        first = families[0]
        return MemoryUsage(
            write_buffers_bytes=total("rocksdb.size-all-mem-tables"),
            write_buffer_limit_bytes=self._write_buffers.get_buffer_size(),
            block_cache_bytes=first.property_int_value("rocksdb.block-cache-usage") or 0,
            block_cache_limit_bytes=first.property_int_value("rocksdb.block-cache-capacity")
            or 0,
            table_readers_bytes=total("rocksdb.estimate-table-readers-mem"),
        )
