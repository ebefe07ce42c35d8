"""What ``lamina bench`` shows: a results table (rich), latency percentiles per series, JSON,
and a PNG of throughput and latency over time (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO

from .loadgen import BenchError
from .workloads import WorkloadResult

__all__ = ["plot", "plot_paths", "print_json", "print_tables"]


def _number(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit in ("ms",):
        return f"{value:,.3f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def print_tables(results: list[WorkloadResult], stream: IO[str]) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console(file=stream, width=None if stream.isatty() else 140, highlight=False)
    figures = Table("workload", "figure", "measured", "target", "", title="lamina bench",
                    title_justify="left")
    for result in results:
        name = result.workload + (" --fsync" if result.fsync else "")
        for figure in result.figures:
            met = figure.met
            status = "" if met is None else ("[green]met[/]" if met else "[red]short[/]")
            figures.add_row(name, figure.label, f"{_number(figure.value, figure.unit)} "
                            f"{figure.unit}".strip(), figure.target_text(), status)
            name = ""
    console.print(figures)
    latency = Table("workload", "series", "ops", "messages", "seconds", "msg/s", "p50 ms",
                    "p90 ms", "p99 ms", "p99.9 ms", "max ms", title="latency per operation "
                    "(end-to-end per message for w3)", title_justify="left")
    for result in results:
        for series in result.series:
            p = series.percentiles_ms
            latency.add_row(result.workload, series.name, f"{series.operations:,}",
                            f"{series.messages:,}", f"{series.elapsed_s:.2f}",
                            f"{series.messages_per_s:,.0f}",
                            *(_number(p.get(k, float("nan")), "ms")
                              for k in ("p50", "p90", "p99", "p99.9", "max")))
    if latency.row_count:
        console.print(latency)
    for result in results:
        for note in result.notes:
            console.print(f"note ({result.workload}): {note}", markup=False)


def print_json(results: list[WorkloadResult], stream: IO[str]) -> None:
    stream.write(json.dumps({"results": [r.to_json() for r in results]}, indent=2) + "\n")


def plot(result: WorkloadResult, path: Path) -> None:
    """Throughput (top) and latency p50/p99 (bottom) per time bucket, one line per series."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install 'lamina[dev]' or "
                         "pip install matplotlib") from None
    if not result.series:
        raise BenchError(f"{result.workload} has no time series to plot")
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for index, series in enumerate(result.series):
        line, color = series.timeline, f"C{index}"
        rate, unit = ((series.messages_per_s, "msg/s") if series.messages
                      else (series.operations_per_s, "requests/s"))
        top.plot(line["t_s"], line["msg_s"], color=color,
                 label=f"{series.name} ({rate:,.0f} {unit} overall)")
        bottom.plot(line["t_s"], line["p50_ms"], color=color, label=f"{series.name} p50")
        bottom.plot(line["t_s"], line["p99_ms"], color=color, linestyle="--",
                    label=f"{series.name} p99")
    top.set_ylabel("messages (or requests) / s")
    top.grid(True, alpha=0.3)
    top.legend(loc="lower right", fontsize="small")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since start")
    if any(v > 0 for s in result.series for v in s.timeline["p99_ms"] if not math.isnan(v)):
        bottom.set_yscale("log")
        bottom.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        bottom.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        bottom.yaxis.set_minor_formatter(NullFormatter())
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(loc="upper right", fontsize="small")
    headline = "; ".join(f"{f.label}: {_number(f.value, f.unit)} {f.unit}"
                         for f in result.figures if f.target is not None)
    figure.suptitle(f"{result.title}{' (--fsync)' if result.fsync else ''}\n{headline}",
                    fontsize="medium")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_paths(base: Path, results: list[WorkloadResult]) -> list[tuple[WorkloadResult, Path]]:
    """One workload: ``base`` itself; several: ``base`` with ``-w1``, ``-w2``... before the
    suffix (the idle workload has no timeline and no plot)."""
    plottable = [r for r in results if r.series]
    if len(plottable) == 1:
        return [(plottable[0], base)]
    suffix = base.suffix or ".png"
    out = []
    for result in plottable:
        tag = result.workload + ("-fsync" if result.fsync else "")
        out.append((result, base.with_name(f"{base.stem}-{tag}{suffix}")))
    return out
