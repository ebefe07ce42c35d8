"""What runs in the load generator's client processes: one function per kind of client,
started by ``loadgen.run_workers`` as ``target(index, barrier, *args)``. Each connects, waits
at the barrier (so all start together), runs its loop and returns its :class:`Recorder`.

They use the blocking :class:`~lamina.client.Client`, one request in flight per thread
(``inflight`` threads share one pipelined connection), except the paced w3 producer, whose
sends must keep their schedule whatever the answers: it drives the clients' own sans-IO codec
(:class:`~lamina.wire.protocol.ClientConnection`) over a plain socket from one thread, which
costs a fraction of the CPU of an ``AsyncClient`` task per send (the producer shares the two
cores with the server it measures).
"""

from __future__ import annotations

import os
import queue as queue_module
import select
import socket
import struct
import threading
from typing import Any, Callable

from lamina.engine.errors import LaminaError, error_from_wire
from lamina.client import Client
from lamina.wire.protocol import ClientConnection, Greeting, Response

from .loadgen import BenchError, Recorder, clock_s

__all__ = ["check_results", "consume_worker", "latency_consumer_worker",
           "latency_loop", "paced_loop", "paced_producer_worker", "produce_worker", "round_trip_worker", "share"]

SEND_TIME = struct.Struct("<d")  # W3: CLOCK_MONOTONIC seconds at the start of each body
PINGS = 5000  # W4's first phase
_PRODUCER_READ_BYTES = 64 * 1024  # W3 producer: bytes asked of its socket per read


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
                   batch: int, inflight: int, sequential: bool) -> Recorder:
    """W2: receive up to ``batch`` and delete them with one request, until the queue is empty.
    Each batch's delete goes out with the next receive (``Client.delete_and_receive``: one
    round trip per batch); ``sequential``: receive, then delete, two round trips per batch. A
    sample is one batch, from the request that received it to the answer of its delete."""
    with Client.connect(*address, timeout=30) as client:
        barrier.wait()

        def work(thread: int, recorder: Recorder) -> None:
            add = recorder.add
            if sequential:
                while True:
                    begin = clock_s()
                    deliveries = client.receive(queue, max=batch, wait=0)
                    if not deliveries:
                        return
                    results = client.delete(queue, deliveries)
                    end = clock_s()
                    add("receive+delete", end, end - begin, len(deliveries))
                    check_results(results, "delete")
            begin = clock_s()
            deliveries = client.receive(queue, max=batch, wait=0)
            while deliveries:
                results, following = client.delete_and_receive(queue, deliveries, max=batch,
                                                               wait=0)
                end = clock_s()
                add("receive+delete", end, end - begin, len(deliveries))
                check_results(results, "delete")
                begin, deliveries = end, following

        return _threads(inflight, work, ["receive+delete"])


