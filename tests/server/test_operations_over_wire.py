"""Every operation of PROTOCOL.md §5 and every error code of §6, over a real socket with the
blocking client. Semantics are the engine's (tested there); these tests pin what travels."""

from __future__ import annotations

import struct
import time
from typing import Any

import cbor2
import pytest

from lamina.engine.errors import (
    InternalError,
    InvalidArgument,
    InvalidQueueName,
    InvalidReceipt,
    InvalidRedrivePolicy,
    LaminaError,
    MessageNotFound,
    MessageTooLarge,
    NoDeadLetterQueue,
    QueueAlreadyExists,
    QueueFull,
    QueueNotFound,
    RewindDisabled,
    RewindOutOfRange,
    StaleReceipt,
    TagAlreadyExists,
    TagNotFound,
    TooManyQueues,
    TooManyTags,
    Unavailable,
    UnknownOperation,
)
from lamina.engine.results import Grant, QueueInfo, Sent, TagInfo, VisibilityChanged
from lamina.client import Client, Delivery, Peeked, ServerInfo, message


@pytest.fixture
def server(start_server: Any) -> Any:
    return start_server()


@pytest.fixture
def client(server: Any) -> Any:
    with Client.connect("127.0.0.1", server.port) as connected:
        yield connected


def test_greeting_advertises_limits_and_features(client: Client) -> None:
    greeting = client.greeting
    assert greeting.server == "lamina" and greeting.protocol == 1
    assert greeting.auth_required is False
    assert greeting.max_frame_bytes == 16 * 1024 * 1024
    assert (greeting.max_inflight, greeting.max_waiting) == (1024, 64)
    assert {"tags", "topics", "dlq", "rewind", "peek", "grants"} <= set(greeting.features)


def test_ping_and_server_info(client: Client) -> None:
    assert abs(client.ping() - time.time() * 1000) < 5000
    client.create_queue("info")
    info = client.server_info()
    assert isinstance(info, ServerInfo)
    assert info.queues == 1 and info.connections == 1
    assert info.data_bytes > 0 and info.uptime >= 0 and info.version


def test_queue_lifecycle(client: Client) -> None:
    created = client.create_queue("orders", {"visibility_timeout": 60})
    assert isinstance(created, QueueInfo)
    assert created.attributes["visibility_timeout"] == 60 and created.created > 0
    assert client.create_queue("orders", {"visibility_timeout": 60}).created == created.created
    with pytest.raises(QueueAlreadyExists):
        client.create_queue("ORDERS")
    with pytest.raises(InvalidQueueName):
        client.create_queue("9lives")
    info = client.get_queue("orders")
    assert info.stats is not None and info.stats["messages"] == 0
    assert "default" in info.stats["tags"]
    attributes = client.set_queue_attributes("orders", {"polling_wait": 1})
    assert attributes["polling_wait"] == 1 and attributes["visibility_timeout"] == 60
    copy = client.copy_queue("orders2", "orders")
    assert copy.queue == "orders2" and copy.attributes == attributes
    page = client.list_queues(limit=1)
    assert page.queues == ["orders"] and page.next == "orders"
    assert client.list_queues(after=page.next).queues == ["orders2"]
    assert client.list_queues(prefix="orders2").queues == ["orders2"]
    client.send("orders", [b"a", b"b"])
    assert client.purge_queue("orders") == 2
    client.delete_queue("orders2")
    with pytest.raises(QueueNotFound):
        client.get_queue("orders2")
    with pytest.raises(QueueNotFound):
        client.delete_queue("orders2")


def test_tags(client: Client) -> None:
    client.create_queue("q")
    tag = client.create_tag("q", "audit", start="oldest",
                            filter={"attributes": {"kind": "x"}, "match": "all"})
    assert isinstance(tag, TagInfo)
    assert tag.start == 0 and tag.filter == {"attributes": {"kind": "x"}, "match": "all"}
    with pytest.raises(TagAlreadyExists):
        client.create_tag("q", "audit")
    tags = client.list_tags("q")
    assert [t.tag for t in tags] == ["audit", "default"]
    assert tags[0].stats is not None and "active" in tags[0].stats
    client.delete_tag("q", "audit")
    with pytest.raises(TagNotFound):
        client.delete_tag("q", "audit")
    with pytest.raises(InvalidArgument, match="tag"):
        client.delete_tag("q", "default")
    with pytest.raises(TagNotFound):
        client.receive("q", tag="nope")


def test_too_many_tags(client: Client) -> None:
    client.create_queue("q")
    for number in range(255):
        client.create_tag("q", f"t{number}")
    with pytest.raises(TooManyTags):
        client.create_tag("q", "one-more")


