"""A read-only snapshot's bulk read of the log, when the writer beside has deleted a file the
read needs after the snapshot opened (its rows dropped, the table and blob files compacted
away), fails with an error that names the file and says to refresh the view: RocksDB's
iterator only turns invalid there, and the read would otherwise end early without a word,
missing every row from that file on."""

from __future__ import annotations

from pathlib import Path

import pytest

from lamina.engine import Engine
from lamina.tools.snapshot import Snapshot, SnapshotReadError

#: Bodies of 4 KiB or more are stored in blob files (engine/store.py).
BLOB_BODY = b"x" * 5000


def _engine_with_flushed_rows(path: Path, body: bytes) -> Engine:
    engine = Engine.open(path)
    engine.create_queue("q")
    for _ in range(4):  # four flushes: four table files (and blob files)
        engine.send("q", [body] * 50)
        engine._store.log.flush(True)
    return engine


def _drop_log_files(engine: Engine) -> None:
    """What the server does to consumed segments, all at once: their rows deleted and
    compacted away, so their table and blob files are deleted."""
    log = engine._store.log
    for key in list(log.keys()):
        log.delete(key)
    log.flush(True)
    log.compact_range(None, None)


def test_a_read_whose_blob_files_were_deleted_beside_it_fails_and_names_the_cause(
        tmp_path: Path) -> None:
    path = tmp_path / "data"
    engine = _engine_with_flushed_rows(path, BLOB_BODY)
    try:
        assert list((path / "db").glob("*.blob"))
        with Snapshot(path) as snapshot:
            q = snapshot.queue("q")
            _drop_log_files(engine)
            assert not list((path / "db").glob("*.blob"))
            with pytest.raises(SnapshotReadError, match=r"\.blob is gone\. ") as bulk:
                list(snapshot.messages(q, 0, 10**9))
            assert bulk.value.file is not None and bulk.value.file.endswith(".blob")
            assert f"{path}: the data file {bulk.value.file} is gone" in str(bulk.value)
            assert "refresh the view" in str(bulk.value)
            # the engine's scan helpers (``Store.items``) and point reads too
            with pytest.raises(SnapshotReadError, match=r"\.blob is gone\. "):
                list(snapshot.lane_rows(q, q.lanes_used[0], 0, 10**9))
            with pytest.raises(SnapshotReadError, match=r"\.blob is gone\. "):
                snapshot.first_seq_at(q, 0)  # reads the records of the time index's range
            snapshot.refresh()  # the view as of now: the rows are gone, and that reads clean
            assert list(snapshot.messages(snapshot.queue("q"), 0, 10**9)) == []
    finally:
        engine.close()


def test_a_read_beside_a_writer_that_deleted_nothing_it_needs_reads_every_row(
        tmp_path: Path) -> None:
    path = tmp_path / "data"
    engine = _engine_with_flushed_rows(path, BLOB_BODY)
    try:
        with Snapshot(path) as snapshot:
            q = snapshot.queue("q")
            engine.send("q", [BLOB_BODY] * 10)  # after the open: not in this view
            engine._store.log.flush(True)
            rows = list(snapshot.messages(q, 0, 10**9))
        assert [seq for seq, _, _ in rows] == list(range(200))
    finally:
        engine.close()
