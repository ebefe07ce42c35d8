"""Observability (DESIGN.md §4): the Prometheus /metrics endpoint and structured log lines."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import urllib.request
from pathlib import Path

import pytest
import trio
from botocore.exceptions import ClientError

from lamina.client import AsyncClient
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args
from lamina.server.logs import JsonFormatter
from tests.support.servers import running_server
from tests.support.sqs import sqs_client


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def sample(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {prefix!r}")


async def test_metrics_endpoint(tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0, metrics_interval_s=0.25) as server:
        assert server.metrics_port
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("orders")
            await client.create_tag("orders", "audit")
            await client.send("orders", [b"a", b"b", b"c"])
            await client.receive("orders")
            try:
                await client.get_queue("missing")
            except Exception:
                pass
            await trio.sleep(0.4)  # a refresh of the queue gauges
            text = await trio.to_thread.run_sync(scrape, server.metrics_port)
            connections = sample(text, "lamina_connections ")
    assert sample(text, 'lamina_requests_total{op="send",outcome="ok"}') == 1
    assert sample(text, 'lamina_requests_total{op="get_queue",outcome="QueueNotFound"}') == 1
    assert sample(text, 'lamina_request_seconds_count{op="receive"}') == 1
    assert sample(text, 'lamina_queue_messages{queue="orders"}') == 3
    assert sample(text, 'lamina_tag_messages{queue="orders",state="inflight",tag="default"}') == 1
    assert sample(text, 'lamina_tag_messages{queue="orders",state="active",tag="audit"}') == 3
    assert sample(text, "lamina_group_commit_requests_count") >= 5
    assert connections == 1
    assert "lamina_wal_syncs_total" in text


async def test_metrics_show_the_store_memory_and_the_bounds_it_opened_with(tmp_path: Path
                                                                         ) -> None:
    async with running_server(tmp_path, metrics_port=0, metrics_interval_s=0.1,
                              write_buffer_bytes=6 << 20, block_cache_bytes=3 << 20) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("orders")
            await client.send("orders", [b"a" * 1000] * 100)
            await trio.sleep(0.3)
            text = await trio.to_thread.run_sync(scrape, server.metrics_port)
    assert sample(text, 'lamina_store_memory_bytes{kind="write_buffers_limit"}') == 6 << 20
    assert sample(text, 'lamina_store_memory_bytes{kind="block_cache_limit"}') == 3 << 20
    assert sample(text, 'lamina_store_memory_bytes{kind="write_buffers"}') >= 100_000
    assert 'lamina_store_memory_bytes{kind="block_cache"}' in text
    assert 'lamina_store_memory_bytes{kind="table_readers"}' in text


def test_log_lines_are_json_with_their_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("lamina.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("listening", extra={"event": "start", "port": 7766})
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("failed", extra={"event": "error"})
    finally:
        logger.removeHandler(handler)
    first, second = [json.loads(line) for line in stream.getvalue().splitlines()
                     if line.startswith("{")]
    assert first["event"] == "start" and first["port"] == 7766
    assert first["level"] == "WARNING" and first["message"] == "listening"
    assert second["event"] == "error" and "ValueError: bad" in second["error"]


async def test_server_logs_start_and_stop(tmp_path: Path) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("lamina.server")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with running_server(tmp_path):
            pass
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    events = [json.loads(line).get("event") for line in stream.getvalue().splitlines()]
    assert events[0] == "start" and events[-1] == "stop"


async def test_lone_requests_count_as_group_commits_of_one_in_the_group_histogram(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0, metrics_interval_s=3600) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.ping()
            before = await trio.to_thread.run_sync(scrape, server.metrics_port)
            for _ in range(10):
                await client.ping()
            after = await trio.to_thread.run_sync(scrape, server.metrics_port)
    for name in ('lamina_group_commit_requests_bucket{le="1.0"}',
                 'lamina_group_commit_requests_bucket{le="2.0"}',
                 'lamina_group_commit_requests_bucket{le="+Inf"}',
                 "lamina_group_commit_requests_count", "lamina_group_commit_requests_sum",
                 "lamina_group_commit_seconds_count", 'lamina_requests_total{op="ping"'):
        assert sample(after, name) - sample(before, name) == 10, name


async def test_lone_requests_that_succeed_or_fail_are_counted_exactly_when_scraped(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0, metrics_interval_s=3600) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            before = await trio.to_thread.run_sync(scrape, server.metrics_port)
            groups_before = server.groups
            for _ in range(5):
                await client.ping()
            for _ in range(4):
                await client.send("q", [b"m"])
            for _ in range(3):
                try:
                    await client.get_queue("missing")
                except Exception:
                    pass
            after = await trio.to_thread.run_sync(scrape, server.metrics_port)
            assert server.groups - groups_before == 12  # the stop log's count: a group each

    def delta(name: str) -> float:
        return sample(after, name) - (sample(before, name) if name in before else 0)

    assert delta('lamina_requests_total{op="ping",outcome="ok"}') == 5
    assert delta('lamina_requests_total{op="send",outcome="ok"}') == 4
    assert delta('lamina_requests_total{op="get_queue",outcome="QueueNotFound"}') == 3
    assert delta('lamina_request_seconds_count{op="ping"}') == 5
    assert delta('lamina_request_seconds_bucket{le="+Inf",op="send"}') == 4
    assert delta('lamina_request_seconds_count{op="get_queue"}') == 3
    assert delta('lamina_group_commit_requests_bucket{le="1.0"}') == 12
    assert delta("lamina_group_commit_requests_sum") == 12
    assert delta("lamina_group_commit_seconds_count") == 12
    # A lone request's group took the request's time.
    seconds = sum(delta(f'lamina_request_seconds_sum{{op="{op}"}}')
                  for op in ("ping", "send", "get_queue"))
    assert abs(delta("lamina_group_commit_seconds_sum") - seconds) < 1e-6


async def scrape_when(port: int, prefix: str, value: float) -> str:
    """The /metrics text once ``prefix`` reads ``value`` (a connection ends asynchronously)."""
    with trio.move_on_after(5):
        while True:
            text = await trio.to_thread.run_sync(scrape, port)
            if f"{prefix.rstrip()} {float(value)}" in text:
                return text
            await trio.sleep(0.02)
    return await trio.to_thread.run_sync(scrape, port)


async def test_sqs_gateway_connections_count_in_the_connection_metrics_as_in_server_info(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0, sqs_port=0,
                              metrics_interval_s=3600) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            sqs = await trio.open_tcp_stream("127.0.0.1", server.sqs_port)
            text = await scrape_when(server.metrics_port, "lamina_connections ", 2)
            info = await client.server_info()
            assert sample(text, "lamina_connections ") == info.connections == 2
            assert sample(text, "lamina_connections_accepted_total") == 2
            await sqs.aclose()
            text = await scrape_when(server.metrics_port, "lamina_connections ", 1)
            assert sample(text, "lamina_connections ") == 1
            assert (await client.server_info()).connections == 1


OPERATIONS = Path(__file__).parents[2] / "docs" / "OPERATIONS.md"


async def test_the_operations_guide_names_every_metric_the_server_exposes(tmp_path: Path
                                                                          ) -> None:
    async with running_server(tmp_path, metrics_port=0, metrics_interval_s=0.05) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            await client.send("q", [b"m"])
            await client.receive("q")
        await trio.sleep(0.2)  # a refresh of the refreshed figures
        text = await trio.to_thread.run_sync(scrape, server.metrics_port)
    names = {line.split()[2].removesuffix("_created") for line in text.splitlines()
             if line.startswith("# TYPE ")}  # a counter's _created: in the guide's last words
    guide = OPERATIONS.read_text()
    assert len(names) >= 12
    missing = {name for name in names if f"`{name}`" not in guide
               and f"`{name}_total`" not in guide}
    assert not missing


def test_the_operations_guide_names_every_log_event_the_server_writes() -> None:
    root = Path(__file__).parents[2]
    sources = [*(root / "server").rglob("*.py"), *(root / "engine").rglob("*.py")]
    events = {match for source in sources
              for match in re.findall(r'"event": "(\w+)"', source.read_text())}
    guide = OPERATIONS.read_text()
    assert {"start", "stop", "refused", "write_failed", "clock_behind"} <= events
    assert not {event for event in events if f"| `{event}` |" not in guide}


async def test_sqs_gateway_requests_are_counted_by_action_and_outcome(tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0, sqs_port=0,
                              metrics_interval_s=3600) as server:
        sqs = sqs_client(server.sqs_port)

        def requests() -> None:
            url = sqs.create_queue(QueueName="orders")["QueueUrl"]
            sqs.get_queue_url(QueueName="orders")
            sqs.send_message(QueueUrl=url, MessageBody="hello")
            for _ in range(2):
                with pytest.raises(ClientError):
                    sqs.get_queue_url(QueueName="missing")

        await trio.to_thread.run_sync(requests)
        text = await trio.to_thread.run_sync(scrape, server.metrics_port)
    assert sample(text, 'lamina_sqs_requests_total{action="CreateQueue",outcome="ok"}') == 1
    assert sample(text, 'lamina_sqs_requests_total{action="GetQueueUrl",outcome="ok"}') == 1
    assert sample(text, 'lamina_sqs_requests_total{action="SendMessage",outcome="ok"}') == 1
    assert sample(text, 'lamina_sqs_requests_total{action="GetQueueUrl",'
                        'outcome="QueueDoesNotExist"}') == 2


async def test_the_daily_stats_of_the_busiest_queues_feed_the_metrics(tmp_path: Path) -> None:
    async with running_server(tmp_path, metrics_port=0, metrics_interval_s=0.05) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("orders")
            await client.send("orders", [b"a" * 10, b"b" * 20, b"c" * 30])
            deliveries = await client.receive("orders", max=2)
            await client.delete("orders", [deliveries[0].receipt])
            text = await scrape_when(server.metrics_port,
                                     'lamina_queue_stats_total{counter="deleted",queue="orders"}',
                                     1)
            today = (await client.stats("orders", days=1))[0]
    for counter in ("sent", "received", "deleted", "dead", "expired", "bytes_in", "bytes_out"):
        figure = sample(text, f'lamina_queue_stats_total{{counter="{counter}",queue="orders"}}')
        assert figure == today[counter], counter
    assert today["sent"] == 3 and today["bytes_in"] == 60 and today["received"] == 2


def test_the_metrics_endpoint_binds_another_address_only_with_insecure() -> None:
    parser = add_serve_arguments(argparse.ArgumentParser(prog="lamina serve"))
    assert config_from_args(parser.parse_args(["--metrics-port", "9100"])).metrics_host \
        == "127.0.0.1"
    with pytest.raises(ConfigError, match="--insecure"):
        config_from_args(parser.parse_args(["--metrics-port", "9100",
                                            "--metrics-host", "0.0.0.0"]))
    config = config_from_args(parser.parse_args(["--metrics-port", "9100", "--insecure",
                                                 "--metrics-host", "0.0.0.0"]))
    assert config.metrics_host == "0.0.0.0"
