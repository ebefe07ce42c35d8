"""A read-only snapshot's open beside a writer that changes the files under it (table files
compacted away, WAL files deleted or reused: docs/STORAGE.md "WAL files") is tried again: when
RocksDB fails it for a file gone, and when a WAL file the manifest it read still needed went
during the open (RocksDB would open without that WAL's rows, and say nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import lamina.tools.snapshot as snapshot_module
from lamina.engine import Engine
from lamina.tools.snapshot import OPEN_ATTEMPTS, Snapshot, SnapshotError
from lamina.engine.store import Store


def opens_with(monkeypatch: pytest.MonkeyPatch, before_open: Callable[[int], None],
               after_open: Callable[[int], None]) -> list[int]:
    """Make each read-only ``Store`` open of the snapshot module call ``before_open(n)`` and
    ``after_open(n)`` around it (n: the attempt, from 1); -> the attempts made."""
    attempts: list[int] = []

    class Watched(Store):
        def __init__(self, *args: Any, **kwargs: Any):
            attempts.append(len(attempts) + 1)
            before_open(attempts[-1])
            super().__init__(*args, **kwargs)
            after_open(attempts[-1])

    monkeypatch.setattr(snapshot_module, "Store", Watched)
    return attempts


def test_an_open_that_rocksdb_fails_for_a_file_gone_is_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data"
    with Engine.open(path) as engine:
        engine.create_queue("q")

    def fail_first(attempt: int) -> None:
        if attempt == 1:
            raise Exception("IO error: No such file or directory: While opening a file for "
                            "sequentially reading: 000012.log: No such file or directory")

    attempts = opens_with(monkeypatch, fail_first, lambda attempt: None)
    with Snapshot(path) as snapshot:
        assert snapshot.queue("q").name == "q"
    assert attempts == [1, 2]


def test_any_other_open_failure_is_raised_at_once(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data"
    with Engine.open(path) as engine:
        engine.create_queue("q")

    def fail(attempt: int) -> None:
        raise Exception("IO error: Permission denied")

    attempts = opens_with(monkeypatch, fail, lambda attempt: None)
    with pytest.raises(Exception, match="Permission denied"):
        Snapshot(path)
    assert attempts == [1]


def hidden_wal(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[int], None],
                                                                 Callable[[int], None]]:
    """-> ``hide(attempt)``, which renames the store's one WAL file away (as if reused under
    a new name), and ``bring_back(attempt)``, which the pause before each new attempt calls."""
    (wal,) = (path / "db").glob("*.log")
    hidden = wal.with_name(wal.name + ".hidden")

    def bring_back(attempt: int) -> None:
        if hidden.exists():
            hidden.rename(wal)

    monkeypatch.setattr(snapshot_module.time, "sleep", lambda seconds: bring_back(0))
    return (lambda attempt: wal.rename(hidden)), bring_back


def test_a_needed_wal_gone_during_the_open_makes_it_open_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data"
    with Engine.open(path) as engine:  # its rows only in its WAL, which the open needs
        engine.create_queue("q")
        hide, _ = hidden_wal(path, monkeypatch)
        attempts = opens_with(monkeypatch, lambda attempt: None,
                              lambda attempt: hide(attempt) if attempt == 1 else None)
        with Snapshot(path) as snapshot:
            assert snapshot.queue("q").name == "q"
    assert attempts == [1, 2]


def test_wal_files_changing_under_every_open_is_an_error_that_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data"
    with Engine.open(path) as engine:
        engine.create_queue("q")
        hide, bring_back = hidden_wal(path, monkeypatch)
        attempts = opens_with(monkeypatch, lambda attempt: None, hide)
        with pytest.raises(SnapshotError, match="WAL files changed"):
            Snapshot(path)
        bring_back(0)
    assert len(attempts) == OPEN_ATTEMPTS
