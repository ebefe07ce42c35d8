"""The lease deadlines of one tag, in memory: its LEASED leases ordered by (due_ms, seq).

A LEASED lease whose due time has passed is Active again (``docs/STORAGE.md``), so this order
is also the "Active again" queue of DESIGN.md §2, in the order it asks for (the time a message
became Active, then seq). The lease rows are the durable form: the index is rebuilt from them
when a tag is loaded, so a deadline runs on while the server is down exactly as before. Kept
in memory instead of a RocksDB family written and deleted with every lease, it saves a row
put per delivery and a row delete per delete.

Invariants:
- every LEASED lease ``(due, seq)`` of the tag has its entry; entries of leases that changed
  since (deleted, redue'd, rewound) may stay behind until a walk meets them, and every reader
  checks an entry against ``TagState.leases`` before acting on it (as it did for rows);
- entries are unique pairs; walks see them in ascending (due, seq).

Entries are packed into one int (``due << 64 | seq``): ints compare faster than tuples, and
``sortedcontainers.SortedList`` keeps them in order with O(log n) inserts and removals.
"""

from __future__ import annotations

from typing import Iterator

from sortedcontainers import SortedList

__all__ = ["DueIndex", "DueWalk"]

_SEQ_BITS = 64
_SEQ_MASK = (1 << _SEQ_BITS) - 1


def _pack(due_ms: int, seq: int) -> int:
    return due_ms << _SEQ_BITS | seq


class DueIndex:
    """The (due_ms, seq) pairs of one tag's LEASED leases."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, due_ms: int, seq: int) -> None:
        """Index a LEASED lease (again: adding a pair already there changes nothing)."""
        entry = due_ms << _SEQ_BITS | seq
        if entry not in self._entries:
            self._entries.add(entry)

    def add_new(self, due_ms: int, seq: int) -> None:
        """``add`` for the first lease of ``seq``, which cannot be indexed yet."""
        self._entries.add(due_ms << _SEQ_BITS | seq)

    def discard(self, due_ms: int, seq: int) -> None:
        self._entries.discard(due_ms << _SEQ_BITS | seq)

    def first_due_after(self, time_ms: int) -> int | None:
        """The earliest due time later than ``time_ms``, or None."""
        entries = self._entries
        index = entries.bisect_left((time_ms + 1) << _SEQ_BITS)
        return entries[index] >> _SEQ_BITS if index < len(entries) else None

    def between(self, lower: tuple[int, int], upper_due_ms: int) -> list[tuple[int, int]]:
        """The pairs from ``lower`` (inclusive) with due time up to ``upper_due_ms``
        (inclusive), as a list: the caller may change the index while it goes through them."""
        found = self._entries.irange(_pack(*lower), _pack(upper_due_ms, _SEQ_MASK))
        return [(entry >> _SEQ_BITS, entry & _SEQ_MASK) for entry in found]

    def walk(self, from_due_ms: int, to_due_ms: int) -> DueWalk:
        """A walk over the pairs due from ``from_due_ms`` to ``to_due_ms`` (inclusive) that
        stays valid while the index changes under it (each step is one bisection)."""
        return DueWalk(self._entries, _pack(from_due_ms, 0), _pack(to_due_ms, _SEQ_MASK))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((entry >> _SEQ_BITS, entry & _SEQ_MASK) for entry in self._entries)


class DueWalk:
    """A position in a ``DueIndex``: ``current`` is the next pair within bounds (or None);
    ``next()`` moves past it. The index may change under a walk: an entry added or removed
    meanwhile is seen or not by where it sorts relative to the position, and removing the
    current entry is safe."""

    __slots__ = ("_entries", "_position", "_upper", "current")

    def __init__(self, entries: SortedList, lower: int, upper: int) -> None:
        self._entries = entries
        self._position = lower
        self._upper = upper
        self.current: tuple[int, int] | None = None
        self._seek()

    def _seek(self) -> None:
        entries = self._entries
        index = entries.bisect_left(self._position)
        if index < len(entries):
            entry = entries[index]
            if entry <= self._upper:
                self._position = entry
                self.current = (entry >> _SEQ_BITS, entry & _SEQ_MASK)
                return
        self.current = None

    def next(self) -> None:
        self._position += 1
        self._seek()
