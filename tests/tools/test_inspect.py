"""``lamina inspect``: tables, JSON, dumps and tag states against what the engine holds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from lamina.engine import Engine
from lamina.tools.inspect import main as inspect_main
from lamina.tools.inspect import message_json, message_line
from lamina.tools.snapshot import Snapshot
from lamina.tools.timefmt import iso_ms

from tests.support.stores import START_MS, build_mixed, build_plain


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Any:
    """``run(*argv)`` -> (exit code, stdout, stderr) of ``lamina inspect ARGV``."""

    def _run(*argv: object) -> tuple[int, str, str]:
        capsys.readouterr()
        code = inspect_main([str(arg) for arg in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("mixed") / "data"
    clock, _ = build_mixed(path)
    return path, clock


def engine_messages(path: Path, queue: str, clock: Any) -> list[Any]:
    with Engine.open(path, clock=clock) as engine:
        return [p.message for p in engine.peek(queue, start=0, max=1000).messages]


def test_queues_json_matches_the_engine(run: Any, mixed: Any) -> None:
    path, clock = mixed
    code, out, _ = run(path, "queues", "--json")
    assert code == 0
    rows = {row["queue"]: row for row in lines(out)}
    assert sorted(rows) == ["dlq", "orders"]
    with Engine.open(path, clock=clock) as engine:
        for name, row in rows.items():
            stats = engine.get_queue(name).stats
            assert row["messages"] == stats["messages"]
            assert row["segments"] == stats["segments"]
            assert row["bytes"] == stats["bytes"]
    assert rows["orders"]["tags"] == ["default", "eu"]


def test_tables_render(run: Any, mixed: Any) -> None:
    path, _ = mixed
    for command in (["queues"], ["segments", "orders"], ["tags", "orders"],
                    ["leases", "orders"], ["leases", "orders", "--tag", "eu"]):
        code, out, err = run(path, *command)
        assert code == 0, err
        assert "┃" in out  # a rich table


def test_segments_json_partition_the_log(run: Any, mixed: Any) -> None:
    path, _ = mixed
    code, out, _ = run(path, "segments", "orders", "--json")
    rows = lines(out)
    assert code == 0 and len(rows) == 5  # 37 messages, 8 per segment
    assert [r["first_seq"] for r in rows] == [0, 8, 16, 24, 32]
    assert sum(r["count"] for r in rows) == 37
    assert all(r["last_seq"] + 1 == n["first_seq"] for r, n in zip(rows, rows[1:]))


def test_tags_and_leases_json(run: Any, mixed: Any) -> None:
    path, clock = mixed
    code, out, _ = run(path, "tags", "orders", "--json")
    tags = {row["tag"]: row for row in lines(out)}
    assert tags["eu"]["filter"] == {"attributes": {"region": "eu"}, "match": "all"}
    assert tags["default"]["dead"] == 1
    code, out, _ = run(path, "leases", "orders", "--json")
    leases = lines(out)
    assert {row["state"] for row in leases} >= {"dead"}
    dead = next(row for row in leases if row["state"] == "dead")
    assert dead["dlq"] == "dlq" and dead["dlq_seq"] == 0
    code, out, _ = run(path, "leases", "orders", "--tag", "eu", "--json")
    assert {row["tag"] for row in lines(out)} == {"eu"}


def test_dump_equals_the_engines_records(run: Any, mixed: Any) -> None:
    path, clock = mixed
    code, out, _ = run(path, "dump", "orders")
    assert code == 0
    dumped = lines(out)
    expected = engine_messages(path, "orders", clock)
    assert [d["id"] for d in dumped] == [m.id for m in expected]
    for row, message in zip(dumped, expected):
        body = message.body.encode() if isinstance(message.body, str) else message.body
        if row["body_encoding"] == "utf-8":
            assert row["body"].encode() == body
        else:
            import base64
            assert base64.b64decode(row["body"]) == body
        assert bytes.fromhex(row["md5"]) == message.md5
        assert (row["time"], row["visible_time"], row["priority"], row["topic"]) == (
            message.enqueue_time, message.visible_time, message.priority, message.topic)
        if message.attributes is not None:
            assert row["attributes"]["region"] == message.attributes["region"]
    binary = next(d for d in dumped if d["priority"] == 2)
    assert binary["body_encoding"] == "base64"
    text = next(d for d in dumped if d["body"].startswith("text"))
    assert text["attributes"]["raw"] == {"$base64": "AP8="}
    code, out, _ = run(path, "dump", "dlq")
    (copy,) = lines(out)
    assert copy["dead"]["source_queue"] == "orders"
    assert copy["attributes"]["DLQ.sourceQueue"] == "orders"


def test_dump_line_is_the_json_object(mixed: Any) -> None:
    path, _ = mixed
    with Snapshot(path) as snapshot:
        for name in ("orders", "dlq"):
            q = snapshot.queue(name)
            for seq, _, value in snapshot.messages(q, 0, q.next_seq):
                assert json.loads(message_line(seq, value) + "}") == message_json(seq, value)


def test_dump_ranges(run: Any, tmp_path: Path) -> None:
    path = tmp_path / "data"
    build_plain(path, 1000, segment=100, batch=50, step_ms=10)  # 20 sends, 10 ms apart
    code, out, _ = run(path, "dump", "q", "--segment", 250)
    assert [d["seq"] for d in lines(out)] == list(range(200, 300))
    code, out, _ = run(path, "dump", "q", "--since", START_MS + 30, "--until", START_MS + 50)
    assert [d["seq"] for d in lines(out)] == list(range(150, 250))
    iso = iso_ms(START_MS + 30)
    code, out, _ = run(path, "dump", "q", "--since", iso, "--limit", 7)
    assert [d["seq"] for d in lines(out)] == list(range(150, 157))
    code, out, err = run(path, "dump", "q", "--segment", 5000)
    assert code == 2 and "no segment" in err


def test_dump_tag_states_equal_peek(run: Any, mixed: Any, tmp_path: Path) -> None:
    path, clock = mixed
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    for tag in ("default", "eu"):
        code, out, _ = run(copy, "dump", "orders", "--tag", tag, "--at", clock.now_ms)
        assert code == 0
        states = {d["id"]: (d["state"], d["dequeue_count"], d["first_dequeue_time"],
                            d["next_visible_time"]) for d in lines(out)}
        with Engine.open(copy, clock=clock) as engine:
            peeked = engine.peek("orders", tag, start=0, max=1000).messages
        assert peeked
        for p in peeked:
            assert states[p.message.id] == (p.state, p.dequeue_count, p.first_dequeue_time,
                                            p.next_visible_time), p.message.id
        shown = {p.message.id for p in peeked}
        hidden = {state for id_, (state, *_) in states.items() if id_ not in shown}
        assert hidden <= {"out_of_scope", "gone", "expired"}
        if tag == "eu":
            assert "out_of_scope" in hidden
        if tag == "default":  # the scenario reaches every state
            assert {s for s, *_ in states.values()} == {
                "active", "inflight", "delayed", "parked", "deleted", "dead"}


def test_states_outside_retention_are_expired(run: Any, tmp_path: Path) -> None:
    path = tmp_path / "data"
    build_plain(path, 10, segment=100)
    code, out, _ = run(path, "dump", "q", "--tag", "default", "--at", START_MS + 400 * 86400_000)
    assert {d["state"] for d in lines(out)} == {"expired"}


def test_beside_a_running_engine_and_without_side_effects(run: Any, tmp_path: Path) -> None:
    path = tmp_path / "data"
    build_plain(path, 300)
    (path / "receipt.key").unlink()  # never needed
    with Engine.open(path) as engine:  # holds the LOCK
        before = sorted(os.listdir(path)), sorted(os.listdir(path / "db"))
        (sent,) = engine.send("q", [b"while open"])
        code, out, _ = run(path, "dump", "q", "--since", sent.enqueue_time)
        assert code == 0 and [d["body"] for d in lines(out)] == ["while open"]
        code, out, _ = run(path, "verify")
        assert code == 0, out
        assert (sorted(os.listdir(path)), sorted(os.listdir(path / "db"))) == before
        engine.send("q", [b"more"])


def test_missing_directory_or_queue(run: Any, tmp_path: Path) -> None:
    code, _, err = run(tmp_path / "nothing", "queues")
    assert code == 2 and "no Lamina database" in err
    assert not (tmp_path / "nothing").exists()
    path = tmp_path / "data"
    build_plain(path, 5)
    code, _, err = run(path, "segments", "nope")
    assert code == 2 and "nope" in err


def test_registered_on_the_lamina_command(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    from lamina.tools.cli import main
    path = tmp_path / "data"
    build_plain(path, 5)
    assert main(["inspect", str(path), "queues", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["messages"] == 5


def test_large_messages_in_blob_files(run: Any, tmp_path: Path) -> None:
    """Log values of 4 KiB or more live in RocksDB blob files, which secondary instances cannot
    read (they crash): the tools open read-only, and the secondary mode refuses."""
    from lamina.tools.snapshot import SnapshotError
    path = tmp_path / "data"
    with Engine.open(path) as engine:
        engine.create_queue("q")
        engine.send("q", [b"small", b"B" * 70_000, "T" * 5000])
    assert list((path / "db").glob("*.blob"))
    code, out, _ = run(path, "dump", "q")
    assert [len(d["body"]) for d in lines(out)] == [5, 70_000, 5000]
    code, out, _ = run(path, "verify")
    assert code == 0, out
    with pytest.raises(SnapshotError, match="blob"):
        Snapshot(path, mode="secondary")


@pytest.mark.parametrize("command", [["leases", "orders"], ["dump", "orders"]])
def test_a_limit_below_one_is_refused_not_taken_for_no_rows(run: Any, mixed: Any,
                                                            command: list[str]) -> None:
    path, _ = mixed
    with pytest.raises(SystemExit) as exc:
        run(path, *command, "--limit", "-1")
    assert exc.value.code == 2


def test_dump_at_a_time_without_a_tag_is_refused_not_ignored(run: Any, mixed: Any) -> None:
    path, _ = mixed
    code, out, err = run(path, "dump", "orders", "--at", "0")
    assert code == 2 and out == "" and "--at goes with --tag" in err


def test_the_tags_table_does_not_call_the_stored_lease_ceiling_leases_made(
        run: Any, tmp_path: Path) -> None:
    """While the engine runs, a tag's row holds its lease counter ahead of the next number
    (docs/STORAGE.md): after one lease it is not 1."""
    path = tmp_path / "data"
    with Engine.open(path) as engine:
        engine.create_queue("q")
        engine.send("q", [b"one"])
        engine.receive("q")
        code, out, _ = run(path, "tags", "q")
        assert code == 0 and "leases made" not in out and "lease ceiling" in out
        [row] = lines(run(path, "tags", "q", "--json")[1])
        assert row["lease_counter"] > 1
