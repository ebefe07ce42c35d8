"""One request, whichever way it reaches the server, is checked and answered the same
(PROTOCOL.md §1-2): alone in a read (the lone-request path), behind one or many requests in
one read (the pipelined path, in slices), cut across two reads (the buffering path), read by
the read hub, on a server that syncs each group (--fsync), on a connection that
authenticated first, and through TLS. Each way has its own server, given the same requests in
the same order, so their stores stay alike; errors must match byte for byte, successes in
their shape (ids, times and receipts differ)."""

from __future__ import annotations

import math
import socket
import ssl
import struct
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterator

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.server.dispatch import OPERATIONS
from lamina.wire.framing import FrameReader
from lamina.wire.protocol import auth_signature
from tests.support.servers import ADMIN, KEYS, Certificates, ThreadServer, server_thread

MAX_FRAME = 2 * 1024 * 1024
#: The id of the request sent beside the one under test (never one a strategy draws).
OTHER_ID = 2**62 + 11


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def encode(item: Any) -> bytes:
    return framed(cbor2.dumps(item))


# -- the ways in -----------------------------------------------------------------------------


class Way:
    """One server and one way of sending it a request: a connection kept open between
    requests (a new one after the server closed it)."""

    def __init__(self, name: str, port: int, *, before: int = 0, split: bool = False,
                 auth: bool = False, tls: ssl.SSLContext | None = None,
                 hub: bool = False) -> None:
        self.name, self.port = name, port
        self.before, self.split, self.auth, self.tls = before, split, auth, tls
        self.sock: socket.socket | None = None
        #: A second connection whose reads come with this one's: the read hub serves them.
        self.companion = socket.create_connection(("127.0.0.1", port), timeout=10) if hub \
            else None
        self.companion_ids = 0
        self.reader = FrameReader(64 * 1024 * 1024)

    def _connect(self) -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.tls.wrap_socket(raw, server_hostname="127.0.0.1") if self.tls else raw
        self.sock, self.reader = sock, FrameReader(64 * 1024 * 1024)
        greeting = self._next()
        assert greeting is not None and greeting[0] == 0
        if self.auth:
            nonce = greeting[2]["nonce"]
            sock.sendall(encode([1, "auth", {"key": ADMIN.key_id, "signature": auth_signature(
                ADMIN.secret, nonce, ADMIN.key_id)}]))
            answer = self._next()
            assert answer is not None and answer[1] is None, answer
        return sock

    def _next(self) -> list[Any] | None:
        assert self.sock is not None
        while (body := self.reader.next_frame()) is None:
            try:
                data = self.sock.recv(1 << 20)
            except (ConnectionResetError, ssl.SSLError):
                data = b""
            if not data:
                return None
            self.reader.feed(data)
        item = cbor2.loads(body)
        # Every frame, the ones spliced by hand too, is what cbor2 writes for its item.
        assert cbor2.dumps(item) == body, body.hex()
        return item

    def ask(self, frame: bytes, request_id: Any) -> list[Any]:
        """Send ``frame``; -> what the server sent about it: its answer, and then the final
        protocol error frame if it broke the protocol (the connection is then closed)."""
        sock = self.sock or self._connect()
        if self.companion is not None:
            self._together(sock, self.companion)
        if self.before:
            sock.sendall(b"".join(encode([OTHER_ID + n, "ping", {}]) for n in range(self.before))
                         + frame)
        elif self.split:
            cut = max(1, len(frame) // 2)
            sock.sendall(frame[:cut])
            time.sleep(0.005)
            sock.sendall(frame[cut:])
        else:
            sock.sendall(frame)
        got: list[Any] = []
        others = 0
        while True:
            answer = self._next()
            if answer is None:
                self.close()
                return got + ["closed"]
            if OTHER_ID <= answer[0] < OTHER_ID + self.before:
                others += 1
                continue
            # In order: no request here waits (PROTOCOL §2), so those before come first.
            assert others == self.before, (others, answer)
            got.append(answer)
            if answer[0] == 0:  # the protocol error: the connection ends
                assert self._next() is None
                self.close()
                return got + ["closed"]
            if answer[0] == request_id:
                return got

    def _together(self, sock: socket.socket, companion: socket.socket) -> None:
        """A ping on both connections at once, so that this one's next read is the hub's
        (readhub.py rule 1)."""
        for _ in range(3):
            self.companion_ids += 1
            companion.sendall(encode([self.companion_ids, "ping", {}]))
            sock.sendall(encode([OTHER_ID, "ping", {}]))
            companion.recv(1 << 16)
            answer = self._next()
            assert answer is not None and answer[0] == OTHER_ID

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# -- what must agree -------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """What two answers to one request must share: errors exactly, results in their shape."""
    if type(value) is dict:
        if set(value) <= {"code", "message", "details"} and "code" in value:
            return value
        return {key: shape(item) for key, item in value.items()}
    if type(value) is list:
        return [shape(item) for item in value]
    return type(value).__name__


def normalise(answers: list[Any]) -> list[Any]:
    return [answer if answer == "closed" else [answer[0], answer[1], shape(answer[2])]
            for answer in answers]


# -- requests ----------------------------------------------------------------------------------

QUEUES = ["pq", "pq2", "pdl"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(),
    st.sampled_from([1, 1.0, 0, -0.0, math.inf]), st.text(max_size=8), st.binary(max_size=8),
    st.builds(cbor2.CBORTag, st.sampled_from([0, 1, 2, 3, 24, 55799, 1000]),
              st.integers(0, 3)),
    st.builds(cbor2.CBORSimpleValue, st.sampled_from([0, 19, 99, 255])),
    st.just(cbor2.undefined),
)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4) | st.integers(0, 6), inner,
                                      max_size=3), max_leaves=8)
