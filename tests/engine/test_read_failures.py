"""Reads that RocksDB fails (a blob file removed or damaged under the engine's open database):
the operation answers Unavailable naming the file, logs one line naming it, and changes
nothing: once the file is back, every message is delivered, none skipped. Should rebuilding
memory fail as well, every operation answers Unavailable until a reopen rebuilds it all."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import lamina.engine.recovery as recovery
from lamina.engine import Engine, Unavailable
from lamina.engine.store import read_failure
from lamina.server.logs import JsonFormatter

#: Bodies of 4 KiB or more are stored in blob files (engine/store.py).
BODY_BYTES = 5000
MESSAGES = 200


@pytest.fixture(autouse=True)
def reopen_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)


def _body(n: int) -> bytes:
    return b"%06d" % n + b"x" * (BODY_BYTES - 6)


def _engine_with_blob_files(path: Path) -> Engine:
    """An engine whose queue ``q`` holds ``MESSAGES`` messages in four blob files."""
    engine = Engine.open(path)
    engine.create_queue("q")
    for chunk in range(4):
        engine.send("q", [_body(n) for n in range(chunk * 50, chunk * 50 + 50)])
        engine._store.log.flush(True)
    return engine


def _set_aside(db: Path, keep: Path) -> list[Path]:
    """Copy the blob files of ``db`` to ``keep``; -> the originals."""
    keep.mkdir()
    blobs = sorted(db.glob("*.blob"))
    assert len(blobs) == 4
    for blob in blobs:
        shutil.copy2(blob, keep / blob.name)
    return blobs


def _put_back(blobs: list[Path], keep: Path) -> None:
    for blob in blobs:
        blob.write_bytes((keep / blob.name).read_bytes())


def _bodies(engine: Engine, count: int) -> list[bytes]:
    return [d.message.body for d in engine.receive("q", max=count, visibility_timeout=600)]


def test_a_receive_over_a_removed_blob_file_is_unavailable_names_it_and_skips_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine_with_blob_files(tmp_path / "data")
    try:
        blobs = _set_aside(tmp_path / "data" / "db", tmp_path / "kept")
        for blob in blobs:
            blob.unlink()
        received: list[bytes] = []
        # RocksDB still reads the files it holds open; the first it must open fails.
        with caplog.at_level(logging.ERROR, logger="lamina.engine"):
            with pytest.raises(Unavailable) as refused:
                for _ in range(MESSAGES // 10 + 1):
                    received += _bodies(engine, 10)
        missing = [str(blob) for blob in blobs if str(blob) in refused.value.message]
        assert len(missing) == 1
        assert refused.value.message.startswith("storage read failed, nothing changed: ")
        assert f"the data file {missing[0]} is gone" in refused.value.message
        [record] = [r for r in caplog.records if getattr(r, "event", "") == "read_failed"]
        assert record.file == missing[0]  # type: ignore[attr-defined]
        assert "\n" not in JsonFormatter().format(record)  # one JSON line, no traceback
        with pytest.raises(Unavailable, match="is gone"):  # still so, and still no skipping
            _bodies(engine, 10)
        failures = engine.storage_failures  # as /metrics shows them
        assert failures["read"] >= 1 and failures["write"] == 0
        _put_back(blobs, tmp_path / "kept")
        received += _bodies(engine, MESSAGES)
        assert received == [_body(n) for n in range(MESSAGES)]
    finally:
        engine.close()


def test_a_damaged_blob_file_closes_the_store_until_a_reopen_can_rebuild_everything(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "data"
    _engine_with_blob_files(path).close()
    blobs = _set_aside(path / "db", tmp_path / "kept")
    engine = Engine.open(path)
    try:
        for blob in blobs:  # damaged in place: RocksDB's open readers see it too
            with open(blob, "r+b") as damaged:
                damaged.seek(100)
                damaged.write(b"\xff" * 200)
        with caplog.at_level(logging.ERROR, logger="lamina.engine"):
            with pytest.raises(Unavailable, match="storage read failed, nothing changed"):
                _bodies(engine, 10)
        # Rebuilding memory reads the damaged record too: every operation is refused.
        assert [r.event for r in caplog.records  # type: ignore[attr-defined]
                if hasattr(r, "event")] == ["read_failed", "reload_failed"]
        with pytest.raises(Unavailable, match="storage unavailable, nothing changed"):
            engine.get_queue("q")
        with pytest.raises(Unavailable, match="storage unavailable, nothing changed"):
            engine.send("q", [b"refused"])
        _put_back(blobs, tmp_path / "kept")
        assert _bodies(engine, MESSAGES) == [_body(n) for n in range(MESSAGES)]
        assert engine.get_queue("q").stats["messages"] == MESSAGES
    finally:
        engine.close()


@pytest.mark.parametrize("message, file", [
    ("IO error: No such file or directory: while stat a file for size: /d/db/000013.blob: "
     "No such file or directory", "/d/db/000013.blob"),
    ("IO error: No such file or directory: While open a file for random read: "
     "/d/db/000123.sst: No such file or directory", "/d/db/000123.sst"),
    ("Corruption: Blob CRC mismatch", None),
])
def test_rocksdb_read_errors_are_recognised_with_the_file_they_name(message: str,
                                                                    file: str | None) -> None:
    failure = read_failure(Exception(message))
    assert failure is not None and failure.file == file and failure.message == message


def test_other_exceptions_are_not_read_failures() -> None:
    assert read_failure(Exception("Invalid argument: Column family not found")) is None
    assert read_failure(Exception("IO error: No space left on device: While appending to "
                                  "file: /d/db/000004.log")) is None  # a write's
    assert read_failure(OSError("IO error: not RocksDB's")) is None
    assert read_failure(ValueError("Corruption: not RocksDB's")) is None
