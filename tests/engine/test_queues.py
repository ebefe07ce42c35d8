"""Queue administration: names, attributes, idempotent create, listing, purge, delete."""

import pytest

from lamina.engine import (
    InvalidArgument,
    InvalidQueueName,
    InvalidRedrivePolicy,
    QueueAlreadyExists,
    QueueNotFound,
    TooManyQueues,
)


def test_create_queue_resolves_defaults(engine, clock):
    info = engine.create_queue("orders")
    assert info.queue == "orders"
    assert info.created == clock.now_ms
    assert info.attributes == {
        "visibility_timeout": 30, "polling_wait": 0, "max_message_size": 262144,
        "retention": 345600, "delay": 0, "max_messages": 100_000_000, "rewind": 0,
        "redrive": None,
    }


def test_create_queue_again_with_equal_attributes_returns_original(engine, clock):
    first = engine.create_queue("orders", {"visibility_timeout": 60})
    clock.advance(5000)
    again = engine.create_queue("orders", {"visibility_timeout": 60})
    assert again.created == first.created


def test_create_queue_with_other_attributes_is_already_exists(engine):
    engine.create_queue("orders")
    with pytest.raises(QueueAlreadyExists):
        engine.create_queue("orders", {"visibility_timeout": 61})


def test_queue_names_are_unique_ignoring_case(engine):
    engine.create_queue("Orders")
    with pytest.raises(QueueAlreadyExists):
        engine.create_queue("orders")
    assert engine.get_queue("ORDERS").queue == "Orders"


@pytest.mark.parametrize("name", ["", "1abc", "a" * 65, "has space", "dot.ted"])
def test_invalid_queue_names_are_refused(engine, name):
    with pytest.raises(InvalidQueueName):
        engine.create_queue(name)


@pytest.mark.parametrize("name", [7, None, b"bytes"])
def test_a_queue_that_is_not_text_is_invalid_argument(engine, name):
    with pytest.raises(InvalidArgument):
        engine.create_queue(name)
    with pytest.raises(InvalidArgument):
        engine.get_queue(name)


@pytest.mark.parametrize("name", ["1abc", "has space", "a" * 65])
def test_a_lookup_judges_no_name(engine, name):
    with pytest.raises(QueueNotFound):
        engine.get_queue(name)


@pytest.mark.parametrize("attributes, field", [
    ({"visibility_timeout": 0}, "attributes.visibility_timeout"),
    ({"visibility_timeout": 43201}, "attributes.visibility_timeout"),
    ({"polling_wait": 31}, "attributes.polling_wait"),
    ({"max_message_size": 1023}, "attributes.max_message_size"),
    ({"max_message_size": 1048577}, "attributes.max_message_size"),
    ({"retention": 59}, "attributes.retention"),
    ({"retention": 365 * 86400 + 1}, "attributes.retention"),
    ({"delay": 30 * 86400 + 1}, "attributes.delay"),
    ({"delay": 60, "retention": 60}, "attributes.delay"),
    ({"max_messages": 0}, "attributes.max_messages"),
    ({"max_messages": 10**10 + 1}, "attributes.max_messages"),
    ({"rewind": 120, "retention": 60}, "attributes.rewind"),
    ({"visibility_timeout": True}, "attributes.visibility_timeout"),
    ({"visibility_timeout": 1.5}, "attributes.visibility_timeout"),
    ({"colour": 1}, "attributes.colour"),
    ({"redrive": {"dlq": "d"}}, "attributes.redrive.max_receives"),
    ({"redrive": {"dlq": "d", "max_receives": 1001}}, "attributes.redrive.max_receives"),
])
def test_out_of_range_attributes_name_the_field(engine, attributes, field):
    with pytest.raises(InvalidArgument) as caught:
        engine.create_queue("q", attributes)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_redrive_policy_rules(engine):
    engine.create_queue("dlq")
    with pytest.raises(InvalidRedrivePolicy):
        engine.create_queue("src", {"redrive": {"dlq": "missing", "max_receives": 3}})
    with pytest.raises(InvalidRedrivePolicy):
        engine.create_queue("self", {"redrive": {"dlq": "self", "max_receives": 3}})
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 3}})
    with pytest.raises(InvalidRedrivePolicy):  # a DLQ cannot get a policy
        engine.set_queue_attributes("dlq", {"redrive": {"dlq": "src", "max_receives": 1}})
    engine.create_queue("other")
    with pytest.raises(InvalidRedrivePolicy):  # a source cannot be a DLQ
        engine.create_queue("third", {"redrive": {"dlq": "src", "max_receives": 1}})


