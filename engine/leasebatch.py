"""Lease batches: the leases one receive makes of never-delivered messages in one lane, kept
as one row of the ``leasebatches`` family instead of a ``leases`` row each.

A receive of 16 messages writes one row where it wrote 16, and the delete of those 16 writes
that row again with its entries marked deleted, where it wrote 16 ``ENDED_DELETED`` rows
(``docs/STORAGE.md``, schema version 3). A row holds at most 64 entries (a longer run is
cut into rows: a delete rewrites its whole row), and a receive of one message from a lane
writes its plain ``leases`` row: one row either way, and that one costs less to build.

Row: key ``queue | tag | lane | last seq`` (``keys.batch_key``); value::

    due_ms:u64 | first_dequeue_ms:u64 | n:u16 | seq x n (ascending) | lease number x n | state x n

with ``state`` LEASED or ENDED_DELETED (u8). Every entry was delivered once: dequeue count 1
at ``first_dequeue_ms``, due at ``due_ms``.

Invariants:
- a ``leases`` row of the same seq overrides the entry: anything that changes a lease other
  than the in-line delete (a redelivery, ``change_visibility``, a dead-letter move, a delete
  that leaves the message ``ENDED_AHEAD``) writes that row, and detaches the lease in memory
  from its batch (``Lease.batch`` None). A lease in memory whose ``batch`` is set therefore
  has no ``leases`` row: the entry is its durable form;
- entries below ``gone_seq`` mean nothing (their messages are gone; the row goes with the
  segment of its last seq);
- within a lane the rows' seq ranges ``[first, last]`` are disjoint: a lane cursor only moves
  forward, and a rewind, which moves it back, cuts the rows at its seq (``cut``). So the row
  that may hold a seq is the first of its lane whose last seq is not below it.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from typing import Iterator, Sequence

from . import keys
from .state import ENDED_DELETED, LEASED, Lease
from .store import Store

_HEAD = struct.Struct(">QQH")


class LeaseBatch:
    """One batch row in memory, shared by the leases it holds (``Lease.batch``)."""

    __slots__ = ("key", "head", "seqs", "states")

    def __init__(self, key: bytes, head: bytes, seqs: list[int], states: bytearray):
        self.key = key
        self.head = head  # the value up to the states: fixed once written
        self.seqs = seqs
        self.states = states

    def row(self) -> bytes:
        return self.head + self.states

    # A delete marks its lease's entry ``states[bisect_left(seqs, seq)] = ENDED_DELETED`` (in
    # line, messaging.py) and writes ``row()`` once per batch it touched.


def row_size(entries: int) -> int:
    """The length of a row of ``entries`` entries."""
    return _HEAD.size + 17 * entries


_ROWS: dict[int, struct.Struct] = {}  # entries -> the struct of a row's head (n <= 64)


def encode_head(due_ms: int, first_ms: int, seqs: list[int], numbers: Sequence[int]) -> bytes:
    n = len(seqs)
    head = _ROWS.get(n)
    if head is None:
        head = _ROWS[n] = struct.Struct(f">QQH{n}Q{n}Q")
    return head.pack(due_ms, first_ms, n, *seqs, *numbers)


def decode(key: bytes, value: bytes) -> tuple[int, int, list[int], list[int], LeaseBatch]:
    """-> (due_ms, first_ms, seqs, lease numbers, the batch)"""
    due_ms, first_ms, n = _HEAD.unpack_from(value)
    fields = struct.unpack_from(f">{n}Q{n}Q", value, _HEAD.size)
    seqs, numbers = list(fields[:n]), list(fields[n:])
    head_size = len(value) - n
    return due_ms, first_ms, seqs, numbers, LeaseBatch(key, value[:head_size],
                                                       seqs, bytearray(value[head_size:]))


def as_leases(lane: int, key: bytes, value: bytes, gone_seq: int
              ) -> Iterator[tuple[int, Lease]]:
    """``(seq, lease)`` of a row's entries at or above ``gone_seq``: LEASED ones held by the
    row's batch, deleted ones as the ``ENDED_DELETED`` row a delete used to write."""
    due_ms, first_ms, seqs, numbers, batch = decode(key, value)
    for seq, number, state in zip(seqs, numbers, batch.states):
        if seq < gone_seq:
            continue
        if state == LEASED:
            yield seq, Lease(LEASED, lane, due_ms, 1, first_ms, number, None, batch)
        else:
            yield seq, Lease(ENDED_DELETED, lane, 0, 1, first_ms, 0)


def lane_leases(store: Store, queue_id: int, tag_id: int, lane: int, gone_seq: int
                ) -> Iterator[tuple[int, Lease]]:
    """``as_leases`` of every row of one lane of the tag, by seq."""
    lower, upper = keys.batch_lane_bounds(queue_id, tag_id, lane, gone_seq)
    for key, value in Store.items(store.leasebatches, lower, upper):
        yield from as_leases(lane, key, value, gone_seq)


def find(store: Store, queue_id: int, tag_id: int, lane: int, seq: int) -> Lease | None:
    """The entry of ``seq`` (in ``lane``) as ``as_leases`` gives it, or None."""
    lower, upper = keys.batch_lane_bounds(queue_id, tag_id, lane, seq)
    it = Store.scan(store.leasebatches, lower, upper)
    if not it.valid():
        it.check_status()  # RocksDB's error, not a missing row
        return None
    for found, lease in as_leases(lane, it.key(), it.value(), seq):
        if found == seq:
            return lease
    return None


def cut(store: Store, queue_id: int, tag_id: int, lane: int, from_seq: int
        ) -> tuple[bytes, LeaseBatch] | None:
    """Drop the lane's entries from ``from_seq`` on (a rewind): the rows whose last seq is at
    or above it go; the one row that also holds lower seqs is written again with those alone.
    -> (its old key, the batch it became), or None when no row held both."""
    lower, upper = keys.batch_lane_bounds(queue_id, tag_id, lane, from_seq)
    it = Store.scan(store.leasebatches, lower, upper)
    kept: tuple[bytes, LeaseBatch] | None = None
    if it.valid():
        old_key = it.key()
        due_ms, first_ms, seqs, numbers, batch = decode(old_key, it.value())
        keep = bisect_left(seqs, from_seq)
        if keep:
            seqs, numbers = seqs[:keep], numbers[:keep]
            key = keys.batch_key(queue_id, tag_id, lane, seqs[-1])
            batch = LeaseBatch(key, encode_head(due_ms, first_ms, seqs, numbers), seqs,
                               batch.states[:keep])
            store.put(store.leasebatches_h, key, batch.row())
            kept = (old_key, batch)
    else:
        it.check_status()  # RocksDB's error, not a lane without rows
    store.delete_range(store.leasebatches_h, lower, upper)
    return kept
