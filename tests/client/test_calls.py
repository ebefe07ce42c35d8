"""One blocking client's calls: a thread calling alone takes the short path (its own answer,
read and returned as it is), and a second thread calling meanwhile still gets its answer."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest

from lamina.client import Client, Delivery
from lamina.engine.errors import QueueNotFound
from lamina.engine.results import Sent


def test_a_reader_whose_own_answer_comes_alone_hands_the_reading_to_a_waiting_thread(
        start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client, \
            Client.connect("127.0.0.1", server.port) as producer:
        client.create_queue("first")
        client.create_queue("second")
        first: list[list[Delivery]] = []
        second: list[list[Delivery]] = []
        reader = threading.Thread(target=lambda: first.append(client.receive("first", wait=0.3)))
        reader.start()
        time.sleep(0.1)  # the reader is reading the socket for everyone
        waiter = threading.Thread(target=lambda: second.append(client.receive("second", wait=5)))
        waiter.start()
        reader.join(5)
        assert first == [[]]  # its empty answer came alone, while the waiter slept
        time.sleep(0.2)
        producer.send("second", [b"late"])  # no call of `client` reads this answer for it
        waiter.join(5)
        assert not waiter.is_alive()
        assert [[delivery.body for delivery in batch] for batch in second] == [[b"late"]]


def test_calls_from_several_threads_each_get_their_own_answer(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        failures: list[BaseException] = []
        calls = [0] * 4

        def caller(index: int) -> None:
            body = f"thread {index}".encode()
            digest = hashlib.md5(body).digest()
            try:
                for n in range(60):
                    if n % 3 == 0:
                        assert client.ping() > 0
                    else:  # a send of index + 1 messages answers with index + 1 entries
                        results = client.send("q", [body] * (index + 1))
                        assert len(results) == index + 1
                        assert all(type(r) is Sent and r.md5 == digest for r in results)
                    calls[index] += 1
            except BaseException as exc:
                failures.append(exc)

        alone = threading.Thread(target=caller, args=(0,))
        alone.start()  # calls alone for a while, then the others join in
        time.sleep(0.05)
        others = [threading.Thread(target=caller, args=(i,)) for i in range(1, 4)]
        for thread in others:
            thread.start()
        for thread in [alone, *others]:
            thread.join(30)
        assert not failures and calls == [60] * 4
        deliveries = client.receive("q", max=1000)
        assert sorted(delivery.body for delivery in deliveries) == sorted(
            f"thread {i}".encode() for i in range(4) for n in range(60) if n % 3
            for _ in range(i + 1))


def test_an_error_answer_on_the_short_path_raises_and_the_next_call_goes_through(
        start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        for _ in range(3):
            with pytest.raises(QueueNotFound):
                client.get_queue("missing")
            assert client.ping() > 0
