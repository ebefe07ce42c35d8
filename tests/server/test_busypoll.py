"""Busy polling (server/busypoll.py) and the blocking client's ``busy_poll_us``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Sequence

import pytest
import trio

from lamina.engine.errors import InvalidArgument
from lamina.server.busypoll import (
    EPOCH,
    MAX_BUSY_POLL_US,
    TIE_SLACK,
    BusyPoll,
    PollPolicy,
)
from lamina.client import Client
from lamina.server.config import ConfigError, ServerConfig

from tests.support.servers import running_server


US = 1e-6


class FakeClocks:
    """Wall time and the loop's CPU time, moved by the test."""

    def __init__(self) -> None:
        self.wall_s = 1.0
        self.cpu_s = 0.0

    def idle(self, seconds: float) -> None:
        self.wall_s += seconds

    def work(self, seconds: float) -> None:
        self.wall_s += seconds
        self.cpu_s += seconds


def _fed(max_window_us: float, gaps_us: Sequence[float]) -> PollPolicy:
    policy = PollPolicy(max_window_us * US)
    for gap in gaps_us:
        policy.observe(gap * US)
    return policy


def _window_us(policy: PollPolicy) -> float:
    return round(policy.window_s / US, 3)


def test_no_window_is_chosen_before_the_first_epoch() -> None:
    policy = _fed(100, [30] * (EPOCH - 1))
    assert _window_us(policy) == 0
    policy.observe(30 * US)
    assert _window_us(policy) > 0


def test_round_trips_poll_for_the_whole_window_while_it_catches_every_gap() -> None:
    # Every window from 37.5 µs catches 30 µs gaps at the same cost: the longest is taken.
    policy = _fed(100, [30] * EPOCH)
    assert policy.cost_s(37.5 * US) == policy.cost_s(100 * US) < policy.cost_s(25 * US)
    assert _window_us(policy) == 100
    assert _window_us(_fed(100, [99] * EPOCH)) == 100
    assert _window_us(_fed(800, [30] * EPOCH)) == 800


def test_sparse_traffic_is_not_polled_for() -> None:
    assert _window_us(_fed(100, [5_000] * EPOCH)) == 0
    assert _window_us(_fed(100, [101] * EPOCH)) == 0


