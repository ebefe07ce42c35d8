"""The SQS gateway over the Query protocol, as older SDKs and tools send it: form-encoded
``Action=...`` with numbered members, XML answers, XML errors with the
``AWS.SimpleQueueService.*`` codes; plain HTTP requests over loopback, and boto3 itself made
to speak Query."""

from __future__ import annotations

import base64
import http.client
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest
from botocore.exceptions import ClientError

from tests.support.sqs import ACCOUNT, expected_md5_of_attributes, query_protocol_client, sqs_server
from tests.support.servers import ThreadServer

NS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    with sqs_server(tmp_path_factory.mktemp("sqs") / "data") as running:
        yield running


def query(server: ThreadServer, params: dict[str, Any], *, path: str = "/",
          method: str = "POST") -> tuple[int, ET.Element]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server.sqs_port, timeout=30)
    try:
        form = urlencode({"Version": "2012-11-05", **params})
        if method == "POST":
            connection.request("POST", path, body=form, headers={
                "Content-Type": "application/x-www-form-urlencoded"})
        else:
            connection.request("GET", f"{path}?{form}")
        response = connection.getresponse()
        body = response.read()
        assert response.getheader("Content-Type") == "text/xml"
        return response.status, ET.fromstring(body)
    finally:
        connection.close()


def text(root: ET.Element, path: str) -> str | None:
    found = root.find(path, NS)
    return found.text if found is not None else None


