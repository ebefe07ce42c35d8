"""peek (three modes), delete_by_id and purge (DESIGN.md §2 "Peek, delete by id",
"Purge, delete, copy")."""

import pytest

from lamina.engine import (
    InvalidArgument,
    MessageNotFound,
    PeekPage,
    Peeked,
    StaleReceipt,
)

T0 = 1_700_000_000_000


@pytest.fixture
def q(engine):
    engine.create_queue("q")
    return "q"


def bodies(items):
    return [item.message.body for item in items]


def ids_of(items):
    return [item.message.id for item in items]


def states(page):
    return [(p.message.body, p.state) for p in page.messages]


# -- default mode: what receive would return -----------------------------------------------

def mixed_backlog(engine, q, clock):
    """Active-again, ended delays, priorities and topics, all at once."""
    engine.send(q, [b"again", {1: b"delayed", 5: 1}, {1: b"low", 4: 12},
                    {1: b"t1", 3: "t"}, {1: b"t2", 3: "t"}, {1: b"high", 4: 2}, b"plain"])
    engine.receive(q, visibility_timeout=2)  # "high"
    clock.advance(2000)


@pytest.mark.parametrize("count", [1, 3, 10])
def test_default_peek_shows_exactly_what_receive_would_return(engine, q, clock, count):
    mixed_backlog(engine, q, clock)
    peeked = engine.peek(q, max=count)
    assert isinstance(peeked, PeekPage) and peeked.next is None
    received = engine.receive(q, max=count)
    assert ids_of(peeked.messages) == ids_of(received)
    assert len(received) == min(count, 6)


def test_default_peek_orders_like_receive(engine, q, clock):
    mixed_backlog(engine, q, clock)
    # Active again by (time it became Active, seq): the delay ended at +1 s, the lease at
    # +2 s; then never-delivered by (priority, seq), one per topic
    assert bodies(engine.peek(q, max=10).messages) == [
        b"delayed", b"high", b"again", b"t1", b"plain", b"low"]


def test_default_peek_changes_nothing(engine, q, clock):
    mixed_backlog(engine, q, clock)
    before = engine.get_queue(q).stats
    first = engine.peek(q, max=10)
    second = engine.peek(q, max=10)
    assert ids_of(first.messages) == ids_of(second.messages)
    assert engine.get_queue(q).stats == before
    received = engine.receive(q, max=10)
    assert [d.dequeue_count for d in received] == [p.dequeue_count + 1 for p in first.messages]


def test_default_peek_entries_are_active_with_their_counts(engine, q, clock):
    engine.send(q, [b"a", b"b"])
    engine.receive(q, visibility_timeout=1)
    clock.advance(1000)
    entries = engine.peek(q, max=2).messages
    assert [(p.state, p.dequeue_count, p.first_dequeue_time) for p in entries] == [
        ("active", 1, T0), ("active", 0, None)]
    assert all(isinstance(p, Peeked) for p in entries)


def test_default_peek_on_a_tag(engine, q):
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    engine.send(q, [{1: b"no", 2: {"k": 2}}, {1: b"yes", 2: {"k": 1}}])
    assert bodies(engine.peek(q, tag="f", max=10).messages) == [b"yes"]
    assert bodies(engine.peek(q, max=10).messages) == [b"no", b"yes"]


def test_default_peek_is_empty_when_nothing_is_active(engine, q):
    engine.send(q, [b"a", {1: b"d", 5: 10}])
    engine.receive(q)
    assert engine.peek(q, max=10) == PeekPage([], None)


# -- start mode ----------------------------------------------------------------------------

@pytest.fixture
def every_state(engine, clock):
    """A queue holding one message in each state for the default tag -> sent ids by body."""
    engine.create_queue("dlq")
    engine.create_queue("s", {"redrive": {"dlq": "dlq", "max_receives": 10}})
    sent = engine.send("s", [b"deleted", b"dead", b"inflight", {1: b"head", 3: "t"},
                             {1: b"parked", 3: "t"}, {1: b"delayed", 5: 60},
                             {1: b"active", 4: 16}])
    got = {d.body: d for d in engine.receive("s", max=4)}
    assert set(got) == {b"deleted", b"dead", b"inflight", b"head"}
    engine.delete("s", [got[b"deleted"].receipt])
    engine.dead("s", [got[b"dead"].receipt])
    return {body: s.id for body, s in zip(
        [b"deleted", b"dead", b"inflight", b"head", b"parked", b"delayed", b"active"], sent)}


