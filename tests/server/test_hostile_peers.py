"""Peers that read late, trickle, vanish or flood (DESIGN.md §4): the server stops reading a
connection rather than drop what it read, bounds what it holds, and frees what a peer leaves."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import cbor2
import trio

from tests.support.servers import RawConnection, running_server


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


async def slow_reader(port: int) -> RawConnection:
    """A connection whose client takes little at a time (a small receive window)."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    connection = RawConnection(trio.SocketStream(sock))
    assert (await connection.next_event()).error is None  # the greeting
    return connection


async def test_a_client_that_pipelines_many_small_requests_and_reads_late_gets_every_answer(
        tmp_path: Path) -> None:
    count = 20_000
    async with running_server(tmp_path) as server:
        client = await slow_reader(server.port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_bytes,
                               b"".join(frame([n, "ping", {}]) for n in range(1, count + 1)))
            await trio.sleep(1.0)  # reads nothing meanwhile: the server must stop reading it
            with trio.fail_after(30):
                for expected in range(1, count + 1):
                    answer = await client.next_event()
                    assert answer is not None, f"closed after {expected - 1} answers"
                    assert (answer.id, answer.error) == (expected, None)
        assert (await (await RawConnection.open(server.port)).call("ping")).error is None
