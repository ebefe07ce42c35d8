"""The SQS gateway over AWS JSON 1.0, driven by boto3 itself against a real server on
loopback: queue actions, messages with attributes and their digests, long polling, batches,
errors in SQS's codes, and messages crossing between SQS and the binary protocol."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from botocore.exceptions import ClientError

from lamina.client import Client
from tests.support.sqs import ACCOUNT, expected_md5_of_attributes, sqs_client, sqs_server
from tests.support.servers import ThreadServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    with sqs_server(tmp_path_factory.mktemp("sqs") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def sqs(server: ThreadServer) -> Any:
    return sqs_client(server.server.sqs_port)


def _error(call: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response


def test_queue_urls_arns_and_lookups(sqs: Any, server: ThreadServer) -> None:
    url = sqs.create_queue(QueueName="urls")["QueueUrl"]
    assert url == f"http://127.0.0.1:{server.server.sqs_port}/{ACCOUNT}/urls"
    assert sqs.create_queue(QueueName="urls")["QueueUrl"] == url  # idempotent
    assert sqs.get_queue_url(QueueName="urls")["QueueUrl"] == url
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    assert arn == {"QueueArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:urls"}
    missing = _error(sqs.get_queue_url, QueueName="no-such-queue")
    assert missing["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert missing["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url + "-gone", MessageBody="x")


def test_create_queue_with_other_attributes_is_queue_name_exists(sqs: Any) -> None:
    sqs.create_queue(QueueName="exists", Attributes={"VisibilityTimeout": "40"})
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName="exists", Attributes={"VisibilityTimeout": "50"})


def test_invalid_names_and_attributes_are_refused_naming_them(sqs: Any) -> None:
    error = _error(sqs.create_queue, QueueName="bad name")["Error"]
    assert error["Code"] == "InvalidParameterValue" and "QueueName" in error["Message"]
    error = _error(sqs.create_queue, QueueName="attrs", Attributes={"Colour": "red"})["Error"]
    assert error["Code"] == "InvalidAttributeName" and "Colour" in error["Message"]
    error = _error(sqs.create_queue, QueueName="attrs",
                   Attributes={"DelaySeconds": "901"})["Error"]
    assert error["Code"] == "InvalidAttributeValue" and "DelaySeconds" in error["Message"]


def test_list_queues_with_prefix_and_pages(sqs: Any) -> None:
    for name in ("page-a", "page-b", "page-c"):
        sqs.create_queue(QueueName=name)
    names = [url.rsplit("/", 1)[1] for url in
             sqs.list_queues(QueueNamePrefix="page-")["QueueUrls"]]
    assert names == ["page-a", "page-b", "page-c"]
    first = sqs.list_queues(QueueNamePrefix="page-", MaxResults=2)
    assert len(first["QueueUrls"]) == 2 and "NextToken" in first
    second = sqs.list_queues(QueueNamePrefix="page-", MaxResults=2,
                             NextToken=first["NextToken"])
    assert [u.rsplit("/", 1)[1] for u in second["QueueUrls"]] == ["page-c"]
    assert "NextToken" not in second


def test_list_queues_lists_only_names_that_start_with_the_prefix(sqs: Any) -> None:
    sqs.create_queue(QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})
    for name in ("jobs-dlq", "jobs-fast", "Jobsx"):
        sqs.create_queue(QueueName=name)

    def listed(prefix: str, **page: Any) -> list[str]:
        return [url.rsplit("/", 1)[1] for url in
                sqs.list_queues(QueueNamePrefix=prefix, **page).get("QueueUrls", [])]

    assert listed("jobs-") == ["jobs-dlq", "jobs-fast"]  # not jobs.fifo (held as jobs-fifo)
    assert listed("jobs-f") == ["jobs-fast"]
    assert listed("jobs.") == ["jobs.fifo"]
    assert listed("jobs") == ["jobs-dlq", "jobs-fast", "jobs.fifo"]
    assert listed("Jobs") == ["Jobsx"]  # SQS's prefixes are case-sensitive
    first = sqs.list_queues(QueueNamePrefix="jobs-", MaxResults=1)
    assert [url.rsplit("/", 1)[1] for url in first["QueueUrls"]] == ["jobs-dlq"]
    assert listed("jobs-", MaxResults=1, NextToken=first["NextToken"]) == ["jobs-fast"]
    assert listed("j" * 70) == []


def test_attributes_map_onto_the_queue_and_back(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="attributes", Attributes={
        "DelaySeconds": "5", "VisibilityTimeout": "45", "MessageRetentionPeriod": "600",
        "ReceiveMessageWaitTimeSeconds": "2", "MaximumMessageSize": "2048",
        "Policy": '{"Version": "2012-10-17"}'})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["DelaySeconds"] == "5" and got["VisibilityTimeout"] == "45"
    assert got["MessageRetentionPeriod"] == "600" and got["MaximumMessageSize"] == "2048"
    assert got["ReceiveMessageWaitTimeSeconds"] == "2"
    assert got["Policy"] == '{"Version": "2012-10-17"}'
    assert got["ApproximateNumberOfMessages"] == "0"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0",
                                                       "VisibilityTimeout": "60"})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "DelaySeconds", "VisibilityTimeout"])["Attributes"]
    assert got == {"DelaySeconds": "0", "VisibilityTimeout": "60"}
    sqs.send_message(QueueUrl=url, MessageBody="counted")
    sqs.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=60)
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["ApproximateNumberOfMessages"] == "1"
    assert got["ApproximateNumberOfMessagesDelayed"] == "1"
    sqs.receive_message(QueueUrl=url)
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["ApproximateNumberOfMessagesNotVisible"] == "1"


def test_message_attributes_and_digests_are_sqs_exact(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="digests")["QueueUrl"]
    attributes = {
        "text": {"DataType": "String", "StringValue": "héllo"},
        "count": {"DataType": "Number", "StringValue": "42"},
        "price": {"DataType": "Number", "StringValue": "1.50"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        "custom": {"DataType": "String.colour", "StringValue": "blue"},
    }
    trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="body ✓", MessageAttributes=attributes,
                            MessageSystemAttributes=trace)
    assert sent["MD5OfMessageBody"] == hashlib.md5("body ✓".encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == expected_md5_of_attributes(attributes)
    assert sent["MD5OfMessageSystemAttributes"] == expected_md5_of_attributes(trace)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                              MessageSystemAttributeNames=["All"])["Messages"][0]
    assert got["MessageId"] == sent["MessageId"] and got["Body"] == "body ✓"
    assert got["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert got["MessageAttributes"] == attributes
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    system = got["Attributes"]
    assert system["ApproximateReceiveCount"] == "1" and system["AWSTraceHeader"] == "Root=1-abc"
    assert int(system["SentTimestamp"]) <= int(system["ApproximateFirstReceiveTimestamp"])
    assert system["SenderId"] == ACCOUNT


def test_message_attribute_names_select_by_name_and_prefix(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="select")["QueueUrl"]
    attributes = {name: {"DataType": "String", "StringValue": name}
                  for name in ("order.id", "order.total", "trace")}
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=attributes)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["order.*"],
                              VisibilityTimeout=1)["Messages"][0]
    assert set(got["MessageAttributes"]) == {"order.id", "order.total"}
    assert got["MD5OfMessageAttributes"] == expected_md5_of_attributes(
        got["MessageAttributes"])
    time.sleep(1.1)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["trace"])["Messages"][0]
    assert set(got["MessageAttributes"]) == {"trace"}
    assert "Attributes" not in got  # no system attribute was asked for


def test_invalid_messages_are_refused(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="invalid")["QueueUrl"]
    error = _error(sqs.send_message, QueueUrl=url, MessageBody="bad \x01 char")["Error"]
    assert error["Code"] == "InvalidMessageContents"
    error = _error(sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes={
        "AWS.reserved": {"DataType": "String", "StringValue": "v"}})["Error"]
    assert error["Code"] == "InvalidParameterValue" and "reserved" in error["Message"]
    error = _error(sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes={
        "n": {"DataType": "Number", "StringValue": "twelve"}})["Error"]
    assert error["Code"] == "InvalidParameterValue" and "number" in error["Message"]
    error = _error(sqs.send_message, QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1))
    assert error["Error"]["Code"] == "InvalidParameterValue"


def test_long_poll_is_a_real_wait_answered_when_a_message_arrives(sqs: Any,
                                                                  server: ThreadServer) -> None:
    url = sqs.create_queue(QueueName="longpoll")["QueueUrl"]
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert time.monotonic() - started >= 0.9
    answers: list[Any] = []
    receiver = threading.Thread(target=lambda: answers.append(
        (sqs_client(server.server.sqs_port).receive_message(QueueUrl=url, WaitTimeSeconds=10),
         time.monotonic())))
    receiver.start()
    time.sleep(0.5)
    sent_at = time.monotonic()
    sqs.send_message(QueueUrl=url, MessageBody="wake up")
    receiver.join(15)
    answer, answered_at = answers[0]
    assert [m["Body"] for m in answer["Messages"]] == ["wake up"]
    assert answered_at - sent_at < 2  # the send woke the waiter; it did not poll to the end
    assert server.server.waiting.__len__() == 0


def test_receive_limits_and_visibility(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="visibility")["QueueUrl"]
    error = _error(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=11)["Error"]
    assert error["Code"] == "InvalidParameterValue" and "MaxNumberOfMessages" in error["Message"]
    error = _error(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=21)["Error"]
    assert "WaitTimeSeconds" in error["Message"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)}
                                                  for i in range(10)])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1)
    assert sorted(m["Body"] for m in got["Messages"]) == [str(i) for i in range(10)]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    time.sleep(1.2)
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                AttributeNames=["ApproximateReceiveCount"])
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again["Messages"]} == {"2"}


def test_receipt_handle_stays_valid_across_visibility_changes(sqs: Any) -> None:
    """And, as in SQS, deleting with the handle of an ended lease succeeds without deleting:
    the message is delivered again."""
    url = sqs.create_queue(QueueName="handles")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    handle = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=100)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=200)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)  # SQS: an old handle succeeds
    other = sqs.create_queue(QueueName="handles-other")["QueueUrl"]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=other, ReceiptHandle=handle)  # not this queue's
    error = _error(sqs.delete_message, QueueUrl=url, ReceiptHandle="not-a-handle!")
    assert error["Error"]["Code"] == "ReceiptHandleIsInvalid"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_changing_visibility_with_an_ended_lease_s_handle_says_why(sqs: Any) -> None:
    """SQS: a handle whose message is visible again is MessageNotInflight; one whose message
    was received again since, or deleted, names a message that does not exist or is not
    available (InvalidParameterValue)."""
    url = sqs.create_queue(QueueName="ended")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]
    time.sleep(1.1)
    with pytest.raises(sqs.exceptions.MessageNotInflight):
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                      VisibilityTimeout=5)
    second = sqs.receive_message(QueueUrl=url)["Messages"][0]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    for handle in (first["ReceiptHandle"], second["ReceiptHandle"]):
        error = _error(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle,
                       VisibilityTimeout=5)["Error"]
        assert error["Code"] == "InvalidParameterValue"
        assert "ReceiptHandle" in error["Message"] and "not available" in error["Message"]
    failed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "gone", "ReceiptHandle": second["ReceiptHandle"], "VisibilityTimeout": 5}])
    assert failed["Failed"][0]["Code"] == "InvalidParameterValue"


def test_a_fifo_delete_with_an_expired_handle_is_refused(sqs: Any) -> None:
    """SQS: on a FIFO queue a handle whose visibility timeout passed has expired, and deleting
    with it is an error (the message is delivered again); a standard queue's succeeds."""
    url = sqs.create_queue(QueueName="expiring.fifo",
                           Attributes={"FifoQueue": "true"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m", MessageGroupId="g",
                     MessageDeduplicationId="d")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]
    time.sleep(1.1)
    error = _error(sqs.delete_message, QueueUrl=url,
                   ReceiptHandle=first["ReceiptHandle"])["Error"]
    assert error["Code"] == "InvalidParameterValue" and "expired" in error["Message"]
    second = sqs.receive_message(QueueUrl=url)["Messages"][0]
    assert second["MessageId"] == first["MessageId"]
    answer = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "old", "ReceiptHandle": first["ReceiptHandle"]}])  # received again since
    assert answer["Failed"][0]["Id"] == "old" and not answer["Successful"]
    assert answer["Failed"][0]["Code"] == "InvalidParameterValue"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])  # a retry
    assert "Messages" not in sqs.receive_message(QueueUrl=url)


