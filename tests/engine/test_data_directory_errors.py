"""Opening a data directory the engine cannot use: held by another engine (in this process or
another) or damaged (a blob file gone). The open fails with ``DataDirectoryError`` saying so
and what to do, releases what it took, and the directory opens once the cause is gone;
``lamina serve`` logs that one line and exits 1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lamina.engine import DataDirectoryError, Engine
from lamina.engine.core import EngineCore

BODY_BYTES = 5000  # stored in blob files (engine/store.py)


def _directory_with_blob_files(path: Path) -> None:
    with Engine.open(path) as engine:
        engine.create_queue("q")
        for chunk in range(2):
            engine.send("q", [b"%04d" % n + b"x" * (BODY_BYTES - 4)
                              for n in range(chunk * 20, chunk * 20 + 20)])
            engine._store.log.flush(True)


def test_a_damaged_directory_is_named_with_its_missing_file_and_opens_once_it_is_back(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    _directory_with_blob_files(data)
    blob = sorted((data / "db").glob("*.blob"))[0]
    kept = tmp_path / blob.name
    shutil.move(blob, kept)
    with pytest.raises(DataDirectoryError) as raised:
        Engine.open(data)
    message = str(raised.value)
    assert str(data) in message and f"{blob} is gone" in message and "damaged" in message
    shutil.move(kept, blob)
    with Engine.open(data) as engine:  # nothing of the failed open is left holding it
        bodies = [d.message.body for d in engine.receive("q", max=40)]
    assert [body[:4] for body in bodies] == [b"%04d" % n for n in range(40)]


def test_a_directory_held_by_an_engine_of_this_process_is_in_use(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "data"):
        with pytest.raises(DataDirectoryError, match="in use .* holds its lock"):
            Engine.open(tmp_path / "data")
    Engine.open(tmp_path / "data").close()


_HOLD = """
import sys, time
from lamina.engine import Engine
engine = Engine.open(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
engine.close()
"""


@pytest.mark.slow
def test_lamina_serve_on_a_directory_in_use_logs_one_line_and_exits_1(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(data)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(DataDirectoryError, match="in use"):
            Engine.open(data)  # another process's lock
        served = subprocess.run([sys.executable, "-m", "lamina.tools.cli", "serve", "--data",
                                 str(data), "--port", "0"], capture_output=True, text=True,
                                timeout=60)
    finally:
        holder.communicate("")
    assert served.returncode == 1
    lines = [json.loads(line) for line in served.stderr.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line["level"] == "ERROR"]
    assert len(failed) == 1 and failed[0]["event"] == "start_failed"
    assert f"{data}: in use" in failed[0]["message"]
    assert "Traceback" not in served.stderr


def test_a_failed_load_releases_the_directory(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    Engine.open(data).close()
    table = tmp_path / "000123.sst"  # (RocksDB's open deletes files of db/ it does not know)
    table.write_bytes(b"damaged")  # there, but unreadable

    def unreadable(self: EngineCore) -> None:  # as rocksdict raises RocksDB's read error
        raise Exception(f"Corruption: block checksum mismatch in {table} offset 0 size 4096")

    with monkeypatch.context() as patched:
        patched.setattr(EngineCore, "_load", unreadable)
        with pytest.raises(DataDirectoryError, match="could not be read .* damaged"):
            Engine.open(data)
    Engine.open(data).close()  # the lock of the failed open was released


def test_other_failures_of_a_load_are_raised_as_they_are(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    Engine.open(data).close()

    def broken(self: EngineCore) -> None:
        raise ValueError("not RocksDB's")

    with monkeypatch.context() as patched:
        patched.setattr(EngineCore, "_load", broken)
        with pytest.raises(ValueError, match="not RocksDB's"):
            Engine.open(data)
    Engine.open(data).close()
