"""Every kind of acknowledged operation survives a killed process (DESIGN.md §3
"Acknowledged means in the WAL (survives a killed process)"; "In-memory state ... is a cache
rebuilt from RocksDB at open").

After each operation of a scenario that uses them all — queues and tags created, changed and
deleted, sends with priorities, topics, delays and deduplication keys, receives of several
tags, deletes, change_visibility, dead-letter moves (by ``dead`` and by a lease running out
while the process is down), redrive, rewind, delete_by_id, purge, copy_queue, grants and
extras — the data directory is copied while the engine is still open (nothing closed or
flushed: what a kill -9 leaves) and opened. The copy must show everything the running engine
shows: queues, attributes, extras, grants, tags, stats and daily counters, every message's
state by peek, what a receive would take, and the standing of every receipt issued so far.
Some copies are opened after time passed (lease deadlines and delays run on while down).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from lamina.engine import Engine, FakeClock

START_MS = 1_790_000_000_000 - 5 * 3_600_000  # 5 hours before a midnight (UTC)


def exact(stats: dict[str, Any]) -> dict[str, Any] | str:
    """A filtered tag's counts are refreshed at most every 10 s (DESIGN.md §8, flagged
    ``approximate``): a reopened engine counts them afresh."""
    return "approximate" if stats["approximate"] else stats


def observe(engine: Engine, receipts: list[tuple[str, str, bytes]]) -> dict[str, Any]:
    seen: dict[str, Any] = {"grants": engine.list_grants()}
    for name in engine.list_queues().queues:
        info = engine.get_queue(name)
        tags = engine.list_tags(name)
        stats = {**info.stats, "tags": {tag: exact(figures)
                                        for tag, figures in info.stats["tags"].items()}}
        seen[name] = {
            "attributes": info.attributes, "created": info.created, "stats": stats,
            "days": engine.stats(name, days=3), "extras": engine.queue_extras(name),
            "tags": [(t.tag, t.start, t.filter, t.created, exact(t.stats or {})) for t in tags],
            "peek": {t.tag: engine.peek(name, t.tag, max=1000, start=0).messages
                     for t in tags},
            "next": {t.tag: engine.peek(name, t.tag, max=1000).messages for t in tags},
        }

    def standing(queue: str, tag: str, receipt: bytes) -> str:
        try:
            return engine.receipt_standing(queue, receipt, tag)
        except Exception as exc:  # its queue or tag deleted
            return type(exc).__name__

    seen["receipts"] = [standing(*issued) for issued in receipts]
    return seen


class Crashes:
    """Runs operations on an engine and compares, after each, a copy of its directory."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.clock = FakeClock(START_MS)
        self.path = tmp_path / "live"
        self.engine = Engine.open(self.path, clock=self.clock, segment_max_messages=8)
        self.receipts: list[tuple[str, str, bytes]] = []
        self.copies = 0

    def step(self, label: str, operation: Callable[[Engine], Any], *,
             down_ms: int = 0) -> Any:
        result = operation(self.engine)
        copy = self.tmp_path / f"copy{self.copies}"
        self.copies += 1
        shutil.copytree(self.path, copy)
        # The clock row holds a ceiling up to 100 ms ahead (docs/STORAGE.md "The clock"):
        # both look at a time past it.
        self.clock.advance(150 + down_ms)
        live = observe(self.engine, self.receipts)
        with Engine.open(copy, clock=self.clock, segment_max_messages=8) as reopened:
            assert observe(reopened, self.receipts) == live, f"after {label}"
        shutil.rmtree(copy)
        return result

    def lease(self, queue: str, tag: str, deliveries: list[Any]) -> list[Any]:
        self.receipts += [(queue, tag, d.receipt) for d in deliveries]
        return deliveries


