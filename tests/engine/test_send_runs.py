"""A send whose messages are all plain is written as one run (``Appender._append_plain``): the
rows it stores and the answer it gets (spliced from its ``SentColumns``) are byte for byte those
of the message-by-message path, whatever the batch holds, wherever segments end, whichever tags
read the queue; ``Engine.send`` still returns a list of ``Sent``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cbor2
import pytest

from lamina.engine import Engine, FakeClock, LaminaError, Sent, appending
from lamina.engine.results import SentColumns
from lamina.engine.store import COLUMN_FAMILIES
from lamina.wire.splicing import encode_send_response
from tests.engine.test_lease_deadlines import raw_store

RUN_FROM = appending.PLAIN_RUN_FROM
UNIFORM = [(b"%04d" % index).ljust(256, b"x") for index in range(16)]
# Bodies whose CBOR heads differ in length (1, 2, 3 and 5 bytes), not of one size.
VARIED = [b"a", b"b" * 23, b"c" * 24, b"d" * 255, b"e" * 256, b"f" * 65_536, b"g" * 7, b"h" * 300]
MIXED = [b"plain", {1: b"red", 2: {"a": 1}}, "text", {1: b"urgent", 4: 1}, b"p" * 30,
         {1: b"later", 5: 2}, b"", b"after the refused one", {1: b"topical", 3: "t"}, b"end"]


def _send_all(path: Path) -> tuple[list[Any], list[bytes]]:
    """Sends of every kind -> (the results, as types and fields; their answer frames)."""
    clock = FakeClock()
    results: list[Any] = []
    answers: list[bytes] = []

    def send(queue: str, messages: list[Any]) -> None:
        sent = engine.send_columns(queue, messages)  # as a server sends
        answers.append(encode_send_response(len(answers) + 1, sent))
        results.append([(type(entry).__name__, str(entry)) if isinstance(entry, LaminaError)
                        else (entry.id, entry.enqueue_time, entry.md5) for entry in sent])
        sent_again = engine.send(queue, messages)  # as the embedded API answers
        assert type(sent_again) is list
        results.append([(type(entry).__name__, str(entry)) if isinstance(entry, LaminaError)
                        else (type(entry).__name__, entry.id, entry.enqueue_time, entry.md5)
                        for entry in sent_again])

    with Engine.open(path, clock=clock, segment_max_messages=20, segment_max_bytes=70_000
                     ) as engine:
        engine.create_queue("q")
        engine.create_tag("q", "red", filter={"attributes": {"a": 1}})
        engine.create_tag("q", "later", start=clock() + 5)
        send("q", UNIFORM)
        send("q", UNIFORM)  # fills the open segment: the next starts within the batch
        send("q", VARIED)   # 64 KiB + 1 byte: past segment_max_bytes within the batch
        clock.advance(1)
        send("q", MIXED)
        send("q", UNIFORM[:RUN_FROM])
        send("q", UNIFORM[:RUN_FROM - 1])
        clock.advance(10)
        send("q", UNIFORM)
        engine.receive("q", "red", max=10)
        engine.receive("q", max=10)
        send("q", UNIFORM)
        engine.create_queue("small", {"max_messages": 20})
        send("small", UNIFORM)
        send("small", UNIFORM)  # 4 accepted, 12 refused: the queue is full
        engine.create_queue("delayed", {"delay": 1})
        send("delayed", UNIFORM)
    return results, answers


def _rows(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    with raw_store(path) as db:
        rows = {}
        for name in COLUMN_FAMILIES:
            family = db.get_column_family(name)
            rows[name] = list(family.items())
            del family  # a family keeps the database open
        return rows


def test_a_run_of_plain_messages_stores_and_answers_what_each_message_alone_would(
        tmp_path, monkeypatch):
    runs = _send_all(tmp_path / "runs")
    monkeypatch.setattr(appending, "PLAIN_RUN_FROM", 10**9)  # message by message
    singles = _send_all(tmp_path / "singles")
    assert runs == singles
    assert _rows(tmp_path / "runs") == _rows(tmp_path / "singles")


def test_only_a_send_of_enough_plain_messages_within_the_queue_s_room_is_a_run(tmp_path):
    with Engine.open(tmp_path / "data", clock=FakeClock()) as engine:
        engine.create_queue("q")
        engine.create_queue("small", {"max_messages": 20})
        assert type(engine.send_columns("q", UNIFORM)) is SentColumns
        assert type(engine.send_columns("q", UNIFORM[:RUN_FROM])) is SentColumns
        assert type(engine.send_columns("q", UNIFORM[:RUN_FROM - 1])) is list
        assert type(engine.send_columns("q", MIXED)) is list
        assert type(engine.send_columns("small", UNIFORM)) is SentColumns
        assert type(engine.send_columns("small", UNIFORM)) is list  # 4 of 16 fit


def test_a_run_s_columns_give_each_entry_s_sent(tmp_path):
    clock = FakeClock()
    with Engine.open(tmp_path / "data", clock=clock) as engine:
        engine.create_queue("q")
        columns = engine.send_columns("q", UNIFORM)
        listed = engine.send("q", UNIFORM)
    assert type(columns) is SentColumns and len(columns) == len(UNIFORM)
    sent = list(columns)
    assert all(type(entry) is Sent for entry in sent + listed)
    assert columns.ids == [entry.id.encode() for entry in sent]
    assert columns.digests == [entry.md5 for entry in sent] == [entry.md5 for entry in listed]
    assert {entry.enqueue_time for entry in sent + listed} == {columns.enqueue_time} == {clock()}
    assert [int(entry.id[8:24], 16) for entry in sent + listed] == list(range(2 * len(UNIFORM)))


@pytest.mark.parametrize("request_id", [1, 23, 24, 300, 2**40])
def test_a_run_s_answer_is_byte_identical_to_cbor2(tmp_path, request_id):
    with Engine.open(tmp_path / "data", clock=FakeClock()) as engine:
        engine.create_queue("q")
        columns = engine.send_columns("q", VARIED)
    expected = cbor2.dumps([request_id, None, {"results": [
        [entry.id, entry.enqueue_time, entry.md5] for entry in columns]}])
    assert encode_send_response(request_id, columns) == len(expected).to_bytes(4, "big") + expected
