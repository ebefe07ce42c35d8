"""Queue extras and deduplicated sends (engine/extras.py): kept across restarts, gone with
their queue, duplicates answered with the first acceptance within the window only, and the
window's rows dropped once they expire."""

from __future__ import annotations

from typing import Any

import pytest

from lamina.engine import Engine, FakeClock
from lamina.engine.errors import AccessDenied, InvalidArgument, QueueNotFound
from lamina.engine.extras import DEDUP_WINDOW_MS
from lamina.engine.results import Sent
from lamina.engine.store import Store


def _dedup_rows(engine: Engine) -> int:
    return sum(1 for _ in Store.keys(engine._store.meta, b"F", b"G"))


def test_extras_are_kept_across_restarts_and_go_with_their_queue(open_engine: Any) -> None:
    engine = open_engine()
    engine.create_queue("q")
    assert engine.queue_extras("q") == {}
    engine.set_queue_extras("q", {"FifoQueue": True, "tags": {"team": "a"}, "n": 3})
    engine.close()
    engine = open_engine()
    assert engine.queue_extras("q") == {"FifoQueue": True, "tags": {"team": "a"}, "n": 3}
    engine.delete_queue("q")
    engine.create_queue("q")  # a new queue of the same name starts without extras
    assert engine.queue_extras("q") == {}
    engine.close()
    engine = open_engine()
    assert engine.queue_extras("q") == {}
    assert not list(Store.keys(engine._store.meta, b"X", b"Y"))


def test_extras_are_checked(engine: Engine) -> None:
    engine.create_queue("q")
    with pytest.raises(InvalidArgument, match="extras"):
        engine.set_queue_extras("q", {"bad": [1, 2]})
    with pytest.raises(InvalidArgument, match="bytes"):
        engine.set_queue_extras("q", {"big": "x" * 140_000})
    with pytest.raises(QueueNotFound):
        engine.set_queue_extras("nope", {})
    engine.grant("q", "reader", ["peek"])
    assert engine.queue_extras("q", caller="reader") == {}
    with pytest.raises(AccessDenied):
        engine.set_queue_extras("q", {"a": "b"}, caller="reader")


def test_a_duplicate_within_the_window_is_not_sent_again(engine: Engine,
                                                         clock: FakeClock) -> None:
    engine.create_queue("q")
    first = engine.send_deduplicated("q", [b"a", b"b", b"a-again"], [b"k1", b"k2", b"k1"])
    assert all(isinstance(r, Sent) for r in first)
    assert first[2].id == first[0].id and first[1].id != first[0].id
    clock.advance(DEDUP_WINDOW_MS - 1)
    again = engine.send_deduplicated("q", [b"b"], [b"k2"])
    assert again[0].id == first[1].id
    assert [d.message.body for d in engine.receive("q", max=10)] == [b"a", b"b"]
    clock.advance(1)
    later = engine.send_deduplicated("q", [b"b"], [b"k2"])
    assert later[0].id not in (first[0].id, first[1].id)


def test_the_window_survives_a_restart_and_expired_keys_leave(open_engine: Any,
                                                              clock: FakeClock) -> None:
    engine = open_engine()
    engine.create_queue("q")
    sent = engine.send_deduplicated("q", [b"a"], [b"key"])[0]
    engine.close()
    engine = open_engine()
    assert engine.send_deduplicated("q", [b"a"], [b"key"])[0].id == sent.id
    assert _dedup_rows(engine) == 1
    clock.advance(DEDUP_WINDOW_MS)
    engine.send_deduplicated("q", [b"c"], [b"other"])  # drops the expired key
    assert _dedup_rows(engine) == 1
    clock.advance(DEDUP_WINDOW_MS)
    engine.close()
    engine = open_engine()  # the open drops what expired meanwhile
    assert _dedup_rows(engine) == 0


def test_keys_of_a_deleted_queue_are_dropped_on_open(open_engine: Any) -> None:
    engine = open_engine()
    engine.create_queue("q")
    engine.send_deduplicated("q", [b"a"], [b"key"])
    engine.delete_queue("q")
    engine.create_queue("q")
    assert engine.send_deduplicated("q", [b"a"], [b"key"])[0].id.startswith("00000002")
    engine.close()
    engine = open_engine()
    assert _dedup_rows(engine) == 1


def test_refused_entries_record_no_key(engine: Engine) -> None:
    engine.create_queue("q", {"max_message_size": 1024})
    refused = engine.send_deduplicated("q", [b"x" * 2000], [b"k"])
    assert not isinstance(refused[0], Sent)
    assert isinstance(engine.send_deduplicated("q", [b"small"], [b"k"])[0], Sent)
    with pytest.raises(InvalidArgument, match="dedup_keys"):
        engine.send_deduplicated("q", [b"a", b"b"], [b"k"])
    with pytest.raises(InvalidArgument, match=r"dedup_keys\[0\]"):
        engine.send_deduplicated("q", [b"a"], [b""])


def test_a_closed_engine_answers_unavailable(engine: Engine) -> None:
    from lamina.engine.errors import Unavailable
    engine.create_queue("q")
    engine.close()
    for call in (lambda: engine.queue_extras("q"), lambda: engine.check_queue_access("q"),
                 lambda: engine.set_queue_extras("q", {}),
                 lambda: engine.send_deduplicated("q", [b"a"], [b"k"])):
        with pytest.raises(Unavailable):
            call()


def test_check_queue_access_needs_any_permission(engine: Engine) -> None:
    engine.create_queue("q")
    assert engine.check_queue_access("Q") == "q"
    engine.grant("q", "sender", ["send"])
    assert engine.check_queue_access("q", caller="sender") == "q"
    with pytest.raises(AccessDenied):
        engine.check_queue_access("q", caller="stranger")
    with pytest.raises(QueueNotFound):
        engine.check_queue_access("nope")


def test_queue_summary_is_get_queue_without_stats(engine: Engine) -> None:
    engine.create_queue("q", {"delay": 3})
    summary = engine.queue_summary("q")
    full = engine.get_queue("q")
    assert (summary.queue, summary.attributes, summary.created, summary.stats) == \
        (full.queue, full.attributes, full.created, None)
    with pytest.raises(AccessDenied):
        engine.queue_summary("q", caller="stranger")
