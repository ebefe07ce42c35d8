"""What runs in the client processes of the Redis comparator: the counterparts of
``bench/workers.py``, one per kind of client, against Redis Streams. Each records the same
series as Lamina's worker (``send``, ``receive+delete``, ``end-to-end``, ``ping``), so the
two are scored by the same code.

A message is a stream entry with one field (``b``: the body); a queue is a stream with one
consumer group; receiving is ``XREADGROUP``, deleting is ``XACK`` + ``XDEL`` of the entries
(acknowledged and gone, as Lamina's delete). Every batch is one write and one round trip, as
with Lamina's ``Client``.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any

from ..loadgen import BenchError, Recorder, clock_s
from ..workers import PINGS, SEND_TIME, latency_loop, paced_loop
from .resp import RespConnection

__all__ = ["FIELD", "GROUP", "consume_worker", "latency_consumer_worker", "paced_producer_worker",
           "produce_worker", "round_trip_worker"]

FIELD = b"b"  # the entry's one field: the body
GROUP = b"bench"  # the consumer group every receiving worker reads through
_PRODUCER_READ_BYTES = 64 * 1024


def _ids(answer: Any) -> list[bytes]:
    """The entry ids of an ``XREADGROUP`` answer of one stream (None: nothing new)."""
    if not answer:
        return []
    return [entry[0] for entry in answer[0][1]]


def _entries(answer: Any) -> list[tuple[bytes, bytes]]:
    """(id, body) of each entry of an ``XREADGROUP`` answer of one stream."""
    if not answer:
        return []
    return [(entry_id, fields[1]) for entry_id, fields in answer[0][1]]


def _read(stream: bytes, consumer: bytes, count: int, block_ms: int | None = None
          ) -> tuple[Any, ...]:
    block = () if block_ms is None else (b"BLOCK", block_ms)
    return (b"XREADGROUP", b"GROUP", GROUP, consumer, b"COUNT", count, *block,
            b"STREAMS", stream, b">")


def _deleting(stream: bytes, ids: list[bytes]) -> list[tuple[Any, ...]]:
    """Acknowledge and remove entries: Lamina's delete."""
    return [(b"XACK", stream, GROUP, *ids), (b"XDEL", stream, *ids)]


def _check_deleted(answers: list[Any], count: int) -> None:
    if answers[0] != count or answers[1] != count:
        raise BenchError(f"XACK / XDEL of {count} entries answered {answers[0]} / {answers[1]}")


def produce_worker(index: int, barrier: Any, address: tuple[str, int], stream: bytes,
                   messages: int, batch: int, body_bytes: int) -> Recorder:
    """W1: ``XADD`` ``messages`` entries, a batch of ``batch`` per write (one round trip)."""
    body = os.urandom(body_bytes)
    recorder = Recorder()
    with RespConnection(address) as redis:
        barrier.wait()
        recorder.start("send")
        add = recorder.add
        left = messages
        while left > 0:
            count = min(batch, left)
            begin = clock_s()
            redis.pipeline([(b"XADD", stream, b"*", FIELD, body)] * count)
            end = clock_s()
            add("send", end, end - begin, count)
            left -= count
    return recorder


def consume_worker(index: int, barrier: Any, address: tuple[str, int], stream: bytes,
                   batch: int, sequential: bool) -> Recorder:
    """W2: read up to ``batch`` entries through the group and delete them, until none are left.
    Each batch's ``XACK`` + ``XDEL`` go out with the next ``XREADGROUP`` (one round trip a
    batch, as ``delete_and_receive``); ``sequential``: read, then delete, two round trips."""
    consumer = b"c%d" % index
    read = _read(stream, consumer, batch)
    recorder = Recorder()
    with RespConnection(address) as redis:
        barrier.wait()
        recorder.start("receive+delete")
        add = recorder.add
        begin = clock_s()
        ids = _ids(redis.call(*read))
        while ids:
            if sequential:
                _check_deleted(redis.pipeline(_deleting(stream, ids)), len(ids))
                end = clock_s()
                add("receive+delete", end, end - begin, len(ids))
                begin = clock_s()
                following = _ids(redis.call(*read))
            else:
                *deleted, answer = redis.pipeline([*_deleting(stream, ids), read])
                end = clock_s()
                add("receive+delete", end, end - begin, len(ids))
                _check_deleted(deleted, len(ids))
                begin, following = end, _ids(answer)
            ids = following
    return recorder


