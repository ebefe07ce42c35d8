"""``python -m lamina.bench.sharedtag``: several consumers of one tag, timed and counted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lamina.bench import sharedtag

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sharedtag_times_receives_and_deletes_for_both_trees(capsys):
    sharedtag.main(["--against", str(REPO), "--rounds", "2", "--calls", "8"])
    out = capsys.readouterr().out
    assert "(against, this tree)" in out
    for figure in ("receive", "delete"):
        line = next(line for line in out.splitlines() if line.split()[:1] == [figure])
        values = [float(v) for v in re.findall(r"\d+\.\d+", line)]
        assert len(values) == 2 and all(v > 0 for v in values), line


def test_sharedtag_counts_each_operations_bytecodes(capsys):
    sharedtag.main(["--count", "--calls", "4"])
    counts = json.loads(capsys.readouterr().out)["this tree"]
    assert counts["receive"] > 0 and counts["delete"] > 0
