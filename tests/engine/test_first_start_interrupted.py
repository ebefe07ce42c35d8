"""A first start of a data directory that stops while creating the receipt key file (a full
disk, or a process killed at that moment) leaves the directory openable once the cause is
gone (DESIGN.md §3 "nothing stored ever lost": the directory holds nothing yet)."""

from __future__ import annotations

import errno
import os

import pytest

from lamina.engine import Engine


def test_a_key_file_whose_write_failed_does_not_keep_the_directory_from_opening(
        tmp_path, monkeypatch, clock):
    path = tmp_path / "data"
    real_write = os.write

    def disk_full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError):
        Engine.open(path, clock=clock)
    monkeypatch.setattr(os, "write", real_write)  # room again
    with Engine.open(path, clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"m"])
        [delivery] = engine.receive("q")
    with Engine.open(path, clock=clock) as engine:  # the same key again: the receipt holds
        assert engine.delete("q", [delivery.receipt]) == [None]


def test_a_file_system_without_hard_links_still_gets_its_key(tmp_path, monkeypatch, clock):
    def no_links(source: object, target: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        engine.create_queue("q")
        engine.send("q", [b"m"])
        [delivery] = engine.receive("q")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["db", "receipt.key"]
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        assert engine.delete("q", [delivery.receipt]) == [None]
