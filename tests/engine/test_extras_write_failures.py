"""A failed write changes nothing (docs/STORAGE.md "Group commit": "A failed write raises
`Unavailable` for that operation only, and it had no effect"), for the queue extras and the
deduplication keys of ``send_deduplicated`` too: memory does not keep what the store never
got."""

from __future__ import annotations

import pytest

from lamina.engine import Engine, Unavailable, recovery
from tests.engine.test_write_failures import FailingDB


@pytest.fixture(autouse=True)
def reopen_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)


def test_a_deduplicated_send_that_failed_is_stored_when_retried(engine: Engine) -> None:
    engine.create_queue("q")
    engine._store.db = FailingDB(engine._store.db)
    with pytest.raises(Unavailable):
        engine.send_deduplicated("q", [b"order 1"], [b"key-1"])
    # The disk has room again: the producer retries with the same key.
    [sent] = engine.send_deduplicated("q", [b"order 1"], [b"key-1"])
    [delivery] = engine.receive("q")
    assert (delivery.id, delivery.body) == (sent.id, b"order 1")
    engine._store.db = FailingDB(engine._store.db)  # a duplicate is still one
    with pytest.raises(Unavailable):
        engine.send_deduplicated("q", [b"order 2"], [b"key-2"])
    assert engine.send_deduplicated("q", [b"order 1"], [b"key-1"])[0].id == sent.id


def test_extras_whose_write_failed_are_not_reported(engine: Engine) -> None:
    engine.create_queue("q")
    engine.set_queue_extras("q", {"tags": {"team": "a"}})
    engine._store.db = FailingDB(engine._store.db)
    with pytest.raises(Unavailable):
        engine.set_queue_extras("q", {"tags": {"team": "b"}})
    assert engine.queue_extras("q") == {"tags": {"team": "a"}}


def test_a_queue_and_its_extras_are_written_together(tmp_path, clock) -> None:
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        engine._store.db = FailingDB(engine._store.db)
        with pytest.raises(Unavailable):
            engine.create_queue("q", extras={"tags": {"team": "a"}})
        assert engine.list_queues().queues == []
        engine.create_queue("q", extras={"tags": {"team": "a"}})
        # An existing equal queue is answered as it is, its extras untouched.
        engine.create_queue("q", extras={"tags": {"team": "b"}})
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        assert engine.queue_extras("q") == {"tags": {"team": "a"}}
