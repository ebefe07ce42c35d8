"""Long work in chunks over a real socket: a big redrive lets other connections' requests in
between its chunks, keeps its own connection's later requests behind it, and answers what
one pass would (counts only, no timing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import lamina.engine.deadletter as deadletter
from lamina.engine import Engine
from tests.support.servers import RawConnection, running_server

DEAD = 2_000


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletter, "REDRIVE_CHUNK", 50)  # 2,000 dead letters: 40 chunks


def engine_with_dead_letters(data: Path) -> Engine:
    engine = Engine.open(data)
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 1}})
    for start in range(0, DEAD, 1000):
        engine.send("src", [b"m%d" % n for n in range(start, start + 1000)])
    while delivered := engine.receive("src", max=1000):
        engine.dead("src", [d.receipt for d in delivered])
    return engine


async def test_a_big_redrive_lets_other_connections_in_between_its_chunks(
        tmp_path: Path, small_chunks: None) -> None:
    engine = engine_with_dead_letters(tmp_path / "data")
    try:
        async with running_server(tmp_path, engine=engine) as server:
            mover = await RawConnection.open(server.port)
            bystander = await RawConnection.open(server.port)
            answered_meanwhile = 0
            redrive = await mover.send("redrive", {"queue": "dlq", "max": DEAD})
            done = trio.Event()

            async def wait_for_redrive() -> Any:
                result = await mover.response(redrive)
                done.set()
                return result

            async with trio.open_nursery() as nursery:
                outcome: list[Any] = []
                nursery.start_soon(lambda: _keep(outcome, wait_for_redrive()))
                while not done.is_set():
                    ping = await bystander.call("ping")
                    assert ping.error is None
                    if not done.is_set():
                        answered_meanwhile += 1
            assert outcome[0].error is None
            assert outcome[0].result == {"moved": DEAD, "skipped": 0}
            assert answered_meanwhile >= 1
            await mover.aclose()
            await bystander.aclose()
    finally:
        engine.close()


async def _keep(outcome: list[Any], waiting: Any) -> None:
    outcome.append(await waiting)


async def test_requests_after_a_redrive_on_its_connection_see_it_done(
        tmp_path: Path, small_chunks: None) -> None:
    engine = engine_with_dead_letters(tmp_path / "data")
    try:
        async with running_server(tmp_path, engine=engine) as server:
            connection = await RawConnection.open(server.port)
            redrive = await connection.send("redrive", {"queue": "dlq", "max": DEAD})
            after = await connection.send("get_queue", {"queue": "src"})
            later = await connection.send("redrive", {"queue": "dlq", "dry_run": True})
            first = await connection.next_event()
            assert first.id == redrive and first.result == {"moved": DEAD, "skipped": 0}
            stats = (await connection.response(after)).result["stats"]
            assert stats["tags"]["default"]["active"] == DEAD
            assert (await connection.response(later)).result == {"moved": 0, "skipped": 0}
            await connection.aclose()
    finally:
        engine.close()


async def test_a_redrive_running_at_shutdown_is_finished_and_answered(
        tmp_path: Path, small_chunks: None) -> None:
    engine = engine_with_dead_letters(tmp_path / "data")
    try:
        async with running_server(tmp_path, engine=engine) as server:
            connection = await RawConnection.open(server.port)
            redrive = await connection.send("redrive", {"queue": "dlq", "max": DEAD})
            await connection.call("ping")  # the redrive has begun
            server.request_stop()
            response = await connection.response(redrive)
            assert response.result == {"moved": DEAD, "skipped": 0}
    finally:
        engine.close()