def test_deleting_a_dlq_removes_policies_naming_it(engine):
    engine.create_queue("dlq")
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 3}})
    engine.delete_queue("dlq")
    assert engine.get_queue("src").attributes["redrive"] is None


def test_set_queue_attributes_changes_only_given_keys_and_checks_the_result(engine):
    engine.create_queue("q", {"delay": 10})
    changed = engine.set_queue_attributes("q", {"visibility_timeout": 90})
    assert changed["visibility_timeout"] == 90 and changed["delay"] == 10
    with pytest.raises(InvalidArgument):
        engine.set_queue_attributes("q", {"retention": 60, "delay": 60})
    assert engine.get_queue("q").attributes["retention"] == 345600


def test_list_queues_orders_by_lower_cased_name_and_pages(engine):
    for name in ["beta", "Alpha", "gamma", "alphabet", "Delta"]:
        engine.create_queue(name)
    page = engine.list_queues(limit=2)
    assert page.queues == ["Alpha", "alphabet"] and page.next == "alphabet"
    page = engine.list_queues(after=page.next, limit=2)
    assert page.queues == ["beta", "Delta"]
    page = engine.list_queues(after=page.next, limit=2)
    assert page.queues == ["gamma"] and page.next is None
    assert engine.list_queues(prefix="ALP").queues == ["Alpha", "alphabet"]


def test_list_queues_limit_is_checked(engine):
    with pytest.raises(InvalidArgument, match="limit"):
        engine.list_queues(limit=0)
    with pytest.raises(InvalidArgument, match="limit"):
        engine.list_queues(limit=1001)


def test_too_many_queues(open_engine):
    engine = open_engine(max_queues=2)
    engine.create_queue("a")
    engine.create_queue("b")
    with pytest.raises(TooManyQueues):
        engine.create_queue("c")


def test_deleted_queue_is_gone_and_a_recreated_name_sees_no_old_data(engine):
    engine.create_queue("q")
    engine.send("q", [b"old"])
    receipt = engine.receive("q")[0].receipt
    engine.delete_queue("q")
    with pytest.raises(QueueNotFound):
        engine.get_queue("q")
    engine.create_queue("q")
    assert engine.receive("q", max=10) == []
    from lamina.engine import InvalidReceipt
    assert isinstance(engine.delete("q", [receipt])[0], InvalidReceipt)


def test_purge_drops_everything_produced_so_far_and_keeps_seq_going(engine, clock):
    engine.create_queue("q")
    sent = engine.send("q", [b"a", b"b", b"c"])
    receipt = engine.receive("q")[0].receipt
    assert engine.purge_queue("q") == 3
    assert engine.receive("q", max=10) == []
    from lamina.engine import StaleReceipt
    assert isinstance(engine.delete("q", [receipt])[0], StaleReceipt)
    later = engine.send("q", [b"d"])[0]
    assert later.id > sent[-1].id
    assert [d.body for d in engine.receive("q", max=10)] == [b"d"]
    assert engine.get_queue("q").stats["messages"] == 1


def test_queue_state_survives_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("q", {"visibility_timeout": 5})
    engine.close()
    engine = open_engine()
    assert engine.get_queue("q").attributes["visibility_timeout"] == 5
    assert engine.list_queues().queues == ["q"]


def test_delete_queue_leaves_no_row_of_it_behind(engine, clock):
    from lamina.engine import keys
    engine.create_queue("q")
    engine.create_tag("q", "t", "oldest")
    engine.send("q", [{1: b"a", 3: "topic"}, {1: b"d", 5: 5}, b"plain"])
    engine.receive("q", max=10)
    engine.delete_queue("q")
    store = engine._store
    lower, upper = keys.queue_bounds(1)
    for family in ("log", "time", "segments", "delays", "delayseq", "topics", "tags", "leases"):
        assert list(store.keys(getattr(store, family), lower, upper)) == [], family
    assert [k for k in store.meta.keys() if k[:1] in b"QWTPD" and k[1:5] == lower] == []
    assert [k for k in store.meta.keys() if k[:1] == b"N"] == []
