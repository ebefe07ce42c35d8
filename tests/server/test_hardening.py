"""Careless and hostile clients (DESIGN.md §4, docs/LIMITS.md): what one client can make the
server hold in memory is bounded, it never stalls the others, and a connection the protocol
says to close is closed at once."""

from __future__ import annotations

import argparse
import logging
import socket
import struct
from pathlib import Path

import cbor2
import pytest
import trio

from lamina.server.budget import DEFAULT_MAX_BUFFERED_BYTES
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args
from lamina.server.metrics import MAX_TRAFFIC_QUEUES, ServerMetrics
from lamina.wire.protocol import MAX_REQUEST_ITEMS, Response, auth_signature
from tests.support.descriptors import out_of_descriptors
from tests.support.servers import ADMIN, BOB, KEYS, RawConnection, running_server

MAX_FRAME = 2 * 1024 * 1024


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


async def signed_in(port: int, key_id: str, secret: str) -> RawConnection:
    connection = await RawConnection.open(port)
    signature = auth_signature(secret, connection.greeting.nonce, key_id)
    answer = await connection.call("auth", {"key": key_id, "signature": signature})
    assert answer.error is None
    return connection


async def ping_often(port: int, until: trio.Event, latencies: list[float]) -> None:
    """A bystander: one ping after another until ``until``, each answered."""
    bystander = await RawConnection.open(port)
    while not until.is_set():
        started = trio.current_time()
        with trio.fail_after(5):
            assert (await bystander.call("ping")).error is None
        latencies.append(trio.current_time() - started)
        await trio.sleep(0.01)


async def test_a_greedy_reader_is_held_to_its_cap_and_closed_while_others_are_answered(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, max_frame=MAX_FRAME, idle_timeout_s=1.0) as server:
        setup = await RawConnection.open(server.port)
        await setup.call("create_queue", {"queue": "big",
                                          "attributes": {"max_message_size": 1048576}})
        for _ in range(3):
            await setup.call("send", {"queue": "big", "messages": [b"x" * 1_000_000]})
        before = set(server.connections)
        greedy = await RawConnection.open(server.port)
        (greedy_side,) = set(server.connections) - before
        # Many pipelined requests with ~1-3 MB answers each, in one write, never read.
        requests = [frame([n, "peek", {"queue": "big", "start": 0, "max": 3}])
                    for n in range(1, 150)]
        requests += [frame([n, "receive", {"queue": "big", "max": 3}]) for n in range(150, 160)]
        await greedy.send_bytes(b"".join(requests))
        done = trio.Event()
        latencies: list[float] = []
        held: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping_often, server.port, done, latencies)
            with trio.fail_after(8):
                while any(c is greedy_side for c in server.connections):
                    outbox = greedy_side.outbox
                    held.append(outbox.unsent_bytes + outbox.reserved_bytes)
                    await trio.sleep(0.005)
            done.set()
        assert max(held) > 2 * MAX_FRAME  # it did try
        assert max(held) <= 4 * MAX_FRAME  # never past the cap, not even by one slice
        assert len(latencies) > 20
        assert server.budget.used_bytes == 0  # everything it held is given back


async def test_large_partial_frames_wait_for_the_memory_budget_and_none_is_dropped(
        tmp_path: Path) -> None:
    budget = 8 * 1024 * 1024
    async with running_server(tmp_path, max_frame=MAX_FRAME, max_buffered=budget) as server:
        setup = await RawConnection.open(server.port)
        await setup.call("create_queue", {"queue": "q",
                                          "attributes": {"max_message_size": 1048576}})
        senders = [await RawConnection.open(server.port) for _ in range(12)]
        frames = [frame([1, "send", {"queue": "q", "messages": [bytes([n]) * 900_000] * 2}])
                  for n in range(len(senders))]
        split = 1_500_000
        release = trio.Event()
        answers: list[Response] = []

        async def send(sender: RawConnection, data: bytes) -> None:
            await sender.send_bytes(data[:split])
            await release.wait()
            await sender.send_bytes(data[split:])
            with trio.fail_after(20):
                answers.append(await sender.response(1))

        async with trio.open_nursery() as nursery:
            for sender, data in zip(senders, frames):
                nursery.start_soon(send, sender, data)
            await trio.sleep(0.5)
            buffered = sum(c.proto._frames.buffered_bytes for c in server.connections)
            assert buffered <= budget + len(senders) * 64 * 1024  # not 12 x 1.5 MB
            assert server.budget.used_bytes <= budget
            assert (await setup.call("ping")).error is None  # small requests go on
            release.set()  # the rest: every frame is then read and applied
        assert len(answers) == len(senders)
        for answer in answers:
            assert answer.error is None
            assert all(type(entry) is list for entry in answer.result["results"])
        info = await setup.call("get_queue", {"queue": "q"})
        assert info.result["stats"]["messages"] == 2 * len(senders)
        assert server.budget.used_bytes == 0


async def test_a_failed_auth_or_pre_auth_protocol_error_always_closes_at_once(
        tmp_path: Path) -> None:
    # The bytes are there before the server accepts (a blocking connect and send, which do
    # not let the server's task run), so they are read before the auth deadline's task runs.
    bad_auth = frame([1, "auth", {"key": "alice", "signature": b"\x00" * 32}])
    zero_length = struct.pack(">I", 0)
    async with running_server(tmp_path, keys=KEYS, auth_timeout_s=10) as server:
        for data in [bad_auth] * 40 + [zero_length] * 20:
            plain = socket.create_connection(("127.0.0.1", server.port))
            plain.sendall(data)
            sock = trio.socket.from_stdlib_socket(plain)
            received = b""
            with trio.fail_after(2):
                while chunk := await sock.recv(65536):
                    received += chunk
            sock.close()
            assert b"Unauthorized" in received or b"ProtocolError" in received
        with trio.fail_after(2):
            while server.connections:
                await trio.sleep(0.01)


