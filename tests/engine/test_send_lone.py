"""A send of one plain message that the queue has room for and that fits in the open segment
takes ``Appender._append_lone``: the rows it stores, the results and the answer it gets are
byte for byte those of ``append``'s message-by-message loop, whatever the queue, its tags and
its segments hold; any other lone send goes through the loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cbor2
import pytest

from lamina.engine import Engine, FakeClock, LaminaError, Sent, appending
from lamina.engine.results import SentColumns
from lamina.wire.splicing import encode_send_response
from tests.engine.test_send_runs import _rows

BODY = b"b" * 256
# Lone sends of every kind: plain ones of every body-head length, and ones the loop takes.
LONE = [b"a", b"b" * 23, b"c" * 24, BODY, b"e" * 65_536, "text", b"", {1: b"red", 2: {"a": 1}},
        {1: b"urgent", 4: 1}, {1: b"later", 5: 2}, {1: b"topical", 3: "t"}, 7]


def _send_all(path: Path) -> tuple[list[Any], list[bytes]]:
    """Lone sends around segment ends, tags, a full queue and a delayed one -> (the results
    as types and fields, their answer frames)."""
    clock = FakeClock()
    results: list[Any] = []
    answers: list[bytes] = []

    def send(queue: str, message: Any) -> None:
        sent = engine.send_columns(queue, [message])  # as a server sends
        answers.append(encode_send_response(len(answers) + 1, sent))
        results.append([(type(entry).__name__, str(entry)) if isinstance(entry, LaminaError)
                        else (entry.id, entry.enqueue_time, entry.md5) for entry in sent])
        sent_again = engine.send(queue, [message])  # as the embedded API answers
        assert type(sent_again) is list
        results.append([(type(entry).__name__, str(entry)) if isinstance(entry, LaminaError)
                        else (type(entry).__name__, entry.id, entry.enqueue_time, entry.md5)
                        for entry in sent_again])

    with Engine.open(path, clock=clock, segment_max_messages=5, segment_max_bytes=70_000,
                     segment_max_age_ms=50) as engine:
        engine.create_queue("q")
        send("q", BODY)  # the queue's first message: its first segment, lane, time row
        engine.create_tag("q", "red", filter={"attributes": {"a": 1}})
        engine.create_tag("q", "later", start=clock() + 5)
        for message in LONE:  # segments fill by count and by bytes
            send("q", message)
        clock.advance(1)
        engine.receive("q", max=100)  # the default tag's cursor past the tail
        engine.receive("q", "red", max=100)
        send("q", BODY)
        clock.advance(10)
        send("q", BODY)  # "later" starts
        for _ in range(3):
            send("q", BODY)
        clock.advance(60)  # the open segment's age ran out
        send("q", BODY)
        send("q", BODY)
        engine.create_queue("small", {"max_messages": 3})
        for _ in range(3):
            send("small", BODY)  # the last one is refused: the queue is full
        engine.create_queue("delayed", {"delay": 1})
        send("delayed", BODY)
        engine.create_queue("tiny", {"max_message_size": 1024})
        send("tiny", b"1" * 1024)
        send("tiny", b"1" * 1025)  # refused: too large
    return results, answers


def test_a_lone_plain_message_stores_and_answers_what_append_s_loop_would(
        tmp_path, monkeypatch):
    lone = _send_all(tmp_path / "lone")
    monkeypatch.setattr(appending.Appender, "_append_lone", lambda *args: None)
    looped = _send_all(tmp_path / "looped")
    assert lone == looped
    assert _rows(tmp_path / "lone") == _rows(tmp_path / "looped")


def test_only_a_lone_plain_message_with_room_is_sent_as_columns(tmp_path):
    with Engine.open(tmp_path / "data", clock=FakeClock()) as engine:
        engine.create_queue("q")
        engine.create_queue("small", {"max_messages": 2})
        assert type(engine.send_columns("q", [BODY])) is list  # the queue's first segment
        assert type(engine.send_columns("q", [BODY])) is SentColumns
        assert type(engine.send_columns("q", ["text"])) is list
        assert type(engine.send_columns("q", [{1: BODY}])) is list
        engine.send("small", [BODY])
        assert type(engine.send_columns("small", [BODY])) is SentColumns
        (refused,) = engine.send_columns("small", [BODY])
        assert isinstance(refused, LaminaError)


@pytest.mark.parametrize("request_id", [1, 23, 24, 300, 2**40])
def test_a_lone_message_s_answer_is_byte_identical_to_cbor2(tmp_path, request_id):
    with Engine.open(tmp_path / "data", clock=FakeClock()) as engine:
        engine.create_queue("q")
        engine.send("q", [BODY])
        columns = engine.send_columns("q", [BODY])
    (entry,) = list(columns)
    assert type(entry) is Sent
    expected = cbor2.dumps([request_id, None, {"results": [
        [entry.id, entry.enqueue_time, entry.md5]]}])
    assert encode_send_response(request_id, columns) == len(expected).to_bytes(4, "big") + expected
