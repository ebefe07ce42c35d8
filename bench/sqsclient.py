"""The SQS benchmark's client process: boto3 against any SQS endpoint, run as a script.

    PYTHON sqsclient.py < job.json

It imports only the standard library and boto3, so it runs under any interpreter that has
boto3 — Lamina's own, or a virtual environment with an older boto3 that speaks the Query
protocol (servers that predate AWS JSON, such as ElasticMQ 0.7.1, answer only that). Under
the Query protocol every per-queue action is posted to its queue URL, as the SDKs of that era
did, rather than to ``/`` with a ``QueueUrl`` parameter (which such servers refuse).

The parent (``sqsbench.py``) writes one JSON job on standard input and reads JSON lines back:

- ``{"mode": "admin", "ops": [...]}``: queue set-up and checks, not measured; one answer line
  ``{"ok": [result per op]}``.
- ``{"mode": "worker", "kind": "send" | "consume" | "rounds", ...}``: the client connects and
  warms up, writes ``{"ready": true}``, waits for a ``go`` line (so that all clients start
  together), runs, and writes ``{"ok": {"series": ..., "cpu_s": ...}}``: per series its start
  and, per request, when it completed, how long it took (µs) and how many messages it carried
  — the samples ``loadgen.summarize`` reads. Times are ``CLOCK_MONOTONIC``, shared by all
  processes on Linux.

Any failure is one line ``{"error": "..."}`` and exit status 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List

#: SQS's largest batch (SendMessageBatch, DeleteMessageBatch, ReceiveMessage).
SQS_BATCH = 10


def clock_s() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def make_client(job: Dict[str, Any]) -> Any:
    """A boto3 SQS client for the job's endpoint: no retries (a refused request fails the run
    rather than being hidden in its latency); Query protocol: post to the queue URL."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "sqs", endpoint_url=job["endpoint"], region_name=job["region"],
        aws_access_key_id=job["access_key"], aws_secret_access_key=job["secret_key"],
        config=Config(retries={"max_attempts": 0}, connect_timeout=30, read_timeout=60))
    if client.meta.service_model.protocol == "query":
        client.meta.events.register("before-call.sqs.*", _post_to_queue_url)
    return client


def _post_to_queue_url(params: Dict[str, Any], **_: Any) -> None:
    body = params.get("body")
    if isinstance(body, dict) and body.get("QueueUrl"):
        params["url"] = body["QueueUrl"]


class Series:
    """One kind of request's samples: completion time, latency (µs), messages carried."""

    def __init__(self) -> None:
        self.start = clock_s()
        self.done: List[float] = []
        self.latency_us: List[float] = []
        self.messages: List[int] = []
        self.out_of_order = 0  # FIFO consumers: messages seen before an earlier one of their group

    def add(self, begin_s: float, end_s: float, messages: int) -> None:
        self.done.append(end_s)
        self.latency_us.append((end_s - begin_s) * 1e6)
        self.messages.append(messages)

    def to_json(self) -> Dict[str, Any]:
        return {"start": self.start, "done": self.done, "latency_us": self.latency_us,
                "messages": self.messages}


def _failed(answer: Dict[str, Any], what: str) -> None:
    failed = answer.get("Failed") or []
    if failed:
        raise RuntimeError(f"{what}: {len(failed)} entries failed, e.g. {failed[0]}")


def _body(prefix: str, body_bytes: int) -> str:
    return (prefix + "x" * body_bytes)[:max(body_bytes, len(prefix))]


# --- Admin (not measured) ---------------------------------------------------------------------


def _create(client: Any, op: Dict[str, Any]) -> str:
    attributes = {"FifoQueue": "true"} if op.get("fifo") else {}
    return str(client.create_queue(QueueName=op["name"], Attributes=attributes)["QueueUrl"])


def _count(client: Any, op: Dict[str, Any]) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = client.get_queue_attributes(QueueUrl=op["url"], AttributeNames=names)
    return sum(int(attributes["Attributes"].get(name, 0)) for name in names)


def _delete(client: Any, op: Dict[str, Any]) -> None:
    client.delete_queue(QueueUrl=op["url"])


ADMIN: Dict[str, Callable[[Any, Dict[str, Any]], Any]] = {
    "create": _create, "count": _count, "delete": _delete}


def run_admin(job: Dict[str, Any]) -> List[Any]:
    client = make_client(job)
    return [ADMIN[op["op"]](client, op) for op in job["ops"]]


# --- Workers (measured) -----------------------------------------------------------------------


