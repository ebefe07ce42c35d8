"""Waiting receives woken by a request answered in place (applier.py, receives.py): the
receives a send wakes are answered at once, before the send, with the arguments their
receive was checked with, counted in the metrics like any answer."""

from __future__ import annotations

import struct
from pathlib import Path

import cbor2
import trio

from tests.support.servers import RawConnection, running_server


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


async def waiting_receive(connection: RawConnection, **args: object) -> int:
    """Send a receive with ``wait`` 10 and give the server time to read it (it then waits,
    after the waits begun before it)."""
    request_id = await connection.send("receive", {"queue": "q", "wait": 10, **args})
    await trio.sleep(0.03)
    return request_id


async def test_a_lone_send_answers_the_receive_it_woke_on_another_connection_first(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        consumer = await RawConnection.open(server.port)
        producer = await RawConnection.open(server.port)
        await producer.call("create_queue", {"queue": "q"})
        waiting = await waiting_receive(consumer, max=16)
        sent = await producer.call("send", {"queue": "q", "messages": [b"one"]})
        assert sent.error is None
        woken = await consumer.response(waiting)
        assert [m[0][1] for m in woken.result["messages"]] == [b"one"]
        receipt = woken.result["messages"][0][1]
        deleted = await consumer.call("delete", {"queue": "q", "receipts": [receipt]})
        assert deleted.result == {"results": [None]}
        assert (await consumer.call("receive", {"queue": "q", "wait": 0})).result == {
            "messages": []}


async def test_a_read_of_sends_wakes_each_waiter_in_arrival_order_before_its_waker(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        producer = await RawConnection.open(server.port)
        await producer.call("create_queue", {"queue": "q"})
        consumers = [await RawConnection.open(server.port) for _ in range(2)]
        waits = [await waiting_receive(consumer) for consumer in consumers]
        own = await waiting_receive(producer)
        await producer.send_bytes(b"".join(
            frame([n, "send", {"queue": "q", "messages": [str(n)]}]) for n in range(1, 4)))
        with trio.fail_after(10):
            order = [(await producer.next_event()).id for _ in range(4)]
            bodies = [(await c.response(w)).result["messages"][0][0][1]
                      for c, w in zip(consumers, waits)]
        assert bodies == ["1", "2"]
        # The producer's own receive, woken by the third send, is answered before that send.
        assert sorted(order) == [1, 2, 3, own] and order.index(own) < order.index(3)


async def test_answers_read_before_the_waking_request_go_out_before_the_woken_receive(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        own = await waiting_receive(connection)
        await connection.send_bytes(frame([1, "ping", {}])
                                    + frame([2, "send", {"queue": "q", "messages": [b"x"]}]))
        with trio.fail_after(10):
            order = [(await connection.next_event()).id for _ in range(3)]
        assert order == [1, own, 2]


async def test_a_woken_receive_keeps_its_max_tag_and_visibility_timeout(tmp_path: Path
                                                                       ) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        await connection.call("create_tag", {"queue": "q", "tag": "t"})
        waiting = await waiting_receive(connection, tag="t", max=2, visibility_timeout=5)
        await connection.call("send", {"queue": "q", "messages": [b"a", b"b", b"c"]})
        woken = await connection.response(waiting)
        messages = woken.result["messages"]
        assert [m[0][1] for m in messages] == [b"a", b"b"]
        for message in messages:
            assert 4_900 <= message[4] - message[3] <= 5_100  # leased for 5 s, not 30
        rest = await connection.call("receive", {"queue": "q", "tag": "t", "max": 10})
        assert [m[0][1] for m in rest.result["messages"]] == [b"c"]
        untouched = await connection.call("receive", {"queue": "q", "max": 10})
        assert len(untouched.result["messages"]) == 3  # the default tag had no waiter


async def test_a_woken_receive_stays_within_the_frame_limit(tmp_path: Path) -> None:
    max_frame = 2 * 1024 * 1024
    body_bytes = 1_048_500  # two fit a send frame, not a receive answer
    async with running_server(tmp_path, max_frame=max_frame) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q",
                                               "attributes": {"max_message_size": 1048576}})
        waiting = await waiting_receive(connection, max=10)
        sent = await connection.call("send", {"queue": "q", "messages": [
            b"a" * body_bytes, b"b" * body_bytes]})
        assert sent.error is None
        woken = await connection.response(waiting)
        assert woken.error is None
        assert [m[0][1][:1] for m in woken.result["messages"]] == [b"a"]
        rest = await connection.call("receive", {"queue": "q", "max": 10})
        assert [m[0][1][:1] for m in rest.result["messages"]] == [b"b"]


async def test_woken_receives_and_their_wakers_are_counted_in_the_metrics(tmp_path: Path
                                                                          ) -> None:
    async with running_server(tmp_path) as server:
        consumer = await RawConnection.open(server.port)
        producer = await RawConnection.open(server.port)
        await producer.call("create_queue", {"queue": "q"})
        for n in range(3):
            waiting = await waiting_receive(consumer)
            await producer.call("send", {"queue": "q", "messages": [str(n)]})
            assert (await consumer.response(waiting)).error is None
        counts = server.metrics.request_counts  # a snapshot, as a scrape takes
        assert counts["receive", "ok"] == 3
        assert counts["send", "ok"] == 3
        assert len(server.waiting) == 0
