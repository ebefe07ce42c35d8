"""Where the bench's processes run: ``--server-cpus`` and ``--client-cpus``.

On a virtual machine a CPU with nothing to run halts, and waking it for the next request is
charged to the process woken. A server on a CPU of its own (``--server-cpus 1 --client-cpus
0``) is woken that way for every request its clients await one at a time; a server sharing
its clients' CPU (``--server-cpus 0 --client-cpus 0``) is switched to directly and never
halts between requests, but waits for the CPU while a client runs. Left to the scheduler (the
default, as applications run), each run lands somewhere between the two, and a figure such as
the server's CPU per request can differ by two to eight times from run to run with the same
code (docs/PERFORMANCE.md, "Where the server runs"). Pinning removes that variation (not the
host's own drift); whichever placement is chosen applies to both systems of a ``--against``
run alike.

A CPU list is written as ``taskset`` takes it: ``1``, ``0,1``, ``0-3``.
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["Cpus", "cpu_list", "cpus_option", "describe", "pin_process", "pinned",
           "placement_of", "threads"]

#: A set of CPU numbers; None where the bench leaves placement to the scheduler.
Cpus = frozenset[int]


def cpu_list(text: str) -> Cpus:
    """``"0,2-3"`` -> {0, 2, 3}, each a CPU this process may run on (else ValueError)."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r} (write it as 1, 0,1 or 0-3)") from None
        if first < 0 or last < first:
            raise ValueError(f"not a CPU list: {text!r} (write it as 1, 0,1 or 0-3)")
        cpus.update(range(first, last + 1))
    usable = os.sched_getaffinity(0)
    outside = sorted(cpus - usable)
    if outside:
        raise ValueError(f"CPU {', '.join(map(str, outside))} is not one this machine lets the "
                         f"bench use (usable: {describe(frozenset(usable))})")
    return frozenset(cpus)


def cpus_option(text: str) -> Cpus:
    """``cpu_list`` as an argparse ``type``: its message becomes the option's error."""
    try:
        return cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def describe(cpus: Cpus) -> str:
    """{0, 1, 2, 5} -> "0-2,5"."""
    ordered = sorted(cpus)
    runs: list[str] = []
    start = previous = ordered[0]
    for cpu in ordered[1:] + [-2]:
        if cpu != previous + 1:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
            start = cpu
        previous = cpu
    return ",".join(runs)


def threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (``/proc/PID/task``)."""
    try:
        return [int(entry.name) for entry in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return [pid]


def pin_process(pid: int, cpus: Cpus) -> None:
    """Every thread of process ``pid`` onto ``cpus``; threads it starts later inherit the
    placement of the thread that starts them."""
    for thread in threads(pid):
        try:
            os.sched_setaffinity(thread, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile


def placement_of(pid: int) -> Cpus:
    """The CPUs any thread of process ``pid`` may run on, as the kernel has them."""
    cpus: set[int] = set()
    for thread in threads(pid):
        try:
            cpus.update(os.sched_getaffinity(thread))
        except ProcessLookupError:
            continue
    return frozenset(cpus)


@contextmanager
def pinned(cpus: Cpus | None) -> Iterator[None]:
    """This thread on ``cpus`` while the block runs (nothing when None)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
