"""Redrive as long work in chunks (DESIGN.md §3): each chunk is one operation, other
operations run between chunks, and the result is the same as in one pass."""

from __future__ import annotations

from typing import Any

import pytest

from lamina.engine import Engine, FakeClock, Redriven


def dead_letters(engine: Engine, count: int, *, sources: tuple[str, ...] = ("src",)) -> None:
    """``count`` dead letters per source, in two lanes (priorities 1 and 8) of the DLQ."""
    engine.create_queue("dlq")
    for name in sources:
        engine.create_queue(name, {"redrive": {"dlq": "dlq", "max_receives": 1}})
        engine.send(name, [{1: b"%s-%d" % (name.encode(), n), 4: 1 if n % 3 else 8}
                           for n in range(count)])
        while delivered := engine.receive(name, max=100):
            engine.dead(name, [d.receipt for d in delivered])


def run_in_chunks(engine: Engine, chunk: int, between: Any = None, **args: Any) -> Redriven:
    steps = engine.redrive_steps("dlq", chunk=chunk, **args)
    chunks = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            assert chunk > 1 or done.value.moved + done.value.skipped <= chunks + 1
            return done.value
        chunks += 1
        if between is not None:
            between(chunks)


@pytest.mark.parametrize("args", [
    {}, {"max": 7}, {"dry_run": True}, {"dry_run": True, "max": 1}, {"source": "b"},
    {"max": 5, "source": "a"},
])
def test_chunks_give_the_result_of_one_pass(tmp_path: Any, args: dict[str, Any]) -> None:
    results, states = [], []
    for chunk in (1, 3, 1000):
        engine = Engine.open(tmp_path / f"chunk{chunk}", clock=FakeClock(1_700_000_000_000))
        dead_letters(engine, 12, sources=("a", "b"))
        results.append(run_in_chunks(engine, chunk, **args))
        states.append({name: sorted(d.body for d in engine.receive(name, max=100))
                       for name in ("a", "b", "dlq")})
        engine.close()
    assert results[0] == results[1] == results[2]
    assert states[0] == states[1] == states[2]
    if not args.get("dry_run"):
        expected = min(args.get("max", 1000), 12 if "source" in args else 24)
        assert results[0].moved == expected


def test_a_dry_run_of_one_looks_at_one_chunk_only(engine: Engine) -> None:
    dead_letters(engine, 50)
    steps = engine.redrive_steps("dlq", max=1, dry_run=True, chunk=4)
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value == Redriven(1, 0)


def test_other_operations_run_between_chunks(engine: Engine) -> None:
    dead_letters(engine, 20)
    copies = [p.message.id for p in engine.peek("dlq", start=0, max=100).messages]

    def between(chunk: int) -> None:
        if chunk == 1:  # a copy further on is deleted, a new dead letter arrives
            engine.delete_by_id("dlq", [copies[-1]])
            engine.create_queue("late", {"redrive": {"dlq": "dlq", "max_receives": 1}})
            engine.send("late", [b"late"])
            engine.dead("late", [d.receipt for d in engine.receive("late")])
        engine.send("other-work", [b"x"]) if engine.list_queues(prefix="other").queues \
            else engine.create_queue("other-work")

    result = run_in_chunks(engine, 5, between)
    assert result == Redriven(19, 0)  # not the deleted copy, not the later dead letter
    left = [p.message.body for p in engine.peek("dlq", max=10).messages]
    assert left == [b"late"]


def test_a_dlq_deleted_between_chunks_ends_the_redrive_with_what_was_done(
        engine: Engine) -> None:
    dead_letters(engine, 10)
    engine.set_queue_attributes("src", {"redrive": None})
    steps = engine.redrive_steps("dlq", chunk=4)
    next(steps)
    engine.delete_queue("dlq")
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value.moved == 4
