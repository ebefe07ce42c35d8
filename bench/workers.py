"""What runs in the load generator's client processes: one function per kind of client,
started by ``loadgen.run_workers`` as ``target(index, barrier, *args)``. Each connects, waits
at the barrier (so all start together), runs its loop and returns its :class:`Recorder`.

They use the blocking :class:`~lamina.server.client.Client`, one request in flight per thread
(``inflight`` threads share one pipelined connection), except the paced w3 producer, which
uses :class:`~lamina.server.client.AsyncClient` so that its sends keep their schedule.
"""

from __future__ import annotations

import os
import queue as queue_module
import struct
import threading
from typing import Any, Callable

from lamina.engine.errors import LaminaError
from lamina.server.client import Client

from .loadgen import BenchError, Recorder, clock_s

__all__ = ["check_results", "consume_worker", "latency_consumer_worker",
           "paced_producer_worker", "produce_worker", "round_trip_worker", "share"]

_SEND_TIME = struct.Struct("<d")  # W3: CLOCK_MONOTONIC seconds at the start of each body
PINGS = 5000  # W4's first phase


def check_results(results: list[Any], what: str) -> None:
    errors = [r for r in results if isinstance(r, LaminaError)]
    if errors:
        raise BenchError(f"{what}: {len(errors)} entries failed, e.g. {errors[0]!r}")


def _threads(count: int, work: Callable[[int, Recorder], None], names: list[str]) -> Recorder:
    """Run ``work(thread_index, recorder)`` on ``count`` threads (1: on this one); -> their
    samples merged, each thread having recorded into its own Recorder."""
    recorders = [Recorder() for _ in range(count)]
    start = clock_s()
    for recorder in recorders:
        for name in names:
            recorder.start(name, start)
    if count == 1:
        work(0, recorders[0])
        return recorders[0]
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            work(index, recorders[index])
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    merged = recorders[0]
    for other in recorders[1:]:
        for name, series in other.series.items():
            for key in ("done", "latency_us", "messages"):
                merged.series[name][key].extend(series[key])
    return merged


def share(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def produce_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                   messages: int, batch: int, body_bytes: int, inflight: int) -> Recorder:
    """W1: send ``messages`` in batches of ``batch``."""
    body = os.urandom(body_bytes)
    with Client.connect(*address, timeout=30) as client:
        barrier.wait()

        def work(thread: int, recorder: Recorder) -> None:
            left = share(messages, inflight, thread)
            add = recorder.add
            while left > 0:
                count = min(batch, left)
                entries = [body] * count
                begin = clock_s()
                results = client.send(queue, entries)
                end = clock_s()
                add("send", end, end - begin, count)
                check_results(results, "send")
                left -= count

        return _threads(inflight, work, ["send"])


def consume_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                   batch: int, inflight: int) -> Recorder:
    """W2: receive up to ``batch``, delete them with one request, until the queue is empty."""
    with Client.connect(*address, timeout=30) as client:
        barrier.wait()

        def work(thread: int, recorder: Recorder) -> None:
            add = recorder.add
            while True:
                begin = clock_s()
                deliveries = client.receive(queue, max=batch, wait=0)
                if not deliveries:
                    return
                results = client.delete(queue, deliveries)
                end = clock_s()
                add("receive+delete", end, end - begin, len(deliveries))
                check_results(results, "delete")

        return _threads(inflight, work, ["receive+delete"])


def paced_producer_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                          rate: float, messages: int, body_bytes: int) -> Recorder:
    """W3 producer, open loop: one message per send, the i-th issued at start + i/rate
    whether or not earlier sends were answered (each is its own task on one pipelined
    AsyncClient connection), each carrying the time it was issued."""
    import trio

    from lamina.server.client import AsyncClient

    padding = os.urandom(max(body_bytes - _SEND_TIME.size, 0))
    recorder = Recorder()
    add = recorder.add

    async def send_one(client: AsyncClient) -> None:
        begin = clock_s()
        results = await client.send(queue, [_SEND_TIME.pack(begin) + padding])
        end = clock_s()
        add("send", end, end - begin)
        check_results(results, "send")

    async def produce() -> None:
        async with AsyncClient.connect(*address, timeout=30) as client:
            barrier.wait()  # nothing else runs in this process yet
            start = clock_s()
            recorder.start("send", start)
            async with trio.open_nursery() as nursery:
                for i in range(messages):
                    delay = start + i / rate - clock_s()
                    if delay > 0:
                        await trio.sleep(delay)
                    nursery.start_soon(send_one, client)

    trio.run(produce)
    return recorder


def latency_consumer_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                            messages: int, batch: int, deadline_s: float) -> Recorder:
    """W3 consumer: long-poll receive, note each message's end-to-end latency at once, and
    hand the receipts to a deleting thread (pipelined on the same connection)."""
    recorder = Recorder()
    receipts: queue_module.Queue[Any] = queue_module.Queue()
    failures: list[BaseException] = []

    with Client.connect(*address, timeout=30) as client:
        def delete_loop() -> None:
            try:
                while (batch_receipts := receipts.get()) is not None:
                    check_results(client.delete(queue, batch_receipts), "delete")
            except BaseException as exc:
                failures.append(exc)

        deleter = threading.Thread(target=delete_loop, daemon=True)
        deleter.start()
        barrier.wait()
        start = clock_s()
        recorder.start("end-to-end", start)
        add = recorder.add
        received = 0
        while received < messages and clock_s() - start < deadline_s and not failures:
            deliveries = client.receive(queue, max=batch, wait=1)
            now = clock_s()
            for delivery in deliveries:
                sent = _SEND_TIME.unpack_from(delivery.message.body)[0]
                add("end-to-end", now, now - sent)
            received += len(deliveries)
            if deliveries:
                receipts.put(deliveries)
        receipts.put(None)
        deleter.join(30)
    if failures:
        raise failures[0]
    if received < messages:
        raise BenchError(f"the consumer got {received} of {messages} messages in "
                         f"{deadline_s:.0f} s")
    return recorder


def round_trip_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                      messages: int, body_bytes: int) -> Recorder:
    """W4: ``messages`` sends of one message, each awaited; then receive 1 + delete 1 as
    many times. First, for scale, pings: the round trip of a request with no engine work."""
    body = os.urandom(body_bytes)
    recorder = Recorder()
    with Client.connect(*address, timeout=30) as client:
        barrier.wait()
        recorder.start("ping")
        add = recorder.add
        for _ in range(min(messages, PINGS)):
            begin = clock_s()
            client.ping()
            end = clock_s()
            add("ping", end, end - begin, 0)
        recorder.start("send")
        for _ in range(messages):
            begin = clock_s()
            results = client.send(queue, [body])
            end = clock_s()
            add("send", end, end - begin)
            check_results(results, "send")
        recorder.start("receive+delete")
        for _ in range(messages):
            begin = clock_s()
            deliveries = client.receive(queue, max=1, wait=0)
            if not deliveries:
                break
            results = client.delete(queue, deliveries)
            end = clock_s()
            add("receive+delete", end, end - begin, len(deliveries))
            check_results(results, "delete")
    return recorder
