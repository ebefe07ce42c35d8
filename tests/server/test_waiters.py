"""Waiting receives without a connection (waiters.py): who waits on which tag, in arrival order,
which tags are due, which waits time out, and how the applier ends a wait (applier.py)."""

from __future__ import annotations

from typing import Any

from lamina.server.applier import GroupApplier
from lamina.server.dispatch import ReceiveAnswer
from lamina.server.keyring import KeyRing
from lamina.server.metrics import ServerMetrics
from lamina.server.waiters import STALE_SLACK, Waiter, WaitingReceives, tag_key


class Owner:
    """A stand-in for a connection: it records what it is told."""

    def __init__(self, peer: str = "peer") -> None:
        self.peer = peer
        self.forgotten: list[Waiter] = []
        self.answers: list[tuple[int, Any]] = []
        self.aborted = False

    def forget_wait(self, waiter: Waiter) -> None:
        self.forgotten.append(waiter)

    def abort(self) -> None:
        self.aborted = True

    def answer(self, request_id: int, answer: Any) -> None:
        self.answers.append((request_id, answer))


def waiter(owner: Owner, request_id: int, queue: str = "q", tag: str | None = None,
           deadline: float = 10.0) -> Waiter:
    return Waiter(owner, owner.answer, request_id, 0.0, {"queue": queue}, None, deadline,
                  tag_key(queue, tag))


def test_waiters_of_one_tag_are_served_in_arrival_order() -> None:
    waiting, owner = WaitingReceives(), Owner()
    first, second, third = (waiter(owner, n) for n in (1, 2, 3))
    for w in (first, second, third):
        waiting.add(w)
    assert waiting.waiting_on(tag_key("q", None)) == [first, second, third]
    assert waiting.remove(second)
    assert waiting.waiting_on(tag_key("q", "default")) == [first, third]
    assert len(waiting) == 2


def test_a_waiter_is_removed_once() -> None:
    waiting = WaitingReceives()
    w = waiter(Owner(), 1)
    waiting.add(w)
    assert waiting.remove(w) and not waiting.remove(w)
    assert not waiting.has(w) and len(waiting) == 0


def test_only_tags_with_waiters_become_due_and_taking_them_clears_the_marks() -> None:
    waiting, owner = WaitingReceives(), Owner()
    waiting.add(waiter(owner, 1, "Q", "Blue"))
    waiting.mark_due("other")
    assert not waiting.any_due
    waiting.mark_due("q", "BLUE")  # names compare lower-cased, as the engine's
    assert waiting.any_due
    assert waiting.take_due() == [("q", "blue")]
    assert not waiting.any_due and waiting.take_due() == []


def test_a_queue_marked_due_makes_every_tag_of_it_due() -> None:
    waiting, owner = WaitingReceives(), Owner()
    for n, tag in enumerate(("b", "a", None)):
        waiting.add(waiter(owner, n, "q", tag))
    waiting.add(waiter(owner, 9, "other"))
    waiting.mark_due("q")
    assert waiting.take_due() == [("q", "a"), ("q", "b"), ("q", "default")]


def test_expired_waits_come_oldest_deadline_first_and_skip_the_ones_gone() -> None:
    waiting, owner = WaitingReceives(), Owner()
    late, gone, early = waiter(owner, 1, deadline=5.0), waiter(owner, 2, deadline=2.0), \
        waiter(owner, 3, deadline=1.0)
    for w in (late, gone, early):
        waiting.add(w)
    waiting.remove(gone)
    assert waiting.next_deadline() == 1.0
    assert waiting.expired(3.0) == [early]
    assert waiting.has(early)  # ending it is the applier's job
    waiting.remove(early)
    assert waiting.next_deadline() == 5.0
    assert waiting.expired(3.0) == []


def test_long_polls_answered_one_after_another_leave_no_pile_of_deadlines() -> None:
    # A consumer's long polls with one timeout, each answered before the next begins: each
    # leaves an entry behind, dropped by the next add, so no burst of cleaning ever comes.
    waiting, owner = WaitingReceives(), Owner()
    for n in range(5 * STALE_SLACK):
        w = waiter(owner, n, deadline=1.0 + n * 0.001)
        waiting.add(w)
        assert waiting.deadline_entries == 1
        assert waiting.remove(w)
    assert waiting.next_deadline() is None and waiting.expired(1e9) == []


def test_deadlines_of_waiters_gone_behind_a_later_live_one_are_bounded() -> None:
    # A live wait with a long timeout stays on top; the short waits behind it, answered, pile
    # up only until the heap is rebuilt, and the live ones still time out in order.
    waiting, owner = WaitingReceives(), Owner()
    long_wait = waiter(owner, 0, deadline=100.0)
    waiting.add(long_wait)
    short_live = waiter(owner, 1, deadline=150.0)
    waiting.add(short_live)
    for n in range(2, 10 * STALE_SLACK):
        w = waiter(owner, n, deadline=200.0 + n)
        waiting.add(w)
        assert waiting.deadline_entries <= 2 * len(waiting) + STALE_SLACK + 1
        assert waiting.remove(w)
    assert len(waiting) == 2
    assert waiting.next_deadline() == 100.0
    assert waiting.expired(1e9) == [long_wait, short_live]


def test_waiters_of_a_queue_and_of_a_tag_are_found_for_their_deletion() -> None:
    waiting, owner = WaitingReceives(), Owner()
    a, b, c = waiter(owner, 1, "q", "a"), waiter(owner, 2, "q", "b"), waiter(owner, 3, "r")
    for w in (a, b, c):
        waiting.add(w)
    assert waiting.on_queue("Q") == [a, b]
    assert waiting.on_tag("q", "B") == [b]
    assert set(waiting) == {a, b, c}


def _applier() -> GroupApplier:
    return GroupApplier(max_frame_bytes=1 << 20, clock=lambda: 0, metrics=ServerMetrics(),
                        keys=KeyRing(), auth_required=False, server_info=dict,
                        on_deadline_changed=lambda: None, on_wait_added=lambda _: None)


def test_ending_a_wait_answers_no_messages_through_its_callback_and_tells_its_owner() -> None:
    applier, owner = _applier(), Owner()
    w = waiter(owner, 7)
    applier.waiting.add(w)
    applier.end_wait(w)
    assert owner.answers == [(7, ReceiveAnswer([]))]
    assert owner.forgotten == [w] and w.claimed and len(applier.waiting) == 0
    applier.end_wait(w)  # a second end answers nothing more
    assert owner.answers == [(7, ReceiveAnswer([]))]


def test_a_claimed_wait_is_not_answered_by_its_end() -> None:
    applier, owner = _applier(), Owner()
    w = waiter(owner, 7)
    applier.waiting.add(w)
    w.claimed = True  # the applier leased messages for it: only it answers
    applier.end_wait(w)
    assert owner.answers == [] and owner.forgotten == [w]


def test_a_dropped_wait_is_forgotten_without_an_answer() -> None:
    applier, owner = _applier(), Owner()
    w = waiter(owner, 7)
    applier.waiting.add(w)
    applier.drop_wait(w)
    assert owner.answers == [] and len(applier.waiting) == 0
