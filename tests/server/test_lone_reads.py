"""A read of one request whose answer may be large (a receive, a peek) is applied in place
only while its answer's bound fits the connection's cap (connection.py rule 3), as the
requests of larger reads are."""

from __future__ import annotations

import struct
from pathlib import Path

import cbor2
import trio

from tests.support.servers import RawConnection, running_server


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


async def test_lone_reads_of_large_answers_stop_at_the_unsent_cap(tmp_path: Path) -> None:
    max_frame = 2 * 1024 * 1024
    async with running_server(tmp_path, max_frame=max_frame) as server:
        slow = await RawConnection.open(server.port)
        await slow.call("create_queue", {"queue": "big",
                                         "attributes": {"max_message_size": 1048576}})
        assert (await slow.call("send", {"queue": "big", "messages": [b"x" * 1_000_000]})
                ).error is None
        for n in range(1, 41):  # ~40 MB of answers that we do not read yet, one a read
            await slow.send_bytes(frame([n, "peek", {"queue": "big", "start": 0}]))
            await trio.sleep(0.005)
        await trio.sleep(0.2)
        (conn,) = server.connections
        # Each peek's answer is bounded by max_frame: the reader stops once the cap would
        # be passed (what the socket's buffers took is not counted).
        assert conn.unsent_bytes <= 4 * max_frame + max_frame
        assert conn.proto.outstanding_count > 0  # some were not even applied
        with trio.fail_after(20):
            for _ in range(40):
                event = await slow.next_event()
                assert event.error is None


async def test_a_lone_receive_waits_while_the_memory_budget_is_held_by_unsent_answers(
        tmp_path: Path) -> None:
    max_frame = 2 * 1024 * 1024
    async with running_server(tmp_path, max_frame=max_frame,
                              max_buffered=3 * 1024 * 1024) as server:
        slow = await RawConnection.open(server.port)
        await slow.call("create_queue", {"queue": "big",
                                         "attributes": {"max_message_size": 1048576}})
        assert (await slow.call("send", {"queue": "big", "messages": [b"x" * 1_000_000]})
                ).error is None
        await slow.call("create_queue", {"queue": "q"})
        await slow.call("send", {"queue": "q", "messages": [b"m"]})
        for n in range(100, 140):  # answers we do not read yet: they fill the budget
            await slow.send_bytes(frame([n, "peek", {"queue": "big", "start": 0}]))
            await trio.sleep(0.005)
        await trio.sleep(0.2)
        assert server.budget.used_bytes > 1024 * 1024  # no room for a receive's bound
        consumer = await RawConnection.open(server.port)
        request_id = await consumer.send("receive", {"queue": "q"})
        applied_without_room = False
        with trio.move_on_after(0.3):
            await consumer.response(request_id)
            applied_without_room = True
        for _ in range(40):  # the slow client reads: room comes, the receive is applied
            with trio.fail_after(20):
                assert (await slow.next_event()).error is None
        assert not applied_without_room
        with trio.fail_after(20):
            received = await consumer.response(request_id)
        assert received.error is None
        assert [m[0][1] for m in received.result["messages"]] == [b"m"]