durations = st.sampled_from([0, 60, 60.5, -1, 43201, True, "1", math.nan])  # (no time runs out)
entries = st.one_of(
    st.binary(max_size=10), st.text(max_size=10),
    st.fixed_dictionaries({1: st.binary(max_size=10)}, optional={
        2: st.dictionaries(st.text(min_size=1, max_size=4), scalars, max_size=2),
        3: st.text(max_size=6), 4: st.sampled_from([0, 1, 8, 16, 17, True, 8.0]),
        5: durations}),
    junk)
PLAUSIBLE: dict[str, Any] = {
    "queue": st.sampled_from(QUEUES) | st.text(max_size=6), "source": st.sampled_from(QUEUES),
    "tag": st.sampled_from(["default", "t", "bad name"]),
    "messages": st.lists(entries, max_size=4), "max": st.sampled_from([1, 2, 1000, 0, True]),
    "wait": st.sampled_from([0, 0.0, 0.02, -1, 31, True, "1"]),
    "visibility_timeout": durations, "receipts": st.lists(st.binary(max_size=41), max_size=2),
    "entries": st.lists(st.tuples(st.binary(max_size=41), durations).map(list), max_size=2),
    "ids": st.lists(st.text(max_size=12), max_size=2),
    "start": st.sampled_from([0, 1, "oldest", "now", True, 1.0, -1]),
    "after": st.text(max_size=8), "time": st.sampled_from([0, 1, 2**63, True]),
    "attributes": st.dictionaries(st.sampled_from(["retention", "visibility_timeout", "redrive",
                                                   "delay", "x"]),
                                  st.sampled_from([0, 60, 120, True, None,
                                                   {"dlq": "pdl", "max_receives": 2}]),
                                  max_size=2),
    "since": st.sampled_from([0, 2**45]), "until": st.sampled_from([0, 2**45]),
    "dry_run": st.booleans() | st.just(1), "days": st.sampled_from([1, 7, 31, 32, 0, True]),
    "prefix": st.text(max_size=3), "limit": st.sampled_from([1, 1000, 0, 1001, True, 1.0]),
    "key": st.text(max_size=6), "permissions": st.lists(
        st.sampled_from(["send", "receive", "peek", "manage", "grant", "x"]), max_size=3),
    "filter": st.fixed_dictionaries({"attributes": st.dictionaries(st.text(max_size=3), scalars,
                                                                   max_size=2)},
                                    optional={"match": st.sampled_from(["all", "any", "x"])}),
    "signature": st.binary(max_size=32),
}
request_ids = st.integers(1, 9) | st.sampled_from([2**63 - 1, 2**63, 0, -1, True, 1.0])


