"""The Python clients (DESIGN.md §5): connection errors, threads sharing a blocking client,
pipelined pairs (``delete_and_receive``), the lease keeper and the worker loop."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from lamina.engine.errors import InvalidArgument, LaminaError, QueueNotFound, StaleReceipt
from lamina.client import (
    AsyncClient,
    Client,
    Delivery,
    LaminaConnectionError,
    message,
)
from lamina.wire.framing import FrameReader
from tests.support.servers import running_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_errors_are_clear() -> None:
    with pytest.raises(LaminaConnectionError, match="cannot connect"):
        Client.connect("127.0.0.1", free_port(), timeout=2)
    error = LaminaConnectionError("x")
    assert isinstance(error, ConnectionError) and isinstance(error, LaminaError)


def test_server_going_away_fails_calls_in_flight(start_server: Any) -> None:
    server = start_server()
    client = Client.connect("127.0.0.1", server.port)
    client.create_queue("q")
    failures: list[BaseException] = []

    def wait_long() -> None:
        try:
            client.receive("q", wait=20)
        except BaseException as exc:
            failures.append(exc)

    waiter = threading.Thread(target=wait_long)
    waiter.start()
    time.sleep(0.2)
    server.call(lambda: [c.abort() for c in list(server.server.connections)])
    waiter.join(5)
    assert failures and isinstance(failures[0], LaminaConnectionError)
    with pytest.raises(LaminaConnectionError):
        client.ping()
    client.close()


def test_threads_share_one_blocking_client(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        got: list[Delivery] = []

        def consumer() -> None:
            got.extend(client.receive("q", wait=5))  # a long poll on the shared connection

        thread = threading.Thread(target=consumer)
        thread.start()
        time.sleep(0.1)
        ids = set()
        for n in range(20):  # meanwhile the main thread's calls go through
            ids.add(client.send("q", [f"m{n}"])[0].id)  # type: ignore[union-attr]
        thread.join(5)
        assert len(got) == 1 and got[0].id in ids
        with pytest.raises(QueueNotFound):
            client.peek("missing")


def test_message_builder() -> None:
    assert message(b"x") == b"x"
    assert message("x", priority=2, delay=1.5, attributes={"a": 1}, topic=None) == {
        1: "x", 2: {"a": 1}, 4: 2, 5: 1.5}


def test_a_delivery_decodes_its_record_when_first_read() -> None:
    from lamina.engine.records import Message
    from lamina.client.operations import _decode_delivery

    record = ["id-1", b"body", None, None, 8, 10, 10, b"m" * 16, None]
    lazy = _decode_delivery([record, b"receipt", 1, 11, 20])
    assert lazy._message is None  # nothing decoded until asked
    eager = Delivery(Message(*record), b"receipt", 1, 11, 20)
    assert lazy == eager and hash(lazy) == hash(eager) and repr(lazy) == repr(eager)
    assert (lazy.id, lazy.body, lazy.message.priority) == ("id-1", b"body", 8)
    older = _decode_delivery([["id-2", "text"], b"r", 2, 3, 4])  # fields only ever appended
    assert older.message == Message("id-2", "text", None, None, 8, 0, 0, b"", None)


@pytest.mark.slow
def test_lease_keeper_holds_a_slow_message_and_deletes_it(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client, \
            Client.connect("127.0.0.1", server.port) as rival:
        client.create_queue("q")
        client.send("q", [b"slow"])
        with client.lease_keeper("q", lease_s=1) as keeper:
            (delivery,) = client.receive("q", visibility_timeout=1)
            keeper.hold([delivery])
            deadline = time.monotonic() + 2.2  # over two leases
            while time.monotonic() < deadline:
                assert rival.receive("q", wait=0.3) == []  # never redelivered meanwhile
            assert keeper.receipt(delivery) != delivery.receipt  # extended, new receipt
            keeper.complete(delivery)
        assert rival.peek("q", start=0).messages == []  # deleted, hence gone
        assert not keeper.lost


@pytest.mark.slow
def test_process_handles_deletes_and_lets_failures_come_back(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        client.send("q", [b"ok1", b"boom", b"ok2"])
        seen: list[Any] = []

        def handler(delivery: Delivery) -> None:
            seen.append(delivery.body)
            if delivery.body == b"boom":
                raise RuntimeError("worker crashed")

        handled = client.process("q", handler, max=10, wait=0.2, lease_s=1, limit=2)
        assert handled == 2 and seen == [b"ok1", b"boom", b"ok2"]
        assert client.receive("q") == []  # the failed one is still leased...
        started = time.monotonic()
        again = client.receive("q", wait=3)  # ...and comes back within one short lease
        assert [d.body for d in again] == [b"boom"] and time.monotonic() - started < 1.5


async def test_async_lease_keeper_and_process(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            await client.send("q", [b"a", b"b"])
            seen: list[Any] = []

            async def handler(delivery: Delivery) -> None:
                seen.append(delivery.body)

            assert await client.process("q", handler, max=5, wait=0.1, limit=2) == 2
            assert seen == [b"a", b"b"]
            await client.send("q", [b"c"])
            async with client.lease_keeper("q", lease_s=1) as keeper:
                (delivery,) = await client.receive("q", visibility_timeout=1)
                keeper.hold([delivery])
                await keeper.extend_now()
                assert keeper.receipt(delivery) != delivery.receipt
                await keeper.release(delivery)
            assert [d.body for d in await client.receive("q")] == [b"c"]


async def test_async_client_errors_are_not_wrapped(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        with pytest.raises(QueueNotFound):
            async with AsyncClient.connect("127.0.0.1", server.port) as client:
                await client.get_queue("missing")
    with pytest.raises(LaminaConnectionError):
        async with AsyncClient.connect("127.0.0.1", free_port(), timeout=2):
            pass


async def test_async_client_sees_the_server_leave(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            for connection in list(server.connections):
                connection.abort()
            with trio.fail_after(5):
                with pytest.raises(LaminaConnectionError):
                    await client.receive("q", wait=10)


def test_many_threads_pipeline_over_one_blocking_client(start_server: Any) -> None:
    # Leader/follower: whichever thread reads hands the others their answers.
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        polled: list[Delivery] = []
        poller = threading.Thread(target=lambda: polled.extend(client.receive("q", wait=10)))
        poller.start()
        time.sleep(0.1)
        sent: list[list[str]] = [[] for _ in range(8)]

        def producer(index: int) -> None:
            for n in range(40):
                result = client.send("q", [f"{index}-{n}"])[0]
                sent[index].append(result.id)  # type: ignore[union-attr]

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        poller.join(10)
        ids = [message_id for chunk in sent for message_id in chunk]
        assert len(ids) == len(set(ids)) == 320
        assert len(polled) == 1 and polled[0].id in ids
        assert client.ping() > 0


async def test_async_client_frames_never_interleave(tmp_path: Path) -> None:
    # Large frames fill the socket buffer: a send that writes part of its frame at once must
    # finish it before any other task's frame, even when callers are cancelled meanwhile.
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("big", {"max_message_size": 1048576})
            bodies = {f"{n:03d}".encode() * 200_000 for n in range(12)}  # 600 kB each
            done: list[str] = []

            async def send(body: bytes) -> None:
                sent = await client.send("big", [body])
                done.append(sent[0].id)  # type: ignore[union-attr]

            async def send_and_give_up(body: bytes) -> None:
                with trio.move_on_after(0.001):
                    await client.send("big", [body])

            async with trio.open_nursery() as nursery:
                for body in bodies:
                    nursery.start_soon(send, body)
                    nursery.start_soon(send_and_give_up, body)
            assert len(done) == len(bodies)
            seen = set()
            while True:
                page = await client.receive("big", max=10, wait=0)
                if not page:
                    break
                seen.update(delivery.body for delivery in page)
            assert bodies <= seen  # every frame arrived whole
            assert await client.ping() > 0


def test_delete_and_receive_deletes_then_receives_in_one_write(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        client.send("q", [b"a", b"b", b"c"])
        nothing, first = client.delete_and_receive("q", [], max=2, wait=0)  # a plain receive
        assert nothing == [] and [d.body for d in first] == [b"a", b"b"]
        writes = _count_writes(client)
        results, following = client.delete_and_receive("q", first, max=2, wait=0)
        assert results == [None, None] and [d.body for d in following] == [b"c"]
        assert writes == [2]  # one write carried both requests
        results, following = client.delete_and_receive("q", following + first, max=2, wait=0)
        assert results[0] is None and isinstance(results[1], StaleReceipt)
        assert following == []
        assert client.get_queue("q").stats["messages"] == 0  # all three deleted

        # A long poll: the delete is answered at once, the receive when a message comes.
        client.send("q", [b"d"])
        (held,) = client.receive("q", wait=0)
        with Client.connect("127.0.0.1", server.port) as producer:
            sender = threading.Timer(0.3, lambda: producer.send("q", [b"e"]))
            sender.start()
            results, following = client.delete_and_receive("q", [held], wait=5)
            sender.join()  # the woken receive may be answered before the send that woke it
        assert results == [None] and [d.body for d in following] == [b"e"]


def _count_writes(client: Client) -> list[int]:
    """From now on, the number of request frames in each of ``client``'s socket writes."""
    writes: list[int] = []
    sock = client._sock

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(sock, name)

        def sendall(self, data: bytes) -> None:
            writes.append(len(_frames_in(data)))
            sock.sendall(data)

    client._sock = Recording()  # type: ignore[assignment]
    return writes


