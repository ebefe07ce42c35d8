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

Entries are grouped by due time: the leases of one receive share theirs, so a lease costs a
dict insert and a dict removal in its group (``buckets``; a group of one lease is its seq
alone, which costs a fraction of a dict's memory), and only the distinct due times are kept
sorted (a ``sortedcontainers.SortedList``). A group's seqs are sorted when a walk or
read reaches the group (rarely: only for leases that ran out or are read in order).
"""

from __future__ import annotations

from itertools import repeat
from typing import Collection, Iterator

from sortedcontainers import SortedList

__all__ = ["DueIndex", "DueWalk"]

#: A group: its one seq (most groups of single receives hold one lease: an int costs a
#: fraction of a dict), or its seqs as the keys of a dict (insertion order).
Group = int | dict[int, None]


def _seqs(group: Group) -> Collection[int]:
    return (group,) if isinstance(group, int) else group


class DueIndex:
    """The (due_ms, seq) pairs of one tag's LEASED leases."""

    __slots__ = ("buckets", "dues", "version")

    def __init__(self) -> None:
        self.buckets: dict[int, Group] = {}  # due -> its seqs
        self.dues: SortedList = SortedList()  # the due times of the non-empty buckets
        self.version = 0  # bumped by every add: a walk re-sorts a group that grew

    def __len__(self) -> int:
        return sum(len(_seqs(bucket)) for bucket in self.buckets.values())

    def add(self, due_ms: int, seq: int) -> None:
        """Index a LEASED lease (again: adding a pair already there changes nothing)."""
        buckets = self.buckets
        bucket = buckets.get(due_ms)
        if bucket is None:
            buckets[due_ms] = seq
            self.dues.add(due_ms)
        elif bucket.__class__ is dict:  # an attribute, not a call: the usual path
            bucket[seq] = None
        elif bucket != seq:  # a one-seq group becomes a dict
            buckets[due_ms] = {bucket: None, seq: None}  # type: ignore[dict-item]
        self.version += 1

    def add_all(self, due_ms: int, seqs: list[int]) -> None:
        """``add(due_ms, seq)`` for each of ``seqs`` (a receive's leases share their due)."""
        if len(seqs) == 1:
            self.add(due_ms, seqs[0])
            return
        buckets = self.buckets
        bucket = buckets.get(due_ms)
        if bucket is None:
            buckets[due_ms] = dict.fromkeys(seqs)
            self.dues.add(due_ms)
        elif bucket.__class__ is dict:
            bucket.update(dict.fromkeys(seqs))
        else:
            buckets[due_ms] = {bucket: None, **dict.fromkeys(seqs)}  # type: ignore[dict-item]
        self.version += 1

    def discard_runs(self, due_seqs: dict[int, list[int]]) -> None:
        """``discard_run`` of each due time's seqs (a delete's leases: usually one
        receive's, sharing their due time)."""
        for due_ms, seqs in due_seqs.items():
            self.discard_run(due_ms, seqs)

    def discard_run(self, due_ms: int, seqs: list[int]) -> None:
        """``discard(due_ms, seq)`` for each of ``seqs`` (distinct: a lease ends once)."""
        buckets = self.buckets
        bucket = buckets.get(due_ms)
        if bucket.__class__ is dict:
            # The usual delete ends every lease of one receive: the whole group goes.
            if len(seqs) != len(bucket) or False in map(bucket.__contains__, seqs):
                [*map(bucket.pop, seqs, repeat(None, len(seqs)))]
                if bucket:
                    return
        elif bucket is None or bucket not in seqs:  # none, or a one-seq group of another
            return
        del buckets[due_ms]
        if buckets:
            self.dues.remove(due_ms)
        else:  # the last group (a consumer's lone lease, usually): cheaper than a remove
            self.dues.clear()

    def discard(self, due_ms: int, seq: int) -> None:
        buckets = self.buckets
        bucket = buckets.get(due_ms)
        if bucket is None:
            return
        if bucket.__class__ is dict:
            if seq not in bucket:
                return
            del bucket[seq]
            if bucket:
                return
        elif bucket != seq:
            return  # a one-seq group of another seq
        del buckets[due_ms]
        if buckets:
            self.dues.remove(due_ms)
        else:
            self.dues.clear()

    def first_due_after(self, time_ms: int) -> int | None:
        """The earliest due time later than ``time_ms``, or None."""
        dues = self.dues
        index = dues.bisect_right(time_ms)
        return dues[index] if index < len(dues) else None

    def between(self, lower: tuple[int, int], upper_due_ms: int) -> list[tuple[int, int]]:
        """The pairs from ``lower`` (inclusive) with due time up to ``upper_due_ms``
        (inclusive), as a list: the caller may change the index while it goes through them."""
        low_due, low_seq = lower
        found: list[tuple[int, int]] = []
        for due in self.dues.irange(low_due, upper_due_ms):
            found.extend((due, seq) for seq in sorted(_seqs(self.buckets[due]))
                         if due != low_due or seq >= low_seq)
        return found

    def walk(self, from_due_ms: int, to_due_ms: int) -> DueWalk:
        """A walk over the pairs due from ``from_due_ms`` to ``to_due_ms`` (inclusive) that
        stays valid while the index changes under it."""
        return DueWalk(self, from_due_ms, to_due_ms)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        buckets = self.buckets
        return ((due, seq) for due in list(self.dues) for seq in sorted(_seqs(buckets[due])))


class DueWalk:
    """A position in a ``DueIndex``: ``current`` is the next pair within bounds (or None);
    ``next()`` moves past it. The index may change under a walk: an entry added or removed
    meanwhile is seen or not by where it sorts relative to the position, and removing the
    current entry is safe."""

    __slots__ = ("_index", "_due", "_seq", "_upper", "_sorted", "_at", "_version", "current")

    def __init__(self, index: DueIndex, lower_due_ms: int, upper_due_ms: int) -> None:
        self._index = index
        self._due = lower_due_ms  # the position: the next pair is >= (_due, _seq)
        self._seq = 0
        self._upper = upper_due_ms
        self._sorted: list[int] = []  # the seqs of group ``_due`` in order, when read
        self._at = 0
        self._version = -1
        self.current: tuple[int, int] | None = None
        self._seek()

    def _seek(self) -> None:
        index = self._index
        while True:
            if self._due > self._upper:
                self.current = None
                return
            group = index.buckets.get(self._due)
            if group is not None:
                bucket = _seqs(group)
                if self._version != index.version or not self._sorted:
                    self._sorted = sorted(bucket)
                    self._version = index.version
                    self._at = 0
                ordered, at, seq = self._sorted, self._at, self._seq
                while at < len(ordered) and (ordered[at] < seq or ordered[at] not in bucket):
                    at += 1
                self._at = at
                if at < len(ordered):
                    self._seq = ordered[at]
                    self.current = (self._due, self._seq)
                    return
            dues = index.dues
            position = dues.bisect_right(self._due)
            if position >= len(dues):
                self.current = None
                return
            self._due, self._seq, self._sorted = dues[position], 0, []

    def next(self) -> None:
        self._seq += 1
        self._seek()