def test_visibility_zero_makes_a_message_receivable_again(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="release")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    handle = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=url)["Messages"][0]
    assert again["Body"] == "m"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)  # the old handle deletes nothing
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"],
                                  VisibilityTimeout=0)
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "m"


def test_batches_answer_per_entry_and_refuse_bad_batches(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="batches")["QueueUrl"]
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "ok", "MessageBody": "fine"}, {"Id": "bad", "MessageBody": "\x00"}])
    assert [e["Id"] for e in sent["Successful"]] == ["ok"]
    assert sent["Failed"][0]["Id"] == "bad" and sent["Failed"][0]["SenderFault"]
    assert sent["Failed"][0]["Code"] == "InvalidMessageContents"
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[])
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"}
                                                      for i in range(11)])
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": "x"},
                                                        {"Id": "a", "ReceiptHandle": "y"}])
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a b", "ReceiptHandle": "x"}])
    with pytest.raises(sqs.exceptions.BatchRequestTooLong):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": "x" * 300_000} for i in range(4)])
    handle = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "good", "ReceiptHandle": handle, "VisibilityTimeout": 60},
        {"Id": "stale", "ReceiptHandle": "AAAA", "VisibilityTimeout": 60}])
    assert [e["Id"] for e in changed["Successful"]] == ["good"]
    assert changed["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "good", "ReceiptHandle": handle}, {"Id": "forged", "ReceiptHandle": "AAAA"}])
    assert [e["Id"] for e in deleted["Successful"]] == ["good"]
    assert deleted["Failed"][0]["Id"] == "forged"
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"


def test_purge_empties_the_queue_once_a_minute(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="purged")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    sqs.purge_queue(QueueUrl=url)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    error = _error(sqs.purge_queue, QueueUrl=url)
    assert error["Error"]["Code"] == "AWS.SimpleQueueService.PurgeQueueInProgress"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_delete_queue(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="deleted")["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="deleted")


def test_unknown_action_is_invalid_action(server: ThreadServer) -> None:
    import urllib.request
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.server.sqs_port}/", data=b"{}", method="POST",
        headers={"X-Amz-Target": "AmazonSQS.Frobnicate",
                 "Content-Type": "application/x-amz-json-1.0"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    assert b"InvalidAction" in caught.value.read()


def test_sent_over_sqs_received_over_the_binary_protocol_and_back(sqs: Any,
                                                                 server: ThreadServer) -> None:
    url = sqs.create_queue(QueueName="bridge")["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="from sqs", MessageAttributes={
        "kind": {"DataType": "String", "StringValue": "order"},
        "n": {"DataType": "Number", "StringValue": "7"}})
    with Client.connect("127.0.0.1", server.port) as client:
        delivery = client.receive("bridge", max=1)[0]
        assert delivery.id == sent["MessageId"]
        assert delivery.message.body == "from sqs"
        assert delivery.message.attributes == {"kind": "order", "n": 7}
        client.delete("bridge", [delivery])
        client.send("bridge", [{1: b"from lamina", 2: {"flag": True, "size": 3}, 4: 2}])
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
    assert got["Body"] == "from lamina"
    assert got["MessageAttributes"] == {
        "flag": {"DataType": "String", "StringValue": "true"},
        "size": {"DataType": "Number", "StringValue": "3"},
        "lamina.priority": {"DataType": "Number", "StringValue": "2"}}
    assert got["MD5OfMessageAttributes"] == expected_md5_of_attributes(got["MessageAttributes"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
    with Client.connect("127.0.0.1", server.port) as client:
        client.send("bridge", [b"\xff\xfe not utf-8"])
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
    assert got["MessageAttributes"]["lamina.body-encoding"]["StringValue"] == "base64"
    import base64
    assert base64.b64decode(got["Body"]) == b"\xff\xfe not utf-8"


def test_shutdown_answers_a_long_poll_and_closes_idle_connections(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data") as running:
        sqs = sqs_client(running.server.sqs_port)
        url = sqs.create_queue(QueueName="closing")["QueueUrl"]
        answers: list[Any] = []
        poller = threading.Thread(target=lambda: answers.append(
            sqs_client(running.server.sqs_port).receive_message(QueueUrl=url,
                                                                WaitTimeSeconds=20)))
        poller.start()
        waiting_by = time.monotonic() + 30  # a loaded machine makes boto3's client slowly
        while not len(running.server.waiting) and time.monotonic() < waiting_by:
            time.sleep(0.01)
        assert len(running.server.waiting) == 1, "the long poll never began to wait"
        started = time.monotonic()
        running.stop()  # the idle keep-alive connection of ``sqs`` must not hold it up
        assert time.monotonic() - started < 5
        poller.join(5)
        assert answers == [{"ResponseMetadata": answers[0]["ResponseMetadata"]}]


def test_attribute_rules_of_the_queue_speak_sqs_names(sqs: Any) -> None:
    error = _error(sqs.create_queue, QueueName="rules", Attributes={
        "DelaySeconds": "900", "MessageRetentionPeriod": "600"})["Error"]
    assert error["Code"] == "InvalidAttributeValue"
    assert "DelaySeconds" in error["Message"] and "delay" not in error["Message"]


def test_unknown_attribute_names_in_a_receive_are_refused(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="names")["QueueUrl"]
    error = _error(sqs.receive_message, QueueUrl=url,
                   MessageSystemAttributeNames=["NoSuchAttribute"])["Error"]
    assert error["Code"] == "InvalidAttributeName" and "NoSuchAttribute" in error["Message"]


def test_with_fsync_an_sqs_send_is_answered_after_its_sync(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", fsync=True) as running:
        sqs = sqs_client(running.server.sqs_port)
        url = sqs.create_queue(QueueName="synced")["QueueUrl"]
        before = running.server.syncs
        sqs.send_message(QueueUrl=url, MessageBody="durable")
        assert running.server.syncs > before


def test_names_differing_only_in_case_are_one_queue(sqs: Any) -> None:
    sqs.create_queue(QueueName="casing")
    with pytest.raises(sqs.exceptions.QueueNameExists, match="letter case"):
        sqs.create_queue(QueueName="Casing")


def test_a_number_attribute_comes_back_as_sent_with_the_send_s_digest(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="numbers")["QueueUrl"]
    attributes = {name: {"DataType": "Number", "StringValue": value}
                  for name, value in (("zero", "0"), ("minus-zero", "-0"), ("plus", "+5"),
                                      ("negative", "-12"), ("padded", "007"))}
    sent = sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes=attributes)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
    assert got["MessageAttributes"] == attributes
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]


def test_a_message_over_the_queue_s_maximum_size_is_refused_in_sqs_s_names(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="small",
                           Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    error = _error(sqs.send_message, QueueUrl=url, MessageBody="x" * 1025)["Error"]
    assert error["Code"] == "InvalidParameterValue"
    assert "MaximumMessageSize" in error["Message"] and "1024" in error["Message"]
    assert "max_message_size" not in error["Message"] and "messages[" not in error["Message"]
    answer = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "bad", "MessageBody": "x", "DelaySeconds": 901},
        {"Id": "fits", "MessageBody": "x" * 1024},
        {"Id": "large", "MessageBody": "x" * 1025}])
    assert [entry["Id"] for entry in answer["Successful"]] == ["fits"]
    large = [entry for entry in answer["Failed"] if entry["Id"] == "large"][0]
    assert large["Code"] == "InvalidParameterValue" and large["SenderFault"]
    assert large["Message"].startswith("Entries[2]") and "MaximumMessageSize" in large["Message"]


def test_a_handle_of_another_queue_is_refused_naming_the_receipt_handle(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="mine")["QueueUrl"]
    other = sqs.create_queue(QueueName="theirs")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    handle = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
    for call, extra in ((sqs.delete_message, {}),
                        (sqs.change_message_visibility, {"VisibilityTimeout": 5})):
        error = _error(call, QueueUrl=other, ReceiptHandle=handle, **extra)["Error"]
        assert error["Code"] == "ReceiptHandleIsInvalid"
        assert error["Message"].startswith("The input receipt handle is not valid")
        assert "another queue" in error["Message"]
