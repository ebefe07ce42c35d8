"""CreateQueue and SetQueueAttributes write a queue's Lamina attributes and its SQS-only
attributes and tags together: a storage write that fails part-way (a full disk) leaves no
queue with half of them, and the request can be retried
(DESIGN.md §3 "Everything one request changes goes in one WriteBatch across column families:
atomic")."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from lamina.engine import recovery
from tests.support.sqs import sqs_client, sqs_server

DISK_FULL = "IO error: No space left on device: While appending to file: 000004.log"


class FailingAfterFirstWrite:
    """A database whose first write goes through and whose later ones fail, as when the
    disk fills up between two writes (until the store is opened again)."""

    def __init__(self, db: Any):
        self._db = db
        self._writes = 0

    def write(self, *args: Any) -> None:
        self._writes += 1
        if self._writes > 1:
            raise Exception(DISK_FULL)
        self._db.write(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_create_queue_cut_short_by_a_full_disk_can_be_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    with sqs_server(tmp_path / "data") as running:
        sqs = sqs_client(running.server.sqs_port)

        def fill_the_disk(engine: Any) -> None:
            engine._store.db = FailingAfterFirstWrite(engine._store.db)

        running.engine_job(fill_the_disk)
        try:
            sqs.create_queue(QueueName="jobs.fifo", Attributes=attributes,
                             tags={"team": "a"})
        except ClientError:
            pass  # the disk filled up during it: not acknowledged
        # Room again (the store is reopened): the client retries, as it must.
        sqs.create_queue(QueueName="jobs.fifo", Attributes=attributes, tags={"team": "a"})
    with sqs_server(tmp_path / "data") as running:  # and what was acknowledged holds
        sqs = sqs_client(running.server.sqs_port)
        url = sqs.get_queue_url(QueueName="jobs.fifo")["QueueUrl"]
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert got["ContentBasedDeduplication"] == "true"
        assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}
        sent = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
        assert sent["MessageId"]  # no deduplication id needed: content-based


def test_set_queue_attributes_cut_short_by_a_full_disk_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(recovery, "REOPEN_INTERVAL_S", 0.0)
    with sqs_server(tmp_path / "data") as running:
        sqs = sqs_client(running.server.sqs_port)
        url = sqs.create_queue(QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})[
            "QueueUrl"]

        def fill_the_disk(engine: Any) -> None:
            engine._store.db = FailingAfterFirstWrite(engine._store.db)

        running.engine_job(fill_the_disk)
        try:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={
                "VisibilityTimeout": "99", "ContentBasedDeduplication": "true"})
            changed = True
        except ClientError:
            changed = False  # not acknowledged: all of it, or none of it
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (got["VisibilityTimeout"], got["ContentBasedDeduplication"]) == (
            ("99", "true") if changed else ("30", "false"))
