"""Busy polling per reader (server/busypoll.py rule 6): the window after a read is chosen from
the gaps that followed that reader's earlier reads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import trio

from lamina.client import Client
from lamina.server.busypoll import EPOCH, BusyPoll

from tests.server.test_busypoll import US, FakeClocks, _poll_with, _run_window
from tests.support.servers import running_server

def _producer_then_consumer(clocks: FakeClocks, poll: BusyPoll, producer: Callable[[], None],
                            consumer: Callable[[], None], rounds: int) -> list[bool]:
    """``rounds`` of: the producer's read, 20 µs idle, the consumer's read, 400 µs idle (as
    W3's send and the long poll it wakes); -> whether each read armed polling, in turn."""
    armed = []
    for _ in range(rounds):
        for kick, gap_after_us in ((producer, 20), (consumer, 400)):
            kick()
            clocks.work(10 * US)
            armed.append(poll.polling)
            poll._polling = False  # the window itself is not run here
            clocks.idle(gap_after_us * US)
    return armed


def test_each_reader_polls_after_its_reads_only_when_the_next_read_came_soon() -> None:
    clocks = FakeClocks()
    poll = _poll_with(clocks)
    producer, consumer = poll.reader_kick(), poll.reader_kick()
    armed = _producer_then_consumer(clocks, poll, producer, consumer, 2 * EPOCH)
    assert armed[-2:] == [True, False]  # after the producer's read only
    assert poll.windows == EPOCH  # from its first epoch on, once a round


def test_reads_without_a_reader_share_one_policy() -> None:
    clocks = FakeClocks()
    poll = _poll_with(clocks)
    armed = _producer_then_consumer(clocks, poll, poll.kick, poll.kick, 2 * EPOCH)
    assert armed[-2:] == [True, True]  # half the gaps short: a window after every read


def test_a_read_caught_while_polling_makes_the_window_its_readers() -> None:
    clocks = FakeClocks()
    poll = _poll_with(clocks)
    producer, consumer = poll.reader_kick(), poll.reader_kick()
    _producer_then_consumer(clocks, poll, producer, consumer, 2 * EPOCH)
    producer()
    assert poll.polling

    def read() -> None:  # the consumer's reader, between two of the polling task's checkpoints
        consumer()
        clocks.work(10 * US)

    taken = _run_window(poll, clocks, [read])
    # The consumer's read was caught; the window then followed the consumer's policy (none):
    # it ended at the checkpoint that saw the read, neither polling 100 µs more nor taking
    # one more pass of the scheduler for nothing.
    assert poll.caught == 1 and taken == 1 and poll.wasted_cpu_s == 0


async def _pinged_in_rounds(tmp_path: Path, rounds: int, pause_s: float,
                            order: Callable[[int, list[Client]], list[Client]]) -> BusyPoll:
    """A server polling windows of up to 5 ms, three clients pinging it in ``rounds``, each
    ping right after the answer of the one before, in the ``order`` of each round, then a
    pause; -> the server's busy polling, its counters as it ended."""
    async with running_server(tmp_path, busy_poll_us=5000) as server:
        def clients() -> None:
            with Client.connect("127.0.0.1", server.port) as first, \
                    Client.connect("127.0.0.1", server.port) as second, \
                    Client.connect("127.0.0.1", server.port) as third:
                for round_ in range(rounds):
                    for client in order(round_, [first, second, third]):
                        client.ping()
                    time.sleep(pause_s)
        await trio.to_thread.run_sync(clients)
        await trio.sleep(0.05)
        return server.busy_poll


async def test_a_server_polls_after_the_reads_of_the_connection_that_is_answered_soon(
        tmp_path: Path) -> None:
    rounds = 2 * EPOCH + 16
    # The second right after the first's answer; rounds four windows apart.
    poll = await _pinged_in_rounds(tmp_path, rounds, 0.02, lambda _, clients: clients[:2])
    # A window after the first's reads (catching the second's), none after the second's:
    # one policy for both would poll on after every read of the second for nothing.
    assert poll.caught >= EPOCH // 2
    assert poll.wasted_cpu_s < rounds * 300 * US


def test_of_two_reads_after_a_third_in_either_order_only_the_second_is_not_polled_after(
        ) -> None:
    # Rule 7: W3's consumer re-issues its long poll on one connection and deletes on another,
    # in either order, after each send: a window pays after the first of the two, not after
    # the second. One policy per connection saw half of each, and polled after both.
    clocks = FakeClocks()
    poll = _poll_with(clocks)
    producer, receives, deletes = poll.reader_kick(), poll.reader_kick(), poll.reader_kick()
    armed: list[tuple[bool, bool, bool]] = []
    for round_ in range(6 * EPOCH):
        first, second = (receives, deletes) if round_ % 2 else (deletes, receives)
        after = []
        for kick, gap_after_us in ((producer, 20), (first, 20), (second, 400)):
            kick()
            clocks.work(10 * US)
            after.append(poll.polling)
            poll._polling = False  # the window itself is not run here
            clocks.idle(gap_after_us * US)
        armed.append((after[0], after[1], after[2]))
    assert armed[-2:] == [(True, True, False)] * 2


async def test_a_server_does_not_poll_after_the_last_of_a_consumers_two_reads(
        tmp_path: Path) -> None:
    rounds = 4 * EPOCH + 16

    def order(round_: int, clients: list[Client]) -> list[Client]:
        producer, receives, deletes = clients  # the consumer's two, in either order
        return [producer, receives, deletes] if round_ % 2 else [producer, deletes, receives]

    poll = await _pinged_in_rounds(tmp_path, rounds, 0.01, order)  # two windows apart
    # Windows after the producer's reads and after the first of the other two catch the
    # next read; none follows the second: one policy per connection (half its reads
    # followed by a short gap, half by a long one) polled a window of 1.9 ms after it.
    assert poll.caught >= EPOCH
    assert poll.wasted_cpu_s < rounds * 500 * US
