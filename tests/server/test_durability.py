"""What an acknowledgement means (DESIGN.md §3-4): group commit with one WAL sync per group and
no answer before its sync, graceful shutdown of a real ``lamina serve`` on SIGTERM, and kill -9
under load losing nothing acknowledged."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from lamina.engine import Engine
from lamina.engine.results import Sent
from lamina.client import AsyncClient
from tests.support.servers import (AckedLoad, RawConnection, count_queued_work, kill_under_load,
                                   running_server)


async def test_group_commit_syncs_once_per_group_before_answering(tmp_path: Path) -> None:
    engine = Engine.open(tmp_path / "data", fsync=True)
    syncs: list[tuple[float, float]] = []
    real_sync = engine.sync_wal

    def slow_sync() -> None:  # a slow disk: requests pile up behind each sync
        started = time.perf_counter()
        time.sleep(0.01)
        real_sync()
        syncs.append((started, time.perf_counter()))

    engine.sync_wal = slow_sync  # type: ignore[method-assign]
    answered: list[tuple[float, float]] = []
    try:
        async with running_server(tmp_path, engine=engine) as server:
            async with AsyncClient.connect("127.0.0.1", server.port) as setup:
                await setup.create_queue("q")
            groups_before, syncs_before = server.groups, server.syncs

            async def producer() -> None:
                async with AsyncClient.connect("127.0.0.1", server.port) as client:
                    for n in range(10):
                        started = time.perf_counter()
                        result = await client.send("q", [f"m{n}".encode()])
                        assert isinstance(result[0], Sent)
                        answered.append((started, time.perf_counter()))

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(producer)
            group_syncs = server.syncs - syncs_before
            assert group_syncs <= server.groups - groups_before  # at most one per group
            assert group_syncs < 200 / 2  # 200 sends shared far fewer syncs
            for started, finished in answered:  # every answer after a sync that began after
                assert any(started <= s_start and s_end <= finished for s_start, s_end in syncs)
    finally:
        engine.close()


def _frame(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    import struct

    import cbor2
    body = cbor2.dumps([request_id, op, args])
    return struct.pack(">I", len(body)) + body


async def test_with_fsync_requests_applied_in_place_wait_for_a_sync_begun_after_them(
        tmp_path: Path) -> None:
    # A read of one request, a read of several, and the receive a send wakes: each is
    # applied by its reader (no inbox) and answered only once a WAL sync that began after
    # the request was written has ended.
    engine = Engine.open(tmp_path / "data", fsync=True)
    syncs: list[tuple[float, float]] = []
    real_sync = engine.sync_wal

    def slow_sync() -> None:
        started = time.perf_counter()
        time.sleep(0.005)
        real_sync()
        syncs.append((started, time.perf_counter()))

    def synced_between(started: float, answered: float) -> bool:
        return any(started <= begun and ended <= answered for begun, ended in syncs)

    engine.sync_wal = slow_sync  # type: ignore[method-assign]
    try:
        async with running_server(tmp_path, engine=engine) as server:
            queued = count_queued_work(server)
            producer = await RawConnection.open(server.port)
            consumer = await RawConnection.open(server.port)
            await producer.call("create_queue", {"queue": "q"})
            with trio.fail_after(10):
                started = time.perf_counter()
                lone = await producer.call("send", {"queue": "q", "messages": ["lone"]})
                assert lone.error is None and synced_between(started, time.perf_counter())

                started = time.perf_counter()
                await producer.send_bytes(
                    _frame(11, "send", {"queue": "q", "messages": ["a"]})
                    + _frame(12, "send", {"queue": "q", "messages": ["b"]}))
                for request_id in (11, 12):
                    answer = await producer.response(request_id)
                    assert answer.error is None
                    assert synced_between(started, time.perf_counter())

                received = await consumer.call("receive", {"queue": "q", "max": 10})
                assert [m[0][1] for m in received.result["messages"]] == ["lone", "a", "b"]
                waiting = await consumer.send("receive", {"queue": "q", "wait": 5})
                await trio.sleep(0.05)  # the receive waits
                started = time.perf_counter()
                await producer.send("send", {"queue": "q", "messages": ["woke"]})
                woken = await consumer.response(waiting)
                assert [m[0][1] for m in woken.result["messages"]] == ["woke"]
                assert synced_between(started, time.perf_counter())
            assert queued() == 0
            await producer.aclose()
            await consumer.aclose()
    finally:
        engine.close()


@pytest.mark.slow
async def test_sigterm_answers_what_was_read_and_exits_zero(tmp_path: Path,
                                                            spawned: Any) -> None:
    process = spawned()
    connection = await RawConnection.open(process.port)
    await connection.call("create_queue", {"queue": "q"})
    waiting = await connection.send("receive", {"queue": "q", "wait": 25})
    sends = [await connection.send("send", {"queue": "q", "messages": [f"m{n}"]})
             for n in range(50)]
    await connection.response(sends[0])
    process.signal(signal.SIGTERM)
    with trio.fail_after(10):
        answered = {}
        while (event := await connection.next_event()) is not None:
            answered[event.id] = event
    assert answered[waiting].result is not None  # [] or the first message: never dropped
    acknowledged = [n for n, rid in enumerate(sends) if rid in answered or n == 0]
    code = await trio.to_thread.run_sync(process.wait)
    assert code == 0
    assert "stop" in process.events()
    restarted = spawned(data=tmp_path / "data")
    with trio.fail_after(10):
        async with AsyncClient.connect("127.0.0.1", restarted.port) as client:
            page = await client.peek("q", start=0, max=1000)
    bodies = {p.body for p in page.messages}
    assert {f"m{n}" for n in acknowledged} <= bodies | {
        d[0][1] for d in (answered[waiting].result or {}).get("messages", [])}


@pytest.mark.slow
def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path, spawned: Any) -> None:
    process = spawned()
    load = AckedLoad(process.port, "q")
    kill_under_load(process, load.producer, load.consumer, load.stop, load_s=1.5, join_s=10)
    assert len(load.acked_sent) > 100 and len(load.acked_deleted) > 10

    restarted = spawned(data=tmp_path / "data")
    load.assert_nothing_lost(restarted.port)
