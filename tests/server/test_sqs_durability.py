"""A real ``lamina serve --sqs-port`` killed with SIGKILL under SQS load (boto3 producers
sending batches, consumers receiving and batch-deleting) loses no acknowledged send and
brings back no acknowledged delete; a FIFO queue's deduplication outlives the restart."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from tests.support.servers import assert_nothing_acknowledged_lost, kill_under_load
from tests.support.sqs import sqs_client


def _sqs_port(process: Any) -> int:
    return next(line["sqs_port"] for line in process.lines if line.get("event") == "start")


@pytest.mark.slow
def test_kill_9_under_sqs_load_loses_nothing_acknowledged(tmp_path: Path,
                                                           spawned: Any) -> None:
    process = spawned("--sqs-port", "0")
    port = _sqs_port(process)
    # Leases outlast the test: a delete acknowledged here really deleted (with an ended
    # lease SQS, and the gateway, answer success without deleting).
    url = sqs_client(port).create_queue(QueueName="q", Attributes={
        "VisibilityTimeout": "300"})["QueueUrl"]
    fifo = sqs_client(port).create_queue(QueueName="once.fifo", Attributes={
        "FifoQueue": "true"})["QueueUrl"]
    first = sqs_client(port).send_message(QueueUrl=fifo, MessageBody="x", MessageGroupId="g",
                                          MessageDeduplicationId="only-once")
    stop = threading.Event()
    acked_sent: set[str] = set()
    received: set[str] = set()
    acked_deleted: set[str] = set()
    lock = threading.Lock()

    def producer(number: int) -> None:
        sqs = sqs_client(port, read_timeout_s=5)
        n = 0
        try:
            while not stop.is_set():
                entries = [{"Id": str(i), "MessageBody": f"p{number}-{n + i}"}
                           for i in range(10)]
                n += 10
                answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
                with lock:
                    acked_sent.update(e["MessageId"] for e in answer["Successful"])
        except (BotoCoreError, ClientError):
            pass

    def consumer() -> None:
        sqs = sqs_client(port, read_timeout_s=5)
        try:
            while not stop.is_set():
                messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                               WaitTimeSeconds=1).get("Messages", [])
                with lock:
                    received.update(m["MessageId"] for m in messages)
                if not messages:
                    continue
                answer = sqs.delete_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)])
                ids = {str(i): m["MessageId"] for i, m in enumerate(messages)}
                with lock:
                    acked_deleted.update(ids[e["Id"]] for e in answer["Successful"])
        except (BotoCoreError, ClientError):
            pass

    kill_under_load(process, producer, consumer, stop, load_s=2.0, join_s=15)
    assert len(acked_sent) > 50 and len(acked_deleted) > 10

    restarted = spawned("--sqs-port", "0", data=tmp_path / "data")
    assert_nothing_acknowledged_lost(restarted.port, "q", acked_sent, acked_deleted, received)
    again = sqs_client(_sqs_port(restarted)).send_message(
        QueueUrl=fifo.replace(str(port), str(_sqs_port(restarted))), MessageBody="x",
        MessageGroupId="g", MessageDeduplicationId="only-once")
    assert again["MessageId"] == first["MessageId"]