def test_create_send_receive_delete_in_xml(server: ThreadServer) -> None:
    status, root = query(server, {"Action": "CreateQueue", "QueueName": "xml",
                                  "Attribute.1.Name": "VisibilityTimeout",
                                  "Attribute.1.Value": "40"})
    assert status == 200 and root.tag == "{%s}CreateQueueResponse" % NS["sqs"]
    url = text(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    assert url is not None and url.endswith(f"/{ACCOUNT}/xml")
    assert text(root, "sqs:ResponseMetadata/sqs:RequestId")
    status, root = query(server, {
        "Action": "SendMessage", "QueueUrl": url, "MessageBody": "hello <xml> & co",
        "MessageAttribute.1.Name": "kind", "MessageAttribute.1.Value.DataType": "String",
        "MessageAttribute.1.Value.StringValue": "order",
        "MessageAttribute.2.Name": "blob", "MessageAttribute.2.Value.DataType": "Binary",
        "MessageAttribute.2.Value.BinaryValue": base64.b64encode(b"\x01\x02").decode()})
    assert status == 200
    attributes = {"kind": {"DataType": "String", "StringValue": "order"},
                  "blob": {"DataType": "Binary", "BinaryValue": b"\x01\x02"}}
    assert text(root, "sqs:SendMessageResult/sqs:MD5OfMessageAttributes") == \
        expected_md5_of_attributes(attributes)
    message_id = text(root, "sqs:SendMessageResult/sqs:MessageId")
    status, root = query(server, {"Action": "ReceiveMessage", "QueueUrl": url,
                                  "AttributeName.1": "All", "MessageAttributeName.1": "All"})
    message = root.find("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert message is not None
    assert text(message, "sqs:MessageId") == message_id
    assert text(message, "sqs:Body") == "hello <xml> & co"
    names = {text(a, "sqs:Name"): text(a, "sqs:Value")
             for a in message.findall("sqs:Attribute", NS)}
    assert names["ApproximateReceiveCount"] == "1"
    values = {text(a, "sqs:Name"): a.find("sqs:Value", NS)
              for a in message.findall("sqs:MessageAttribute", NS)}
    assert text(values["kind"], "sqs:StringValue") == "order"
    assert base64.b64decode(text(values["blob"], "sqs:BinaryValue") or "") == b"\x01\x02"
    handle = text(message, "sqs:ReceiptHandle")
    status, root = query(server, {"Action": "DeleteMessage", "QueueUrl": url,
                                  "ReceiptHandle": handle})
    assert status == 200 and root.tag.endswith("DeleteMessageResponse")


def test_errors_carry_query_codes(server: ThreadServer) -> None:
    status, root = query(server, {"Action": "GetQueueUrl", "QueueName": "nothing-here"})
    assert status == 400 and root.tag == "{%s}ErrorResponse" % NS["sqs"]
    assert text(root, "sqs:Error/sqs:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert text(root, "sqs:Error/sqs:Type") == "Sender"
    status, root = query(server, {"Action": "CreateQueue", "QueueName": "dup"})
    status, root = query(server, {"Action": "CreateQueue", "QueueName": "dup",
                                  "Attribute.1.Name": "DelaySeconds",
                                  "Attribute.1.Value": "3"})
    assert text(root, "sqs:Error/sqs:Code") == "QueueAlreadyExists"
    status, root = query(server, {"Action": "Explode"})
    assert status == 400 and text(root, "sqs:Error/sqs:Code") == "InvalidAction"
    status, root = query(server, {"QueueName": "x"})
    assert text(root, "sqs:Error/sqs:Code") == "MissingParameter"


def test_batches_and_lists_in_xml(server: ThreadServer) -> None:
    _, root = query(server, {"Action": "CreateQueue", "QueueName": "xml-batch"})
    url = text(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    status, root = query(server, {
        "Action": "SendMessageBatch", "QueueUrl": url,
        "SendMessageBatchRequestEntry.1.Id": "one",
        "SendMessageBatchRequestEntry.1.MessageBody": "1",
        "SendMessageBatchRequestEntry.2.Id": "two",
        "SendMessageBatchRequestEntry.2.MessageBody": "",
        "SendMessageBatchRequestEntry.3.Id": "three",
        "SendMessageBatchRequestEntry.3.MessageBody": "3",
        "SendMessageBatchRequestEntry.3.DelaySeconds": "0"})
    result = root.find("sqs:SendMessageBatchResult", NS)
    assert result is not None
    ok = [text(e, "sqs:Id") for e in result.findall("sqs:SendMessageBatchResultEntry", NS)]
    failed = result.findall("sqs:BatchResultErrorEntry", NS)
    assert ok == ["one", "three"] and [text(e, "sqs:Id") for e in failed] == ["two"]
    assert text(failed[0], "sqs:SenderFault") == "true"
    status, root = query(server, {"Action": "ReceiveMessage", "QueueUrl": url,
                                  "MaxNumberOfMessages": "10"})
    handles = [text(m, "sqs:ReceiptHandle")
               for m in root.findall("sqs:ReceiveMessageResult/sqs:Message", NS)]
    assert len(handles) == 2
    params = {"Action": "DeleteMessageBatch", "QueueUrl": url}
    for n, handle in enumerate(handles, 1):
        params[f"DeleteMessageBatchRequestEntry.{n}.Id"] = f"d{n}"
        params[f"DeleteMessageBatchRequestEntry.{n}.ReceiptHandle"] = handle
    _, root = query(server, params)
    assert [text(e, "sqs:Id") for e in root.findall(
        "sqs:DeleteMessageBatchResult/sqs:DeleteMessageBatchResultEntry", NS)] == ["d1", "d2"]
    _, root = query(server, {"Action": "ListQueues", "QueueNamePrefix": "xml-"})
    assert [u.text for u in root.findall("sqs:ListQueuesResult/sqs:QueueUrl", NS)] == [url]
    _, root = query(server, {"Action": "GetQueueAttributes", "QueueUrl": url,
                             "AttributeName.1": "VisibilityTimeout",
                             "AttributeName.2": "QueueArn"})
    got = {text(a, "sqs:Name"): text(a, "sqs:Value") for a in root.findall(
        "sqs:GetQueueAttributesResult/sqs:Attribute", NS)}
    assert got == {"VisibilityTimeout": "30",
                   "QueueArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:xml-batch"}


def test_a_request_to_the_queue_url_names_the_queue_and_get_works(server: ThreadServer) -> None:
    _, root = query(server, {"Action": "CreateQueue", "QueueName": "by-path"})
    status, root = query(server, {"Action": "SendMessage", "MessageBody": "via path"},
                         path=f"/{ACCOUNT}/by-path", method="GET")
    assert status == 200
    status, root = query(server, {"Action": "ReceiveMessage"}, path=f"/{ACCOUNT}/by-path")
    assert text(root, "sqs:ReceiveMessageResult/sqs:Message/sqs:Body") == "via path"
    _, root = query(server, {"Action": "TagQueue", "Tag.1.Key": "k", "Tag.1.Value": "v"},
                    path=f"/{ACCOUNT}/by-path")
    _, root = query(server, {"Action": "ListQueueTags"}, path=f"/{ACCOUNT}/by-path")
    tags = root.findall("sqs:ListQueueTagsResult/sqs:Tag", NS)
    assert [(text(t, "sqs:Key"), text(t, "sqs:Value")) for t in tags] == [("k", "v")]


def test_boto3_speaking_query_end_to_end(server: ThreadServer, tmp_path: Path) -> None:
    sqs = query_protocol_client(server.server.sqs_port, tmp_path / "models")
    assert sqs.meta.service_model.protocol == "query"
    url = sqs.create_queue(QueueName="boto-query", Attributes={"VisibilityTimeout": "40"},
                           tags={"team": "core"})["QueueUrl"]
    attributes = {"n": {"DataType": "Number", "StringValue": "1.5"},
                  "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="hi <&>", MessageAttributes=attributes)
    assert sent["MD5OfMessageAttributes"] == expected_md5_of_attributes(attributes)
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "1"}, {"Id": "b", "MessageBody": ""}])
    assert [e["Id"] for e in batch["Successful"]] == ["a"]
    assert batch["Failed"][0]["Code"] == "InvalidParameterValue"
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                              MessageAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["hi <&>", "1"]
    assert got[0]["MessageAttributes"] == attributes
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)])
    assert [e["Id"] for e in deleted["Successful"]] == ["0", "1"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])[
        "Attributes"] == {"VisibilityTimeout": "40"}
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core"}
    assert url in sqs.list_queues(QueueNamePrefix="boto-")["QueueUrls"]
    with pytest.raises(ClientError) as caught:
        sqs.get_queue_url(QueueName="missing")
    assert caught.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"


