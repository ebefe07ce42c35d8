"""``lamina bench --against PEER``: Lamina's figures beside a peer's, line by line, with the
ratio Lamina / peer and which of the two did better.

Both results of a workload come from the same scoring code (``workloads.score_w1`` ...), so
their figures share labels; the comparison takes every figure both have, then the latency
percentiles of every series both have (per operation; end-to-end per message for W3).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import IO, Any

from .workloads import WorkloadResult

__all__ = ["Comparison", "compare", "print_comparison", "print_comparison_json"]

_PERCENTILES = ("p50", "p99", "p99.9")
_LOWER_IS_BETTER_UNITS = ("ms", "µs", "MB")


@dataclass(frozen=True)
class Comparison:
    """One line: a figure of one workload, measured on Lamina and on the peer."""

    workload: str
    fsync: bool
    figure: str
    unit: str
    lamina: float
    peer: float
    #: None: neither (a share of a core busy says how hard the server worked, not how well).
    higher_is_better: bool | None

    @property
    def ratio(self) -> float:
        """Lamina / peer (nan when the peer's figure is 0 or missing)."""
        if self.peer == 0 or math.isnan(self.peer) or math.isnan(self.lamina):
            return float("nan")
        return self.lamina / self.peer

    def better(self, peer_name: str) -> str:
        if self.higher_is_better is None or math.isnan(self.ratio) or self.ratio == 1:
            return ""
        lamina_wins = (self.ratio > 1) == self.higher_is_better
        return "lamina" if lamina_wins else peer_name

    def to_json(self, peer_name: str) -> dict[str, Any]:
        ratio = self.ratio  # given to 4 significant digits: a small ratio keeps its precision
        return {"workload": self.workload, "fsync": self.fsync, "figure": self.figure,
                "unit": self.unit, "lamina": self.lamina, peer_name: self.peer,
                "ratio": None if math.isnan(ratio) else float(f"{ratio:.4g}"),
                "better": self.better(peer_name) or None}


def _higher_is_better(unit: str, target: float | None, at_least: bool) -> bool | None:
    if target is not None:
        return at_least
    if unit == "%":
        return None
    return unit not in _LOWER_IS_BETTER_UNITS


def compare(lamina: WorkloadResult, peer: WorkloadResult) -> list[Comparison]:
    """The lines of one workload: shared figures, then shared series' latency percentiles."""
    lines: list[Comparison] = []
    theirs = {f.label: f for f in peer.figures}
    for figure in lamina.figures:
        other = theirs.get(figure.label)
        if other is not None:
            lines.append(Comparison(lamina.workload, lamina.fsync, figure.label, figure.unit,
                                    figure.value, other.value,
                                    _higher_is_better(figure.unit, figure.target,
                                                      figure.at_least)))
    seen = {line.figure for line in lines}
    their_series = {s.name: s for s in peer.series}
    for series in lamina.series:
        other_series = their_series.get(series.name)
        if other_series is None:
            continue
        for key in _PERCENTILES:
            label = f"{series.name} {key}"
            if label in seen:
                continue
            lines.append(Comparison(lamina.workload, lamina.fsync, label, "ms",
                                    series.percentiles_ms.get(key, float("nan")),
                                    other_series.percentiles_ms.get(key, float("nan")), False))
    return lines


def _value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "ms":
        return f"{value:,.3f} ms"
    return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:,.2f} {unit}"


def print_comparison(pairs: list[tuple[WorkloadResult, WorkloadResult]], peer_name: str,
                     peer_title: str, stream: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console(file=stream, width=None if stream.isatty() else 140, highlight=False)
    table = Table("workload", "figure", "lamina", peer_name, f"lamina / {peer_name}", "better",
                  title=f"lamina bench --against {peer_name}: Lamina beside {peer_title}",
                  title_justify="left")
    for lamina, peer in pairs:
        name = lamina.workload + (" --fsync" if lamina.fsync else "")
        for line in compare(lamina, peer):
            ratio = line.ratio
            table.add_row(name, line.figure, _value(line.lamina, line.unit),
                          _value(line.peer, line.unit),
                          "n/a" if math.isnan(ratio) else f"{ratio:.2f}",
                          line.better(peer_name))
            name = ""
    console.print(table)
    console.print("ratio: Lamina's figure divided by the peer's; for throughput above 1 is "
                  "better, for latency, CPU and memory below 1", markup=False)
    for lamina, peer in pairs:
        for result in (lamina, peer):
            for note in result.notes:
                console.print(f"note ({result.workload}, {result.system}): {note}",
                              markup=False)


def print_comparison_json(pairs: list[tuple[WorkloadResult, WorkloadResult]], peer_name: str,
                          peer_title: str, stream: IO[str]) -> None:
    document = {
        "peer": {"name": peer_name, "title": peer_title},
        "results": [r.to_json() for pair in pairs for r in pair],
        "comparison": [line.to_json(peer_name) for lamina, peer in pairs
                       for line in compare(lamina, peer)],
    }
    stream.write(json.dumps(document, indent=2) + "\n")
