"""Public API, group commit, recovery from internal errors, closed engines."""

import pytest

import lamina.engine
from lamina.engine import Engine, InternalError, Unavailable


def test_exported_names_change_only_on_purpose():
    assert sorted(lamina.engine.__all__) == sorted([
        "AccessDenied", "DataDirectoryError", "Delivery", "Engine", "FakeClock", "Grant", "InternalError",
        "InvalidArgument", "MemoryBounds", "MemoryUsage", "PeekPage", "Peeked", "Redriven", "Rewound", "TagInfo",
        "InvalidQueueName", "InvalidReceipt", "InvalidRedrivePolicy", "LaminaError", "Message",
        "MessageNotFound", "MessageTooLarge", "NoDeadLetterQueue", "ProtocolError",
        "QueueAlreadyExists", "QueueFull", "QueueInfo", "QueueNotFound", "QueuePage",
        "RewindDisabled", "RewindOutOfRange", "Sent", "StaleReceipt", "TagAlreadyExists",
        "TagNotFound", "TooManyQueues", "TooManyTags", "Unauthorized", "Unavailable",
        "UnknownOperation", "VisibilityChanged", "wall_clock_ms",
    ])


def test_every_wire_code_has_its_exception():
    from lamina.engine.errors import ERROR_CLASSES, error_from_wire
    assert len(ERROR_CLASSES) == 23
    for code, cls in ERROR_CLASSES.items():
        assert isinstance(error_from_wire({"code": code, "message": "m"}), cls)
    unknown = error_from_wire({"code": "Novel", "message": "m"})
    assert type(unknown) is lamina.engine.LaminaError and unknown.code == "Novel"


def test_group_applies_operations_in_order_with_one_wal_sync(open_engine):
    engine = open_engine(fsync=True)
    engine.create_queue("q")
    syncs = []
    real_sync = engine._store.sync_wal
    engine._store.sync_wal = lambda: (syncs.append(1), real_sync())[1]
    with engine.group():
        engine.send("q", [b"a"])
        engine.send("q", [b"b"])
        got = engine.receive("q", max=3)  # a read inside a group sees the earlier sends
        assert syncs == []
    engine.sync_wal()
    assert [d.body for d in got] == [b"a", b"b"]
    assert len(syncs) == 1
    engine.send("q", [b"c"])  # outside a group, fsync=True syncs every operation
    assert len(syncs) == 2


def test_internal_error_rebuilds_state_and_loses_nothing_committed(engine, monkeypatch):
    engine.create_queue("q")
    engine.send("q", [b"kept"])

    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine._counters, "received", explode)  # after the lease is made
    with pytest.raises(InternalError, match="boom"):
        engine.receive("q")
    monkeypatch.undo()
    assert [d.body for d in engine.receive("q")] == [b"kept"]


def test_an_internal_error_is_logged_with_its_event_name(engine, monkeypatch, caplog):
    engine.create_queue("q")
    engine.send("q", [b"m"])

    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine._counters, "received", explode)
    with caplog.at_level("ERROR", logger="lamina.engine"), pytest.raises(InternalError):
        engine.receive("q")
    assert [getattr(record, "event", None) for record in caplog.records] == ["internal_error"]


def test_failed_write_makes_the_operation_unavailable_and_changes_nothing(engine, monkeypatch):
    engine.create_queue("q")

    def failing_flush():
        raise OSError("disk gone")

    monkeypatch.setattr(engine._store, "flush", failing_flush)
    with pytest.raises(Unavailable):
        engine.send("q", [b"lost"])
    monkeypatch.undo()
    assert engine.receive("q") == []
    assert engine.get_queue("q").stats["messages"] == 0


def test_closed_engine_is_unavailable(tmp_path):
    engine = Engine.open(tmp_path / "d")
    engine.close()
    engine.close()
    with pytest.raises(Unavailable):
        engine.list_queues()


def test_invalid_argument_from_the_wire_keeps_its_field():
    from lamina.engine.errors import error_from_wire
    error = error_from_wire({"code": "InvalidArgument", "message": "max: must be an integer"})
    assert error.field == "max"


def test_cheap_views_of_queues(engine, clock):
    engine.create_queue("a", {"polling_wait": 5})
    engine.send("a", [b"x", b"y"])
    assert engine.queue_count == 1
    assert engine.queue_attributes("A")["polling_wait"] == 5
    assert engine.queue_depths() == {"a": 2}