def test_each_acknowledged_operation_holds_after_a_killed_process(tmp_path):
    run = Crashes(tmp_path)
    run.step("create_queue dlq", lambda e: e.create_queue("dlq", {"retention": 86400}))
    run.step("create_queue", lambda e: e.create_queue("orders", {
        "retention": 86400, "rewind": 3600, "visibility_timeout": 5,
        "redrive": {"dlq": "dlq", "max_receives": 2}}))
    run.step("create_tag", lambda e: e.create_tag("orders", "audit", "oldest"))
    run.step("create_tag filtered", lambda e: e.create_tag(
        "orders", "eu", "now", {"attributes": {"region": "eu"}}))
    run.step("grant", lambda e: e.grant("orders", "reporting", ["peek", "receive"]))
    run.step("set_queue_extras", lambda e: e.set_queue_extras("orders", {"tags": {"a": "1"}}))
    sent = run.step("send", lambda e: e.send("orders", [
        *(b"plain %d" % i for i in range(6)),
        {1: b"eu 1", 2: {"region": "eu"}}, {1: b"urgent", 4: 0},
        {1: b"topic a1", 3: "a"}, {1: b"topic a2", 3: "a"}, {1: b"later", 5: 3}]))
    run.step("send_deduplicated", lambda e: e.send_deduplicated(
        "orders", [b"once", b"twice"], [b"k1", b"k2"]))
    first = run.step("receive", lambda e: run.lease("orders", "default", e.receive(
        "orders", max=4)))
    run.step("receive of a tag", lambda e: run.lease("orders", "audit", e.receive(
        "orders", "audit", max=3)))
    run.step("receive of a filtered tag", lambda e: run.lease("orders", "eu", e.receive(
        "orders", "eu", max=3)))
    run.step("delete", lambda e: e.delete("orders", [first[0].receipt]))
    run.step("change_visibility", lambda e: run.lease("orders", "default", [
        changed for changed in e.change_visibility("orders", [(first[1].receipt, 600)])]))
    run.step("dead", lambda e: e.dead("orders", [first[2].receipt]))
    # A lease that runs out while the process is down: Active again at reopen.
    run.step("time passes while down", lambda e: None, down_ms=6_000)
    second = run.step("receive again", lambda e: run.lease("orders", "default", e.receive(
        "orders", max=10, visibility_timeout=2)))
    # Its second lease runs out while down: a dead-letter move comes due (max_receives 2).
    run.step("a dead-letter move comes due while down", lambda e: None, down_ms=3_000)
    dead = run.step("receive from the DLQ", lambda e: run.lease("dlq", "default", e.receive(
        "dlq", max=10, visibility_timeout=1)))
    run.step("redrive", lambda e: e.redrive("dlq"), down_ms=1_000)
    run.step("delete_by_id", lambda e: e.delete_by_id("orders", [sent[3].id, sent[4].id]))
    run.step("set_queue_attributes", lambda e: e.set_queue_attributes(
        "orders", {"visibility_timeout": 40, "redrive": None}))
    run.step("rewind", lambda e: e.rewind("orders", START_MS, "audit"))
    run.step("past midnight", lambda e: None, down_ms=5 * 3_600_000)
    run.step("receive after midnight", lambda e: run.lease("orders", "audit", e.receive(
        "orders", "audit", max=5)))
    run.step("delete after midnight", lambda e: e.delete(
        "orders", [receipt for queue, tag, receipt in run.receipts[-2:]], "audit"))
    run.step("copy_queue", lambda e: e.copy_queue("copy", "orders"))
    run.step("delete_tag", lambda e: e.delete_tag("orders", "eu"))
    run.step("revoke", lambda e: e.revoke("orders", "reporting"))
    run.step("purge_queue", lambda e: e.purge_queue("orders"))
    run.step("send after purge", lambda e: e.send("orders", [b"fresh"]))
    run.step("delete_queue", lambda e: e.delete_queue("dlq"))
    run.step("create_queue again", lambda e: e.create_queue("dlq"))
    # The scenario reached what it meant to test: both dead letters, the one by ``dead``
    # and the one whose lease ran out while down.
    assert {d.dequeue_count for d in second} == {1, 2} and len(dead) == 2, (second, dead)
    run.engine.close()
