"""Exact error codes of PROTOCOL.md §2 and §6, with frames written from the spec alone (the
project's client refuses some of these values before they reach the server)."""

from __future__ import annotations

import socket
import struct
from typing import Any, Iterator

import cbor2
import pytest


class RawClient:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.next_id = 0
        self.read()  # the greeting

    def read(self) -> Any:
        (length,) = struct.unpack(">I", self.sock.recv(4, socket.MSG_WAITALL))
        return cbor2.loads(self.sock.recv(length, socket.MSG_WAITALL))

    def call(self, op: str, args: dict[str, Any]) -> tuple[Any, Any]:
        """-> (error map or None, result)."""
        self.next_id += 1
        body = cbor2.dumps([self.next_id, op, args])
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        request_id, error, result = self.read()
        assert request_id == self.next_id
        return error, result

    def ok(self, op: str, args: dict[str, Any]) -> Any:
        error, result = self.call(op, args)
        assert error is None, error
        return result

    def code(self, op: str, args: dict[str, Any]) -> str:
        error, _ = self.call(op, args)
        assert error is not None
        return error["code"]


@pytest.fixture
def raw(start_server: Any) -> Iterator[RawClient]:
    client = RawClient(start_server().port)
    yield client
    client.sock.close()


def test_a_nan_in_one_send_entry_fails_that_entry_alone(raw: RawClient) -> None:
    raw.ok("create_queue", {"queue": "q"})
    results = raw.ok("send", {"queue": "q", "messages": [
        b"first", {1: b"bad", 2: {"weight": float("nan")}}, {1: b"third", 5: float("inf")},
        {1: b"fourth", 2: {"weight": 1.5}}]})["results"]
    assert isinstance(results[0], list) and isinstance(results[3], list)
    assert results[1]["code"] == "InvalidArgument" and "attributes.weight" in results[1]["message"]
    assert results[2]["code"] == "InvalidArgument" and "delay" in results[2]["message"]
    assert raw.ok("get_queue", {"queue": "q"})["stats"]["messages"] == 2


def test_a_nan_timeout_in_one_change_visibility_entry_fails_that_entry_alone(
        raw: RawClient) -> None:
    raw.ok("create_queue", {"queue": "q"})
    raw.ok("send", {"queue": "q", "messages": [b"a", b"b"]})
    first, second = (d[1] for d in raw.ok("receive", {"queue": "q", "max": 2})["messages"])
    results = raw.ok("change_visibility", {"queue": "q", "entries": [
        [first, float("nan")], [second, 5]]})["results"]
    assert results[0]["code"] == "InvalidArgument" and isinstance(results[1], list)


def test_a_value_a_request_may_not_carry_outside_batches_fails_the_request(
        raw: RawClient) -> None:
    assert raw.code("receive", {"queue": "q", "wait": float("nan")}) == "InvalidArgument"


def test_delete_by_id_with_an_id_that_is_not_text_is_invalid_argument_for_that_entry(
        raw: RawClient) -> None:
    raw.ok("create_queue", {"queue": "q"})
    [[message_id, _, _]] = raw.ok("send", {"queue": "q", "messages": [b"a"]})["results"]
    results = raw.ok("delete_by_id", {"queue": "q", "ids": [42, b"id", message_id,
                                                            "no-such-id"]})
    codes = [r and r["code"] for r in results["results"]]
    assert codes == ["InvalidArgument", "InvalidArgument", None, "MessageNotFound"]
    assert "ids[0]" in results["results"][0]["message"]
    peeked = raw.ok("peek", {"queue": "q", "ids": [7]})["messages"]
    assert peeked[0]["code"] == "InvalidArgument"


def test_create_queue_with_a_queue_that_is_not_text_is_invalid_argument(raw: RawClient) -> None:
    assert raw.code("create_queue", {"queue": 7}) == "InvalidArgument"
    assert raw.code("create_queue", {"queue": b"bytes"}) == "InvalidArgument"
    assert raw.code("create_queue", {"queue": "9lives"}) == "InvalidQueueName"
    raw.ok("create_queue", {"queue": "src"})
    assert raw.code("copy_queue", {"queue": 7, "source": "src"}) == "InvalidArgument"
    assert raw.code("copy_queue", {"queue": "bad name", "source": "src"}) == "InvalidQueueName"


@pytest.mark.parametrize("op, extra", [
    ("get_queue", {}), ("delete_queue", {}), ("purge_queue", {}), ("list_tags", {}),
    ("set_queue_attributes", {"attributes": {}}), ("receive", {}), ("peek", {}),
    ("send", {"messages": [b"x"]}), ("stats", {}), ("redrive", {}),
])
def test_a_lookup_of_a_name_breaking_the_rule_is_queue_not_found(
        raw: RawClient, op: str, extra: dict[str, Any]) -> None:
    for name in ("9lives", "has space", "x" * 300):
        assert raw.code(op, {"queue": name, **extra}) == "QueueNotFound"
    assert raw.code(op, {"queue": 7, **extra}) == "InvalidArgument"


def test_copy_from_a_source_breaking_the_rule_is_queue_not_found(raw: RawClient) -> None:
    assert raw.code("copy_queue", {"queue": "new", "source": "9lives"}) == "QueueNotFound"
    assert raw.code("copy_queue", {"queue": "new", "source": 7}) == "InvalidArgument"


def test_a_redrive_source_is_a_filter_that_judges_no_name(raw: RawClient) -> None:
    raw.ok("create_queue", {"queue": "dlq"})
    assert raw.ok("redrive", {"queue": "dlq", "source": "9lives"}) == {"moved": 0, "skipped": 0}
    assert raw.code("redrive", {"queue": "dlq", "source": 7}) == "InvalidArgument"


@pytest.mark.parametrize("pattern", ["é*", "q²*", "ｑ*", "q٣?"])
def test_a_grant_glob_with_a_letter_or_digit_outside_ascii_is_invalid_argument(
        raw: RawClient, pattern: str) -> None:
    # Queue names are ASCII (a glob may hold [A-Za-z0-9_-] and * ? [ ] !): such a glob was
    # stored, a grant that could never match any queue.
    error, _ = raw.call("grant", {"queue": pattern, "key": "k", "permissions": ["send"]})
    assert error is not None and error["code"] == "InvalidArgument"
    assert error["message"].startswith("queue")
    assert raw.ok("list_grants", {}) == {"grants": []}
