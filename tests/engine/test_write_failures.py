"""Failed writes (a full disk, no file descriptors): the request is Unavailable and changes
nothing, only what the failed batch named is rebuilt, and once the store can be reopened writes
succeed again without a restart, nothing acknowledged lost."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import lamina.engine.recovery as recovery
from lamina.engine import Engine, Unavailable
from lamina.engine.store import Store

DISK_FULL = "IO error: No space left on device: While appending to file: 000004.log"


class FailingDB:
    """A database whose writes fail like RocksDB's after a failed WAL append: every write on
    this instance, until it is closed and opened again."""

    def __init__(self, db: Any):
        self._db = db

    def write(self, *args: Any) -> None:
        raise Exception(DISK_FULL)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def break_store(engine: Engine) -> None:
    engine._store.db = FailingDB(engine._store.db)


@pytest.fixture(autouse=True)
def reopen_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)


def observe(engine: Engine) -> dict[str, Any]:
    """What clients can see of every queue: attributes, stats, each tag's messages."""
    seen: dict[str, Any] = {}
    for name in engine.list_queues().queues:
        info = engine.get_queue(name)
        tags = {t.tag: (t.start, t.filter) for t in engine.list_tags(name)}
        pages = {tag: [(p.message.id, p.state, p.dequeue_count, p.next_visible_time)
                       for p in engine.peek(name, tag, start=0, max=1000).messages]
                 for tag in tags}
        seen[name] = (info.attributes, info.stats, tags, pages)
    seen["grants"] = engine.list_grants()
    return seen


def test_a_failed_write_is_unavailable_and_changes_nothing(engine: Engine) -> None:
    engine.create_queue("q")
    engine.send("q", [b"kept"])
    before = observe(engine)
    break_store(engine)
    with pytest.raises(Unavailable, match="No space left on device"):
        engine.send("q", [b"refused"])
    assert observe(engine) == before
    assert engine.storage_failures == {"write": 1, "read": 0}


def test_metrics_count_the_operations_the_store_failed(engine: Engine) -> None:
    from prometheus_client import generate_latest

    from lamina.server.metrics import ServerMetrics
    metrics = ServerMetrics()
    engine.create_queue("q")
    metrics.refresh_queues(engine)
    scraped = generate_latest(metrics.registry).decode()
    assert 'lamina_storage_failures_total{kind="write"} 0.0' in scraped
    for _ in range(2):
        break_store(engine)
        with pytest.raises(Unavailable):
            engine.send("q", [b"refused"])
        engine.send("q", [b"kept"])  # the store reopened: writes succeed again
    metrics.refresh_queues(engine)
    scraped = generate_latest(metrics.registry).decode()
    assert 'lamina_storage_failures_total{kind="write"} 2.0' in scraped
    assert 'lamina_storage_failures_total{kind="read"} 0.0' in scraped


