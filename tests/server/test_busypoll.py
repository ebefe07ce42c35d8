"""Busy polling (server/busypoll.py) and the blocking client's ``busy_poll_us``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from lamina.engine.errors import InvalidArgument
from lamina.server.busypoll import MAX_BUSY_POLL_US, BusyPoll
from lamina.server.client import Client
from lamina.server.config import ConfigError, ServerConfig

from support import running_server


async def _until(condition: Any) -> None:
    with trio.fail_after(1):
        while not condition():
            await trio.sleep(0)


async def test_polls_only_within_the_window_of_the_last_kick() -> None:
    poll = BusyPoll(0.05)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.run)
        await trio.sleep(0.01)
        assert not poll.polling  # nothing read yet: asleep
        poll.kick()
        await _until(lambda: poll.polling)
        begun = trio.current_time()
        await trio.sleep(0.01)  # other tasks run while it polls (rule 2)
        assert trio.current_time() - begun < 0.04
        assert poll.polling
        poll.kick()  # a later read extends the window
        await trio.sleep(0.03)
        assert poll.polling
        await _until(lambda: not poll.polling)  # the window passed: asleep again
        assert trio.current_time() - begun >= 0.05
        nursery.cancel_scope.cancel()


async def test_a_zero_window_never_polls() -> None:
    poll = BusyPoll(0)
    with trio.fail_after(1):
        await poll.run()  # returns at once
    poll.kick()
    assert not poll.polling


def test_the_window_is_checked() -> None:
    for bad in (-1, MAX_BUSY_POLL_US + 1):
        with pytest.raises(ConfigError, match="--busy-poll-us"):
            ServerConfig(busy_poll_us=bad).check()
    ServerConfig(busy_poll_us=0).check()
    ServerConfig(busy_poll_us=MAX_BUSY_POLL_US).check()


@pytest.mark.parametrize("window_us", [0, 200])
async def test_a_server_polling_or_not_serves_and_idles(tmp_path: Path, window_us: int) -> None:
    async with running_server(tmp_path, busy_poll_us=window_us) as server:
        def rounds() -> None:
            with Client.connect("127.0.0.1", server.port) as client:
                client.create_queue("q")
                for index in range(200):
                    client.send("q", [b"%d" % index])
                assert len(client.receive("q", max=10)) == 10
        await trio.to_thread.run_sync(rounds)
        await trio.sleep(0.05)
        assert not server.busy_poll.polling  # no traffic: the server sleeps


def test_client_busy_poll_us_is_checked(start_server: Any) -> None:
    server = start_server()
    for bad in (-1, MAX_BUSY_POLL_US + 1, 1.5, True, "100"):
        with pytest.raises(InvalidArgument, match="busy_poll_us"):
            Client.connect("127.0.0.1", server.port, busy_poll_us=bad)


def test_a_polling_client_gets_quick_and_slow_answers(start_server: Any) -> None:
    """Answers within the window come from polling; a long poll outlasts the window and the
    client sleeps until its answer; threads sharing the client still get their own."""
    server = start_server()
    with Client.connect("127.0.0.1", server.port, busy_poll_us=500) as client:
        client.create_queue("q")
        client.send("q", [b"now"])
        assert [d.body for d in client.receive("q", max=1)] == [b"now"]
        begun = time.monotonic()
        assert client.receive("q", max=1, wait=0.3) == []  # answered after the window
        assert time.monotonic() - begun >= 0.25

        errors: list[BaseException] = []

        def worker(index: int) -> None:
            try:
                for round_ in range(50):
                    body = b"%d-%d" % (index, round_)
                    results = client.send("q", [body])
                    assert results[0].md5 is not None
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        stats = client.get_queue("q").stats
        assert stats is not None and stats["messages"] == 201  # and "now", received
