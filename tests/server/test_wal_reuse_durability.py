"""kill -9 under load once the server writes its WAL over recycled WAL files (docs/STORAGE.md
"WAL files"): nothing acknowledged is lost and no acknowledged delete comes back, with and
without --fsync. A recycled file still holds an older WAL's records past the new ones; recovery
must stop at the new WAL's end without dropping what was acknowledged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import AckedLoad, kill_under_load
from tests.support.walfiles import WalWatch

#: The smallest write buffer budget: a WAL fills after about 2 MiB of writes.
SMALL_WRITE_BUFFERS = ("--write-buffer-bytes", str(4 << 20))


@pytest.mark.slow
@pytest.mark.parametrize("fsync", [False, True], ids=["acked-in-wal", "fsync"])
def test_kill_9_over_recycled_wal_files_loses_nothing_acknowledged(
        tmp_path: Path, spawned: Any, fsync: bool) -> None:
    process = spawned(*SMALL_WRITE_BUFFERS, *(["--fsync"] if fsync else []))
    watch = WalWatch(tmp_path / "data" / "db")
    load = AckedLoad(process.port, "q", body_bytes=3000)

    def reused() -> bool:
        watch.look()
        return bool(watch.reused())

    try:
        # Past the first reuse, so the kill finds the WAL written over an older one's records.
        kill_under_load(process, load.producer, load.consumer, load.stop, load_s=0.5,
                        join_s=10, until=reused, until_s=30)
        assert watch.reused(), "no WAL file was reused before the kill"
    finally:
        watch.close()
    assert len(load.acked_sent) > 100 and len(load.acked_deleted) > 10

    restarted = spawned(data=tmp_path / "data")
    load.assert_nothing_lost(restarted.port)
