"""``lamina inspect`` over a data directory whose table or blob file RocksDB cannot read (the
server beside removed it after the command's view opened, or it went from an offline copy):
one line on stderr naming the file and saying what to do, exit code 2, no traceback. ``verify``
instead reopens the view and checks again; a file it still cannot read is damage (exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import lamina.tools.inspect as inspect
from lamina.engine import Engine
from lamina.tools.snapshot import Snapshot

from tests.tools.test_snapshot_files_gone import (
    BLOB_BODY,
    _drop_log_files,
    _engine_with_flushed_rows,
)

EXIT_DAMAGE, EXIT_USAGE = 1, 2


def _assert_one_clear_line(err: str, data: Path) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    [line] = lines
    assert line.startswith(f"lamina inspect: {data}: the data file {data / 'db'}/")
    assert ".blob is gone. " in line
    assert "run the command again" in line
    assert "Traceback" not in err and "IO error" not in err


@pytest.mark.slow
def test_a_dump_of_a_copy_missing_a_blob_file_says_which_and_exits_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _engine_with_flushed_rows(data, BLOB_BODY).close()
    blobs = sorted((data / "db").glob("*.blob"))
    blobs[1].unlink()
    ran = subprocess.run([sys.executable, "-m", "lamina.tools.cli", "inspect", str(data),
                          "dump", "q"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == EXIT_USAGE
    _assert_one_clear_line(ran.stderr, data)
    assert str(blobs[1]) in ran.stderr


@pytest.mark.parametrize("command", [["dump", "q"], ["verify"]])
def test_files_removed_beside_a_command_after_its_view_opened(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``verify`` checks the directory as it is once reopened: here every log row went
    behind the engine's back, so the segments it still lists miss their rows (damage)."""
    data = tmp_path / "data"
    engine = _engine_with_flushed_rows(data, BLOB_BODY)
    try:
        class RemovedAfterOpening(Snapshot):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                _drop_log_files(engine)  # what a running server does to consumed segments

        monkeypatch.setattr(inspect, "Snapshot", RemovedAfterOpening)
        capsys.readouterr()
        code = inspect.main([str(data), *command])
        captured = capsys.readouterr()
        if command == ["verify"]:
            assert code == EXIT_DAMAGE and captured.err == ""
            assert "segment.missing" in captured.out and "is gone" not in captured.out
        else:
            assert code == EXIT_USAGE
            _assert_one_clear_line(captured.err, data)
    finally:
        engine.close()


def test_verify_of_a_copy_missing_a_blob_file_reports_it_as_damage_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _engine_with_flushed_rows(data, BLOB_BODY).close()
    blobs = sorted((data / "db").glob("*.blob"))
    blobs[1].unlink()
    capsys.readouterr()
    assert inspect.main([str(data), "verify"]) == EXIT_DAMAGE
    captured = capsys.readouterr()
    assert captured.err == ""
    [finding, verdict] = captured.out.splitlines()
    assert finding.startswith("DAMAGE ") and f"{blobs[1]} is gone" in finding
    assert verdict.startswith("DAMAGED: ") and "1 damage" in verdict
    assert inspect.main([str(data), "verify", "--json"]) == EXIT_DAMAGE
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["check"] == "file" and lines[0]["where"] == str(blobs[1])
    assert lines[-1]["summary"]["damage"] == 1


def test_a_view_opened_after_the_removal_reads_clean(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    data = tmp_path / "data"
    with Engine.open(data) as engine:
        engine.create_queue("q")
        engine.send("q", [BLOB_BODY] * 3)
        engine._store.log.flush(True)
        _drop_log_files(engine)
    assert inspect.main([str(data), "dump", "q"]) == 0
    assert capsys.readouterr() == ("", "")


def test_a_command_reading_the_store_itself_reports_a_file_it_could_not_read_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Commands read ``snapshot.store`` directly too (``verify``'s row counts): RocksDB's
    error from there reads the same."""
    data = tmp_path / "data"
    _engine_with_flushed_rows(data, BLOB_BODY).close()
    gone = data / "db" / "000123.blob"

    def failing_read(snapshot: Snapshot, args: Any, out: Any) -> int:
        raise Exception(f"IO error: No such file or directory: while stat a file for size: "
                        f"{gone}: No such file or directory")

    monkeypatch.setitem(inspect._COMMANDS, "queues", failing_read)
    assert inspect.main([str(data), "queues"]) == EXIT_USAGE
    _assert_one_clear_line(capsys.readouterr().err, data)


def test_any_other_exception_of_a_command_is_not_taken_for_a_read_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    _engine_with_flushed_rows(data, BLOB_BODY).close()

    def failing(snapshot: Snapshot, args: Any, out: Any) -> int:
        raise Exception("not RocksDB's")

    monkeypatch.setitem(inspect._COMMANDS, "queues", failing)
    with pytest.raises(Exception, match="not RocksDB's"):
        inspect.main([str(data), "queues"])


def _copy_with_a_damaged_topics_table(data: Path) -> Path:
    """A directory whose ``topics`` table file fails its first block's checksum: the log reads
    fine; a message's state for a tag (its topic's turn) cannot be derived."""
    from lamina.engine.store import COLUMN_FAMILIES
    with Engine.open(data) as engine:
        engine.create_queue("q")
        engine.send("q", [{1: f"m{i}", 3: "t"} for i in range(5)])
        store = engine._store
        for family in COLUMN_FAMILIES:
            if family != "topics":
                getattr(store, family).flush(True)
        before = set((data / "db").glob("*.sst"))
        store.topics.flush(True)
        [table] = set((data / "db").glob("*.sst")) - before
    damaged = bytearray(table.read_bytes())
    damaged[:40] = bytes(b ^ 0xFF for b in damaged[:40])
    table.write_bytes(bytes(damaged))
    return table


def test_a_tag_state_that_cannot_be_read_names_the_file_given_as_a_relative_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    table = _copy_with_a_damaged_topics_table(tmp_path / "data")
    monkeypatch.chdir(tmp_path)  # `lamina inspect data ...`: RocksDB names files relatively
    named = f"data/db/{table.name}"
    capsys.readouterr()
    assert inspect.main(["data", "dump", "q"]) == 0  # the log itself reads
    capsys.readouterr()
    assert inspect.main(["data", "dump", "q", "--tag", "default"]) == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert f"the data file {named} could not be read (Corruption: " in line
    assert "Traceback" not in line and "is gone" not in line
    assert inspect.main(["data", "verify", "--json"]) == EXIT_DAMAGE
    findings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(f["check"], f["where"]) for f in findings[:-1]] == [("file", named)]
