"""Prometheus metrics of one server (DESIGN.md §4), served on ``--metrics-port`` at /metrics.

Each server has its own registry (several servers may share a process in tests). Hot-path
updates (one per answered request) go through pre-resolved label children. Queue figures are
refreshed every ``metrics_interval_s`` by the applier (the engine is not thread-safe), never by
the scrape, which runs in prometheus-client's own thread and only reads.

    lamina_requests_total{op, outcome}         answered requests; outcome "ok" or the error code
    lamina_request_seconds{op}                 read -> answer queued (a waiting receive included)
    lamina_connections                         open connections
    lamina_connections_accepted_total
    lamina_group_commit_requests               requests per group commit (histogram)
    lamina_group_commit_seconds                apply + WAL sync of one group (histogram)
    lamina_wal_syncs_total                     WAL syncs (--fsync: one per group)
    lamina_waiting_receives                    receives waiting right now
    lamina_queue_messages{queue}               retained messages per queue
    lamina_tag_messages{queue, tag, state}     active / inflight / delayed / parked, for the
                                               BUSIEST_QUEUES queues with the most recent
                                               requests
"""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .dispatch import OPERATIONS

if TYPE_CHECKING:
    from lamina.engine import Engine

__all__ = ["BUSIEST_QUEUES", "ServerMetrics"]

log = logging.getLogger("lamina.server")

#: Queues that get per-tag series: the ones with the most requests since the last refresh.
BUSIEST_QUEUES = 10
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TAG_STATES = ("active", "inflight", "delayed", "parked")


class ServerMetrics:
    """The metric families of one server and the cheap calls that update them."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("lamina_requests", "Requests answered, by op and outcome",
                                ["op", "outcome"], registry=registry)
        self.latency = Histogram("lamina_request_seconds",
                                 "Time from reading a request to queuing its answer",
                                 ["op"], buckets=_LATENCY_BUCKETS, registry=registry)
        self.connections = Gauge("lamina_connections", "Open connections", registry=registry)
        self.accepted = Counter("lamina_connections_accepted", "Connections accepted",
                                registry=registry)
        self.group_requests = Histogram("lamina_group_commit_requests",
                                        "Requests applied per group commit",
                                        buckets=_GROUP_BUCKETS, registry=registry)
        self.group_seconds = Histogram("lamina_group_commit_seconds",
                                       "Apply and WAL sync time of one group commit",
                                       buckets=_LATENCY_BUCKETS, registry=registry)
        self.wal_syncs = Counter("lamina_wal_syncs", "WAL syncs to stable storage",
                                 registry=registry)
        self.waiting = Gauge("lamina_waiting_receives", "Receives waiting for messages",
                             registry=registry)
        self.queue_messages = Gauge("lamina_queue_messages", "Messages retained per queue",
                                    ["queue"], registry=registry)
        self.tag_messages = Gauge("lamina_tag_messages",
                                  "Messages per state for each tag of the busiest queues",
                                  ["queue", "tag", "state"], registry=registry)
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        #: Requests per queue (lower-cased), halved at each refresh: what "busiest" means.
        self.traffic: Tally[str] = Tally()
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    # -- hot path ------------------------------------------------------------------------------

    def observe(self, op: str, outcome: str, seconds: float) -> None:
        """One answered request."""
        children = self._children.get((op, outcome))
        if children is None:
            label = op if op in OPERATIONS else "unknown"
            children = (self.requests.labels(label, outcome), self.latency.labels(label))
            self._children[(op, outcome)] = children
        children[0].inc()
        children[1].observe(seconds)

    # -- queue figures (called by the applier, inside a group) --------------------------------

    def refresh_queues(self, engine: Engine) -> None:
        """Depth per queue, and per-tag states for the busiest queues."""
        depths = queue_depths(engine)
        self.queue_messages.clear()
        for name, messages in depths.items():
            self.queue_messages.labels(name).set(messages)
        busiest = [name for name, _ in self.traffic.most_common(BUSIEST_QUEUES)]
        # Halve the counts rather than clear them: "busiest" means recently, not this instant.
        for name, count in list(self.traffic.items()):
            if count < 2:
                del self.traffic[name]
            else:
                self.traffic[name] = count // 2
        self.tag_messages.clear()
        for name in busiest:
            try:
                stats = engine.get_queue(name).stats or {}
            except Exception:  # deleted meanwhile, or anything else: skip this refresh
                continue
            for tag, figures in (stats.get("tags") or {}).items():
                for state in _TAG_STATES:
                    self.tag_messages.labels(name, tag, state).set(figures.get(state, 0))

    # -- the endpoint ----------------------------------------------------------------------------

    def serve_http(self, host: str, port: int) -> int:
        """Start /metrics in a background thread; -> the bound port."""
        self._http = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http[0].server_port)

    def stop_http(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._http = None


def queue_depths(engine: Engine) -> dict[str, int]:
    """Retained messages per queue name (from the engine's memory: cheap)."""
    return engine.queue_depths()
