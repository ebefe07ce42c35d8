"""copy_queue (DESIGN.md §2 "Purge, delete, copy"); purge is covered with peek."""

import pytest

from lamina.engine import (
    InvalidArgument,
    InvalidQueueName,
    QueueAlreadyExists,
    QueueNotFound,
    TagInfo,
)

T0 = 1_700_000_000_000


@pytest.fixture
def source(engine, clock):
    engine.create_queue("dlq")
    engine.create_queue("src", {"visibility_timeout": 45, "retention": 3600, "rewind": 600,
                                "redrive": {"dlq": "dlq", "max_receives": 2}})
    engine.create_tag("src", "filtered", start="oldest",
                      filter={"attributes": {"k": 1}, "match": "any"})
    engine.create_tag("src", "Plain", start=T0 - 5000)
    engine.send("src", [{1: b"old", 2: {"k": 1}}])
    engine.grant("src", "key", ["send", "peek"])
    clock.advance(1000)
    return "src"


def test_copy_has_the_same_attributes_redrive_included(engine, source, clock):
    info = engine.copy_queue("cp", source)
    assert info.queue == "cp"
    assert info.attributes == engine.get_queue(source).attributes
    assert info.attributes["redrive"] == {"dlq": "dlq", "max_receives": 2}
    got = engine.get_queue("cp")
    assert (got.attributes, got.created) == (info.attributes, clock.now_ms)


def test_copy_has_the_tags_with_their_filters_starting_now(engine, source, clock):
    engine.copy_queue("cp", source)
    now = clock.now_ms
    tags = engine.list_tags("cp")
    assert [TagInfo(t.tag, t.start, t.filter, t.created) for t in tags] == [
        TagInfo("default", 0, None, now),
        TagInfo("filtered", now, {"attributes": {"k": 1}, "match": "any"}, now),
        TagInfo("Plain", now, None, now),
    ]


def test_copy_has_no_messages(engine, source):
    engine.copy_queue("cp", source)
    assert engine.get_queue("cp").stats["messages"] == 0
    assert engine.receive("cp", max=10) == []
    assert engine.peek("cp", start=0, max=10).messages == []
    assert engine.receive(source, max=10)[0].body == b"old"  # the source keeps its own


def test_copy_tags_receive_what_is_sent_to_the_copy(engine, source):
    engine.copy_queue("cp", source)
    engine.send("cp", [{1: b"in", 2: {"k": 1}}, {1: b"out", 2: {"k": 2}}])
    assert [d.body for d in engine.receive("cp", tag="filtered", max=10)] == [b"in"]
    assert [d.body for d in engine.receive("cp", tag="plain", max=10)] == [b"in", b"out"]


def test_copy_has_no_grants(engine, source):
    engine.copy_queue("cp", source)
    assert [g.queue for g in engine.list_grants(key="key")] == ["src"]
    assert engine.list_grants(queue="cp") == []


def test_copy_is_another_source_of_the_same_dlq(engine, source):
    engine.copy_queue("cp", source)
    engine.send("cp", [b"m"])
    engine.dead("cp", [engine.receive("cp")[0].receipt])
    copies = engine.receive("dlq", max=10)
    assert [c.message.dead[0] for c in copies] == ["cp"]


@pytest.mark.parametrize("name", ["", "1abc", "a" * 65, "has space"])
def test_copy_to_an_invalid_name_is_invalid_queue_name(engine, source, name):
    with pytest.raises(InvalidQueueName):
        engine.copy_queue(name, source)


def test_copy_to_a_name_that_is_not_text_is_invalid_argument(engine, source):
    with pytest.raises(InvalidArgument):
        engine.copy_queue(7, source)


@pytest.mark.parametrize("name", ["src", "SRC", "dlq"])
def test_copy_onto_an_existing_name_is_queue_already_exists(engine, source, name):
    with pytest.raises(QueueAlreadyExists):
        engine.copy_queue(name, source)


def test_copy_of_a_missing_source_is_queue_not_found(engine):
    with pytest.raises(QueueNotFound):
        engine.copy_queue("cp", "missing")
    assert engine.list_queues().queues == []


def test_copy_survives_reopen(open_engine, clock):
    engine = open_engine()
    engine.create_queue("src", {"visibility_timeout": 45})
    engine.create_tag("src", "f", filter={"attributes": {"k": True}})
    engine.copy_queue("cp", "src")
    before = [(t.tag, t.start, t.filter) for t in engine.list_tags("cp")]
    engine.close()
    engine = open_engine()
    assert [(t.tag, t.start, t.filter) for t in engine.list_tags("cp")] == before
    assert engine.get_queue("cp").attributes["visibility_timeout"] == 45