def paced_producer_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                          rate: float, messages: int, body_bytes: int) -> Recorder:
    """W3 producer, open loop: one message per send, the i-th written at start + i/rate
    whether or not earlier sends were answered, each carrying the time it was issued. One
    thread writes each send when due and reads answers while it waits (see the module
    docstring); a send's latency is from just before its encoding to its answer's parsing."""
    padding = os.urandom(max(body_bytes - SEND_TIME.size, 0))
    recorder = Recorder()
    add = recorder.add
    proto = ClientConnection()
    issued: dict[int, float] = {}  # request id -> when its send began
    with socket.create_connection(address, timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def read_answers() -> int:
            data = sock.recv(_PRODUCER_READ_BYTES)
            if not data:
                raise BenchError("the server closed the producer's connection")
            answered = 0
            for event in proto.receive_data(data):
                if type(event) is Greeting:
                    continue
                if type(event) is not Response or event.id == 0:
                    raise BenchError(f"producer: the server broke the protocol: {event!r}")
                end = clock_s()
                add("send", end, end - issued.pop(event.id))
                if event.error is not None:
                    raise error_from_wire(event.error)
                assert event.result is not None
                check_results([error_from_wire(r) if type(r) is dict else r
                               for r in event.result["results"]], "send")
                answered += 1
            return answered

        def send_one() -> None:
            begin = clock_s()
            request_id, frame = proto.encode_request(
                "send", {"queue": queue, "messages": [SEND_TIME.pack(begin) + padding]})
            issued[request_id] = begin
            sock.sendall(frame)

        while proto.greeting is None:
            read_answers()
        barrier.wait()
        paced_loop(sock, rate, messages, send_one, read_answers, recorder)
    return recorder


def paced_loop(sock: socket.socket, rate: float, messages: int, send_one: Callable[[], None],
               read_answers: Callable[[], int], recorder: Recorder) -> None:
    """W3's open loop, for any system's producer: ``send_one()`` the i-th message at start +
    i/rate, and between sends ``read_answers()`` (-> how many it read) whenever ``sock`` is
    readable, until all ``messages`` are answered."""
    start = clock_s()
    recorder.start("send", start)
    sent = answered = 0
    while answered < messages:
        now = clock_s()
        due = start + sent / rate
        if sent < messages and now >= due:
            send_one()
            sent += 1
            continue
        wait_s = due - now if sent < messages else 30.0
        readable, _, _ = select.select([sock], [], [], wait_s)
        if readable:
            answered += read_answers()
        elif sent == messages:
            raise BenchError(f"producer: {messages - answered} sends unanswered for 30 s")


def latency_consumer_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                            messages: int, batch: int, deadline_s: float) -> Recorder:
    """W3 consumer: long-poll receive, note each message's end-to-end latency at once, and
    hand the receipts to a deleting thread. The deletes go over a connection of their own:
    on a shared one a receive's answer could be read by the deleting thread and handed over,
    a thread switch on the path being measured."""
    with Client.connect(*address, timeout=30) as client, \
            Client.connect(*address, timeout=30) as deleting:
        def receive() -> list[tuple[bytes, Any]]:
            return [(d.message.body, d) for d in client.receive(queue, max=batch, wait=1)]

        def delete(receipts: list[Any]) -> None:
            check_results(deleting.delete(queue, receipts), "delete")

        return latency_loop(barrier, messages, deadline_s, receive, delete)


def latency_loop(barrier: Any, messages: int, deadline_s: float,
                 receive: Callable[[], list[tuple[bytes, Any]]],
                 delete: Callable[[list[Any]], None]) -> Recorder:
    """W3's consumer loop, for any system's consumer: ``receive()`` (a long poll: -> (body,
    receipt) pairs) until ``messages`` came or ``deadline_s`` passed, each body's send time
    turned into an end-to-end latency at once, and the receipts of each batch handed to
    ``delete`` on a thread of its own (with a connection of its own)."""
    recorder = Recorder()
    receipts: queue_module.Queue[list[Any] | None] = queue_module.Queue()
    failures: list[BaseException] = []

    def delete_loop() -> None:
        try:
            while (batch_receipts := receipts.get()) is not None:
                delete(batch_receipts)
        except BaseException as exc:
            failures.append(exc)

    deleter = threading.Thread(target=delete_loop, daemon=True)
    deleter.start()
    barrier.wait()
    start = clock_s()
    recorder.start("end-to-end", start)
    add = recorder.add
    received = 0
    try:
        while received < messages and clock_s() - start < deadline_s and not failures:
            deliveries = receive()
            now = clock_s()
            for body, _ in deliveries:
                add("end-to-end", now, now - SEND_TIME.unpack_from(body)[0])
            received += len(deliveries)
            if deliveries:
                receipts.put([receipt for _, receipt in deliveries])
    finally:
        receipts.put(None)
        deleter.join(30)
    if failures:
        raise failures[0]
    if received < messages:
        raise BenchError(f"the consumer got {received} of {messages} messages in "
                         f"{deadline_s:.0f} s")
    return recorder


def round_trip_worker(index: int, barrier: Any, address: tuple[str, int], queue: str,
                      messages: int, body_bytes: int, poll_us: int) -> Recorder:
    """W4: ``messages`` sends of one message, each awaited; then receive 1 + delete 1 as
    many times. First, for scale, pings: the round trip of a request with no engine work.
    ``poll_us``: the client's ``busy_poll_us``."""
    body = os.urandom(body_bytes)
    recorder = Recorder()
    with Client.connect(*address, timeout=30, busy_poll_us=poll_us) as client:
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
