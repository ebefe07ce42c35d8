"""``python -m lamina.bench.floor``: the stack's least work for W1's request and W2's pair."""

from __future__ import annotations

import json

import pytest

from lamina.bench import floor


def test_floor_reports_both_workloads_a_request_and_a_message(capsys):
    floor.main(["--rounds", "2", "--requests", "50", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {"w1_send16", "w2_receive16_delete16"}
    for figure in figures.values():
        assert 0 < figure["best_us"] <= figure["median_us"]
        assert figure["best_us_a_message"] == pytest.approx(figure["best_us"] / 16, abs=0.01)


def test_floor_refuses_rounds_below_one(capsys):
    with pytest.raises(SystemExit):
        floor.main(["--rounds", "0"])
    assert "--rounds and --requests must be at least 1" in capsys.readouterr().err