def paced_producer_worker(index: int, barrier: Any, address: tuple[str, int], stream: bytes,
                          rate: float, messages: int, body_bytes: int) -> Recorder:
    """W3 producer, open loop as Lamina's: one ``XADD`` per message, the i-th written at
    start + i/rate whatever the answers, each body carrying the time it was issued; answers
    (in order) are read while waiting for the next send's time."""
    padding = os.urandom(max(body_bytes - SEND_TIME.size, 0))
    recorder = Recorder()
    add = recorder.add
    issued: deque[float] = deque()
    with RespConnection(address) as redis:
        sock = redis.sock

        def read_answers() -> int:
            data = sock.recv(_PRODUCER_READ_BYTES)
            if not data:
                raise BenchError("the Redis server closed the producer's connection")
            redis.feed(data)
            answers = redis.answers()
            end = clock_s()
            for _ in answers:
                add("send", end, end - issued.popleft())
            return len(answers)

        def send_one() -> None:
            begin = clock_s()
            frame = redis.encode(b"XADD", stream, b"*", FIELD, SEND_TIME.pack(begin) + padding)
            issued.append(begin)
            sock.sendall(frame)

        barrier.wait()
        paced_loop(sock, rate, messages, send_one, read_answers, recorder)
    return recorder


def latency_consumer_worker(index: int, barrier: Any, address: tuple[str, int], stream: bytes,
                            messages: int, batch: int, deadline_s: float) -> Recorder:
    """W3 consumer: a blocking ``XREADGROUP`` (up to ``batch``, 1 s: the long poll), each
    entry's end-to-end latency noted at once, the ids deleted by a thread with a connection
    of its own (as Lamina's consumer: ``workers.latency_loop``)."""
    read = _read(stream, b"c%d" % index, batch, block_ms=1000)
    with RespConnection(address) as redis, RespConnection(address) as deleting:
        def receive() -> list[tuple[bytes, Any]]:
            return [(body, entry_id) for entry_id, body in _entries(redis.call(*read))]

        def delete(ids: list[Any]) -> None:
            _check_deleted(deleting.pipeline(_deleting(stream, ids)), len(ids))

        return latency_loop(barrier, messages, deadline_s, receive, delete)


def round_trip_worker(index: int, barrier: Any, address: tuple[str, int], stream: bytes,
                      messages: int, body_bytes: int, poll_us: int) -> Recorder:
    """W4: pings (``PING``), then ``messages`` single awaited ``XADD``s, then as many
    ``XREADGROUP COUNT 1`` each followed by its ``XACK`` + ``XDEL`` (two round trips, as
    Lamina's receive 1 + delete 1). ``poll_us``: the client's busy-poll window."""
    body = os.urandom(body_bytes)
    recorder = Recorder()
    read = _read(stream, b"c%d" % index, 1)
    with RespConnection(address, poll_us=poll_us) as redis:
        barrier.wait()
        recorder.start("ping")
        add = recorder.add
        for _ in range(min(messages, PINGS)):
            begin = clock_s()
            redis.call(b"PING")
            end = clock_s()
            add("ping", end, end - begin, 0)
        recorder.start("send")
        for _ in range(messages):
            begin = clock_s()
            redis.call(b"XADD", stream, b"*", FIELD, body)
            end = clock_s()
            add("send", end, end - begin)
        recorder.start("receive+delete")
        for _ in range(messages):
            begin = clock_s()
            ids = _ids(redis.call(*read))
            if not ids:
                break
            answers = redis.pipeline(_deleting(stream, ids))
            end = clock_s()
            add("receive+delete", end, end - begin, len(ids))
            _check_deleted(answers, len(ids))
    return recorder

