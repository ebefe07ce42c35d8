"""The store recycles its WAL files (docs/STORAGE.md "WAL files"): an obsolete WAL is renamed
and written over by the next one instead of being deleted, which halves the cost of a WAL sync;
the WALs stay few; and a directory whose WAL was written without recycling, left by a killed
process, opens with recycling and loses nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lamina.engine import Engine, MemoryBounds
from lamina.engine.store import RECYCLED_WAL_FILES
from tests.support.stores import run_killed
from tests.support.walfiles import WalWatch

MIB = 1 << 20
#: The smallest write buffer budget: the log's write buffer (half of it) and so a WAL fill up
#: after about 2 MiB of sends.
SMALL = MemoryBounds(write_buffer_bytes=4 * MIB, block_cache_bytes=MIB)
PER_MIB = 1000  # messages a MiB of sends


def send_until_reused(engine: Engine, watch: WalWatch, limit_mib: int) -> tuple[int, int]:
    """Send 1 MiB at a time until a WAL file was reused (or ``limit_mib``); -> MiB sent and
    the most WAL files seen at once."""
    body = os.urandom(MIB // PER_MIB)
    most = 0
    for sent_mib in range(1, limit_mib + 1):
        engine.send("q", [body] * PER_MIB)
        watch.look()
        most = max(most, len(list(watch.db_path.glob("*.log"))))
        if watch.reused():
            return sent_mib, most
    return limit_mib, most


def test_obsolete_wal_files_are_written_over_by_the_next_wals(tmp_path, clock):
    path = tmp_path / "data"
    watch = WalWatch(path / "db")
    try:
        with Engine.open(path, clock=clock, memory=SMALL) as engine:
            engine.create_queue("q", {"max_message_size": 4096})
            sent_mib, most = send_until_reused(engine, watch, limit_mib=40)
            reused = watch.reused()
    finally:
        watch.close()
    assert reused, f"no WAL file reused after {sent_mib} MiB of sends"
    # The queue's rows in rarely written families (its state, its time index) do not keep old
    # WALs alive for long: the first ones become obsolete after a few WALs' worth of sends.
    assert sent_mib <= 16
    assert most <= RECYCLED_WAL_FILES + 3  # the live WALs and the ones kept for reuse


KILLED_WITHOUT_RECYCLING = """
import os, signal, sys
import lamina.engine.store as store
store.RECYCLED_WAL_FILES = 0  # as stores were written before WAL files were recycled
from lamina.engine import Engine
engine = Engine.open(sys.argv[1])
engine.create_queue("q", {"max_message_size": 4096})
for index in range(300):
    engine.send("q", [b"%06d" % index] * 10)
print(3000, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_killed_store_written_without_recycling_opens_with_it_and_loses_nothing(
        tmp_path: Path) -> None:
    path = tmp_path / "data"
    sent = int(run_killed(KILLED_WITHOUT_RECYCLING, path))
    assert not list((path / "db").glob("*.sst"))  # everything it holds is in its WAL
    watch = WalWatch(path / "db")
    try:
        with Engine.open(path, memory=SMALL) as engine:
            assert engine.get_queue("q").stats["messages"] == sent
            sent_mib, _ = send_until_reused(engine, watch, limit_mib=40)
            assert watch.reused(), f"no WAL file reused after {sent_mib} MiB of sends"
            sent += sent_mib * PER_MIB
    finally:
        watch.close()
    with Engine.open(path, memory=SMALL) as engine:
        assert engine.get_queue("q").stats["messages"] == sent
