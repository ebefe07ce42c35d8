"""A receive's seqs go onto a tag's heaps (``lessor.push_ascending``) laid out exactly as
pushing them one by one lays them out: the heaps are compared as lists."""

from __future__ import annotations

from heapq import heappush

from hypothesis import given
from hypothesis import strategies as st

from lamina.engine.lessor import push_ascending


@given(st.lists(st.integers(0, 200)), st.integers(0, 220), st.integers(1, 64))
def test_ascending_seqs_pushed_at_once_leave_the_heap_as_pushes_one_by_one(
        held, first, entries):
    heap: list[int] = []
    for seq in held:
        heappush(heap, seq)
    seqs = list(range(first, first + entries))
    expected = list(heap)
    for seq in seqs:
        heappush(expected, seq)
    push_ascending(heap, seqs)
    assert heap == expected


def test_a_batch_past_those_in_flight_is_appended_and_one_below_them_sifts_up():
    heap = [10, 11, 12, 13]
    push_ascending(heap, [20, 21])
    assert heap == [10, 11, 12, 13, 20, 21]
    push_ascending(heap, [1, 2])
    assert heap[0] == 1 and sorted(heap) == [1, 2, 10, 11, 12, 13, 20, 21]
