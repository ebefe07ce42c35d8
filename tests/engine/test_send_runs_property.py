"""For any sequence of sends, the run of plain messages (``Appender._append_plain``) stores the
rows, gives the results and answers the frames that the message-by-message path does: random
batches of plain bodies of many sizes (the CBOR head's every length, one below and at the
queue's ``max_message_size``, of one size or mixed), mixed with entries that are not plain
(text, attributes, priorities, topics, delays, empty or too large bodies), into a queue whose
segments end within batches, read by filtered and later-starting tags, and nearly full."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.engine import Engine, FakeClock, LaminaError, appending
from lamina.wire.splicing import encode_send_response
from tests.engine.strategies import attributes
from tests.engine.test_send_runs import _rows

MAX_MESSAGE_SIZE = 1024  # the smallest a queue may have: bodies at and past it stay cheap

#: Body sizes at each CBOR head's edges and at the queue's limit.
plain_sizes = st.one_of(
    st.sampled_from([1, 2, 23, 24, 25, 255, 256, 257, MAX_MESSAGE_SIZE - 1, MAX_MESSAGE_SIZE]),
    st.integers(min_value=1, max_value=MAX_MESSAGE_SIZE),
)
plain_bodies = st.builds(lambda size, fill: bytes([fill]) * size, plain_sizes,
                         st.integers(0, 255))
#: Entries that are not plain: each takes the message-by-message path, or is refused there.
other_entries = st.one_of(
    st.text(min_size=1, max_size=40),
    st.builds(lambda body, attrs: {1: body, 2: attrs}, plain_bodies, attributes),
    st.builds(lambda body, priority: {1: body, 4: priority}, plain_bodies,
              st.integers(1, 16)),
    st.builds(lambda body, topic: {1: body, 3: topic}, plain_bodies,
              st.sampled_from(["t", "u"])),
    st.builds(lambda body, delay: {1: body, 5: delay}, plain_bodies, st.sampled_from([0, 1])),
    st.sampled_from([b"", b"z" * (MAX_MESSAGE_SIZE + 1)]),
)
#: Batches of one size, of plain bodies of any sizes, or mixed.
batches = st.one_of(
    st.builds(lambda body, count: [body] * count, plain_bodies, st.integers(1, 40)),
    st.lists(plain_bodies, min_size=1, max_size=40),
    st.lists(st.one_of(plain_bodies, plain_bodies, other_entries), min_size=1, max_size=20),
)
#: A send: the batch and the milliseconds the clock moves before it.
sends = st.lists(st.tuples(batches, st.integers(0, 3)), min_size=1, max_size=8)


def _send_all(path: Path, plan: list[tuple[list[Any], int]]) -> list[Any]:
    """The sends of ``plan`` as a server sends -> their answers and results."""
    clock = FakeClock()
    seen: list[Any] = []
    with Engine.open(path, clock=clock, segment_max_messages=50, segment_max_bytes=20_000
                     ) as engine:
        engine.create_queue("q", {"max_messages": 150, "max_message_size": MAX_MESSAGE_SIZE})
        engine.create_tag("q", "red", filter={"attributes": {"a": 1}})
        engine.create_tag("q", "later", start=clock() + 5)
        for index, (messages, advance_ms) in enumerate(plan):
            clock.advance(advance_ms)
            sent = engine.send_columns("q", messages)
            seen.append(encode_send_response(index + 1, sent))
            seen.append([str(entry) if isinstance(entry, LaminaError)
                         else (entry.id, entry.enqueue_time, entry.md5) for entry in sent])
        seen.append([(d.message.id, d.record) for d in engine.receive("q", max=1000)])
    return seen


@settings(max_examples=40, deadline=None)
@given(sends)
def test_any_sends_store_and_answer_the_same_as_a_run_or_message_by_message(plan):
    with tempfile.TemporaryDirectory() as scratch:
        runs = _send_all(Path(scratch) / "runs", plan)
        previous = appending.PLAIN_RUN_FROM
        appending.PLAIN_RUN_FROM = 10**9  # message by message
        try:
            singles = _send_all(Path(scratch) / "singles", plan)
        finally:
            appending.PLAIN_RUN_FROM = previous
        assert runs == singles
        assert _rows(Path(scratch) / "runs") == _rows(Path(scratch) / "singles")
