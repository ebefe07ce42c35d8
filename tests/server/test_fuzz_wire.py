"""Fuzzing a real server over loopback (PROTOCOL.md §1-2): requests of every op with plausible
and junk arguments, and frames mangled on the way (flipped bytes, cut short, lengths that lie,
garbage). Whatever arrives: no InternalError, the server stays up, another connection is
answered, and the messages stored before are untouched."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import cbor2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.client import Client
from lamina.server.dispatch import OPERATIONS
from lamina.wire.framing import FrameReader
from tests.support.servers import server_thread

KEPT_QUEUE = "kept"
KEPT_BODIES = [b"first", "second", b"\x00" * 1000, b"fourth"]
FUZZ_QUEUES = ["fz", "fz2", "dl", "FZ"]
MAX_FRAME = 2 * 1024 * 1024

# -- strategies ------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True),
    st.text(max_size=20), st.binary(max_size=40),
    st.builds(cbor2.CBORTag, st.integers(0, 300), st.integers(0, 5)),
    st.builds(cbor2.CBORSimpleValue, st.sampled_from([0, 19, 99, 255])),
)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6) | st.integers(0, 9), inner,
                                      max_size=4), max_leaves=12)
queue_names = st.one_of(*[st.sampled_from(FUZZ_QUEUES)] * 6, st.text(max_size=70).filter(
    lambda name: name.lower() != KEPT_QUEUE))
small_ints = st.integers(-3, 1200)
durations = st.sampled_from([0, 0.01, 0.05, 1, -1, 43201]) | st.floats(0, 0.05)
waits = st.sampled_from([0, 0.01, -1, 31, "1"]) | st.floats(0, 0.05)  # a wait holds the test
attribute_values = st.dictionaries(
    st.sampled_from(["max_message_size", "retention", "visibility_timeout", "max_receives",
                     "redrive", "max_messages", "delay", "x"]),
    small_ints | st.none() | st.just({"dlq": "dl", "max_receives": 2}), max_size=3)
entries = st.one_of(
    st.binary(max_size=50), st.text(max_size=20),
    st.fixed_dictionaries({1: st.binary(max_size=20)}, optional={
        2: st.dictionaries(st.text(min_size=1, max_size=8), scalars, max_size=3),
        3: st.text(max_size=10), 4: st.integers(-1, 17), 5: durations}),
    junk)
PLAUSIBLE: dict[str, Any] = {
    "queue": queue_names, "source": queue_names, "tag": st.sampled_from(["default", "t"]),
    "messages": st.lists(entries, max_size=5), "max": small_ints, "wait": waits,
    "visibility_timeout": durations, "receipts": st.lists(st.binary(max_size=48), max_size=3),
    "entries": st.lists(st.tuples(st.binary(max_size=48), durations).map(list), max_size=3),
    "ids": st.lists(st.text(max_size=30), max_size=3), "start": small_ints,
    "after": st.text(max_size=30), "time": st.integers(0, 2**45), "attributes": attribute_values,
    "since": st.integers(0, 2**45), "until": st.integers(0, 2**45), "dry_run": st.booleans(),
    "days": small_ints, "prefix": st.text(max_size=5), "limit": small_ints,
    "key": st.text(max_size=10), "permissions": st.lists(st.text(max_size=8), max_size=3),
    "filter": st.dictionaries(st.text(max_size=5), scalars, max_size=3),
    "signature": st.binary(max_size=32),
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, str, dict[str, Any]]:
    """``[id, op, args]`` of any op: its own argument names (some left out), now and then an
    unknown one, values plausible or junk."""
    op = draw(st.sampled_from(sorted(OPERATIONS)) if draw(st.integers(0, 9))
              else st.text(max_size=12))
    names = sorted(OPERATIONS[op].allowed) if op in OPERATIONS else []
    args: dict[str, Any] = {}
    for name in names:
        if name in OPERATIONS[op].required or draw(st.integers(0, 2)):
            args[name] = draw(PLAUSIBLE.get(name, junk) if draw(st.integers(0, 6)) else junk)
    if not draw(st.integers(0, 9)):
        args[draw(st.text(max_size=8))] = draw(junk)
    return draw(st.integers(1, 2**63 - 1) | st.integers(1, 9)), op, args


def encode(item: Any) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One frame: a request, maybe mangled; or an envelope that is not a request; or bytes."""
    kind = draw(st.integers(0, 10))
    if kind <= 6:
        return encode(list(draw(requests())))
    if kind == 7:  # one byte flipped
        data = bytearray(encode(list(draw(requests()))))
        data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if kind == 8:  # a length that lies: too long for what follows, or over max_frame
        body = cbor2.dumps(list(draw(requests())))
        length = draw(st.sampled_from([len(body) + 1, 2**20, MAX_FRAME + 1, 2**32 - 1, 0]))
        return struct.pack(">I", length) + body
    if kind == 9:
        return encode(draw(junk))
    return draw(st.binary(min_size=1, max_size=64))


# -- the client side of one example ----------------------------------------------------------


#: The id of the ping sent last: once it is answered, so is everything before it.
LAST_PING_ID = 2**62 + 7


def exchange(port: int, data: list[bytes]) -> list[list[Any]]:
    """Send ``data`` and a last ping on a new connection; -> every frame the server sent back
    until that ping's answer, the connection's end, or a moment's quiet (a frame whose length
    lies swallows the ping)."""
    answers: list[list[Any]] = []
    reader = FrameReader(64 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(data) + encode([LAST_PING_ID, "ping", {}]))
        sock.settimeout(0.25)
        while not answers or answers[-1][0] != LAST_PING_ID:
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            reader.feed(chunk)
            while (body := reader.next_frame()) is not None:
                answers.append(cbor2.loads(body))
    return answers


def test_fuzzed_frames_and_requests_never_break_the_server(tmp_path: Path) -> None:
    with server_thread(tmp_path / "data", max_frame=MAX_FRAME, idle_timeout_s=5.0) as running:
        with Client.connect("127.0.0.1", running.port) as setup:
            setup.create_queue(KEPT_QUEUE)
            kept_ids = [sent.id for sent in setup.send(KEPT_QUEUE, KEPT_BODIES)]
            setup.create_queue("dl")
            setup.create_queue("fz2", {"redrive": {"dlq": "dl", "max_receives": 1}})
            setup.create_queue("fz")
            setup.create_tag("fz", "t")
            for queue in ("fz", "fz2"):
                setup.send(queue, [b"m%d" % n for n in range(200)])
        bystander = Client.connect("127.0.0.1", running.port)

        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(st.lists(frames(), min_size=1, max_size=6))
        def one_connection(data: list[bytes]) -> None:
            for answer in exchange(running.port, data):
                assert type(answer) is list and len(answer) == 3
                error = answer[1]
                assert error is None or error["code"] != "InternalError", error
            assert bystander.ping() > 0  # another connection is answered meanwhile

        one_connection()
        assert running.thread.is_alive()
        peeked = bystander.peek(KEPT_QUEUE, start=0, max=10)
        assert [(p.message.id, p.message.body) for p in peeked.messages] == list(
            zip(kept_ids, KEPT_BODIES))
        bystander.close()
        # Every connection is gone: whatever they held in buffers is given back.
        assert running.call(lambda: running.server.budget.used_bytes) == 0
