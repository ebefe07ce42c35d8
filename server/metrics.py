"""Prometheus metrics of one server (DESIGN.md §4), served on ``--metrics-port`` at /metrics;
docs/OPERATIONS.md tells operators what each means.

Each server has its own registry (several servers may share a process in tests). The
per-request and per-group figures are plain Python counters (:class:`_Histogram`), updated on
the trio thread for a fraction of a prometheus-client child's cost (that one takes a lock and
checks its labels on every call), and turned into metric families only when /metrics is
scraped (:class:`_HotCollector`). Queue figures are refreshed every ``metrics_interval_s`` by
the applier (the engine is not thread-safe), never by the scrape, which runs in
prometheus-client's own thread and only reads.

    lamina_requests_total{op, outcome}         answered requests; outcome "ok" or the error code
    lamina_sqs_requests_total{action, outcome} SQS gateway requests answered; outcome "ok"
                                               or the SQS error code
    lamina_request_seconds{op}                 read -> answer queued (a waiting receive included)
    lamina_connections                         open connections (the SQS gateway's too)
    lamina_connections_accepted_total          connections accepted (the SQS gateway's too)
    lamina_group_commit_requests               requests per group commit (histogram)
    lamina_group_commit_seconds                apply + WAL sync of one group (histogram)
    lamina_wal_syncs_total                     WAL syncs (--fsync: one for the groups applied
                                               since the last, server.py rule 7)
    lamina_waiting_receives                    receives waiting right now
    lamina_queue_messages{queue}               retained messages per queue
    lamina_tag_messages{queue, tag, state}     active / inflight / delayed / parked, for the
                                               BUSIEST_QUEUES queues with the most recent
                                               requests
    lamina_queue_stats_total{queue, counter}   today's (UTC) figures of ``stats``: sent,
                                               received, deleted, dead, expired, bytes_in,
                                               bytes_out, for the BUSIEST_QUEUES queues
    lamina_store_memory_bytes{kind}            the store's memory: write_buffers, block_cache,
                                               table_readers, and the bounds
                                               write_buffers_limit, block_cache_limit
    lamina_storage_failures_total{kind}        operations the store failed (write: a full disk,
                                               no file descriptors; read: a data file missing
                                               or damaged), each answered Unavailable
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import Counter as Tally
from typing import TYPE_CHECKING, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .dispatch import OPERATIONS

if TYPE_CHECKING:
    from lamina.engine import Engine

__all__ = ["BUSIEST_QUEUES", "MAX_TRAFFIC_QUEUES", "ServerMetrics"]

log = logging.getLogger("lamina.server")

#: Queues that get per-tag series: the ones with the most requests since the last refresh.
BUSIEST_QUEUES = 10
#: Queues whose recent requests are tallied (the busiest are kept when there are more).
MAX_TRAFFIC_QUEUES = 10_000
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TAG_STATES = ("active", "inflight", "delayed", "parked")
#: The daily counters of ``stats`` (DESIGN.md §8), today's of each busiest queue.
STATS_COUNTERS = ("sent", "received", "deleted", "dead", "expired", "bytes_in", "bytes_out")


class _Histogram:
    """A histogram as plain numbers: one bucket count per bound (value <= bound) plus +Inf,
    and the sum. Only the trio thread writes; a scrape copies (see ``_HotCollector``)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> _Histogram:
        """A copy (``list()`` of ints: atomic under the GIL, so a scrape may take one)."""
        copied = _Histogram(self.bounds)
        copied.counts, copied.total = list(self.counts), self.total
        return copied

    def add(self, other: _Histogram) -> None:
        """Count ``other``'s observations too (the same bounds)."""
        self.counts = [mine + theirs for mine, theirs in zip(self.counts, list(other.counts))]
        self.total += other.total

    def family_samples(self, ones: int = 0) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` buckets and the sum, as prometheus expects them, with
        ``ones`` observations of 1 counted elsewhere (bounds beginning at 1)."""
        counts, total = list(self.counts), self.total  # list() of ints: atomic under the GIL
        counts[0] += ones
        total += ones
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), counts):
            running += count
            buckets.append((floatToGoString(bound), running))
        return buckets, total


class _HotCollector:
    """Exposes the hot-path figures of :class:`ServerMetrics` at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        requests = CounterMetricFamily("lamina_requests", "Requests answered, by op and outcome",
                                       labels=["op", "outcome"])
        for (op, outcome), count in metrics.request_counts.items():
            requests.add_metric([op, outcome], count)
        yield requests
        sqs = CounterMetricFamily("lamina_sqs_requests",
                                  "SQS gateway requests answered, by action and outcome",
                                  labels=["action", "outcome"])
        for (action, outcome), count in list(metrics.sqs_counts.items()):
            sqs.add_metric([action, outcome], count)
        yield sqs
        failures = CounterMetricFamily("lamina_storage_failures",
                                       "Operations the store failed, each answered Unavailable",
                                       labels=["kind"])
        for kind, count in metrics.storage_failures.items():
            failures.add_metric([kind], count)
        yield failures
        queue_stats = CounterMetricFamily(  # each starts again from zero at midnight UTC
            "lamina_queue_stats", "Today's (UTC) stats counters of the busiest queues",
            labels=["queue", "counter"])
        for (queue, counter), count in metrics.queue_stats.items():
            queue_stats.add_metric([queue, counter], count)
        yield queue_stats
        latency = HistogramMetricFamily("lamina_request_seconds",
                                        "Time from reading a request to queuing its answer",
                                        labels=["op"])
        lone = dict(metrics.lone_latency)
        lone_total = _Histogram(_LATENCY_BUCKETS)  # every lone answered request's time
        for op, histogram in list(metrics.latency.items()):
            merged = histogram.copy()
            alone = lone.pop(op, None)
            if alone is not None:
                merged.add(alone)
                lone_total.add(alone)
            buckets, total = merged.family_samples()
            latency.add_metric([op], buckets, total)
        for op, alone in lone.items():  # answered only alone so far
            lone_total.add(alone)
            buckets, total = alone.family_samples()
            latency.add_metric([op], buckets, total)
        yield latency
        # A lone request answered is a group of one that took the request's time.
        group_seconds = metrics.group_seconds.copy()
        group_seconds.add(lone_total)
        for name, documentation, histogram, ones in (
                ("lamina_group_commit_requests", "Requests applied per group commit",
                 metrics.group_requests, metrics.lone_groups + sum(lone_total.counts)),
                ("lamina_group_commit_seconds", "Apply and WAL sync time of one group commit",
                 group_seconds, 0)):
            buckets, total = histogram.family_samples(ones)
            yield HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


class ServerMetrics:
    """The metric families of one server and the cheap calls that update them."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        #: Answered requests by (op, outcome), and their latency by op (hot path), except
        #: the lone successes (below; ``request_counts`` gives both).
        self._counts: dict[tuple[str, str], int] = {}
        self.latency: dict[str, _Histogram] = {}
        #: Requests answered "ok" as a group of their own (``observe_lone``), by op: their
        #: latency, whose counts are also their number, their groups' sizes and times.
        self.lone_latency: dict[str, _Histogram] = {}
        #: SQS gateway requests answered by (action, outcome): "ok" or the SQS error code.
        self.sqs_counts: dict[tuple[str, str], int] = {}
        self.group_requests = _Histogram(_GROUP_BUCKETS)
        #: Groups of one failed request (``observe_alone``), not yet in ``group_requests``.
        self.lone_groups = 0
        self.group_seconds = _Histogram(_LATENCY_BUCKETS)
        registry.register(_HotCollector(self))
        self.connections = Gauge("lamina_connections", "Open connections", registry=registry)
        self.accepted = Counter("lamina_connections_accepted", "Connections accepted",
                                registry=registry)
        self.wal_syncs = Counter("lamina_wal_syncs", "WAL syncs to stable storage",
                                 registry=registry)
        self.waiting = Gauge("lamina_waiting_receives", "Receives waiting for messages",
                             registry=registry)
        self.queue_messages = Gauge("lamina_queue_messages", "Messages retained per queue",
                                    ["queue"], registry=registry)
        self.tag_messages = Gauge("lamina_tag_messages",
                                  "Messages per state for each tag of the busiest queues",
                                  ["queue", "tag", "state"], registry=registry)
        self.store_memory = Gauge("lamina_store_memory_bytes",
                                  "Memory the store holds, by kind, and its bounds", ["kind"],
                                  registry=registry)
        #: Requests per queue, halved at each refresh: what "busiest" means. Counted by the
        #: name as given (the hot path), folded to lower case at each refresh and bound.
        self.traffic: dict[str, int] = {}
        #: ``Engine.storage_failures`` as of the last refresh (read by the scrape's thread).
        self.storage_failures: dict[str, int] = {"write": 0, "read": 0}
        #: Today's ``stats`` counters of the busiest queues, by (queue, counter), as of the
        #: last refresh (replaced whole: the scrape's thread reads it).
        self.queue_stats: dict[tuple[str, str], int] = {}
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    @property
    def request_counts(self) -> dict[tuple[str, str], int]:
        """Answered requests by (op, outcome): a copy, as scraped."""
        counts = dict(self._counts)
        for op, histogram in list(self.lone_latency.items()):
            counts[op, "ok"] = counts.get((op, "ok"), 0) + sum(list(histogram.counts))
        return counts

    @property
    def lone_group_count(self) -> int:
        """Requests answered alone (``observe_alone``, ``observe_lone``): a group each."""
        return self.lone_groups + sum(sum(list(histogram.counts))
                                      for histogram in list(self.lone_latency.values()))

    # -- hot path ------------------------------------------------------------------------------

    def observe(self, op: str, outcome: str, seconds: float) -> None:
        """One answered request."""
        try:
            self._counts[op, outcome] += 1
            histogram = self.latency[op]
        except KeyError:  # a new series (or a request of an unknown op)
            histogram = self._new_series(op, outcome)
        histogram.counts[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        histogram.total += seconds

    def observe_alone(self, op: str, outcome: str, seconds: float) -> None:
        """One request applied as a group of its own (a client awaiting each answer):
        :meth:`observe` and :meth:`observe_group` at once, the group's time counted, like the
        request's, from its read."""
        index = bisect_left(_LATENCY_BUCKETS, seconds)
        try:
            self._counts[op, outcome] += 1
            histogram = self.latency[op]
        except KeyError:
            histogram = self._new_series(op, outcome)
        histogram.counts[index] += 1
        histogram.total += seconds
        group = self.group_seconds
        group.counts[index] += 1
        group.total += seconds
        self.lone_groups += 1  # a group of one: group_requests' first bucket when scraped

    def observe_lone(self, op: str, seconds: float) -> None:
        """:meth:`observe_alone` of a request answered "ok" (``op`` is then a known op): one
        histogram, whose counts make the request count and the group's figures when scraped."""
        try:
            histogram = self.lone_latency[op]
        except KeyError:
            histogram = self.lone_latency[op] = _Histogram(_LATENCY_BUCKETS)
        histogram.counts[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        histogram.total += seconds

    def _new_series(self, op: str, outcome: str) -> _Histogram:
        """Count one request of a new (op, outcome); -> the latency histogram of ``op``."""
        if op not in OPERATIONS:
            op = "unknown"  # a peer must not be able to create series at will
        key = (op, outcome)
        self._counts[key] = self._counts.get(key, 0) + 1
        return self.latency.get(op) or self.latency.setdefault(op, _Histogram(_LATENCY_BUCKETS))

    def observe_sqs(self, action: str, outcome: str) -> None:
        """One answered SQS gateway request (``action`` one the gateway knows, or
        "unknown": a peer must not be able to create series at will)."""
        key = (action, outcome)
        self.sqs_counts[key] = self.sqs_counts.get(key, 0) + 1

    def count_traffic(self, queue: str) -> None:
        """One request on ``queue`` (an existing queue the caller may use)."""
        try:
            self.traffic[queue] += 1
        except KeyError:  # a name not seen since the last refresh
            self._new_traffic(queue)

    def _new_traffic(self, queue: str) -> None:
        if len(self.traffic) >= MAX_TRAFFIC_QUEUES:  # bounded without a metrics refresh too
            self.traffic = dict(self._folded_traffic().most_common(MAX_TRAFFIC_QUEUES // 2))
        self.traffic[queue] = self.traffic.get(queue, 0) + 1

    def _folded_traffic(self) -> Tally[str]:
        """The traffic by queue name in lower case (queue names ignore case)."""
        folded: Tally[str] = Tally()
        for name, count in list(self.traffic.items()):
            folded[name.lower()] += count
        return folded

    def observe_group(self, requests: int, seconds: float) -> None:
        """One group commit: how many requests it applied, and how long it took."""
        group = self.group_requests
        group.counts[bisect_left(group.bounds, requests)] += 1
        group.total += requests
        group = self.group_seconds
        group.counts[bisect_left(group.bounds, seconds)] += 1
        group.total += seconds

    # -- queue figures (called by the applier, inside a group) --------------------------------

    def refresh_queues(self, engine: Engine) -> None:
        """Depth per queue, per-tag states for the busiest queues, the store's memory and
        failures."""
        usage = engine.memory_usage()
        for kind, value in (("write_buffers", usage.write_buffers_bytes),
                            ("write_buffers_limit", usage.write_buffer_limit_bytes),
                            ("block_cache", usage.block_cache_bytes),
                            ("block_cache_limit", usage.block_cache_limit_bytes),
                            ("table_readers", usage.table_readers_bytes)):
            self.store_memory.labels(kind).set(value)
        self.storage_failures = engine.storage_failures
        depths = queue_depths(engine)
        self.queue_messages.clear()
        for name, messages in depths.items():
            self.queue_messages.labels(name).set(messages)
        folded = self._folded_traffic()
        busiest = [name for name, _ in folded.most_common(BUSIEST_QUEUES)]
        # Halve the counts rather than clear them: "busiest" means recently, not this instant.
        self.traffic = {name: count // 2 for name, count in folded.items() if count >= 2}
        self.tag_messages.clear()
        queue_stats: dict[tuple[str, str], int] = {}
        for name in busiest:
            try:
                stats = engine.get_queue(name).stats or {}
                days = engine.stats(name, days=1)
            except Exception:  # deleted meanwhile, or anything else: skip this refresh
                continue
            today = days[0] if days else {}
            for counter in STATS_COUNTERS:
                queue_stats[name, counter] = today.get(counter, 0)
            for tag, figures in (stats.get("tags") or {}).items():
                for state in _TAG_STATES:
                    self.tag_messages.labels(name, tag, state).set(figures.get(state, 0))
        self.queue_stats = queue_stats

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