def test_start_mode_lists_production_order_with_states(engine, every_state, clock):
    page = engine.peek("s", start=T0, max=100)
    assert states(page) == [
        (b"deleted", "deleted"), (b"dead", "dead"), (b"inflight", "inflight"),
        (b"head", "inflight"), (b"parked", "parked"), (b"delayed", "delayed"),
        (b"active", "active")]
    assert page.next is None


def test_start_mode_inflight_entry_has_its_lease_fields(engine, every_state, clock):
    entry = engine.peek("s", ids=[every_state[b"inflight"]]).messages[0]
    assert (entry.state, entry.dequeue_count, entry.first_dequeue_time,
            entry.next_visible_time) == ("inflight", 1, T0, T0 + 30_000)


def test_start_mode_pages_with_next_and_after(engine, q, clock):
    for i in range(5):
        engine.send(q, [f"m{i}"])
        clock.advance(1)
    seen, after, pages = [], None, 0
    while True:
        page = engine.peek(q, start=T0, after=after, max=2)
        pages += 1
        seen += bodies(page.messages)
        if page.next is None:
            break
        after = page.next
    assert seen == [f"m{i}" for i in range(5)] and pages == 3


def test_start_mode_pages_end_exactly(engine, q):
    engine.send(q, [b"a", b"b", b"c", b"d"])
    first = engine.peek(q, start=0, max=2)
    second = engine.peek(q, start=0, after=first.next, max=2)
    assert bodies(second.messages) == [b"c", b"d"]
    assert second.next is None


def test_start_mode_lists_from_the_start_time(engine, q, clock):
    engine.send(q, [b"early"])
    clock.advance(10)
    engine.send(q, [b"late"])
    assert bodies(engine.peek(q, start=T0 + 1, max=10).messages) == [b"late"]
    assert bodies(engine.peek(q, start=T0 + 11, max=10).messages) == []


def test_start_mode_on_a_tag_lists_only_messages_it_receives(engine, q, clock):
    engine.send(q, [{1: b"before", 2: {"k": 1}}])
    clock.advance(1)
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    engine.send(q, [{1: b"no", 2: {"k": 2}}, {1: b"yes", 2: {"k": 1}}])
    assert bodies(engine.peek(q, tag="f", start=0, max=10).messages) == [b"yes"]


def test_start_mode_does_not_change_anything(engine, every_state, clock):
    before = engine.get_queue("s").stats
    engine.peek("s", start=0, max=100)
    assert engine.get_queue("s").stats == before
    assert bodies(engine.peek("s", max=10).messages) == [b"active"]


# -- ids mode ------------------------------------------------------------------------------

def test_ids_mode_answers_one_entry_per_id_in_request_order(engine, every_state):
    wanted = [b"active", b"dead", b"parked", b"deleted", b"active"]
    page = engine.peek("s", ids=[every_state[b] for b in wanted], max=1)
    assert [(p.message.body, p.state) for p in page.messages] == [
        (b"active", "active"), (b"dead", "dead"), (b"parked", "parked"),
        (b"deleted", "deleted"), (b"active", "active")]
    assert page.next is None


def test_ids_mode_unknown_ids_are_message_not_found_entries(engine, q):
    engine.create_queue("other")
    foreign = engine.send("other", [b"x"])[0].id
    mine = engine.send(q, [b"a"])[0].id
    never = mine[:-2] + "f7"  # a seq never produced in q
    page = engine.peek(q, ids=["nonsense", foreign, mine, never])
    assert isinstance(page.messages[0], MessageNotFound)
    assert isinstance(page.messages[1], MessageNotFound)
    assert page.messages[2].message.body == b"a"
    assert isinstance(page.messages[3], MessageNotFound)


def test_ids_mode_outside_the_tags_scope_is_message_not_found(engine, q, clock):
    old = engine.send(q, [b"old"])[0].id
    clock.advance(1)
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    out = engine.send(q, [{1: b"out", 2: {"k": 2}}])[0].id
    inside = engine.send(q, [{1: b"in", 2: {"k": 1}}])[0].id
    page = engine.peek(q, tag="f", ids=[old, out, inside])
    assert [type(p).__name__ for p in page.messages] == [
        "MessageNotFound", "MessageNotFound", "Peeked"]


@pytest.mark.parametrize("args, field", [
    ({"max": 0}, "max"), ({"max": 1001}, "max"), ({"ids": []}, "ids"),
    ({"ids": ["x"] * 1001}, "ids"), ({"start": -1}, "start"),
])
def test_peek_arguments_are_checked(engine, q, args, field):
    with pytest.raises(InvalidArgument) as caught:
        engine.peek(q, **args)
    assert caught.value.field == field