def test_boto3_speaking_query_dead_letter_actions(server: ThreadServer, tmp_path: Path) -> None:
    import json
    sqs = query_protocol_client(server.server.sqs_port, tmp_path / "models")
    dlq = sqs.create_queue(QueueName="q-dlq")["QueueUrl"]
    arn = f"arn:aws:sqs:us-east-1:{ACCOUNT}:q-dlq"
    source = sqs.create_queue(QueueName="q-src", Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": 1})})["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    handle = sqs.start_message_move_task(SourceArn=arn)["TaskHandle"]
    assert handle
    tasks = sqs.list_message_move_tasks(SourceArn=arn)["Results"]
    assert tasks[0]["Status"] == "COMPLETED" and tasks[0]["SourceArn"] == arn


def test_carriage_returns_survive_the_xml_answer(server: ThreadServer, tmp_path: Path) -> None:
    sqs = query_protocol_client(server.server.sqs_port, tmp_path / "models")
    url = sqs.create_queue(QueueName="crlf")["QueueUrl"]
    body = "line 1\r\nline 2\rend"
    attributes = {"note": {"DataType": "String", "StringValue": "a\r\nb"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
    assert got["Body"] == body and got["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert got["MessageAttributes"] == attributes
    assert expected_md5_of_attributes(got["MessageAttributes"]) == got["MD5OfMessageAttributes"]
