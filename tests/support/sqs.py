"""Helpers for the SQS gateway tests: a server with ``--sqs-port`` in a thread, boto3 clients
for it, and SQS's attribute digest written out independently of the gateway's code."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import boto3
from botocore.config import Config

from tests.support.servers import ThreadServer, server_thread

REGION = "us-east-1"
ACCOUNT = "000000000000"


def sqs_client(port: int, key: str = "unused", secret: str = "unused", *,
               scheme: str = "http", verify: Any = None, retries: int = 0,
               read_timeout_s: float = 30, region: str = REGION) -> Any:
    return boto3.session.Session().client(
        "sqs", endpoint_url=f"{scheme}://127.0.0.1:{port}", region_name=region,
        aws_access_key_id=key, aws_secret_access_key=secret, verify=verify,
        config=Config(retries={"max_attempts": retries, "mode": "standard"},
                      read_timeout=read_timeout_s))


@contextmanager
def sqs_server(data: Path, **overrides: Any) -> Iterator[ThreadServer]:
    overrides.setdefault("sqs_port", 0)
    with server_thread(data, **overrides) as running:
        yield running


def expected_md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """The digest as the SQS developer guide describes it (independent of the gateway)."""
    buffer = bytearray()
    for name in sorted(attributes):
        attribute = attributes[name]
        buffer += len(name.encode()).to_bytes(4, "big") + name.encode()
        kind = attribute["DataType"].encode()
        buffer += len(kind).to_bytes(4, "big") + kind
        if "BinaryValue" in attribute:
            value = attribute["BinaryValue"]
            buffer += b"\x02"
        else:
            value = attribute["StringValue"].encode()
            buffer += b"\x01"
        buffer += len(value).to_bytes(4, "big") + value
    return hashlib.md5(bytes(buffer)).hexdigest()


# --- boto3 speaking the Query protocol ----------------------------------------------------------

#: What the Query protocol needs beyond the JSON model current botocore ships for SQS (as the
#: SDKs' Query models of SQS have it): flattened lists and maps, their member names, and the
#: members renamed on the wire.
_QUERY_TRAITS: dict[str, dict[str, Any]] = {
    "AWSAccountIdList": {"flattened": True, "member": "AWSAccountId"},
    "ActionNameList": {"flattened": True, "member": "ActionName"},
    "AttributeNameList": {"flattened": True, "member": "AttributeName"},
    "BatchResultErrorEntryList": {"flattened": True, "member": "BatchResultErrorEntry"},
    "ChangeMessageVisibilityBatchRequestEntryList": {
        "flattened": True, "member": "ChangeMessageVisibilityBatchRequestEntry"},
    "ChangeMessageVisibilityBatchResultEntryList": {
        "flattened": True, "member": "ChangeMessageVisibilityBatchResultEntry"},
    "CreateQueueRequest": {"members": {"Attributes": "Attribute", "tags": "Tag"}},
    "DeleteMessageBatchRequestEntryList": {"flattened": True,
                                           "member": "DeleteMessageBatchRequestEntry"},
    "DeleteMessageBatchResultEntryList": {"flattened": True,
                                          "member": "DeleteMessageBatchResultEntry"},
    "GetQueueAttributesResult": {"members": {"Attributes": "Attribute"}},
    "ListMessageMoveTasksResultEntryList": {"flattened": True,
                                            "member": "ListMessageMoveTasksResultEntry"},
    "ListQueueTagsResult": {"members": {"Tags": "Tag"}},
    "Message": {"members": {"Attributes": "Attribute", "MessageAttributes": "MessageAttribute"}},
    "MessageAttributeNameList": {"flattened": True, "member": "MessageAttributeName"},
    "MessageBodyAttributeMap": {"flattened": True, "key": "Name", "value": "Value"},
    "MessageBodySystemAttributeMap": {"flattened": True, "key": "Name", "value": "Value"},
    "MessageList": {"flattened": True, "member": "Message"},
    "MessageSystemAttributeMap": {"flattened": True, "key": "Name", "value": "Value"},
    "QueueAttributeMap": {"flattened": True, "key": "Name", "value": "Value"},
    "QueueUrlList": {"flattened": True, "member": "QueueUrl"},
    "SendMessageBatchRequestEntry": {"members": {
        "MessageAttributes": "MessageAttribute",
        "MessageSystemAttributes": "MessageSystemAttribute"}},
    "SendMessageBatchRequestEntryList": {"flattened": True,
                                         "member": "SendMessageBatchRequestEntry"},
    "SendMessageBatchResultEntryList": {"flattened": True, "member": "SendMessageBatchResultEntry"},
    "SendMessageRequest": {"members": {"MessageAttributes": "MessageAttribute",
                                       "MessageSystemAttributes": "MessageSystemAttribute"}},
    "SetQueueAttributesRequest": {"members": {"Attributes": "Attribute"}},
    "TagKeyList": {"flattened": True, "member": "TagKey"},
    "TagMap": {"flattened": True, "key": "Key", "value": "Value"},
}


def query_protocol_client(port: int, models_dir: Path) -> Any:
    """A boto3 SQS client that speaks the Query protocol: the JSON model of the installed
    botocore turned into a Query model (under ``models_dir``), as older SDKs had it."""
    import json

    import botocore.session

    session = botocore.session.get_session()
    loader = session.get_component("data_loader")
    model = loader.load_service_model("sqs", "service-2", "2012-11-05")
    model["metadata"].update(protocol="query", protocols=["query"],
                             xmlNamespace="http://queue.amazonaws.com/doc/2012-11-05/")
    for name, operation in model["operations"].items():
        if "output" in operation:
            operation["output"]["resultWrapper"] = f"{name}Result"
    for name, traits in _QUERY_TRAITS.items():
        shape = model["shapes"].get(name)
        if shape is None:
            continue
        if traits.get("flattened"):
            shape["flattened"] = True
        for part in ("member", "key", "value"):
            if part in traits:
                shape[part]["locationName"] = traits[part]
        for member, location in traits.get("members", {}).items():
            if member in shape.get("members", {}):
                shape["members"][member]["locationName"] = location
    folder = models_dir / "sqs" / "2012-11-05"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "service-2.json").write_text(json.dumps(model))
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(models_dir))
    return boto3.session.Session(botocore_session=session).client(
        "sqs", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION,
        aws_access_key_id="unused", aws_secret_access_key="unused",
        config=Config(retries={"max_attempts": 0, "mode": "standard"}))
