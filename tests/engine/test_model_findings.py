"""Replays of the failing sequences that long random runs of the readers machine found
(docs/model-findings-2026-11-22.md): each finding's printout, step by step, against
``ReadersMachine``, with every invariant checked after each step. They failed on the engine
of their time; each must now run to its end.

Hypothesis prints a failing run as Python: ``state.rule(args)`` lines, each after the
``Draw N (label): value`` lines of what the rule drew from its ``data`` object. The replay
hands those values back in order. Two kinds of value cannot be taken as printed: receipts
carry a MAC under the run's own random key, so a drawn receipt is matched to one this replay
was issued by its unkeyed part (queue, tag, lane, seq, lease number); drawn model objects
(messages, tags) print as reprs, and are matched by seq or tag uid.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.engine import test_model_readers as readers
from lamina.engine.receipts import RECEIPT_BYTES

FINDINGS = Path(__file__).resolve().parents[2] / "docs" / "model-findings-2026-11-22.md"
_UNKEYED = RECEIPT_BYTES - 16  # a receipt's bytes before its MAC
_QUEUE_REPR = re.compile(r"<model\.ModelQueue object at 0x[0-9a-f]+>")
_DRAW = re.compile(r"Draw \d+(?: \((.*?)\))?: (.*)")


def _printed(*args: Any, **fields: Any) -> SimpleNamespace:
    return SimpleNamespace(args=args, **fields)


# What the printed values may name: model objects come back as plain namespaces.
_NAMES = {"Issued": readers.Issued, "ModelMessage": _printed, "TagMsg": _printed,
          "ModelTag": _printed, "nan": float("nan"), "inf": float("inf"), "QUEUE": "QUEUE"}


class _RecordedData:
    """Stands in for Hypothesis' ``data()``: returns the draws recorded for one step."""

    def __init__(self, machine: readers.ReadersMachine) -> None:
        self.machine = machine
        self.draws: list[tuple[str | None, Any]] = []

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        recorded_label, value = self.draws.pop(0)
        assert recorded_label in (label, None), (recorded_label, label)
        return self._ours(value)

    def _ours(self, value: Any) -> Any:
        machine = self.machine
        if isinstance(value, readers.Issued):
            return next(r for r in machine.receipts
                        if (r.queue, r.tag, r.seq, r.lease)
                        == (value.queue, value.tag, value.seq, value.lease))
        if isinstance(value, bytes) and len(value) == RECEIPT_BYTES:
            return next((raw for raw in machine.issued if raw[:_UNKEYED] == value[:_UNKEYED]),
                        value)
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "QUEUE":
            return next((q, t) for q in machine.model.queues.values()
                        for t in q.tags.values() if t.uid == value[1].uid)
        if isinstance(value, list):
            return [self._ours(item) for item in value]
        return value


def _steps(printout: str) -> list[tuple[str, list[tuple[str | None, str]]]]:
    """-> (step source, its draws as (label, value source)) in order. A value or a step may
    run over several lines."""
    steps: list[tuple[str, list[tuple[str | None, str]]]] = []
    draws: list[tuple[str | None, str]] = []
    open_item: list[Any] | None = None  # [text, ...]: what a continuation line extends
    for line in printout.splitlines():
        draw = _DRAW.match(line)
        if draw:
            open_item = [draw.group(2), draw.group(1)]
            draws.append(open_item)  # type: ignore[arg-type]
        elif line.startswith("state"):
            open_item = [line, draws]
            steps.append(open_item)  # type: ignore[arg-type]
            draws = []
        elif line.startswith(("AssertionError", "Failing")):
            open_item = None
        elif open_item is not None:
            open_item[0] += "\n" + line
    return [(source, [(label, value) for value, label in step_draws])
            for source, step_draws in steps]


def _sections() -> dict[str, str]:
    """Finding number -> its section of the doc."""
    found = {}
    for part in FINDINGS.read_text().split("\n## Finding ")[1:]:
        number, _, body = part.partition("\n")
        found[number.strip()] = body
    return found


def _printouts() -> dict[str, str]:
    return {number: body.split("```\n")[1].split("```")[0]
            for number, body in _sections().items()}


PRINTOUTS = _printouts()


def test_every_finding_is_here() -> None:
    assert sorted(PRINTOUTS, key=int) == [str(n) for n in range(1, 20)]


# Findings the doc marks open: their printouts must still fail (strict: a fix shows up).
OPEN = {number for number, body in _sections().items() if "**Open.**" in body}


@pytest.mark.parametrize("finding", [
    pytest.param(number, marks=pytest.mark.xfail(strict=True, reason="open finding"))
    if number in OPEN else number for number in sorted(PRINTOUTS, key=int)])
def test_a_recorded_finding_runs_to_its_end(finding: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "event", lambda *args, **kwargs: None)  # outside a test run
    machine = readers.ReadersMachine()
    data = _RecordedData(machine)
    names = {"state": machine, "data": lambda: data, "nan": float("nan"), "inf": float("inf")}
    invariants = [getattr(machine, name) for name in dir(type(machine))
                  if getattr(getattr(type(machine), name), "hypothesis_stateful_invariant",
                             None) is not None]
    try:
        for source, draws in _steps(PRINTOUTS[finding]):
            if source.startswith(("state = ", "state.teardown")):
                continue
            data.draws = [(label, eval(_QUEUE_REPR.sub("QUEUE", value), dict(_NAMES)))
                          for label, value in draws]
            exec(source.replace("data=data(...)", "data=data()"), names)
            assert not data.draws, f"{source}: draws left over"
            for check in invariants:
                check()
    finally:
        machine.teardown()