def test_send_receive_delete(client: Client) -> None:
    client.create_queue("q", {"max_message_size": 1024})
    results = client.send("q", [b"plain", "text", message(b"urgent", priority=1,
                                                            attributes={"k": 1}),
                                b"x" * 2000, {9: "bad key"}])
    assert isinstance(results[0], Sent) and len(results[0].md5) == 16
    assert isinstance(results[3], MessageTooLarge)
    assert isinstance(results[4], InvalidArgument)
    deliveries = client.receive("q", max=10)
    assert [d.body for d in deliveries] == [b"urgent", b"plain", "text"]
    first = deliveries[0]
    assert isinstance(first, Delivery) and first.md5_ok
    assert first.message.attributes == {"k": 1} and first.message.priority == 1
    assert first.dequeue_count == 1 and first.next_visible_time > first.first_dequeue_time
    results = client.delete("q", [first, first.receipt, b"forged"])
    assert results[0] is None
    assert isinstance(results[1], StaleReceipt)
    assert isinstance(results[2], InvalidReceipt)
    changed = client.change_visibility("q", [(deliveries[1], 60), (deliveries[2], 0),
                                             (b"x", 1), (deliveries[1], 99999)])
    assert isinstance(changed[0], VisibilityChanged) and changed[0].receipt is not None
    assert changed[1].receipt is None  # type: ignore[union-attr]
    assert isinstance(changed[2], InvalidReceipt)
    assert isinstance(changed[3], InvalidArgument)
    again = client.receive("q", max=10)
    assert [d.body for d in again] == ["text"] and again[0].dequeue_count == 2


def test_queue_full_is_per_entry(client: Client) -> None:
    client.create_queue("small", {"max_messages": 1})
    results = client.send("small", [b"one", b"two"])
    assert isinstance(results[0], Sent) and isinstance(results[1], QueueFull)


def test_peek_modes_and_delete_by_id(client: Client) -> None:
    client.create_queue("q")
    sent = client.send("q", [b"m0", b"m1", b"m2"])
    ids = [s.id for s in sent]  # type: ignore[union-attr]
    head = client.peek("q", max=2)
    assert [p.body for p in head.messages] == [b"m0", b"m1"] and head.next is None
    assert all(isinstance(p, Peeked) and p.state == "active" for p in head.messages)
    page = client.peek("q", start=0, max=2)
    assert [p.id for p in page.messages] == ids[:2] and page.next == ids[1]
    rest = client.peek("q", start=0, after=page.next, max=2)
    assert [p.id for p in rest.messages] == ids[2:] and rest.next is None
    results = client.delete_by_id("q", [ids[1], "0" * 25])
    assert results[0] is None and isinstance(results[1], MessageNotFound)
    by_id = client.peek("q", ids=[ids[1], "nonsense"])
    assert by_id.messages[0].state == "deleted"
    assert isinstance(by_id.messages[1], MessageNotFound)
    with pytest.raises(InvalidArgument, match="ids"):
        client.peek("q", ids=[ids[0]], start=0)
    with pytest.raises(InvalidArgument, match="ids"):
        client.delete_by_id("q", [])


def test_dead_letters_and_redrive(client: Client) -> None:
    client.create_queue("dlq")
    with pytest.raises(InvalidRedrivePolicy):
        client.create_queue("src", {"redrive": {"dlq": "missing", "max_receives": 1}})
    client.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 5}})
    client.create_queue("plain")
    client.send("plain", [b"p"])
    with pytest.raises(NoDeadLetterQueue):
        client.dead("plain", client.receive("plain"))
    client.send("src", [b"poison"])
    delivery = client.receive("src")[0]
    assert client.dead("src", [delivery]) == [None]
    dead = client.peek("dlq").messages[0]
    assert dead.message.dead[0] == "src" and dead.message.attributes["DLQ.sourceQueue"] == "src"
    assert client.redrive("dlq", dry_run=True).moved == 1
    redriven = client.redrive("dlq", source="src")
    assert (redriven.moved, redriven.skipped) == (1, 0)
    assert [d.body for d in client.receive("src")] == [b"poison"]


def test_rewind(client: Client) -> None:
    client.create_queue("off")
    with pytest.raises(RewindDisabled):
        client.rewind("off", client.ping())
    client.create_queue("q", {"rewind": 3600})
    start = client.ping()
    client.send("q", [b"again"])
    client.delete("q", client.receive("q"))
    with pytest.raises(RewindOutOfRange):
        client.rewind("q", start + 10**9)
    rewound = client.rewind("q", start)
    assert rewound.time == start and rewound.tags == ["default"]
    assert [d.body for d in client.receive("q")] == [b"again"]


