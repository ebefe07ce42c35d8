"""``python -m lamina.bench.stagecost``: stage costs in process, alternated with another tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lamina.bench import stagecost

REPO = Path(__file__).resolve().parents[2]
FIGURES = ["ping.decode", "send1.apply", "send16.encode", "receive16.apply", "delete16.apply",
           "engine.send1", "engine.receive_delete_per_msg"]


@pytest.mark.slow
def test_stagecost_reports_every_stage_for_both_trees(capsys):
    stagecost.main(["--against", str(REPO), "--rounds", "1", "--calls", "3",
                    "--prefill", "1000"])
    out = capsys.readouterr().out
    assert "(against, this tree)" in out
    for figure in FIGURES:
        line = next(line for line in out.splitlines() if line.startswith(figure + " "))
        values = [float(v) for v in re.findall(r"\d+\.\d+", line)]
        assert len(values) == 2 and all(v > 0 for v in values), line

