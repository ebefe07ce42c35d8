"""Whatever a client sends, the SQS gateway answers with an SQS error of the sender's fault
(a 4xx in the request's own protocol), never an internal failure: any action, with parameters
of any shape, in either protocol."""

from __future__ import annotations

import http.client
import json
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.server.sqs.actions import ACTIONS
from tests.support.sqs import sqs_server
from tests.support.servers import ThreadServer

QUEUE_URL = "http://127.0.0.1/000000000000/q"
FIELDS = ("QueueUrl", "QueueName", "Attributes", "MessageBody", "Entries", "MessageAttributes",
          "MaxNumberOfMessages", "AttributeNames", "ReceiptHandle", "VisibilityTimeout", "Tags",
          "TagKeys", "SourceArn", "WaitTimeSeconds", "MessageGroupId",
          "MessageDeduplicationId", "DelaySeconds", "MessageSystemAttributes",
          "MessageAttributeNames", "NextToken", "MaxResults", "TaskHandle", "DestinationArn",
          "QueueNamePrefix", "tags", "ReceiveRequestAttemptId")
QUERY_KEYS = ("QueueName", "Attribute.1.Name", "Attribute.1.Value", "Attribute.x",
              "MessageBody", "MessageAttribute.1.Name", "MessageAttribute.1.Value.DataType",
              "MessageAttribute.1.Value.StringValue", "MessageAttribute.1.Value.BinaryValue",
              "MessageAttribute.1", "SendMessageBatchRequestEntry.1.Id",
              "SendMessageBatchRequestEntry.1", "AttributeName.1", "AttributeName",
              "Tag.1.Key", "TagKey.1", "VisibilityTimeout", "ReceiptHandle", "A.B.C")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=20),
                    st.sampled_from(["All", QUEUE_URL, "String", "Binary", "Number",
                                     "arn:aws:sqs:us-east-1:000000000000:q", "AAAA"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["Id", "DataType", "StringValue", "BinaryValue", "MessageBody", "ReceiptHandle",
         "VisibilityTimeout", "a"]), inner, max_size=3)), max_leaves=8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    with sqs_server(tmp_path_factory.mktemp("sqs") / "data") as running:
        connection = http.client.HTTPConnection("127.0.0.1", running.server.sqs_port,
                                                timeout=30)
        connection.request("POST", "/", body='{"QueueName": "q"}', headers={
            "X-Amz-Target": "AmazonSQS.CreateQueue"})
        assert connection.getresponse().status == 200
        connection.close()
        yield running


def _post(server: ThreadServer, path: str, body: str, headers: dict[str, str]
          ) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server.sqs_port, timeout=30)
    try:
        connection.request("POST", path, body=body.encode("utf-8", "surrogatepass"),
                           headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(action=st.sampled_from(sorted(ACTIONS)),
       params=st.dictionaries(st.sampled_from(FIELDS), values, max_size=5),
       with_queue=st.booleans())
def test_json_requests_of_any_shape_get_a_sender_error_at_worst(
        server: ThreadServer, action: str, params: dict[str, Any], with_queue: bool) -> None:
    if with_queue:
        params["QueueUrl"] = QUEUE_URL
    status, body = _post(server, "/", json.dumps(params), {
        "X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"})
    assert status < 500, body
    if status != 200:
        assert json.loads(body)["__type"].startswith("com.amazonaws.sqs#")


@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(action=st.sampled_from([*sorted(ACTIONS), "", "Nope"]),
       params=st.dictionaries(st.sampled_from(QUERY_KEYS), st.text(max_size=12), max_size=6),
       path=st.sampled_from(["/", "/000000000000/q", "/000000000000/q/t", "/x/y/z/w"]))
def test_query_requests_of_any_shape_get_a_sender_error_at_worst(
        server: ThreadServer, action: str, params: dict[str, str], path: str) -> None:
    form = urlencode({"Action": action, **params}, encoding="utf-8", errors="surrogatepass")
    status, body = _post(server, path, form,
                         {"Content-Type": "application/x-www-form-urlencoded"})
    assert status < 500, body
    assert body.startswith(b'<?xml version="1.0"?>')
