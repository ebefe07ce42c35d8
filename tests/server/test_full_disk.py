"""A really full file system under a real ``lamina serve``: writes answer Unavailable while
it is full, succeed again once space is freed (no restart), nothing acknowledged is lost, and
SIGTERM still exits 0. Needs permission to mount a small tmpfs (root); skipped otherwise."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from lamina.engine.errors import Unavailable
from lamina.engine.results import Sent
from lamina.client import Client

BODY = b"m" * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` with a file; -> its path."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as out:
        for size in (65536, 4096, 512, 1):  # then the last partial blocks
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def send_until_refused(client: Client, acknowledged: list[bytes]) -> Unavailable:
    for n in range(20_000):
        body = b"%06d" % n + BODY
        try:
            [result] = client.send("q", [body])
        except Unavailable as exc:
            return exc
        assert isinstance(result, Sent)
        acknowledged.append(body)
    raise AssertionError("the disk never filled up")


def receive_all(client: Client) -> list[bytes]:
    bodies = []
    while batch := client.receive("q", max=1000, visibility_timeout=600):
        bodies.extend(d.body for d in batch)
    return bodies


@pytest.mark.slow
def test_writes_recover_once_space_is_freed_without_a_restart(small_disk: Path,
                                                              spawned: Any) -> None:
    process = spawned(data=small_disk / "data")
    acknowledged: list[bytes] = []
    with Client.connect("127.0.0.1", process.port) as client:
        client.create_queue("q")
        filler = fill(small_disk)
        refused = send_until_refused(client, acknowledged)
        assert "No space left on device" in refused.message
        with pytest.raises(Unavailable):
            client.send("q", [b"still full"])
        with pytest.raises(Unavailable):
            client.purge_queue("q")
        assert client.get_queue("q").stats["messages"] == len(acknowledged)  # reads answered
        filler.unlink()
        deadline = time.monotonic() + 20
        while True:  # the engine reopens its store at most twice a second
            try:
                [result] = client.send("q", [b"after"])
                break
            except Unavailable:
                assert time.monotonic() < deadline, "writes never recovered"
                time.sleep(0.1)
        assert isinstance(result, Sent)
        assert receive_all(client) == acknowledged + [b"after"]
    process.signal(signal.SIGTERM)
    assert process.wait() == 0


@pytest.mark.slow
def test_sigterm_while_the_disk_is_full_exits_zero_and_loses_nothing(small_disk: Path,
                                                                     spawned: Any) -> None:
    process = spawned(data=small_disk / "data")
    acknowledged: list[bytes] = []
    with Client.connect("127.0.0.1", process.port) as client:
        client.create_queue("q")
        filler = fill(small_disk)
        send_until_refused(client, acknowledged)
    process.signal(signal.SIGTERM)
    assert process.wait() == 0
    os.unlink(filler)
    restarted = spawned(data=small_disk / "data")
    with Client.connect("127.0.0.1", restarted.port) as client:
        assert receive_all(client) == acknowledged
    restarted.signal(signal.SIGTERM)
    assert restarted.wait() == 0