def test_a_failed_write_rebuilds_only_the_queues_it_named(engine: Engine,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    engine.create_queue("q")
    engine.create_queue("other")
    engine.send("other", [b"x"])
    other_state = engine._queues[engine._queue_names["other"]]
    queue_state = engine._queues[engine._queue_names["q"]]
    monkeypatch.setattr(engine, "_room_to_reopen", lambda: False)  # disk still full
    break_store(engine)

    def whole_reload() -> None:
        raise AssertionError("the whole engine state was reloaded")

    monkeypatch.setattr(engine, "_load", whole_reload)
    for _ in range(3):
        with pytest.raises(Unavailable):
            engine.send("q", [b"refused"])
    assert engine._queues[engine._queue_names["other"]] is other_state  # untouched
    assert engine._queues[engine._queue_names["q"]] is not queue_state  # rebuilt
    assert [p.message.body for p in engine.peek("other", start=0).messages] == [b"x"]
    assert engine.get_queue("q").stats["messages"] == 0  # reads are answered meanwhile


def test_writes_succeed_again_once_the_store_can_be_reopened(engine: Engine,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    engine.create_queue("q")
    acknowledged = [b"m0"]
    engine.send("q", acknowledged)
    room = [False]
    monkeypatch.setattr(engine, "_room_to_reopen", lambda: room[0])
    break_store(engine)
    for n in range(3):
        with pytest.raises(Unavailable):
            engine.send("q", [b"refused%d" % n])
    with pytest.raises(Unavailable):
        engine.purge_queue("q")
    room[0] = True  # space is back: the next operation reopens the store
    engine.send("q", [b"m1"])
    acknowledged.append(b"m1")
    assert [d.body for d in engine.receive("q", max=10)] == acknowledged
    assert engine.purge_queue("q") == 2


def test_a_reopen_that_fails_leaves_every_operation_unavailable_until_one_succeeds(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine.create_queue("q")
    engine.send("q", [b"kept"])
    break_store(engine)
    with pytest.raises(Unavailable):
        engine.send("q", [b"refused"])

    def no_descriptors(path: Any, **options: Any) -> Store:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(recovery, "Store", no_descriptors)
    with pytest.raises(Unavailable, match="Too many open files"):
        engine.get_queue("q")
    with pytest.raises(Unavailable):
        engine.sync_wal()
    monkeypatch.undo()
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)
    assert [d.body for d in engine.receive("q")] == [b"kept"]
    engine.send("q", [b"after"])
    assert engine.get_queue("q").stats["messages"] == 2


def test_closing_an_engine_whose_store_failed_does_not_raise(engine: Engine,
                                                              open_engine: Any) -> None:
    engine.create_queue("q")
    engine.send("q", [b"kept"])
    break_store(engine)
    with pytest.raises(Unavailable):
        engine.send("q", [b"refused"])
    engine._counters.dirty.add((1, 0, 0))  # something pending at close
    engine.close()
    reopened = open_engine()
    assert [d.body for d in reopened.receive("q")] == [b"kept"]


def _operations(engine: Engine, clock: Any) -> list[tuple[str, Callable[[], Any]]]:
    """One of each kind of write, on a state with a DLQ, topics, delays, tags and leases."""
    receipts: list[bytes] = []

    def receive(queue: str, tag: str | None = None) -> None:
        receipts.extend(d.receipt for d in engine.receive(queue, tag, max=2,
                                                          visibility_timeout=5))

    def dead() -> None:
        delivered = engine.receive("src", max=1)
        engine.dead("src", [d.receipt for d in delivered])

    return [
        ("create_queue", lambda: engine.create_queue("fresh")),
        ("send plain", lambda: engine.send("src", [b"p1", b"p2"])),
        ("send topic", lambda: engine.send("src", [{1: b"t", 3: "topic"}, {1: b"t2", 3: "topic"}])),
        ("send delayed", lambda: engine.send("src", [{1: b"d", 5: 30}, {1: b"h", 4: 2}])),
        ("create_tag", lambda: engine.create_tag("src", "audit", start="oldest")),
        ("receive", lambda: receive("src")),
        ("receive audit", lambda: receive("src", "audit")),
        ("delete", lambda: engine.delete("src", receipts[:1])),
        ("change_visibility", lambda: engine.change_visibility("src", [(receipts[1], 0)])),
        ("dead", dead),
        ("redrive", lambda: engine.redrive("dlq", max=1)),
        ("delete_by_id", lambda: engine.delete_by_id(
            "src", [engine.peek("src", start=0).messages[0].message.id])),
        ("grant", lambda: engine.grant("src", "k", ["send"])),
        ("set_queue_attributes", lambda: engine.set_queue_attributes("src", {"delay": 1})),
        ("copy_queue", lambda: engine.copy_queue("copy", "src")),
        ("delete_tag", lambda: engine.delete_tag("src", "audit")),
        ("purge_queue", lambda: engine.purge_queue("dlq")),
        ("delete_queue", lambda: engine.delete_queue("fresh")),
    ]


def test_each_kind_of_failed_write_leaves_what_clients_see_unchanged(
        engine: Engine, clock: Any) -> None:
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    for name, operation in _operations(engine, clock):
        before = observe(engine)
        break_store(engine)
        with pytest.raises(Unavailable):
            operation()
        assert observe(engine) == before, name  # the first read also reopens the store
        operation()  # and succeeds now


def test_a_failed_dead_letter_move_at_a_lease_end_is_made_again_from_the_store(
        engine: Engine, clock: Any, open_engine: Any) -> None:
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    engine.create_queue("bystander")
    engine.send("src", [b"a", b"b"])
    engine.receive("src", max=2, visibility_timeout=5)
    clock.advance(6_000)  # both leases ran out: the next operation moves them to the DLQ
    break_store(engine)
    with pytest.raises(Unavailable):
        engine.get_queue("bystander")
    seen = observe(engine)
    assert [entry[1] for entry in seen["src"][3]["default"]] == ["dead", "dead"]
    assert len(seen["dlq"][3]["default"]) == 2
    engine.close()
    assert observe(open_engine()) == seen