async def test_the_traffic_tally_counts_only_queues_that_pass_their_checks(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, keys=KEYS) as server:
        admin = await signed_in(server.port, "admin", ADMIN.secret)
        await admin.call("create_queue", {"queue": "real"})
        assert (await admin.call("get_queue", {"queue": "real"})).error is None
        stranger = await signed_in(server.port, "bob", BOB.secret)  # no grants
        for n in range(30):
            name = f"{n}" + "n" * 256 * 1024
            answer = await stranger.call("get_queue", {"queue": name})
            assert answer.error is not None
        for n in range(30):
            answer = await admin.call("get_queue", {"queue": f"missing{n}"})
            assert answer.error["code"] == "QueueNotFound"
        assert set(server.metrics.traffic) == {"real"}


def test_the_traffic_tally_keeps_its_busiest_queues_within_a_bound() -> None:
    metrics = ServerMetrics()
    for _ in range(5):
        metrics.count_traffic("busy")
    for n in range(3 * MAX_TRAFFIC_QUEUES):
        metrics.count_traffic(f"q{n}")
    assert len(metrics.traffic) <= MAX_TRAFFIC_QUEUES
    assert metrics.traffic["busy"] == 5


def test_the_traffic_tally_counts_a_queue_under_every_spelling_of_its_name(
        tmp_path: Path) -> None:
    from lamina.engine import Engine

    metrics = ServerMetrics()
    for name in ("Busy", "busy", "BUSY", "busy", "Quiet"):
        metrics.count_traffic(name)
    engine = Engine.open(tmp_path / "data")
    try:
        engine.create_queue("busy")
        metrics.refresh_queues(engine)
    finally:
        engine.close()
    assert metrics.traffic == {"busy": 2}  # 4 requests, halved at the refresh; Quiet's 1 gone
    assert {sample.labels["queue"] for sample in next(iter(
        metrics.tag_messages.collect())).samples} == {"busy"}


async def test_a_frame_of_millions_of_tiny_items_is_refused_before_it_is_decoded(
        tmp_path: Path) -> None:
    count = 16 * 1024 * 1024 - 64
    body = (b"\x83\x01" + cbor2.dumps("send") + b"\xa2" + cbor2.dumps("queue")
            + cbor2.dumps("q") + cbor2.dumps("messages") + b"\x9a" + struct.pack(">I", count)
            + b"\x00" * count)
    async with running_server(tmp_path) as server:
        attacker = await RawConnection.open(server.port)
        done = trio.Event()
        latencies: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping_often, server.port, done, latencies)
            await trio.sleep(0.05)
            await attacker.send_bytes(struct.pack(">I", len(body)) + body)
            with trio.fail_after(10):
                final = await attacker.next_event()
                assert await attacker.next_event() is None  # closed
            done.set()
        assert final.id == 0 and final.error["code"] == "ProtocolError"
        assert f"at most {MAX_REQUEST_ITEMS} CBOR items" in final.error["message"]
        assert latencies


async def test_out_of_file_descriptors_accept_logs_a_json_line_now_and_then(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_server(tmp_path) as server:
        clients = [trio.socket.socket() for _ in range(3)]
        with out_of_descriptors():
            for client in clients:
                await client.connect(("127.0.0.1", server.port))
            await trio.sleep(0.6)  # accept fails every 0.1 s meanwhile
        for client in clients:  # then accepted: each gets its greeting
            with trio.fail_after(5):
                assert await client.recv(65536)
            client.close()
    failed = [r for r in caplog.records if getattr(r, "event", None) == "accept_failed"]
    assert len(failed) == 1 and failed[0].errno == "EMFILE"  # type: ignore[attr-defined]
    assert not failed[0].exc_info
    assert not [r for r in caplog.records if r.name.startswith("trio")]
    assert any(getattr(r, "event", None) == "accept_resumed" for r in caplog.records)


async def test_a_response_and_a_closed_connection_are_what_a_greedy_reader_finds(
        tmp_path: Path) -> None:
    # What the greedy reader of the first test finds once it reads: answers in order up to
    # the point the server gave up on it, then the end of the stream.
    async with running_server(tmp_path, max_frame=MAX_FRAME, idle_timeout_s=0.5) as server:
        greedy = await RawConnection.open(server.port)
        await greedy.call("create_queue", {"queue": "big",
                                           "attributes": {"max_message_size": 1048576}})
        for _ in range(2):
            await greedy.call("send", {"queue": "big", "messages": [b"y" * 1_000_000]})
        await greedy.send_bytes(b"".join(frame([n, "peek", {"queue": "big", "start": 0,
                                                             "max": 2}])
                                         for n in range(1, 100)))
        with trio.fail_after(8):
            while server.connections:
                await trio.sleep(0.01)
        ids = []
        while (event := await greedy.next_event()) is not None:
            assert isinstance(event, Response) and event.error is None
            ids.append(event.id)
        assert ids == list(range(1, len(ids) + 1)) and len(ids) < 99


def test_the_memory_budget_has_an_option_with_its_default_in_the_help() -> None:
    parser = add_serve_arguments(argparse.ArgumentParser(prog="lamina serve"))
    assert "--max-buffered" in parser.format_help()
    assert str(DEFAULT_MAX_BUFFERED_BYTES) in parser.format_help()
    assert config_from_args(parser.parse_args([])).max_buffered == DEFAULT_MAX_BUFFERED_BYTES
    config = config_from_args(parser.parse_args(["--max-buffered", "1048576"]))
    assert config.max_buffered == 1048576
    with pytest.raises(ConfigError):
        config_from_args(parser.parse_args(["--max-buffered", "0"]))
