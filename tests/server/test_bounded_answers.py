"""Answers whose size grows with what is stored fit the smallest ``max_frame`` a server may
run with (PROTOCOL.md §1: 2 MiB), because every count behind them is limited when it grows."""

from __future__ import annotations

import json
from pathlib import Path

import cbor2
import pytest
from botocore.exceptions import ClientError

from lamina.client import AsyncClient
from lamina.engine import Engine
from lamina.engine.errors import MAX_ERROR_MESSAGE_BYTES, InvalidArgument
from lamina.engine.tagging import MAX_TAGS
from lamina.engine.topics import MAX_FILTER_BYTES
from tests.support.servers import RawConnection, running_server
from tests.support.sqs import sqs_client, sqs_server

MIN_MAX_FRAME = 2 * 1024 * 1024
WIDE_KEY = "\U0001F600" * 124  # 128 characters of four UTF-8 bytes each, with a 4-digit index
WIDE_QUEUE = "q" * 64


async def test_grants_past_one_answer_are_listed_by_queue_or_key(tmp_path: Path) -> None:
    """PROTOCOL.md gives list_grants no paging, and a server keeps any number of grants (each
    queue a non-admin key creates adds one): a listing over max_frame is refused naming what
    narrows it, where it was answered InternalError."""
    with Engine.open(tmp_path / "data") as engine:
        for n in range(3500):  # 3,500 of about 620 bytes listed: over 2 MiB
            engine.grant(f"q{n:04d}{WIDE_QUEUE[5:]}", WIDE_KEY,
                         ["send", "receive", "peek", "manage"])
        engine.grant(WIDE_QUEUE, "other", ["peek"])
        async with running_server(tmp_path, engine=engine, max_frame=MIN_MAX_FRAME) as server:
            async with AsyncClient.connect("127.0.0.1", server.port) as client:
                with pytest.raises(InvalidArgument, match="queue: the grants to list do not fit"
                                   r".*over max_frame 2097152.*one queue or of one key"):
                    await client.list_grants()
                with pytest.raises(InvalidArgument, match="do not fit"):
                    await client.list_grants(key=WIDE_KEY)
                assert len(await client.list_grants(key="other")) == 1
                assert len(await client.list_grants(queue=WIDE_QUEUE)) == 1
                assert await client.ping()  # the connection serves on


def widest_filter() -> dict[str, object]:
    """A filter of 16 attributes taking MAX_FILTER_BYTES encoded, the most a filter may."""
    names = [f"{n:02d}".ljust(128, "n") for n in range(16)]
    attributes: dict[str, object] = {name: "" for name in names}
    room = MAX_FILTER_BYTES - len(cbor2.dumps(attributes))
    attributes[names[0]] = "v" * (room - 2)  # a longer text head takes 2 bytes more
    assert len(cbor2.dumps(attributes)) == MAX_FILTER_BYTES
    return {"attributes": attributes, "match": "any"}


async def test_list_tags_of_the_most_tags_with_the_widest_filters_fits_the_smallest_frame(
        tmp_path: Path) -> None:
    with Engine.open(tmp_path / "data") as engine:
        engine.create_queue(WIDE_QUEUE)
        for n in range(MAX_TAGS - 2):
            engine.create_tag(WIDE_QUEUE, f"t{n:03d}".ljust(64, "t"), filter=widest_filter())
        async with running_server(tmp_path, engine=engine, max_frame=MIN_MAX_FRAME) as server:
            async with AsyncClient.connect("127.0.0.1", server.port) as client:
                await client.create_tag(WIDE_QUEUE, "last".ljust(64, "t"), filter=widest_filter())
                tags = await client.list_tags(WIDE_QUEUE)
                info = await client.get_queue(WIDE_QUEUE)
    assert len(tags) == MAX_TAGS == len(info.stats["tags"])


def test_sqs_list_dead_letter_source_queues_without_max_results_answers_at_most_1000(
        tmp_path: Path) -> None:
    # SQS: "If you do not set MaxResults, the response includes a maximum of 1,000 results."
    with Engine.open(tmp_path / "data") as engine:
        engine.create_queue("dead")
        for n in range(1001):
            engine.create_queue(f"src{n:04d}", {"redrive": {"dlq": "dead", "max_receives": 1}})
        with sqs_server(tmp_path / "data", engine=engine) as running:
            sqs = sqs_client(running.server.sqs_port)
            dlq = sqs.get_queue_url(QueueName="dead")["QueueUrl"]
            unpaged = sqs.list_dead_letter_source_queues(QueueUrl=dlq)
            first = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=1000)
            rest = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=1000,
                                                      NextToken=first["NextToken"])
    assert len(unpaged["queueUrls"]) == 1000 and "NextToken" not in unpaged
    assert unpaged["queueUrls"] == first["queueUrls"]
    assert [url.rsplit("/", 1)[1] for url in rest["queueUrls"]] == ["src1000"]
    assert "NextToken" not in rest


async def test_errors_echoing_long_input_fit_the_frame_and_still_name_the_field(
        tmp_path: Path) -> None:
    async with running_server(tmp_path, max_frame=MIN_MAX_FRAME) as server:
        connection = await RawConnection.open(server.port)
        assert (await connection.call("create_queue", {"queue": "q"})).error is None
        # An unknown permission is shown in the message: as a repr, "\x00" takes four bytes.
        answer = await connection.call("grant", {"queue": "q", "key": "k",
                                                 "permissions": ["\x00" * (MIN_MAX_FRAME - 100)]})
        assert answer.error["code"] == "InvalidArgument"
        assert answer.error["message"].startswith("permissions: unknown permission")
        assert answer.error["message"].endswith("one of send, receive, peek, manage, grant")
        assert len(answer.error["message"].encode()) <= MAX_ERROR_MESSAGE_BYTES
        # 1000 entries, each refused for an attribute name too long: every one is answered.
        name = "n" * 2080
        entries = [{1: b"x", 2: {name: 1}}] * 1000
        assert len(cbor2.dumps(entries)) < MIN_MAX_FRAME - 100
        answer = await connection.call("send", {"queue": "q", "messages": entries})
        assert answer.error is None and len(answer.result["results"]) == 1000
        last = answer.result["results"][-1]
        assert last["code"] == "InvalidArgument"
        assert last["message"].startswith("messages[999].attributes.nnn")
        assert last["message"].endswith("names are 1-128 bytes")
        assert not connection.closed


def test_sqs_queue_holds_50_of_the_longest_tags_and_an_8192_byte_policy(tmp_path: Path) -> None:
    # SQS: 50 tags, keys of 128 and values of 256 Unicode characters; a policy of 8,192 bytes.
    tags = {f"{n:02d}" + "\U0001F600" * 126: "\U0001F600" * 256 for n in range(50)}
    policy = json.dumps({"Version": "2012-10-17", "Statement": [], "Id": ""})
    policy = policy.replace('"Id": ""', '"Id": "' + "p" * (8192 - len(policy)) + '"')
    with sqs_server(tmp_path / "data") as running:
        sqs = sqs_client(running.server.sqs_port)
        url = sqs.create_queue(QueueName="tagged", tags=tags,
                               Attributes={"Policy": policy})["QueueUrl"]
        assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == tags
        with pytest.raises(ClientError) as caught:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": policy + " "})
    assert caught.value.response["Error"]["Code"] == "InvalidAttributeValue"
    assert "Policy" in caught.value.response["Error"]["Message"]