def test_short_gaps_among_long_ones_get_a_short_window() -> None:
    # Half the gaps 10 µs (a consumer's next request), half 1 ms (the next message): a short
    # window catches the short ones and wastes little on each long one, which costs less
    # than a wake-up per short gap; the full window would cost more than sleeping.
    policy = _fed(100, [10, 1_000] * (EPOCH // 2))
    cheapest = policy.cost_s(12.5 * US)
    assert cheapest < policy.cost_s(0) < policy.cost_s(100 * US)
    assert policy.cost_s(37.5 * US) <= cheapest * (1 + TIE_SLACK) < policy.cost_s(50 * US)
    assert _window_us(policy) == 37.5


def test_of_windows_costing_about_the_least_the_longest_is_taken() -> None:
    # Most gaps 10 µs, a tail of 60 µs ones, and long gaps: catching the tail costs a little
    # more CPU (the long gaps are polled longer for nothing), and each tail gap caught is a
    # wake-up's latency saved.
    policy = _fed(100, [10] * 16 + [60] * 4 + [1_000] * 12)
    cheapest = policy.cost_s(12.5 * US)
    assert cheapest < policy.cost_s(62.5 * US) <= cheapest * (1 + TIE_SLACK)
    assert policy.cost_s(75 * US) > cheapest * (1 + TIE_SLACK)
    assert _window_us(policy) == 62.5


def test_a_window_that_rarely_catches_is_not_polled() -> None:
    # One gap in four within the window, late in it: polling would cost more than the
    # wake-ups it saves.
    assert _window_us(_fed(100, [90, 500, 500, 500] * (EPOCH // 4))) == 0


def test_recent_traffic_outweighs_older_traffic() -> None:
    policy = _fed(100, [30] * EPOCH)
    assert _window_us(policy) == 100
    for gap in [5_000] * EPOCH:  # traffic turned sparse
        policy.observe(gap * US)
    assert _window_us(policy) == 0
    for gap in [30] * EPOCH:  # and back: polled for again at once
        policy.observe(gap * US)
    assert _window_us(policy) > 0
    for gap in [30] * (4 * EPOCH):  # the sparse spell forgotten
        policy.observe(gap * US)
    assert _window_us(policy) == 100


def _poll_with(clocks: FakeClocks, max_window_us: float = 100) -> BusyPoll:
    return BusyPoll(max_window_us * US, clock=lambda: clocks.wall_s,
                    cpu_clock=lambda: clocks.cpu_s)


def test_a_gap_is_the_wall_time_since_the_last_read_less_the_loop_cpu_time() -> None:
    clocks = FakeClocks()
    poll = _poll_with(clocks)
    for _ in range(EPOCH):
        clocks.work(20 * US)  # the request's work is no idle time
        clocks.idle(90 * US)
        assert not poll.polling
        poll.kick()
    assert _window_us(poll.policy) == 100  # 90 µs gaps, not 110 (longer than any window)
    assert poll.polling and poll.windows == 1  # armed by the read that chose the window


def test_reads_while_busy_are_no_gaps() -> None:
    clocks = FakeClocks()
    poll = _poll_with(clocks)
    for _ in range(3 * EPOCH):
        clocks.work(50 * US)
        poll.kick()
    assert _window_us(poll.policy) == 0 and poll.windows == 0


def _polling(clocks: FakeClocks, gap_us: float) -> BusyPoll:
    """A poll whose policy chose a window from round trips ``gap_us`` apart."""
    poll = _poll_with(clocks)
    for _ in range(EPOCH):
        poll.policy.observe(gap_us * US)
    return poll


def _run_window(poll: BusyPoll, clocks: FakeClocks, steps: list[Any]) -> int:
    """Run one polling window, its checkpoints doing ``steps`` in turn (None, and every
    checkpoint after them: a scheduler pass of 5 µs with nothing to run); -> checkpoints
    taken."""
    taken = 0

    async def checkpoint() -> None:
        nonlocal taken
        step = steps[taken] if taken < len(steps) else None
        taken += 1
        if step is None:
            clocks.work(5 * US)
        else:
            step()

    coroutine = poll.poll_window(checkpoint)
    with pytest.raises(StopIteration):
        coroutine.send(None)  # the fake checkpoint never suspends: one call runs it all
    assert not poll.polling
    return taken


def test_a_window_ends_after_its_length_of_idle_passes() -> None:
    clocks = FakeClocks()
    poll = _polling(clocks, 30)  # window 100 µs
    assert _run_window(poll, clocks, []) == 20  # 20 passes of 5 µs
    assert poll.cpu_s == pytest.approx(100 * US)
    assert poll.caught == 0


def test_work_between_checkpoints_pushes_the_window_back() -> None:
    clocks = FakeClocks()
    poll = _polling(clocks, 30)
    steps = [None, None, lambda: clocks.work(200 * US)]  # other tasks ran 200 µs
    assert _run_window(poll, clocks, steps) == 21  # one pass more than the window's 20
    assert poll.cpu_s == pytest.approx(100 * US)  # the work is not polling


def test_a_read_while_polling_is_caught_and_restarts_the_window() -> None:
    clocks = FakeClocks()
    poll = _polling(clocks, 30)
    poll.kick()  # the read that armed polling
    assert poll.polling

    def read() -> None:  # the reader's task, between two of the polling task's checkpoints
        poll.kick()
        clocks.work(60 * US)

    steps: list[Any] = [None, None, None, None, read]  # the read 20 µs into the window
    assert _run_window(poll, clocks, steps) == 5 + 20
    assert poll.caught == 1


def test_reads_long_after_the_window_ends_stop_polling() -> None:
    clocks = FakeClocks()
    poll = _polling(clocks, 30)
    for _ in range(EPOCH):  # each read 400 µs after the server went idle
        clocks.idle(400 * US)
        poll.kick()
        clocks.work(10 * US)  # its work
        if poll.polling:
            _run_window(poll, clocks, [])  # polled for nothing
    assert _window_us(poll.policy) == 0 and not poll.polling
    clocks.idle(400 * US)
    poll.kick()
    assert not poll.polling


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