@st.composite
def requests(draw: st.DrawFn) -> list[Any]:
    op = draw(st.sampled_from(sorted(set(OPERATIONS) - {"auth"})) if draw(st.integers(0, 12))
              else st.text(max_size=6) | junk)
    names = sorted(OPERATIONS[op].allowed) if type(op) is str and op in OPERATIONS else []
    args: dict[Any, Any] = {}
    for name in names:
        if name in OPERATIONS[op].required or draw(st.integers(0, 2)):
            args[name] = draw(PLAUSIBLE.get(name, junk) if draw(st.integers(0, 5)) else junk)
    if not draw(st.integers(0, 9)):
        args[draw(st.text(max_size=6) | st.integers(0, 3))] = draw(junk)
    request_id = draw(st.integers(1, 2**20)) if draw(st.integers(0, 8)) else draw(request_ids)
    item: list[Any] = [request_id, op, args]
    if not draw(st.integers(0, 15)):
        item = draw(st.sampled_from([item[:2], item + [1], [request_id, op, [args]]]))
    return item


#: Bodies that break PROTOCOL §1's rules, whatever request they wrap.
MANGLES: list[Callable[[bytes], bytes]] = [
    lambda body: body + b"\x00",  # a trailing byte
    lambda body: b"\x9f" + body[1:] + b"\xff",  # an indefinite-length array
    lambda body: body[:-1],  # cut short
    lambda body: b"\x81" * 32 + body,  # 33 deep and more
    lambda body: b"\x81" * 29 + body,  # 30 deep: a request of arrays nested more or less
]


#: Send entries whose map repeats a key (``1``, ``1.0`` and ``true`` are one key): bytes
#: cbor2 would not write.
DUPLICATED = [b"\xa2\x01\x41x\xf9\x3c\x00\x41y", b"\xa2\x01\x41x\xf5\x41y",
              b"\xa2\x01\x41x\x01\x41y", b"\xa2\x01\x41x\x04\x01"]


@st.composite
def frames(draw: st.DrawFn) -> tuple[bytes, Any]:
    """One frame and the id its answer carries."""
    item = draw(requests())
    if not draw(st.integers(0, 15)):  # a frame over 64 KiB (decoded another way)
        item = [item[0], "send", {"queue": "pq", "messages": [b"x" * 70_000]}]
    body = cbor2.dumps(item)
    if not draw(st.integers(0, 15)):
        entry = draw(st.sampled_from(DUPLICATED))
        body = cbor2.dumps([item[0], "send", {"queue": "pq", "messages": [b"."]}])[:-2] + entry
    elif not draw(st.integers(0, 10)):
        body = draw(st.sampled_from(MANGLES))(body)
    return framed(body), item[0] if type(item[0]) is int else None


# -- the servers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ways(tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
         ) -> Iterator[list[Way]]:
    folder = tmp_path_factory.mktemp("ways")
    with ExitStack() as stack:
        def start(name: str, **options: Any) -> ThreadServer:
            return stack.enter_context(server_thread(folder / name, max_frame=MAX_FRAME,
                                                     idle_timeout_s=60.0, **options))
        made = [
            Way("lone", start("lone").port),
            Way("pipelined", start("pipelined").port, before=1),
            Way("crowded", start("crowded").port, before=20),
            Way("split", start("split").port, split=True),
            Way("hub", (hubbed := start("hub")).port, hub=True),
            Way("fsync", start("fsync", fsync=True).port, before=2),
            Way("authenticated", start("authenticated", keys=KEYS).port, auth=True),
            Way("tls", start("tls", tls_cert=certificates.cert,
                             tls_key=certificates.key).port,
                tls=certificates.client_context),
        ]
        for way in made:
            for name in QUEUES:
                way.ask(encode([1, "create_queue", {"queue": name}]), 1)
        yield made
        assert hubbed.server.read_hub is not None and hubbed.server.read_hub.steps > 0
        for way in made:
            way.close()
            if way.companion is not None:
                way.companion.close()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames())
def test_a_request_is_answered_alike_whichever_way_it_came(ways: list[Way],
                                                           case: tuple[bytes, Any]) -> None:
    frame, request_id = case
    answers = {way.name: normalise(way.ask(frame, request_id)) for way in ways}
    first = answers["lone"]
    for name, got in answers.items():
        assert got == first, (name, frame.hex())