def test_peek_takes_either_start_or_ids(engine, q):
    mine = engine.send(q, [b"a"])[0].id
    with pytest.raises(InvalidArgument):
        engine.peek(q, start=0, ids=[mine])
    with pytest.raises(InvalidArgument):
        engine.peek(q, after=mine)


# -- delete_by_id --------------------------------------------------------------------------

def test_delete_by_id_ends_messages_in_every_state(engine, every_state, clock):
    wanted = [b"active", b"inflight", b"delayed", b"head"]
    results = engine.delete_by_id("s", [every_state[b] for b in wanted])
    assert results == [None] * 4
    page = engine.peek("s", ids=[every_state[b] for b in wanted])
    assert [p.state for p in page.messages] == ["deleted"] * 4
    # the topic goes on: the parked successor of the deleted head is next
    successor = engine.receive("s", max=10)
    assert bodies(successor) == [b"parked"]
    engine.delete("s", [successor[0].receipt])
    clock.advance(120_000)
    assert engine.receive("s", max=10) == []


def test_delete_by_id_makes_the_receipt_stale(engine, q):
    sent = engine.send(q, [b"a"])[0]
    receipt = engine.receive(q)[0].receipt
    assert engine.delete_by_id(q, [sent.id]) == [None]
    assert isinstance(engine.delete(q, [receipt])[0], StaleReceipt)


def test_delete_by_id_unlinks_a_parked_message(engine, q):
    sent = engine.send(q, [{1: b"1", 3: "t"}, {1: b"2", 3: "t"}, {1: b"3", 3: "t"}])
    head = engine.receive(q)[0]
    assert engine.delete_by_id(q, [sent[1].id]) == [None]
    assert engine.receive(q) == []  # the head is still inflight
    engine.delete(q, [head.receipt])
    assert bodies(engine.receive(q, max=10)) == [b"3"]


def test_delete_by_id_is_idempotent(engine, q, clock):
    sent = engine.send(q, [b"a", b"b"])
    assert engine.delete_by_id(q, [sent[0].id, sent[0].id]) == [None, None]
    assert engine.delete_by_id(q, [sent[0].id]) == [None]
    engine.delete(q, [engine.receive(q)[0].receipt])  # b
    clock.advance(1)
    engine.send(q, [b"c"])
    assert engine.get_queue(q).stats["messages"] == 1  # a and b are gone
    assert engine.delete_by_id(q, [sent[0].id, sent[1].id]) == [None, None]


def test_messages_deleted_by_id_are_gone_once_ended_for_every_tag(engine, clock):
    engine.create_queue("small", {"max_messages": 1})
    sent = engine.send("small", [b"a"])[0]
    assert engine.delete_by_id("small", [sent.id]) == [None]
    clock.advance(1)  # a is Ended for every tag and produced before now - rewind: gone
    assert engine.get_queue("small").stats["messages"] == 0
    assert not isinstance(engine.send("small", [b"b"])[0], Exception)


def test_delete_by_id_of_unknown_ids_is_message_not_found(engine, q, clock):
    engine.create_queue("other")
    foreign = engine.send("other", [b"x"])[0].id
    mine = engine.send(q, [b"a"])[0].id
    clock.advance(1)
    engine.create_tag(q, "late")
    results = engine.delete_by_id(q, ["nonsense", foreign, mine[:-2] + "f7", mine])
    assert [type(r).__name__ for r in results[:3]] == ["MessageNotFound"] * 3
    assert results[3] is None
    # "a" is now Ended for every tag: below gone_seq, an id answers null for any tag ...
    assert engine.delete_by_id(q, [mine], tag="late") == [None]
    # ... while a retained message before the tag's start is not the tag's.
    kept = engine.send(q, [b"b"])[0].id
    clock.advance(1)
    engine.create_tag(q, "later")
    assert isinstance(engine.delete_by_id(q, [kept], tag="later")[0], MessageNotFound)


def test_delete_by_id_is_per_tag(engine, q):
    engine.create_tag(q, "other", start="oldest")
    sent = engine.send(q, [b"a"])[0]
    engine.delete_by_id(q, [sent.id], tag="other")
    assert engine.receive(q, tag="other") == []
    assert bodies(engine.receive(q)) == [b"a"]


