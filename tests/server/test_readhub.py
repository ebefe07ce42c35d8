"""The read hub (server/readhub.py): while several plain-TCP connections wait for bytes, one
trio wait serves them all; each connection still gets exactly its own answers, in order, and
moves back to its own task for whatever needs it (large reads, backpressure, closing, the idle
timeout, shutdown)."""

from __future__ import annotations

import select
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cbor2
import trio

from lamina.server.server import Server
from tests.support.servers import RawConnection, running_server


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


def hub_of(server: Server) -> Any:
    assert server.read_hub is not None
    return server.read_hub


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.005)


async def burst(connections: list[RawConnection]) -> None:
    """A ping on each connection, all sent before any answer is read: their reads come
    together (readhub.py rule 1)."""
    ids = [await connection.send("ping") for connection in connections]
    for connection, request_id in zip(connections, ids):
        assert (await connection.response(request_id)).error is None


async def open_idle(server: Server, count: int) -> list[RawConnection]:
    """``count`` connections that read together and now wait for bytes: all but perhaps the
    first of them in the hub (its read came after no other's)."""
    assert server.port is not None
    connections = [await RawConnection.open(server.port) for _ in range(count)]
    with trio.fail_after(10):
        while hub_of(server).registered < count - 1:
            await burst(connections)
            await trio.sleep(0.01)
    return connections


async def bodies_of(connection: RawConnection, queue: str) -> list[bytes]:
    received = await connection.call("receive", {"queue": queue, "max": 1000})
    assert received.error is None
    return [message[0][1] for message in received.result["messages"]]


