"""Peers for ``lamina bench --against NAME``: other systems the workloads run against, one
module each, so that a user sees Lamina beside what they run today in one run on their machine.

A peer is a :class:`Peer`: how to start a private server of it (fresh, on a free loopback port,
in memory or, with ``--fsync``, syncing every write; stopped after the run) and, for each
workload it can run, a function ``(Run, Params) -> WorkloadResult`` that sets the workload up on
that server, runs its client processes and scores them with the same code as Lamina's
(``workloads.score_w1`` ...). The figures of both are then compared line by line
(``compare.py``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

if TYPE_CHECKING:  # the command line imports PEER_NAMES without the workloads
    from ..workloads import Params, Run, WorkloadResult

__all__ = ["PEER_NAMES", "Peer", "PeerServer", "load_peer"]

#: name -> the module of bench/peers that defines ``PEER``.
PEER_NAMES = {"redis": "redis"}


class PeerServer(Protocol):
    """A running server of a peer, started by the bench for one run."""

    @property
    def pid(self) -> int: ...

    @property
    def address(self) -> tuple[str, int]: ...

    def stop(self) -> int | None:
        """Stop it and remove its files; -> its exit code."""


@dataclass(frozen=True)
class Peer:
    name: str  # as on the command line
    title: str  # as in the report, e.g. "Redis 7.0.15 (Streams)"
    start: Callable[[bool], PeerServer]  # fsync -> a fresh running server
    workloads: Mapping[str, Callable[[Run, Params], WorkloadResult]]
    #: (run, messages, body bytes): store that many messages apart from the workloads' own,
    #: to stay while a workload runs (``--backlog``).
    fill_backlog: Callable[[Run, int, int], None]


def load_peer(name: str) -> Peer:
    """The peer called ``name`` (a clear error if it cannot run here, e.g. not installed)."""
    from ..loadgen import BenchError
    if name not in PEER_NAMES:
        raise BenchError(f"no peer called {name!r}; known: {', '.join(PEER_NAMES)}")
    module = importlib.import_module(f"{__name__}.{PEER_NAMES[name]}")
    peer: Peer = module.load()
    return peer