def test_delete_by_id_shows_deleted_in_start_mode(engine, q):
    sent = engine.send(q, [b"a", b"b"])
    engine.delete_by_id(q, [sent[1].id])
    assert states(engine.peek(q, start=0, max=10)) == [(b"a", "active"), (b"b", "deleted")]


# -- purge ---------------------------------------------------------------------------------

def test_purge_keeps_attributes_and_tags(engine, clock):
    engine.create_queue("p", {"visibility_timeout": 7})
    engine.create_tag("p", "f", filter={"attributes": {"k": 1}})
    engine.send("p", [{1: b"old", 2: {"k": 1}}, b"plain"])
    assert engine.purge_queue("p") == 2
    assert engine.get_queue("p").attributes["visibility_timeout"] == 7
    tags = {t.tag: t for t in engine.list_tags("p")}
    assert set(tags) == {"default", "f"}
    assert tags["f"].filter == {"attributes": {"k": 1}, "match": "all"}
    engine.send("p", [{1: b"new", 2: {"k": 1}}])
    got = engine.receive("p", tag="f", max=10)
    assert [d.body for d in got] == [b"new"]
    assert got[0].next_visible_time == clock.now_ms + 7000
    assert engine.peek("p", start=0, max=10).messages[0].message.body == b"new"


def test_purge_counts_only_retained_messages(engine, q, clock):
    engine.send(q, [b"a", b"b"])
    engine.delete(q, [engine.receive(q)[0].receipt])
    clock.advance(1)
    assert engine.purge_queue(q) == 1
    assert engine.purge_queue(q) == 0


def test_start_mode_lists_deleted_messages_only_while_retained(engine, clock):
    engine.create_queue("r", {"rewind": 60})
    engine.send("r", [b"a"])
    engine.delete("r", [engine.receive("r")[0].receipt])
    clock.advance(60_000)
    assert states(engine.peek("r", start=0, max=10)) == [(b"a", "deleted")]
    clock.advance(1)
    assert engine.peek("r", start=0, max=10) == PeekPage([], None)


def test_delete_by_id_outside_the_tags_filter_is_message_not_found(engine, q):
    engine.create_tag(q, "f", filter={"attributes": {"k": 1}})
    sent = engine.send(q, [{1: b"out", 2: {"k": 2}}, {1: b"in", 2: {"k": 1}}])
    results = engine.delete_by_id(q, [s.id for s in sent], tag="f")
    assert isinstance(results[0], MessageNotFound) and results[1] is None
    assert engine.receive(q, tag="f") == []


def test_peek_shows_the_dequeue_count_of_a_message_received_then_deleted(engine, clock):
    engine.create_queue("q", {"rewind": 60})  # the window keeps deleted messages retained
    engine.send("q", [b"once", b"twice"])
    engine.delete("q", [d.receipt for d in engine.receive("q", max=1)])
    engine.receive("q", visibility_timeout=1)
    clock.advance(1500)
    [again] = engine.receive("q")
    engine.delete("q", [again.receipt])
    peeked = {p.message.body: p for p in engine.peek("q", start=0, max=10).messages}
    assert (peeked[b"once"].state, peeked[b"once"].dequeue_count) == ("deleted", 1)
    assert (peeked[b"twice"].state, peeked[b"twice"].dequeue_count) == ("deleted", 2)
    assert peeked[b"twice"].first_dequeue_time == clock() - 1500
    by_id = engine.peek("q", ids=[peeked[b"twice"].message.id]).messages[0]
    assert by_id.dequeue_count == 2


def test_a_rewind_resets_the_count_a_deleted_message_showed(engine, clock):
    engine.create_queue("q", {"rewind": 60})
    engine.send("q", [b"m"])
    engine.delete("q", [d.receipt for d in engine.receive("q")])
    clock.advance(1000)
    engine.rewind("q", clock() - 5000)
    [peeked] = engine.peek("q", start=0).messages
    assert (peeked.state, peeked.dequeue_count) == ("active", 0)
    engine.delete("q", [d.receipt for d in engine.receive("q")])
    [peeked] = engine.peek("q", start=0).messages
    assert (peeked.state, peeked.dequeue_count) == ("deleted", 1)


def test_the_count_of_a_deleted_message_survives_a_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"rewind": 60})
    engine.send("q", [b"m"])
    engine.delete("q", [d.receipt for d in engine.receive("q")])
    engine.close()
    [peeked] = open_engine().peek("q", start=0).messages
    assert (peeked.state, peeked.dequeue_count) == ("deleted", 1)