async def test_many_busy_connections_each_get_exactly_their_own_answers_in_order(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        assert server.port is not None
        connections = [await RawConnection.open(server.port) for _ in range(6)]

        async def client(index: int, connection: RawConnection) -> None:
            queue = f"q{index}"
            assert (await connection.call("create_queue", {"queue": queue})).error is None
            expected = []
            for round_ in range(40):
                body = f"{index}-{round_}".encode()
                expected.append(body)
                request_id = await connection.send("send", {"queue": queue,
                                                            "messages": [body]})
                answer = await connection.next_event()
                assert (answer.id, answer.error) == (request_id, None)
            # A burst of requests in one write: answered in the order they were sent.
            ids = [9000 + index * 100 + n for n in range(5)]
            await connection.send_bytes(b"".join(frame([i, "ping", {}]) for i in ids))
            assert [(await connection.next_event()).id for _ in ids] == ids
            assert await bodies_of(connection, queue) == expected

        steps_before = hub_of(server).steps
        async with trio.open_nursery() as nursery:
            for index, connection in enumerate(connections):
                nursery.start_soon(client, index, connection)
        assert hub_of(server).steps > steps_before  # the hub served some of those reads


async def test_one_connection_by_itself_waits_on_its_own_socket(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        assert server.port is not None
        connection = await RawConnection.open(server.port)
        for _ in range(30):
            assert (await connection.call("ping")).error is None
        assert hub_of(server).steps == 0
        assert hub_of(server).registered == 0


async def test_a_connection_closed_by_its_client_while_in_the_hub_leaves_it(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connections = await open_idle(server, 4)
        for connection in connections[:3]:
            await connection.aclose()
        await until(lambda: len(server.connections) == 1)
        assert hub_of(server).registered <= 1
        await trio.sleep(0.01)
        assert (await connections[3].call("ping")).error is None
        # Its read came by itself: it waits on its own socket again (readhub.py rule 1).
        assert hub_of(server).registered == 0


async def test_an_fd_reused_after_a_close_serves_only_its_new_connection(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        assert server.port is not None
        connections = await open_idle(server, 3)
        await connections[1].aclose()
        await until(lambda: len(server.connections) == 2)
        # The next connection most likely gets the closed one's fd number on the server.
        newcomer = await RawConnection.open(server.port)
        assert (await newcomer.call("create_queue", {"queue": "new"})).error is None
        assert (await connections[0].call("create_queue", {"queue": "old"})).error is None

        async def sends(connection: RawConnection, queue: str) -> None:
            for n in range(20):
                answer = await connection.call("send", {"queue": queue,
                                                        "messages": [f"{queue}{n}".encode()]})
                assert answer.error is None

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sends, newcomer, "new")
            nursery.start_soon(sends, connections[0], "old")
            nursery.start_soon(sends, connections[2], "new")
        assert sorted(await bodies_of(newcomer, "new")) == sorted(
            [f"new{n}".encode() for n in range(20)] * 2)
        assert await bodies_of(connections[0], "old") == [f"old{n}".encode()
                                                          for n in range(20)]


async def test_idle_connections_in_the_hub_are_closed_at_the_idle_timeout(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, idle_timeout_s=0.5) as server:
        connections = await open_idle(server, 3)
        with trio.fail_after(5):
            for connection in connections:
                await connection.wait_closed()
        await until(lambda: not server.connections)
        assert hub_of(server).registered == 0


async def test_connections_served_by_the_hub_past_the_idle_timeout_stay_open(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, idle_timeout_s=0.4) as server:
        connections = await open_idle(server, 3)
        busy, idle = connections[:2], connections[2]
        steps_before = hub_of(server).steps
        with trio.move_on_after(1.2):  # three idle timeouts of requests every 20 ms
            while True:
                await burst(busy)
                await trio.sleep(0.02)
        assert hub_of(server).steps > steps_before
        with trio.fail_after(5):
            await idle.wait_closed()
        await burst(busy)
        assert not any(connection.closed for connection in busy)


async def test_shutdown_ends_the_connections_waiting_in_the_hub(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with running_server(tmp_path) as server:
            connections = await open_idle(server, 4)
            server.request_stop()
            for connection in connections:
                await connection.wait_closed()
    assert hub_of(server).registered == 0
    assert not hub_of(server).open


async def test_a_request_split_across_reads_moves_between_the_hub_and_its_task(
        tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connections = await open_idle(server, 3)
        connection = connections[-1]  # in the hub: the others waited before it
        assert (await connection.call("create_queue", {"queue": "q"})).error is None
        # A frame in two writes: the first read leaves it incomplete.
        data = frame([501, "send", {"queue": "q", "messages": [b"split"]}])
        await connection.send_bytes(data[:7])
        await trio.sleep(0.05)
        await connection.send_bytes(data[7:])
        assert (await connection.response(501)).error is None
        # A request larger than one read (64 KiB): its task reads the rest.
        big = b"b" * 200_000
        answer = await connection.call("send", {"queue": "q", "messages": [big]})
        assert answer.error is None
        assert await bodies_of(connection, "q") == [b"split", big]
        steps_before = hub_of(server).steps
        for _ in range(5):  # back in the hub afterwards
            await burst(connections)
        assert hub_of(server).steps > steps_before


async def test_a_reader_that_does_not_read_its_answers_is_held_back_then_served_in_order(
        tmp_path: Path) -> None:
    max_frame = 2 * 1024 * 1024
    async with running_server(tmp_path, max_frame=max_frame) as server:
        other, slow = await open_idle(server, 2)
        await slow.call("create_queue", {"queue": "big",
                                         "attributes": {"max_message_size": 1048576}})
        assert (await slow.call("send", {"queue": "big", "messages": [b"x" * 1_000_000]})
                ).error is None
        ids = list(range(700, 740))  # ~40 MB of answers we do not read yet: over the cap
        steps_before = hub_of(server).steps
        for request_id in ids:  # each read beside one of the other connection's
            ping = await other.send("ping")
            await slow.send_bytes(frame([request_id, "peek", {"queue": "big", "start": 0}]))
            assert (await other.response(ping)).error is None
            await trio.sleep(0.002)
        await trio.sleep(0.1)
        assert hub_of(server).steps > steps_before
        (held,) = [connection for connection in server.connections
                   if getattr(connection, "unsent_bytes", 0) > 0]
        assert held.unsent_bytes <= 4 * max_frame + max_frame  # reading stopped at the cap
        assert (await other.call("ping")).error is None  # the other is served meanwhile
        with trio.fail_after(30):
            answers = [await slow.next_event() for _ in ids]
        assert [(a.id, a.error) for a in answers] == [(i, None) for i in ids]
        await burst([other, slow])


async def test_a_failure_in_a_read_ends_that_connection_only(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        assert server.port is not None
        connections = await open_idle(server, 3)
        applier: Any = server.applier
        apply_lone_now = applier.apply_lone_now

        def failing(requester: Any, request: Any, started: float) -> bool:
            if request.id == 4242:
                raise RuntimeError("a bug in one request's path")
            return bool(apply_lone_now(requester, request, started))

        applier.apply_lone_now = failing
        doomed, others = connections[1], [connections[0], connections[2]]
        pings = [await connection.send("ping") for connection in others]
        await doomed.send_bytes(frame([4242, "ping", {}]))
        for connection, request_id in zip(others, pings):
            assert (await connection.response(request_id)).error is None
        with trio.fail_after(5):
            await doomed.wait_closed()
        newcomer = await RawConnection.open(server.port)
        for _ in range(5):
            await burst([*others, newcomer])
        await until(lambda: len(server.connections) == 3)



class _FailingEpoll:
    """An epoll whose polls fail, once told to, as no real one should."""

    def __init__(self) -> None:
        self.real = select.epoll()
        self.failing = False

    def poll(self, timeout: float) -> Any:
        if self.failing:
            raise OSError("the poll failed")
        return self.real.poll(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_failure_of_the_hubs_own_poll_hands_every_reader_back_and_the_server_goes_on(
        tmp_path: Path, caplog: Any, monkeypatch: Any) -> None:
    from lamina.server import readhub
    epolls: list[_FailingEpoll] = []

    def epoll() -> _FailingEpoll:
        epolls.append(_FailingEpoll())
        return epolls[-1]

    monkeypatch.setattr(readhub, "select", SimpleNamespace(epoll=epoll,
                                                            EPOLLIN=select.EPOLLIN))
    async with running_server(tmp_path) as server:
        connections = await open_idle(server, 4)
        hub = hub_of(server)
        epolls[0].failing = True
        await burst(connections)  # wakes the hub, whose poll now fails
        await until(lambda: not hub.open)
        assert hub.registered == 0
        for _ in range(3):
            await burst(connections)  # each connection on its own socket now
        assert any(record.message.startswith("the read hub failed")
                   for record in caplog.records)
        for connection in connections:
            await connection.aclose()