def _frames_in(data: bytes) -> list[bytes]:
    reader = FrameReader(len(data))
    reader.feed(data)
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_delete_and_receive_reports_both_outcomes_of_a_failure(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        client.send("q", [b"a", b"b"])
        (first,) = client.receive("q", wait=0)
        with pytest.raises(QueueNotFound) as both:
            client.delete_and_receive("missing", [first], wait=0)
        assert both.value.delete_results is None and both.value.deliveries is None
        # Only the receive fails: the delete took effect and its results ride on the error.
        with pytest.raises(InvalidArgument, match="max") as receive_failed:
            client.delete_and_receive("q", [first], max=0, wait=0)
        assert receive_failed.value.delete_results == [None]
        assert receive_failed.value.deliveries is None
        # Only the delete fails (too many receipts): the deliveries ride on its error.
        with pytest.raises(InvalidArgument, match="receipts") as delete_failed:
            client.delete_and_receive("q", [b"x"] * 1001, wait=0)
        assert delete_failed.value.delete_results is None
        assert [d.body for d in delete_failed.value.deliveries] == [b"b"]
        with pytest.raises(QueueNotFound) as no_queue:
            client.delete_and_receive("missing", [], wait=0)
        assert no_queue.value.delete_results == [] and no_queue.value.deliveries is None


def test_a_pipelined_request_that_cannot_be_sent_leaves_the_others_answered(
        start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        big = "x" * (client.greeting.max_frame_bytes + 1)
        answered: list[Any] = []
        with pytest.raises(InvalidArgument, match="max_frame"):
            client._call_many([("ping", {}), ("ping", {"pad": big})], answered.append)
        assert answered == []  # the error, not a partial result
        assert client.ping() > 0  # the first was answered: the connection is in step


async def test_async_delete_and_receive(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            await client.send("q", [b"a", b"b"])
            first = await client.receive("q", wait=0)
            results, following = await client.delete_and_receive("q", first, max=5, wait=0)
            assert results == [None] and [d.body for d in following] == [b"b"]
            with pytest.raises(InvalidArgument) as receive_failed:
                await client.delete_and_receive("q", following, max=0)
            assert receive_failed.value.delete_results == [None]
            assert await client.receive("q", wait=0) == []
            big = "x" * (client.greeting.max_frame_bytes + 1)
            with pytest.raises(InvalidArgument, match="max_frame"):
                await client._call_many([("ping", {}), ("ping", {"pad": big})], list)
            assert await client.ping() > 0


def test_process_deletes_each_batch_with_the_next_receive(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        client.send("q", [f"m{n}" for n in range(6)])
        writes = _count_writes(client)
        seen: list[Any] = []
        assert client.process("q", lambda d: seen.append(d.body), max=3, wait=0,
                              limit=6) == 6
        assert seen == [f"m{n}" for n in range(6)]
        # receive 3; delete 3 + receive 3 in one write; at the limit, delete the last 3.
        assert writes == [1, 2, 1]
        assert client.get_queue("q").stats["messages"] == 0
