"""A read that RocksDB fails under a running server (blob files removed from its data
directory): the client is answered Unavailable naming the file, the server logs one JSON
line naming it and goes on, and once the files are back every message is delivered, none
skipped."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import lamina.engine.recovery as recovery
from lamina.client import Client
from lamina.engine.errors import Unavailable
from lamina.server.logs import JsonFormatter

from tests.support.servers import server_thread

BODY_BYTES = 5000  # stored in blob files (engine/store.py)
MESSAGES = 200


def _body(n: int) -> bytes:
    return b"%06d" % n + b"x" * (BODY_BYTES - 6)


def test_a_receive_whose_blob_file_is_gone_answers_unavailable_and_skips_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)
    db, kept = tmp_path / "data" / "db", tmp_path / "kept"
    with server_thread(tmp_path / "data") as running, \
            Client.connect("127.0.0.1", running.port) as client:
        client.create_queue("q")
        for chunk in range(4):  # four blob files
            client.send("q", [_body(n) for n in range(chunk * 50, chunk * 50 + 50)])
            running.engine_job(lambda engine: engine._store.log.flush(True))
        kept.mkdir()
        blobs = sorted(db.glob("*.blob"))
        assert len(blobs) == 4
        for blob in blobs:
            shutil.copy2(blob, kept / blob.name)
            blob.unlink()
        received: list[bytes] = []
        with caplog.at_level(logging.ERROR, logger="lamina.engine"):
            with pytest.raises(Unavailable) as refused:
                for _ in range(MESSAGES // 10 + 1):
                    batch = client.receive("q", max=10, visibility_timeout=600)
                    received += [d.body for d in batch]
        assert refused.value.code == "Unavailable"
        assert refused.value.message.startswith("storage read failed, nothing changed: "
                                                f"the data file {db}/")
        [gone] = [str(blob) for blob in blobs if str(blob) in refused.value.message]
        [record] = [r for r in caplog.records if getattr(r, "event", "") == "read_failed"]
        line = JsonFormatter().format(record)
        assert "\n" not in line  # one line, no traceback
        assert json.loads(line)["file"] == gone
        assert client.ping() > 0  # the server goes on
        for blob in blobs:
            blob.write_bytes((kept / blob.name).read_bytes())
        while batch := client.receive("q", max=100, visibility_timeout=600):
            received += [d.body for d in batch]
        assert received == [_body(n) for n in range(MESSAGES)]
