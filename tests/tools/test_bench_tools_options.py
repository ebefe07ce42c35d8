"""The bench's developer tools (``python -m lamina.bench.X``) refuse counts below 1, naming
the option, instead of reporting nothing measured or failing with a traceback."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(("tool", "argv"), [
    ("echoreads", ["--rounds", "0"]), ("echoreads", ["--requests", "-1"]),
    ("echoreads", ["--connections", "0"]),
    ("stagecost", ["--rounds", "0"]), ("stagecost", ["--calls", "0"]),
    ("readpath", ["count", "--reads", "0"]), ("readpath", ["count", "--rounds", "0"])])
def test_counts_below_one_are_refused_naming_the_option(
        tool: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"lamina.bench.{tool}")
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 2
    option = next(a for a in argv if a.startswith("--"))
    assert option in capsys.readouterr().err