def test_stats(client: Client) -> None:
    client.create_queue("q")
    client.send("q", [b"a", b"b"])
    client.receive("q")
    days = client.stats("q", days=1)
    assert days[0]["sent"] == 2 and days[0]["received"] == 1
    assert client.stats("q", tag="default")[0]["received"] == 1
    with pytest.raises(InvalidArgument, match="days"):
        client.stats("q", days=40)


def test_grants_without_auth_are_plain_operations(client: Client) -> None:
    client.create_queue("q")
    client.grant("q", "carol", ["send", "peek"])
    assert client.list_grants(key="carol") == [Grant("q", "carol", ["send", "peek"])]
    client.revoke("q", "carol", ["peek"])
    assert client.list_grants(queue="q") == [Grant("q", "carol", ["send"])]
    client.revoke("q", "carol")
    assert client.list_grants() == []


def test_request_level_errors_name_the_field(client: Client) -> None:
    with pytest.raises(UnknownOperation):
        client._call("explode", {}, lambda r: r)
    with pytest.raises(InvalidArgument, match="quue"):
        client._call("get_queue", {"quue": "q"}, lambda r: r)
    with pytest.raises(InvalidArgument, match="queue"):
        client._call("get_queue", {}, lambda r: r)
    client.create_queue("q")
    with pytest.raises(InvalidArgument, match="wait"):
        client.receive("q", wait=31)
    with pytest.raises(InvalidArgument, match="wait"):
        client._call("receive", {"queue": "q", "wait": True}, lambda r: r)
    with pytest.raises(InvalidArgument, match="max"):
        client.receive("q", max=0)
    with pytest.raises(InvalidArgument, match="messages"):
        client.send("q", [])
    with pytest.raises(InvalidArgument, match="key"):
        client._call("auth", {"key": "k", "signature": b""}, lambda r: r)


def test_too_many_queues(start_server: Any) -> None:
    server = start_server(max_queues=1)
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("one")
        with pytest.raises(TooManyQueues):
            client.create_queue("two")


def test_receive_response_stays_under_max_frame(start_server: Any) -> None:
    server = start_server(max_frame=2 * 1024 * 1024)
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("big", {"max_message_size": 1048576})
        body = b"x" * 1_000_000
        with pytest.raises(InvalidArgument, match="max_frame"):  # refused before sending
            client.send("big", [body, body, body])
        for _ in range(3):
            client.send("big", [body])
        first = client.receive("big", max=10)
        assert len(first) == 2  # a third would pass 2 MiB; it is not leased either
        assert len(client.receive("big", max=10)) == 1
        page = client.peek("big", start=0, max=10)
        assert len(page.messages) == 2 and page.next == page.messages[1].id


def test_internal_error_fails_one_request_only(start_server: Any) -> None:
    server = start_server()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        server.call(setattr, server.server.engine, "stats", broken)
        with pytest.raises(InternalError, match="boom"):
            client.stats("q")
        assert client.get_queue("q").queue == "q"


def test_unavailable_when_the_engine_is_closed(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_queue("q")
        server.engine_job(lambda engine: engine.close())
        with pytest.raises(Unavailable):
            client.send("q", [b"lost"])
        assert client.ping() > 0


def test_unknown_error_codes_map_to_the_base_class() -> None:
    from lamina.engine.errors import error_from_wire
    error = error_from_wire({"code": "FutureCode", "message": "m"})
    assert type(error) is LaminaError and error.code == "FutureCode"


def test_raw_frames_get_raw_answers(server: Any) -> None:
    """A client written from PROTOCOL.md alone: length-prefixed CBOR, positional records."""
    import socket
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        def frame(item: Any) -> bytes:
            body = cbor2.dumps(item)
            return struct.pack(">I", len(body)) + body

        def read() -> Any:
            header = sock.recv(4, socket.MSG_WAITALL)
            (length,) = struct.unpack(">I", header)
            return cbor2.loads(sock.recv(length, socket.MSG_WAITALL))

        greeting = read()
        assert greeting[0] == 0 and greeting[2]["protocol"] == 1
        sock.sendall(frame([7, "create_queue", {"queue": "raw"}])
                     + frame([8, "send", {"queue": "raw", "messages": [{1: b"hi", 4: 2}]}])
                     + frame([9, "receive", {"queue": "raw"}]))
        assert read()[0] == 7
        sent = read()
        assert sent[0] == 8 and sent[2]["results"][0][0].endswith("1")
        received = read()
        record, receipt, count, first, next_visible = received[2]["messages"][0]
        assert record[1] == b"hi" and record[4] == 2 and count == 1 and len(receipt) > 16
