"""The op table without a connection (dispatch.py): argument names checked before the engine
is called, ``wait`` checked apart, and an engine failure answered as an error value (a bug as
``InternalError``, bugs.py) instead of raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lamina.engine.errors import (
    InternalError,
    InvalidArgument,
    QueueNotFound,
    UnknownOperation,
)
from lamina.server.dispatch import (
    MAX_WAIT_S,
    Continuation,
    MapAnswer,
    ReceiveAnswer,
    apply_operation,
    check_request,
    continue_operation,
    receive_budget,
    receive_call,
    wait_seconds,
)


class FakeEngine:
    """Records calls; ``purge_queue`` fails as the engine would, ``delete_queue`` as a bug."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def purge_queue(self, **kwargs: Any) -> int:
        raise QueueNotFound("queue: 'q' does not exist", field="queue")

    def delete_queue(self, **kwargs: Any) -> None:
        raise ZeroDivisionError("a bug")

    def receive_columns(self, **kwargs: Any) -> list[Any]:
        self.calls.append(("receive", kwargs))
        return []

    def list_queues(self, **kwargs: Any) -> Any:
        self.calls.append(("list_queues", kwargs))

        class Page:
            queues = ["a"]
            next = None
        return Page()


def fake() -> Any:
    return FakeEngine()


def test_an_unknown_op_is_refused_by_name() -> None:
    with pytest.raises(UnknownOperation, match="'nope'"):
        check_request("nope", {})


def test_an_unknown_argument_is_named_and_a_missing_one_is_required() -> None:
    with pytest.raises(InvalidArgument) as unknown:
        check_request("purge_queue", {"queue": "q", "colour": 1})
    assert unknown.value.field == "colour"
    with pytest.raises(InvalidArgument) as missing:
        check_request("purge_queue", {})
    assert missing.value.field == "queue"


def test_wait_is_taken_out_of_the_arguments_and_checked() -> None:
    args: dict[str, Any] = {"queue": "q", "wait": 1.23456}
    assert wait_seconds(args) == 1.234 and args == {"queue": "q"}
    assert wait_seconds({"queue": "q"}) is None
    assert [wait_seconds({"wait": whole}) for whole in (0, 7, MAX_WAIT_S)] == [0, 7, MAX_WAIT_S]
    for bad in (-1, MAX_WAIT_S + 1, float("nan"), "5", True):
        with pytest.raises(InvalidArgument) as refused:
            wait_seconds({"wait": bad})
        assert refused.value.field == "wait"


def test_a_receive_asks_the_engine_for_what_fits_the_frame() -> None:
    engine: Any = FakeEngine()
    answer = receive_call(engine, {"queue": "q", "max": 2}, "key", 5, 4096)
    assert answer == ReceiveAnswer([])
    (name, kwargs), = engine.calls
    assert kwargs["caller"] == "key" and kwargs["max_bytes"] == receive_budget(5, 2, 4096)
    assert 0 < kwargs["max_bytes"] < 4096
    assert receive_budget(5, 0, 4096) is None  # the engine refuses such a count itself


def test_an_op_runs_as_the_engine_method_of_its_name() -> None:
    engine: Any = FakeEngine()
    operation = check_request("list_queues", {"prefix": "a"})
    answer = apply_operation(operation, engine, {"prefix": "a"}, None, 1, 4096)
    assert answer == MapAnswer({"queues": ["a"], "next": None})
    assert engine.calls == [("list_queues", {"prefix": "a", "caller": None})]


def test_an_engine_error_is_the_answer_not_an_exception() -> None:
    operation = check_request("purge_queue", {"queue": "q"})
    answer = apply_operation(operation, fake(), {"queue": "q"}, None, 1, 4096)
    assert isinstance(answer, QueueNotFound) and answer.__traceback__ is None


def test_a_bug_is_answered_internal_error_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    operation = check_request("delete_queue", {"queue": "q"})
    with caplog.at_level(logging.ERROR, logger="lamina.server"):
        answer = apply_operation(operation, fake(), {"queue": "q"}, None, 1, 4096)
    assert isinstance(answer, InternalError)
    assert answer.message == "delete_queue failed: ZeroDivisionError: a bug"
    assert any(record.exc_info for record in caplog.records)


def test_long_work_fails_like_an_op() -> None:
    def step(engine: Any) -> Any:
        raise KeyError("x")
    answer = continue_operation("redrive", Continuation(step), fake())
    assert isinstance(answer, InternalError) and "redrive failed: KeyError" in answer.message
