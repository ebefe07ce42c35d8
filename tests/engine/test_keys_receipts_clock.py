"""Key encodings order numerically; receipts authenticate; the engine clock is monotonic."""

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lamina.engine import keys
from lamina.engine.clock import EngineClock, FakeClock
from lamina.engine.errors import InvalidReceipt
from lamina.engine.receipts import ReceiptCodec, load_or_create_key

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


@given(st.tuples(u32, st.integers(1, 16), u64), st.tuples(u32, st.integers(1, 16), u64))
def test_log_keys_sort_like_their_fields(a, b):
    assert (keys.log_key(*a) < keys.log_key(*b)) == (a < b)
    assert keys.log_key_decode(keys.log_key(*a)) == a


@given(u32, u64, u64)
def test_time_and_delay_keys_round_trip(queue, time_ms, seq):
    assert keys.time_key_decode(keys.time_key(queue, time_ms, seq)) == (queue, time_ms, seq)
    assert keys.delay_key_decode(keys.delay_key(queue, time_ms, seq)) == (queue, time_ms, seq)


def test_queue_bounds_enclose_every_key_of_the_queue():
    lower, upper = keys.queue_bounds(7)
    for key in (keys.log_key(7, 16, 2**64 - 1), keys.lease_key(7, 2**32 - 1, 2**64 - 1),
                keys.delay_key(7, 2**64 - 1, 2**64 - 1)):
        assert lower <= key < upper
    assert not lower <= keys.log_key(8, 1, 0) < upper


def test_queue_name_keys_ignore_case():
    assert keys.queue_name_key("Orders") == keys.queue_name_key("orders")


def test_receipt_round_trip_and_tampering():
    codec = ReceiptCodec(b"k" * 32)
    receipt = codec.issue(1, 2, 8, 99, 5)
    assert codec.open(receipt, 1, 2) == (8, 99, 5)
    with pytest.raises(InvalidReceipt):
        codec.open(receipt, 1, 3)
    with pytest.raises(InvalidReceipt):
        codec.open(receipt[:-1] + bytes([receipt[-1] ^ 0x80]), 1, 2)
    with pytest.raises(InvalidReceipt):
        ReceiptCodec(b"j" * 32).open(receipt, 1, 2)


def test_receipt_key_file_is_private_and_stable(tmp_path):
    path = tmp_path / "receipt.key"
    key = load_or_create_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create_key(path) == key and len(key) == 32


def test_engine_clock_holds_while_source_is_behind():
    source = FakeClock(1000)
    clock = EngineClock(source, last_ms=5000)
    assert clock.now() == 5000
    source.set(6000)
    assert clock.now() == 6000
    source.set(4000)
    assert clock.now() == 6000


def test_reverse_scan_of_an_empty_range_finds_nothing(tmp_path):
    from rocksdict import Options, Rdict

    from lamina.engine.store import Store
    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    for i in range(10):
        db[bytes([i])] = b"x"
    assert not Store.scan(db, bytes([2]), bytes([2]), last=True).valid()
    it = Store.scan(db, bytes([2]), bytes([5]), last=True)
    assert it.key() == bytes([4])
    it.prev(), it.prev()
    assert it.key() == bytes([2])
    it.prev()
    assert not it.valid()
    del it
    db.close()


def test_the_clock_warning_carries_its_event_name_for_log_selection(caplog):
    source = FakeClock(1000)
    clock = EngineClock(source, last_ms=5000)
    with caplog.at_level("WARNING", logger="lamina.engine"):
        clock.now()
    [record] = caplog.records
    assert record.event == "clock_behind" and record.behind_ms == 4000