def send_worker(client: Any, job: Dict[str, Any]) -> Dict[str, Series]:
    """``messages`` messages in batches of ``batch``. FIFO (``groups`` > 0): this worker owns
    groups index, index + workers, ...; message i goes to its groups in turn, so a batch spans
    several groups and each group's order is this worker's order (the body says group:seq)."""
    url, messages, batch = job["url"], job["messages"], job["batch"]
    groups = list(range(job["index"], job.get("groups") or 0, job["workers"]))
    if job.get("groups") and not groups:
        raise RuntimeError("more FIFO producers than message groups")
    series = Series()
    sequence = [0] * len(groups)
    sent = 0
    while sent < messages:
        entries = []
        for i in range(sent, min(sent + batch, messages)):
            if groups:
                slot = i % len(groups)
                group = groups[slot]
                entries.append({"Id": str(i - sent), "MessageGroupId": f"g{group}",
                                "MessageDeduplicationId": f"{job['tag']}-{job['index']}-{i}",
                                "MessageBody": _body(f"{group}:{sequence[slot]}:",
                                                     job["body_bytes"])})
                sequence[slot] += 1
            else:
                entries.append({"Id": str(i - sent), "MessageBody": job["payload"]})
        begin = clock_s()
        answer = client.send_message_batch(QueueUrl=url, Entries=entries)
        series.add(begin, clock_s(), len(entries))
        _failed(answer, "send_message_batch")
        sent += len(entries)
    return {"send": series}


def consume_worker(client: Any, job: Dict[str, Any]) -> Dict[str, Series]:
    """Receive up to ``batch`` (long poll of ``wait_s``) and delete them with one batch
    delete, until a receive comes back empty. A sample is one batch, from its receive to its
    delete's answer (and, apart, each of the two requests). FIFO: counts messages seen out of
    their group's order."""
    url, batch, wait_s = job["url"], job["batch"], job["wait_s"]
    series, receives, deletes = Series(), Series(), Series()
    last_seen: Dict[str, int] = {}
    out_of_order = 0
    while True:
        begin = clock_s()
        received = client.receive_message(QueueUrl=url, MaxNumberOfMessages=batch,
                                          WaitTimeSeconds=wait_s).get("Messages", [])
        if not received:
            break
        middle = clock_s()
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                   for i, m in enumerate(received)]
        answer = client.delete_message_batch(QueueUrl=url, Entries=entries)
        end = clock_s()
        series.add(begin, end, len(received))
        receives.add(begin, middle, len(received))
        deletes.add(middle, end, len(received))
        _failed(answer, "delete_message_batch")
        if job.get("fifo"):
            for message in received:
                group, seq = message["Body"].split(":", 2)[:2]
                if int(seq) <= last_seen.get(group, -1):
                    out_of_order += 1
                last_seen[group] = int(seq)
    series.out_of_order = out_of_order
    return {"receive+delete": series, "receive": receives, "delete": deletes}


def rounds_worker(client: Any, job: Dict[str, Any]) -> Dict[str, Series]:
    """``rounds`` unbatched round trips: send 1, receive it (long poll, so a server that
    makes a message visible a moment later is not penalized by a retry storm), delete it. A
    sample is a round (and, apart, each of its requests)."""
    url, payload = job["url"], job["payload"]
    series, sends, receives, deletes = Series(), Series(), Series(), Series()
    for _ in range(job["rounds"]):
        begin = clock_s()
        client.send_message(QueueUrl=url, MessageBody=payload)
        sent = clock_s()
        received: List[Any] = []
        while not received:
            received = client.receive_message(QueueUrl=url, MaxNumberOfMessages=1,
                                              WaitTimeSeconds=job["wait_s"]).get("Messages", [])
        got = clock_s()
        client.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])
        end = clock_s()
        series.add(begin, end, 1)
        sends.add(begin, sent, 1)
        receives.add(sent, got, 1)
        deletes.add(got, end, 1)
    return {"round": series, "send": sends, "receive": receives, "delete": deletes}


WORKERS: Dict[str, Callable[[Any, Dict[str, Any]], Dict[str, Series]]] = {
    "send": send_worker, "consume": consume_worker, "rounds": rounds_worker}


def run_worker(job: Dict[str, Any]) -> Dict[str, Any]:
    client = make_client(job)
    client.get_queue_attributes(QueueUrl=job["url"], AttributeNames=["QueueArn"])  # warm up
    job.setdefault("payload", _body("", job.get("body_bytes", 256)))
    _say({"ready": True})
    if sys.stdin.readline().strip() != "go":
        raise RuntimeError("the bench stopped before the start")
    cpu_start = time.process_time()
    series = WORKERS[job["kind"]](client, job)
    answer = {"series": {name: s.to_json() for name, s in series.items()},
              "cpu_s": time.process_time() - cpu_start}
    answer["out_of_order"] = sum(s.out_of_order for s in series.values())
    return answer


def _say(line: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main() -> int:
    try:
        job = json.loads(sys.stdin.readline())
        if job.get("nice"):
            os.nice(job["nice"])
        if job.get("cpus"):
            os.sched_setaffinity(0, job["cpus"])
        _say({"ok": run_admin(job) if job["mode"] == "admin" else run_worker(job)})
        return 0
    except Exception as exc:
        detail = getattr(exc, "response", None)
        _say({"error": f"{type(exc).__name__}: {exc}",
              "code": (detail or {}).get("Error", {}).get("Code"),
              "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main())
