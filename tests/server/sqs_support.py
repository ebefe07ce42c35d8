"""Helpers for the SQS gateway tests: a server with ``--sqs-port`` in a thread, boto3 clients
for it, and SQS's attribute digest written out independently of the gateway's code."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import boto3
from botocore.config import Config

from support import ThreadServer, server_thread

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
