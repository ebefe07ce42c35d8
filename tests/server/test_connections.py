"""Connections (DESIGN.md §4, PROTOCOL.md §1-2): malformed input, pipelining, long polls and
their wake-ups, limits, backpressure, idle timeout, isolation, graceful shutdown."""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import cbor2
import pytest
import trio

from lamina.client import AsyncClient
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args
from lamina.wire.protocol import ProtocolViolation, Response
from tests.support.servers import (
    Certificates,
    RawConnection,
    count_queued_work,
    running_server,
)


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


async def test_malformed_frame_answers_what_came_before_then_closes(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        bystander = await RawConnection.open(server.port)
        bad = await RawConnection.open(server.port)
        await bad.send_bytes(frame([1, "create_queue", {"queue": "q"}])
                             + frame([2, "send", {"queue": "q", "messages": [b"kept"]}])
                             + struct.pack(">I", 0))  # a zero-length frame
        first, second, final = [await bad.next_event() for _ in range(3)]
        assert (first.id, first.error) == (1, None)
        assert (second.id, second.error) == (2, None)
        assert final.id == 0 and final.error["code"] == "ProtocolError"
        assert await bad.next_event() is None  # closed
        received = await bystander.call("receive", {"queue": "q"})
        assert received.result["messages"][0][0][1] == b"kept"


async def test_each_kind_of_malformed_input_is_a_protocol_error(tmp_path: Path) -> None:
    def raw(body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + body

    garbage = [
        struct.pack(">I", 17 * 1024 * 1024),               # over max_frame
        raw(b"\xff\xff"),                                  # not CBOR
        raw(cbor2.dumps([1, "ping", {}]) + b"\x00"),        # trailing bytes
        raw(b"\x9f\x01\xff"),                               # indefinite length
        raw(b"\x83\x01dping\xa2aa\x01aa\x02"),              # duplicate map keys
        raw(b"\x81" * 40 + b"\x01"),                        # nesting deeper than 32
        frame({"not": "a request"}),
        frame([0, "ping", {}]),                            # id 0
        frame([True, "ping", {}]),                         # a bool is not an id
    ]
    async with running_server(tmp_path) as server:
        for data in garbage:
            connection = await RawConnection.open(server.port)
            await connection.send_bytes(data)
            event = await connection.next_event()
            if isinstance(event, Response):
                assert event.id == 0 and event.error["code"] == "ProtocolError", data
            await connection.wait_closed()
        survivor = await RawConnection.open(server.port)
        assert (await survivor.call("ping")).error is None


async def test_request_id_reuse_is_a_protocol_error(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        created = await connection.send("create_queue", {"queue": "q"})
        await connection.send_bytes(frame([7, "receive", {"queue": "q", "wait": 5}])
                                    + frame([7, "ping", {}]))
        events = [await connection.next_event() for _ in range(3)]
        assert [e.id for e in events] == [created, 7, 0]  # the waiting receive ends: []
        assert events[1].result == {"messages": []}
        assert events[2].error["code"] == "ProtocolError"


async def test_pipelined_requests_take_effect_in_order(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        data = frame([1, "create_queue", {"queue": "q"}])
        data += b"".join(frame([2 + n, "send", {"queue": "q", "messages": [str(n)]}])
                         for n in range(200))
        data += frame([500, "receive", {"queue": "q", "max": 1000}])
        await connection.send_bytes(data)
        received = await connection.response(500)
        assert [m[0][1] for m in received.result["messages"]] == [str(n) for n in range(200)]


async def test_a_request_refused_for_a_value_no_request_may_carry_is_answered_in_its_turn(
        tmp_path: Path) -> None:
    # PROTOCOL §2: only a receive's wait lets answers come out of order. A NaN or a tag in
    # the arguments fails the request (InvalidArgument), answered after those read before it.
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        for before in (1, 20):  # one group, and slices of a long read
            await connection.send_bytes(
                b"".join(frame([n, "ping", {}]) for n in range(1, before + 1))
                + frame([100, "ping", {"x": float("nan")}])
                + frame([101, "ping", {"x": cbor2.CBORTag(1, 0)}]) + frame([102, "ping", {}]))
            events = [await connection.next_event() for _ in range(before + 3)]
            assert [event.id for event in events] == [*range(1, before + 1), 100, 101, 102]
            assert [event.error["code"] for event in events[-3:-1]] == ["InvalidArgument"] * 2


async def test_waiting_receive_never_holds_back_later_requests(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        waiting = await connection.send("receive", {"queue": "q", "wait": 10})
        ping = await connection.send("ping")
        send = await connection.send("send", {"queue": "q", "messages": [b"wake"]})
        order = [(await connection.next_event()).id for _ in range(3)]
        # Answered out of order: the ping at once; the wait once the send woke it, before the
        # send itself (applier.py answers the receives a request woke first).
        assert order == [ping, waiting, send]


async def test_one_read_whose_requests_wait_wake_and_end_waits_is_applied_in_order(
        tmp_path: Path) -> None:
    # server.py rule 3 and 6: a read of several requests applied in place stays one group
    # when one of them waits, wakes a waiter or ends waits; later requests still take effect
    # after it, in order.
    async with running_server(tmp_path) as server:
        other = await RawConnection.open(server.port)
        await other.call("create_queue", {"queue": "gone"})
        ended = await other.send("receive", {"queue": "gone", "wait": 10})
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        await connection.send_bytes(
            frame([101, "receive", {"queue": "q", "wait": 10}])  # waits
            + frame([102, "ping", {}])
            + frame([103, "delete_queue", {"queue": "gone"}])  # ends the other's wait
            + frame([104, "send", {"queue": "q", "messages": [b"one"]}])  # wakes 101
            + frame([105, "receive", {"queue": "q", "wait": 0}]))  # after the waiter
        answers = {}
        with trio.fail_after(10):
            for _ in range(5):
                event = await connection.next_event()
                answers[event.id] = event
        assert [m[0][1] for m in answers[101].result["messages"]] == [b"one"]
        assert answers[102].error is None and answers[103].error is None
        assert answers[104].error is None and answers[105].result["messages"] == []
        assert (await other.response(ended)).error["code"] == "QueueNotFound"


async def test_long_polls_answer_out_of_order_across_queues(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        for queue in ("a", "b"):
            await connection.call("create_queue", {"queue": queue})
        wait_a = await connection.send("receive", {"queue": "a", "wait": 10})
        wait_b = await connection.send("receive", {"queue": "b", "wait": 10})
        other = await RawConnection.open(server.port)
        await other.call("send", {"queue": "b", "messages": [b"for b"]})
        first = await connection.next_event()
        assert first.id == wait_b and first.result["messages"][0][0][1] == b"for b"
        await other.call("send", {"queue": "a", "messages": [b"for a"]})
        assert (await connection.next_event()).id == wait_a


async def test_waiters_on_one_tag_are_served_in_arrival_order(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        producer = await RawConnection.open(server.port)
        await producer.call("create_queue", {"queue": "q"})
        consumers = [await RawConnection.open(server.port) for _ in range(3)]
        waits = []
        for consumer in consumers:
            waits.append(await consumer.send("receive", {"queue": "q", "wait": 10}))
            await trio.sleep(0.02)  # arrival order is what the server read first
        for n in range(3):
            await producer.call("send", {"queue": "q", "messages": [str(n)]})
        bodies = [(await c.response(w)).result["messages"][0][0][1]
                  for c, w in zip(consumers, waits)]
        assert bodies == ["0", "1", "2"]


async def test_long_poll_times_out_with_nothing(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q", "attributes": {"polling_wait": 1}})
        started = trio.current_time()
        explicit = await connection.call("receive", {"queue": "q", "wait": 0.2})
        assert explicit.result == {"messages": []}
        assert 0.18 <= trio.current_time() - started < 1
        started = trio.current_time()
        default = await connection.call("receive", {"queue": "q"})  # the queue's polling_wait
        assert default.result == {"messages": []} and trio.current_time() - started >= 0.95


async def test_long_poll_woken_by_lease_and_delay_deadlines(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        await connection.call("send", {"queue": "q", "messages": [{1: b"later", 5: 0.3}]})
        started = trio.current_time()
        delayed = await connection.call("receive", {"queue": "q", "wait": 5})
        assert delayed.result["messages"][0][0][1] == b"later"
        assert 0.25 <= trio.current_time() - started < 2
        receipt = delayed.result["messages"][0][1]
        await connection.call("change_visibility", {"queue": "q", "entries": [[receipt, 0.3]]})
        started = trio.current_time()
        again = await connection.call("receive", {"queue": "q", "wait": 5})
        assert again.result["messages"][0][2] == 2  # dequeue_count
        assert 0.25 <= trio.current_time() - started < 2


async def test_max_waiting_answers_the_next_receive_at_once(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_waiting=2) as server:
        connection = await RawConnection.open(server.port)
        assert connection.greeting.max_waiting == 2
        await connection.call("create_queue", {"queue": "q"})
        for _ in range(2):
            await connection.send("receive", {"queue": "q", "wait": 10})
        started = trio.current_time()
        third = await connection.call("receive", {"queue": "q", "wait": 10})
        assert third.result == {"messages": []} and trio.current_time() - started < 1
        assert connection.events == []  # the first two still wait


async def test_delete_queue_and_tag_end_their_waits(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        await connection.call("create_tag", {"queue": "q", "tag": "t"})
        on_tag = await connection.send("receive", {"queue": "q", "tag": "t", "wait": 10})
        on_default = await connection.send("receive", {"queue": "q", "wait": 10})
        await connection.call("delete_tag", {"queue": "q", "tag": "t"})
        assert (await connection.response(on_tag)).error["code"] == "TagNotFound"
        await connection.call("delete_queue", {"queue": "q"})
        assert (await connection.response(on_default)).error["code"] == "QueueNotFound"


async def test_backpressure_stops_reading_and_drops_nothing(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_inflight=8) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        for _ in range(8):  # eight waits fill max_inflight
            await connection.send("receive", {"queue": "q", "wait": 10})
        pings = [await connection.send("ping") for _ in range(50)]
        await trio.sleep(0.3)
        (conn,) = server.connections
        assert conn.proto.outstanding_count == 8  # paused: the pings are not even read
        other = await RawConnection.open(server.port)
        await other.call("send", {"queue": "q", "messages": [b"m"] * 8})
        for request_id in pings:
            assert (await connection.response(request_id)).error is None


async def test_unread_responses_pause_reading(tmp_path: Path) -> None:
    max_frame = 2 * 1024 * 1024
    async with running_server(tmp_path, max_frame=max_frame) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("big", {"max_message_size": 1048576})
            await client.send("big", [b"x" * 1_000_000])
        slow = await RawConnection.open(server.port)
        # ~1 MB answers that we do not read: the server must stop at about 4 x max_frame.
        data = b"".join(frame([n, "peek", {"queue": "big", "start": 0}]) for n in range(1, 200))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow.send_bytes, data)
            await trio.sleep(0.5)
            (conn,) = server.connections
            assert conn.unsent_bytes <= 4 * max_frame + 17 * 1_000_100
            assert conn.proto.outstanding_count < 199  # not everything was even applied
            answered = 0
            with trio.fail_after(20):
                while answered < 199:
                    event = await slow.next_event()
                    assert isinstance(event, Response) and event.error is None
                    answered += 1


async def test_idle_connection_closes_but_a_waiting_receive_is_not_idle(tmp_path: Path) -> None:
    async with running_server(tmp_path, idle_timeout_s=0.3) as server:
        idle = await RawConnection.open(server.port)
        assert idle.greeting.idle_timeout_s == 0.3
        busy = await RawConnection.open(server.port)
        await busy.call("create_queue", {"queue": "q"})
        waiting = await busy.send("receive", {"queue": "q", "wait": 0.8})
        with trio.fail_after(2):
            await idle.wait_closed()
        response = await busy.response(waiting)
        assert response.result == {"messages": []}  # still open after 0.8 s


async def test_max_connections(tmp_path: Path) -> None:
    async with running_server(tmp_path, max_connections=2) as server:
        keep = [await RawConnection.open(server.port) for _ in range(2)]
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        with trio.fail_after(2):
            assert await stream.receive_some(100) == b""  # closed without a greeting
        assert (await keep[0].call("ping")).error is None


async def test_graceful_stop_answers_what_was_read(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        waiting = await connection.send("receive", {"queue": "q", "wait": 20})
        await trio.sleep(0.05)
        server.request_stop()
        with trio.fail_after(5):
            response = await connection.response(waiting)
            assert response.result == {"messages": []}
            await connection.wait_closed()


async def test_pipelined_async_client_matches_answers(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            results: dict[int, str] = {}

            async def send(n: int) -> None:
                sent = await client.send("q", [f"m{n}"])
                results[n] = sent[0].id  # type: ignore[union-attr]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.receive, "q", None, 1, 5)
                for n in range(100):
                    nursery.start_soon(send, n)
            assert len(set(results.values())) == 100


async def test_protocol_violation_has_no_effect_on_others(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.create_queue("q")
            waiting = trio.Event()
            got: list[object] = []

            async def wait_for_message() -> None:
                waiting.set()
                got.extend(await client.receive("q", wait=5))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for_message)
                await waiting.wait()
                bad = await RawConnection.open(server.port)
                await bad.send_bytes(b"\x00\x00\x00\x01\xff")
                event = await bad.next_event()
                assert isinstance(event, (Response, ProtocolViolation, type(None)))
                await client.send("q", [b"fine"])
            assert len(got) == 1


async def test_a_connection_in_use_is_not_idle_across_many_reads(tmp_path: Path) -> None:
    # One cancel scope spans many reads (connection.py): when its deadline passes while
    # bytes kept coming, the connection stays open.
    async with running_server(tmp_path, idle_timeout_s=0.3) as server:
        connection = await RawConnection.open(server.port)
        for _ in range(12):  # 1.2 s of traffic, one request every 0.1 s
            assert (await connection.call("ping")).error is None
            await trio.sleep(0.1)
        with trio.fail_after(2):
            await connection.wait_closed()  # and once quiet, it is closed


async def test_waits_end_at_their_own_deadlines_not_in_arrival_order(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        started = trio.current_time()
        long_wait = await connection.send("receive", {"queue": "q", "wait": 0.8})
        short_wait = await connection.send("receive", {"queue": "q", "wait": 0.2})
        first = await connection.next_event()
        assert first.id == short_wait and first.result == {"messages": []}
        assert 0.18 <= trio.current_time() - started < 0.6
        second = await connection.next_event()
        assert second.id == long_wait and trio.current_time() - started >= 0.78


async def test_a_closed_connection_leaves_no_waiting_receives(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        connection = await RawConnection.open(server.port)
        await connection.call("create_queue", {"queue": "q"})
        for _ in range(3):
            await connection.send("receive", {"queue": "q", "wait": 10})
        await connection.call("ping")  # the receives are registered by now
        assert len(server.waiting) == 3
        await connection.stream.aclose()
        with trio.fail_after(2):
            while len(server.waiting):
                await trio.sleep(0.01)
        other = await RawConnection.open(server.port)
        await other.call("send", {"queue": "q", "messages": [b"kept"]})
        received = await other.call("receive", {"queue": "q"})
        assert received.result["messages"][0][0][1] == b"kept"  # nobody took it


async def test_small_requests_skip_the_inbox_with_or_without_fsync(tmp_path: Path) -> None:
    # server.py rule 6: with the applier idle, a reader applies its requests itself; with
    # --fsync their answers still wait for a WAL sync (rule 7, test_durability.py).
    for fsync in (False, True):
        async with running_server(tmp_path / str(fsync), fsync=fsync) as server:
            queued = count_queued_work(server)
            connection = await RawConnection.open(server.port)
            await connection.call("create_queue", {"queue": "q"})
            for n in range(20):
                assert (await connection.call("send", {"queue": "q", "messages": [str(n)]})
                        ).error is None
            received = await connection.call("receive", {"queue": "q", "max": 100})
            assert [m[0][1] for m in received.result["messages"]] == [str(n) for n in range(20)]
            assert queued() == 0


async def test_an_item_queued_for_the_applier_is_never_overtaken(tmp_path: Path) -> None:
    # server.py rule 6: once anything is queued for the applier, readers queue behind it.
    from lamina.server.applier import EngineJob
    from lamina.server.ports import Work

    async with running_server(tmp_path) as server:
        with trio.fail_after(2):
            while not server.applier._applier_idle:
                await trio.sleep(0.01)
        inbox = server.inbox_clone()
        job = EngineJob(lambda engine: "ran")
        assert server.applier.try_enqueue(inbox, job)
        work = Work(None, [], 0, 0.0)  # type: ignore[arg-type]
        assert not server.applier.apply_now(work)  # no checkpoint since: the job is not applied yet
        with trio.fail_after(2):
            await job.done.wait()
        assert job.result == "ran"
        with trio.fail_after(2):
            while not server.applier._applier_idle:  # idle again once the inbox is empty
                await trio.sleep(0.01)
        inbox.close()


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_the_idle_timeout_counts_from_a_waiting_receive_s_answer_not_from_its_request(
        tmp_path: Path, certificates: Certificates, tls: bool) -> None:
    # DESIGN §4: a waiting receive is not idle; a client that long-polls longer than the idle
    # timeout and sends its next request just after each answer is never cut off.
    options = {"tls_cert": certificates.cert, "tls_key": certificates.key} if tls else {}
    async with running_server(tmp_path, idle_timeout_s=0.4, **options) as server:
        stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        if tls:
            stream = trio.SSLStream(stream, certificates.client_context,
                                    server_hostname="127.0.0.1")
        connection = RawConnection(stream)
        assert (await connection.next_event()).id == 0  # the greeting
        await connection.call("create_queue", {"queue": "q"})
        for _ in range(2):
            waited = await connection.call("receive", {"queue": "q", "wait": 1.0})
            assert waited.result == {"messages": []}
            await trio.sleep(0.25)
            with trio.fail_after(2):
                assert (await connection.call("ping")).error is None
        with trio.fail_after(2):
            await connection.wait_closed()  # and once quiet, it is closed


@pytest.mark.parametrize("option", ["--idle-timeout", "--auth-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_before_serving(
        option: str, value: str) -> None:
    # A NaN idle timeout was accepted: the server started and reset every connection.
    parser = add_serve_arguments(argparse.ArgumentParser(prog="lamina serve"))
    with pytest.raises(ConfigError, match="timeout"):
        config_from_args(parser.parse_args([option, value]))
