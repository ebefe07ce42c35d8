"""A body's MD5, wherever it is computed (a send's every path, the stored record, the SQS
gateway's ``MD5OfMessageBody``, the client's check, ``lamina verify``), is the standard MD5 of
its bytes, whichever implementation computes it."""

import hashlib
import subprocess
import sys

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lamina.client.operations import Delivery
from lamina.engine.records import SHORT_BODY_BYTES, Message, body_md5, md5_for
from lamina.server.sqs.messages import md5_hex

SIZES = (1, 255, 256, SHORT_BODY_BYTES - 1, SHORT_BODY_BYTES, SHORT_BODY_BYTES + 1, 65_536)


@given(st.binary(max_size=3 * SHORT_BODY_BYTES))
def test_body_md5_is_the_standard_md5_on_both_sides_of_the_threshold(data):
    assert body_md5(data) == hashlib.md5(data).digest()
    assert md5_for(0)(data).digest() == hashlib.md5(data).digest()
    assert md5_for(SHORT_BODY_BYTES + 1)(data).digest() == hashlib.md5(data).digest()


@pytest.mark.parametrize("size", SIZES)
def test_the_sqs_gateway_and_the_client_digest_as_hashlib_does(size):
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert md5_hex(data) == hashlib.md5(data).hexdigest()
    message = Message("0" * 25, data, None, None, 8, 0, 0, hashlib.md5(data).digest(), None)
    assert Delivery(message, b"r", 1, 0, 0).md5_ok


def test_without_the_builtin_md5_hashlib_digests_the_same():
    script = (
        "import sys, hashlib; sys.modules['_md5'] = None\n"
        "from lamina.engine import records\n"
        "assert records.md5_for(0) is hashlib.md5\n"
        "data = b'x' * 300\n"
        "assert records.body_md5(data) == hashlib.md5(data).digest()\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def _stored_md5s(engine, queue, count):
    got = engine.receive(queue, max=count)
    return {cbor2.loads(d.record)[0]: cbor2.loads(d.record)[7] for d in got}


@pytest.mark.parametrize("batch", [
    [b"a"],                                              # a lone plain message
    [b"x" * SHORT_BODY_BYTES + b"y"],                    # a lone long one
    [b"b" * size for size in SIZES],                     # a run of plain messages
    [b"c" * 300] * 16,                                   # a run of one size (W1's)
    [b"d", "text", {1: b"e" * 3000, 4: 3}],              # the message-by-message loop
])
def test_every_send_path_answers_and_stores_the_md5_of_each_body(engine, clock, batch):
    engine.create_queue("q")
    sent = engine.send("q", batch)
    expected = [hashlib.md5(entry[1] if isinstance(entry, dict) else
                            entry.encode() if isinstance(entry, str) else entry).digest()
                for entry in batch]
    assert [s.md5 for s in sent] == expected
    stored = _stored_md5s(engine, "q", len(batch))
    assert [stored[s.id] for s in sent] == expected
