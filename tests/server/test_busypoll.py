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
from lamina.client import Client
from lamina.server.config import ConfigError, ServerConfig

from tests.support.servers import running_server


async def _until(condition: Any) -> None:
    with trio.fail_after(1):
        while not condition():
            await trio.sleep(0.001)  # idle in between: a task spinning is work (rule 3)


async def _settled() -> None:
    """Long enough for the polling task to see the loop idle (a few checkpoints)."""
    await trio.sleep(0.005)


async def test_a_read_after_a_long_sleep_does_not_poll() -> None:
    poll = BusyPoll(0.05)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.run)
        await trio.sleep(0.01)
        poll.kick()  # the first read: nothing came within the window before it
        for _ in range(5):
            assert not poll.polling
            await trio.sleep(0.002)
        await trio.sleep(0.06)
        poll.kick()  # again, after more than the window asleep
        await _settled()
        assert not poll.polling and poll.windows == 0
        nursery.cancel_scope.cancel()


async def test_a_read_within_the_window_of_going_idle_polls_for_the_window() -> None:
    window = 0.1  # long beside the scheduler's delays on a loaded machine
    poll = BusyPoll(window)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.run)
        poll.kick()
        await _settled()  # idle now, not polling
        assert not poll.polling
        poll.kick()  # within the window of going idle: requests keep coming
        await _until(lambda: poll.polling)
        begun = trio.current_time()
        await trio.sleep(0.2 * window)  # other tasks run while it polls (rule 3)
        assert trio.current_time() - begun < 0.8 * window and poll.polling
        poll.kick()  # a read while polling: the window starts again once idle
        await trio.sleep(0.6 * window)
        assert poll.polling
        await _until(lambda: not poll.polling)  # a window without a read: asleep again
        assert trio.current_time() - begun >= window
        assert poll.windows == 1 and poll.caught == 1
        poll.kick()  # after a whole window without a read: not armed
        await _settled()
        assert not poll.polling and poll.windows == 1
        nursery.cancel_scope.cancel()


async def test_windows_that_catch_nothing_back_off_until_one_catches_again() -> None:
    from lamina.server.busypoll import BACK_OFF_MISSES, PROBE_EVERY
    poll = BusyPoll(0.02)

    async def burst(reads: int) -> None:
        """A read after a long sleep, then ``reads - 1`` more in quick succession (the second
        is a chance to arm polling), then a long sleep."""
        poll.kick()
        for _ in range(reads - 1):
            await trio.sleep(0.0005)
            poll.kick()
        await _until(lambda: not poll.polling)
        await trio.sleep(0.03)  # more than the window

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.run)
        for _ in range(BACK_OFF_MISSES):
            await burst(2)  # armed by the second read; the window catches nothing
        assert poll.windows == BACK_OFF_MISSES and poll.caught == 0
        for _ in range(PROBE_EVERY - 1):  # backing off: these chances are not taken
            await burst(2)
        assert poll.windows == BACK_OFF_MISSES
        await burst(4)  # the probe: armed, and this time it catches two reads
        assert poll.windows == BACK_OFF_MISSES + 1 and poll.caught == 2
        await burst(2)  # it paid: armed again at the first chance
        assert poll.windows == BACK_OFF_MISSES + 2
        nursery.cancel_scope.cancel()


async def test_the_window_counts_from_idle_not_from_the_read() -> None:
    poll = BusyPoll(0.02)

    async def request_work() -> None:
        for _ in range(6):  # 60 ms of work in 10 ms steps, three times the window
            end = time.thread_time() + 0.01
            while time.thread_time() < end:
                pass
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll.run)
        poll.kick()
        await _settled()
        poll.kick()  # armed (5 ms after going idle)
        assert poll.polling
        nursery.start_soon(request_work)
        await trio.sleep(0.04)
        assert poll.polling  # 40 ms after the read, but the server was busy
        await _until(lambda: not poll.polling)
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


async def test_round_trips_poll_and_sparse_requests_do_not(tmp_path: Path) -> None:
    async with running_server(tmp_path, busy_poll_us=5000) as server:
        def sparse() -> None:
            with Client.connect("127.0.0.1", server.port) as client:
                for _ in range(10):
                    time.sleep(0.03)  # six windows apart
                    client.ping()
        await trio.to_thread.run_sync(sparse)
        assert server.busy_poll.windows <= 1  # (connecting may read twice in a row)

        def round_trips() -> None:
            with Client.connect("127.0.0.1", server.port) as client:
                for _ in range(200):
                    client.ping()
        await trio.to_thread.run_sync(round_trips)
        await trio.sleep(0.05)  # the last window ends
        assert server.busy_poll.caught >= 100  # each a wake-up saved


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
