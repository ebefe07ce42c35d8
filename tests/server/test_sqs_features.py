"""The SQS gateway beyond plain messages, with boto3: FIFO queues (groups, order,
deduplication), dead-letter queues and move tasks, queue tags, permissions, and Lamina's
priorities and tags reached from SQS clients."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from botocore.exceptions import ClientError

from lamina.client import Client
from tests.support.sqs import ACCOUNT, sqs_client, sqs_server
from tests.support.servers import ThreadServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    with sqs_server(tmp_path_factory.mktemp("sqs") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def sqs(server: ThreadServer) -> Any:
    return sqs_client(server.server.sqs_port)


def _arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"


def _code(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response["Error"]["Code"]


# -- FIFO -------------------------------------------------------------------------------------


def test_fifo_keeps_order_per_group_and_one_in_flight_per_group(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="orders.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    assert url.endswith("/orders.fifo")
    sequence = []
    for n in range(3):
        for group in ("a", "b"):
            sent = sqs.send_message(QueueUrl=url, MessageBody=f"{group}{n}", MessageGroupId=group,
                                    MessageDeduplicationId=f"{group}{n}")
            sequence.append(int(sent["SequenceNumber"]))
    assert sequence == sorted(sequence) and len(set(sequence)) == 6
    seen: dict[str, list[str]] = {"a": [], "b": []}
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                  AttributeNames=["MessageGroupId", "SequenceNumber",
                                                  "MessageDeduplicationId"])
        messages = got.get("Messages", [])
        if not messages:
            break
        groups = [m["Attributes"]["MessageGroupId"] for m in messages]
        assert len(groups) == len(set(groups))  # one in flight per group
        for message in messages:
            seen[message["Attributes"]["MessageGroupId"]].append(message["Body"])
            assert message["Attributes"]["MessageDeduplicationId"] == message["Body"]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert seen == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["FifoQueue"] == "true"
    assert attributes["ContentBasedDeduplication"] == "false"
    assert attributes["DeduplicationScope"] == "queue"
    assert [u.rsplit("/", 1)[1] for u in sqs.list_queues(QueueNamePrefix="orders.")[
        "QueueUrls"]] == ["orders.fifo"]


def test_fifo_deduplicates_by_id_or_by_content(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="dedup.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g",
                             MessageDeduplicationId="same")
    again = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g",
                             MessageDeduplicationId="same")
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    error = _code(sqs.send_message, QueueUrl=url, MessageBody="y", MessageGroupId="g")
    assert error == "InvalidParameterValue"  # neither an id nor content-based deduplication
    assert _code(sqs.send_message, QueueUrl=url, MessageBody="y") == "MissingParameter"
    assert _code(sqs.send_message, QueueUrl=url, MessageBody="y", MessageGroupId="g",
                 MessageDeduplicationId="d", DelaySeconds=5) == "InvalidParameterValue"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "1", "MessageBody": "body", "MessageGroupId": "g"},
        {"Id": "2", "MessageBody": "body", "MessageGroupId": "h"},
        {"Id": "3", "MessageBody": "other", "MessageGroupId": "g"}])
    ids = {entry["Id"]: entry["MessageId"] for entry in batch["Successful"]}
    assert ids["1"] == ids["2"] != ids["3"]
    bodies = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if not got:
            break
        for message in got:
            bodies.append(message["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(bodies) == ["body", "other", "x"]


def test_fifo_deduplication_scope_message_group(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="scoped.fifo", Attributes={
        "FifoQueue": "true", "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId"})["QueueUrl"]
    a = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="a",
                         MessageDeduplicationId="d")
    b = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="b",
                         MessageDeduplicationId="d")
    assert a["MessageId"] != b["MessageId"]


def test_fifo_names_and_attributes_must_agree(sqs: Any) -> None:
    assert _code(sqs.create_queue, QueueName="plain",
                 Attributes={"FifoQueue": "true"}) == "InvalidParameterValue"
    assert _code(sqs.create_queue, QueueName="plain2",
                 Attributes={"ContentBasedDeduplication": "true"}) == "InvalidAttributeName"
    assert _code(sqs.create_queue, QueueName="taken-fifo") == "InvalidParameterValue"


# -- dead-letter queues -----------------------------------------------------------------------


def test_dead_letter_after_max_receive_count_and_a_move_task_back(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName="dead")["QueueUrl"]
    source = sqs.create_queue(QueueName="work", Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": _arn("dead"), "maxReceiveCount": 2})})["QueueUrl"]
    policy = sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])
    assert json.loads(policy["Attributes"]["RedrivePolicy"]) == {
        "deadLetterTargetArn": _arn("dead"), "maxReceiveCount": 2}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    sent = sqs.send_message(QueueUrl=source, MessageBody="poison")
    for _ in range(2):
        assert sqs.receive_message(QueueUrl=source, VisibilityTimeout=1)["Messages"]
        time.sleep(1.1)
    assert "Messages" not in sqs.receive_message(QueueUrl=source)
    dead = sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=1,
                               AttributeNames=["All"])["Messages"][0]
    assert dead["Body"] == "poison"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"] == _arn("work")
    time.sleep(1.1)
    handle = sqs.start_message_move_task(SourceArn=_arn("dead"))["TaskHandle"]
    assert handle
    tasks = sqs.list_message_move_tasks(SourceArn=_arn("dead"))["Results"]
    assert tasks[0]["Status"] == "COMPLETED"
    assert tasks[0]["ApproximateNumberOfMessagesMoved"] == 1
    back = sqs.receive_message(QueueUrl=source)["Messages"][0]
    assert back["MessageId"] == sent["MessageId"] and back["Body"] == "poison"
    assert _code(sqs.cancel_message_move_task, TaskHandle=handle) == \
        "AWS.SimpleQueueService.UnsupportedOperation"
    assert _code(sqs.cancel_message_move_task, TaskHandle="nope") == \
        "ResourceNotFoundException"


def test_redrive_allow_policy_is_enforced(sqs: Any) -> None:
    sqs.create_queue(QueueName="closed-dlq", Attributes={
        "RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"})})
    url = sqs.create_queue(QueueName="wants-dlq")["QueueUrl"]
    assert _code(sqs.set_queue_attributes, QueueUrl=url, Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": _arn("closed-dlq"),
                                     "maxReceiveCount": 3})}) == "InvalidParameterValue"


def test_redrive_policy_refusals_name_the_redrive_policy(sqs: Any) -> None:
    def refusal(**call: Any) -> dict[str, str]:
        with pytest.raises(ClientError) as caught:
            (sqs.set_queue_attributes if "QueueUrl" in call else sqs.create_queue)(**call)
        return caught.value.response["Error"]

    def policy(dlq: str) -> dict[str, str]:
        return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": _arn(dlq),
                                             "maxReceiveCount": 3})}

    url = sqs.create_queue(QueueName="needs-dlq")["QueueUrl"]
    sqs.create_queue(QueueName="plain-dlq")
    sqs.create_queue(QueueName="fifo-dlq.fifo", Attributes={"FifoQueue": "true"})
    fifo = sqs.create_queue(QueueName="fifo-src.fifo", Attributes={"FifoQueue": "true"})
    for error in (refusal(QueueUrl=url, Attributes=policy("no-such-dlq")),  # not the queue's own
                  refusal(QueueName="new-src", Attributes=policy("no-such-dlq")),
                  refusal(QueueUrl=url, Attributes=policy("needs-dlq")),  # its own DLQ
                  refusal(QueueUrl=url, Attributes=policy("fifo-dlq.fifo")),  # SQS: same kinds
                  refusal(QueueUrl=fifo["QueueUrl"], Attributes=policy("plain-dlq"))):
        assert error["Code"] == "InvalidParameterValue"
        assert "RedrivePolicy" in error["Message"] and "attributes." not in error["Message"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    assert "new-src" not in str(sqs.list_queues(QueueNamePrefix="new-src"))
    error = refusal(QueueName="slow", Attributes={"DelaySeconds": "900",
                                                  "MessageRetentionPeriod": "60"})
    assert "MessageRetentionPeriod" in error["Message"]


# -- tags, permissions ------------------------------------------------------------------------


def test_queue_tags(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="tagged", tags={"team": "core"})["QueueUrl"]
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test", "team": "platform"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "platform", "env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)


def test_permissions_are_grants_not_account_policies(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="permissions")["QueueUrl"]
    with pytest.raises(sqs.exceptions.UnsupportedOperation, match="grant"):
        sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["111111111111"],
                           Actions=["SendMessage"])
    with pytest.raises(sqs.exceptions.UnsupportedOperation, match="RemovePermission"):
        sqs.remove_permission(QueueUrl=url, Label="l")


# -- Lamina beyond SQS ------------------------------------------------------------------------


def test_priority_lanes_through_a_message_attribute(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="lanes")["QueueUrl"]
    for body, priority in (("low", "12"), ("urgent", "1"), ("normal", None)):
        attributes = ({"lamina.priority": {"DataType": "Number", "StringValue": priority}}
                      if priority else {})
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                              MessageAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["urgent", "normal", "low"]
    assert got[0]["MessageAttributes"]["lamina.priority"]["StringValue"] == "1"
    assert _code(sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes={
        "lamina.priority": {"DataType": "Number", "StringValue": "17"}}) == \
        "InvalidParameterValue"


def test_a_second_reader_through_a_tag_url(sqs: Any, server: ThreadServer) -> None:
    url = sqs.create_queue(QueueName="shared")["QueueUrl"]
    with Client.connect("127.0.0.1", server.port) as client:
        client.create_tag("shared", "audit", start="oldest")
    sqs.send_message(QueueUrl=url, MessageBody="both see me")
    main = sqs.receive_message(QueueUrl=url)["Messages"][0]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=main["ReceiptHandle"])
    audit = sqs.receive_message(QueueUrl=url + "/audit")["Messages"][0]
    assert audit["MessageId"] == main["MessageId"]
    sqs.delete_message(QueueUrl=url + "/audit", ReceiptHandle=audit["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url + "/audit")
    assert _code(sqs.send_message, QueueUrl=url + "/audit", MessageBody="x") == \
        "InvalidParameterValue"
    assert _code(sqs.receive_message, QueueUrl=url + "/nosuchtag") == \
        "AWS.SimpleQueueService.NonExistentQueue"


def test_a_retried_fifo_receive_gets_the_same_messages_while_leased(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="attempts.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g")
    first = sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="try-1",
                                VisibilityTimeout=1)["Messages"]
    again = sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="try-1")["Messages"]
    assert again == first
    time.sleep(1.2)  # the lease ended: the attempt is a new receive
    later = sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="try-1")["Messages"]
    assert later[0]["MessageId"] == first[0]["MessageId"]
    assert later[0]["ReceiptHandle"] != first[0]["ReceiptHandle"]


def test_a_move_task_needs_a_dead_letter_queue(sqs: Any) -> None:
    sqs.create_queue(QueueName="not-a-dlq")
    assert _code(sqs.start_message_move_task, SourceArn=_arn("not-a-dlq")) == \
        "InvalidParameterValue"
    sqs.create_queue(QueueName="dlq2")
    sqs.create_queue(QueueName="src2", Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": _arn("dlq2"), "maxReceiveCount": 1})})
    sqs.create_queue(QueueName="elsewhere")
    assert _code(sqs.start_message_move_task, SourceArn=_arn("dlq2"),
                 DestinationArn=_arn("elsewhere")) == "InvalidParameterValue"
    assert sqs.start_message_move_task(SourceArn=_arn("dlq2"), DestinationArn=_arn("src2"))


def test_a_move_task_on_a_queue_that_does_not_exist_is_resource_not_found(sqs: Any) -> None:
    for call in (sqs.start_message_move_task, sqs.list_message_move_tasks):
        with pytest.raises(ClientError) as caught:
            call(SourceArn=_arn("no-such-dlq"))
        assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
        assert isinstance(caught.value, sqs.exceptions.ResourceNotFoundException)
        assert "SourceArn" in caught.value.response["Error"]["Message"]
    sqs.create_queue(QueueName="dlq3")
    sqs.create_queue(QueueName="src3", Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": _arn("dlq3"), "maxReceiveCount": 1})})
    with pytest.raises(ClientError) as caught:
        sqs.start_message_move_task(SourceArn=_arn("dlq3"), DestinationArn=_arn("no-such-src"))
    assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert "DestinationArn" in caught.value.response["Error"]["Message"]
