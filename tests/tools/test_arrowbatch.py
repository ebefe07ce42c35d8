"""The Spark scan's batch builder: the vectorised path for plain records gives exactly the
columns of the general (``cbor2.loads``) path, for every body length class."""

from __future__ import annotations

from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

from lamina.engine import Engine, FakeClock  # noqa: E402
from lamina.tools import arrowbatch  # noqa: E402
from lamina.tools.snapshot import Snapshot  # noqa: E402
from lamina.tools.spark import SCHEMA, schema_for  # noqa: E402

from tests.support.stores import START_MS  # noqa: E402

# CBOR head sizes: lengths < 24, < 256, < 65536, and bigger; text bodies too
BODIES = [b"a", b"x" * 12, b"y" * 13, b"z" * 23, b"w" * 24, b"v" * 255, b"u" * 256,
          b"t" * 70_000, "text é", "T" * 300, bytes(range(256))]


def rows(path: Path, entries: list[object], clock_ms: int = START_MS) -> tuple[list, list]:
    with Engine.open(path, clock=FakeClock(clock_ms)) as engine:
        engine.create_queue("q")
        engine.send("q", entries)
    with Snapshot(path) as snapshot:
        q = snapshot.queue("q")
        found = list(snapshot.messages(q, 0, q.next_seq))
    return [seq for seq, _, _ in found], [value for _, _, value in found]


def both(seqs: list[int], values: list[bytes], states: list | None = None) -> tuple:
    schema = to_arrow_schema(schema_for("t" if states is not None else None), timezone="UTC")
    fast = arrowbatch.record_batch(schema, "q", 0, seqs, values, states)
    general = arrowbatch._general_batch(schema, "q", 0, seqs, values, states)
    return fast, general


def test_plain_records_take_the_vectorised_path(tmp_path: Path) -> None:
    seqs, values = rows(tmp_path / "d", list(BODIES))
    packed = pa.array(values, pa.binary())
    assert arrowbatch._plain_rows(packed) is not None
    fast, general = both(seqs, values)
    assert fast.equals(general)
    assert fast.column("body").to_pylist() == [
        b if isinstance(b, bytes) else b.encode() for b in BODIES]
    assert fast.schema.equals(to_arrow_schema(SCHEMA, timezone="UTC"))


def test_other_records_take_the_general_path(tmp_path: Path) -> None:
    entries = [b"plain", {1: b"attrs", 2: {"k": "v", "b": b"\x01", "n": 2, "f": 1.5}},
               {1: b"topic", 3: "t"}, {1: b"priority", 4: 1}, {1: b"delayed", 5: 1}]
    seqs, values = rows(tmp_path / "d", entries)
    fast, general = both(seqs, values, ["active"] * len(values))
    assert fast.equals(general)
    assert fast.column("attributes").to_pylist()[1] == [
        ("k", "v"), ("b", "AQ=="), ("n", "2"), ("f", "1.5")]
    assert fast.column("topic").to_pylist()[2] == "t"


def test_small_times_are_not_plain(tmp_path: Path) -> None:
    seqs, values = rows(tmp_path / "d", [b"early"], clock_ms=2**32 - 10**6)  # 4-byte CBOR uints
    assert arrowbatch._plain_rows(pa.array(values, pa.binary())) is None
    fast, general = both(seqs, values)
    assert fast.equals(general)


@pytest.mark.parametrize("size", [5, 100, 300, 70_000])  # body heads of 1, 2, 3 and 5 bytes
def test_bodies_of_one_head_size_are_sliced_at_once(tmp_path: Path, size: int) -> None:
    bodies = [bytes([65 + i]) * (size + i % 3) for i in range(7)]
    seqs, values = rows(tmp_path / "d", bodies)
    plain = arrowbatch._plain_rows(pa.array(values, pa.binary()))
    assert plain is not None and len(set(plain.body_start.tolist())) == 1
    fast, general = both(seqs, values)
    assert fast.equals(general)
    assert fast.column("body").to_pylist() == bodies
