"""The SQS gateway's pure parts without a server: attribute digests against values SQS
publishes, SigV4 verification against botocore's signer, Query parameter decoding, queue
names, and the receipt-handle map."""

from __future__ import annotations

import calendar
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from lamina.server.sqs.context import Handles
from lamina.server.sqs.errors import SqsError
from lamina.server.sqs.messages import md5_of_attributes
from lamina.server.sqs.queryproto import parse_request
from lamina.server.sqs.queues import ref_of_name, sqs_name_of
from lamina.server.sqs.sigv4 import MAX_SKEW_S, verify


def test_attribute_digests_match_published_sqs_values() -> None:
    assert md5_of_attributes({"timestamp": {"DataType": "Number",
                                            "StringValue": "1493147359900"}}) == \
        "235c5c510d26fb653d073faed50ae77c"
    assert md5_of_attributes({"SellerName": {"DataType": "String",
                                             "StringValue": "Example Store"}}) == \
        "cd28f3b68aeee4b2eac9c66f2f694b58"
    assert md5_of_attributes({"ordinal": {"DataType": "Number", "StringValue": "1"},
                              "category": {"DataType": "String", "StringValue": "test"}}) == \
        "d21ae90c49061e927f57df5f5d72be1f"
    assert md5_of_attributes({}) is None


def _signed(body: str = "Action=ListQueues", target: str = "/?x=1&a=b c",
            secret: str = "s3cret") -> tuple[str, dict[str, str], bytes]:
    request = AWSRequest(method="POST", url=f"http://127.0.0.1:9324{target.replace(' ', '%20')}",
                         data=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(Credentials("key1", secret), "sqs", "us-east-1").add_auth(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers["host"] = "127.0.0.1:9324"
    return target.replace(" ", "%20"), headers, body.encode()


def _secret(key_id: str) -> str | None:
    return "s3cret" if key_id == "key1" else None


def test_sigv4_accepts_botocores_signature_and_names_what_is_wrong() -> None:
    target, headers, body = _signed()
    assert verify("POST", target, headers, body, "us-east-1", _secret) == "key1"
    with pytest.raises(SqsError, match="SignatureDoesNotMatch"):
        verify("POST", target, headers, body + b"&more=1", "us-east-1", _secret)
    with pytest.raises(SqsError, match="SignatureDoesNotMatch"):
        verify("POST", target.replace("x=1", "x=2"), headers, body, "us-east-1", _secret)
    with pytest.raises(SqsError, match="SignatureDoesNotMatch: Credential should be scoped"):
        verify("POST", target, headers, body, "eu-west-1", _secret)
    with pytest.raises(SqsError, match="InvalidClientTokenId"):
        verify("POST", target, headers, body, "us-east-1", lambda key: None)
    broken = dict(headers, authorization="AWS4-HMAC-SHA256 nonsense")
    with pytest.raises(SqsError, match="IncompleteSignature"):
        verify("POST", target, broken, body, "us-east-1", _secret)


def test_sigv4_clock_skew_limit_is_fifteen_minutes() -> None:
    target, headers, body = _signed()
    signed_at = calendar.timegm(time.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ"))
    verify("POST", target, headers, body, "us-east-1", _secret, now_s=signed_at + MAX_SKEW_S)
    verify("POST", target, headers, body, "us-east-1", _secret, now_s=signed_at - MAX_SKEW_S)
    with pytest.raises(SqsError, match="RequestExpired"):
        verify("POST", target, headers, body, "us-east-1", _secret,
               now_s=signed_at + MAX_SKEW_S + 1)


def test_query_parameters_become_the_json_shape() -> None:
    form = ("Action=SendMessageBatch&QueueUrl=http%3A%2F%2Fh%2F000000000000%2Fq"
            "&SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=2"
            "&SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=1"
            "&SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=k"
            "&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=Binary"
            "&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.BinaryValue=AAE%3D")
    action, params = parse_request(form.encode(), "/")
    assert action == "SendMessageBatch"
    assert params == {"QueueUrl": "http://h/000000000000/q", "Entries": [
        {"Id": "a", "MessageBody": "1",
         "MessageAttributes": {"k": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}},
        {"Id": "b", "MessageBody": "2"}]}
    action, params = parse_request(b"Action=GetQueueAttributes&AttributeName.2=QueueArn"
                                   b"&AttributeName.1=All", "/000000000000/q")
    assert params == {"AttributeNames": ["All", "QueueArn"], "QueueUrl": "/000000000000/q"}
    with pytest.raises(SqsError, match="numbered"):
        parse_request(b"Action=GetQueueAttributes&AttributeName.x=All", "/")


def test_queue_names_map_onto_lamina_names() -> None:
    assert ref_of_name("orders").lamina_name == "orders"
    fifo = ref_of_name("orders.fifo")
    assert fifo.fifo and fifo.lamina_name == "orders-fifo"
    assert sqs_name_of("orders-fifo") == "orders.fifo"
    for bad in ("1st", "x" * 65, "has space", "plain-fifo", "a.b"):
        with pytest.raises(SqsError, match="InvalidParameterValue"):
            ref_of_name(bad)
    with pytest.raises(SqsError, match="QueueDoesNotExist"):
        ref_of_name("1st", lookup=True)


def test_a_handle_follows_its_lease_until_the_lease_ends() -> None:
    handles = Handles()
    handles.changed(b"h", b"r1", end_ms=2000, now_ms=1000)
    assert handles.resolve(b"h", 1500) == b"r1"
    handles.changed(b"h", b"r2", end_ms=3000, now_ms=1500)
    assert handles.resolve(b"h", 2500) == b"r2"
    assert handles.resolve(b"h", 3000) == b"h"  # the lease ended: the handle is itself again
    handles.changed(b"other", b"x", end_ms=5000, now_ms=3500)  # prunes the ended entry
    assert b"h" not in handles._current
    handles.changed(b"other", None, end_ms=0, now_ms=3600)
    assert handles.resolve(b"other", 3700) == b"other"


def test_serve_options_of_the_gateway() -> None:
    import argparse
    from lamina.server.config import ConfigError, add_serve_arguments, config_from_args
    parser = add_serve_arguments(argparse.ArgumentParser())
    config = config_from_args(parser.parse_args([]))
    assert (config.sqs_port, config.sqs_account, config.sqs_region) == \
        (None, "000000000000", "us-east-1")
    config = config_from_args(parser.parse_args(
        ["--sqs-port", "9324", "--sqs-account", "123456789012", "--sqs-region", "eu-west-1"]))
    assert (config.sqs_port, config.sqs_account, config.sqs_region) == \
        (9324, "123456789012", "eu-west-1")
    for bad in (["--sqs-port", "70000"], ["--sqs-account", "abc"], ["--sqs-region", "mars"]):
        with pytest.raises(ConfigError):
            config_from_args(parser.parse_args(bad))
    assert "(default 000000000000)" in " ".join(parser.format_help().split())
