"""Permissions per key (DESIGN.md §7): what each operation needs, who may grant, globs,
existence hiding, persistence. ``caller=None`` is an admin (unrestricted)."""

import pytest

from lamina.engine import (
    AccessDenied,
    Grant,
    InvalidArgument,
    QueueNotFound,
)

ALL = ["send", "receive", "peek", "manage", "grant"]
T0 = 1_700_000_000_000


@pytest.fixture
def setup(engine):
    """Admin-made queues: ``q`` (rewind on, redrive to ``dlq``), one message leased."""
    engine.create_queue("dlq")
    engine.create_queue("q", {"rewind": 3600, "redrive": {"dlq": "dlq", "max_receives": 5}})
    engine.create_tag("q", "extra")
    engine.create_queue("plain")  # a copy source without redrive
    sent = engine.send("q", [b"a", b"b", b"c"])
    receipts = [d.receipt for d in engine.receive("q", max=3)]
    return {"ids": [s.id for s in sent], "receipts": receipts}


# op name -> (permission needed, call(engine, setup, caller))
OPERATIONS = {
    "send": ("send", lambda e, s, k: e.send("q", [b"x"], caller=k)),
    "receive": ("receive", lambda e, s, k: e.receive("q", caller=k)),
    "delete": ("receive", lambda e, s, k: e.delete("q", [s["receipts"][0]], caller=k)),
    "change_visibility": ("receive", lambda e, s, k: e.change_visibility(
        "q", [[s["receipts"][1], 5]], caller=k)),
    "dead": ("receive", lambda e, s, k: e.dead("q", [s["receipts"][2]], caller=k)),
    "peek": ("peek", lambda e, s, k: e.peek("q", caller=k)),
    "get_queue": ("peek", lambda e, s, k: e.get_queue("q", caller=k)),
    "list_tags": ("peek", lambda e, s, k: e.list_tags("q", caller=k)),
    "stats": ("peek", lambda e, s, k: e.stats("q", caller=k)),
    "set_queue_attributes": ("manage", lambda e, s, k: e.set_queue_attributes(
        "q", {"visibility_timeout": 9}, caller=k)),
    "create_tag": ("manage", lambda e, s, k: e.create_tag("q", "new", caller=k)),
    "delete_tag": ("manage", lambda e, s, k: e.delete_tag("q", "extra", caller=k)),
    "rewind": ("manage", lambda e, s, k: e.rewind("q", T0, caller=k)),
    "redrive": ("manage", lambda e, s, k: e.redrive("dlq", caller=k)),
    "purge_queue": ("manage", lambda e, s, k: e.purge_queue("q", caller=k)),
    "delete_by_id": ("manage", lambda e, s, k: e.delete_by_id("q", [s["ids"][0]], caller=k)),
    "delete_queue": ("manage", lambda e, s, k: e.delete_queue("q", caller=k)),
    "create_queue": ("manage", lambda e, s, k: e.create_queue("fresh", caller=k)),
    "copy_queue/new": ("manage", lambda e, s, k: e.copy_queue("copy", "plain", caller=k)),
    "copy_queue/source": ("peek", lambda e, s, k: e.copy_queue("copy", "plain", caller=k)),
}


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_operation_is_denied_without_its_permission(engine, setup, name):
    needed, call = OPERATIONS[name]
    engine.grant("*", "k", [p for p in ALL if p != needed])
    with pytest.raises(AccessDenied):
        call(engine, setup, "k")


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_operation_is_allowed_with_its_permission(engine, setup, name):
    needed, call = OPERATIONS[name]
    if name.startswith("copy_queue"):
        engine.grant("*", "k", ["manage", "peek"])
    else:
        engine.grant("*", "k", [needed])
    call(engine, setup, "k")  # raises nothing


def test_admin_may_do_everything(engine, setup):
    for name, (_, call) in OPERATIONS.items():
        if name not in ("delete_queue", "copy_queue/source", "purge_queue"):
            call(engine, setup, None)


def test_permission_is_checked_before_existence(engine):
    with pytest.raises(AccessDenied):
        engine.get_queue("missing", caller="k")
    with pytest.raises(AccessDenied):
        engine.send("missing", [b"x"], caller="k")
    engine.grant("missing", "k", ["peek"])
    with pytest.raises(QueueNotFound):
        engine.get_queue("missing", caller="k")


def test_creator_gets_all_five_on_its_queue(engine):
    engine.grant("team-*", "k", ["manage"])
    engine.create_queue("team-a", caller="k")
    assert Grant("team-a", "k", ALL) in engine.list_grants(key="k")
    engine.send("team-a", [b"x"], caller="k")
    engine.delete("team-a", [engine.receive("team-a", caller="k")[0].receipt], caller="k")
    engine.grant("team-a", "other", ["send"], caller="k")


def test_create_queue_needs_manage_on_a_grant_matching_the_new_name(engine):
    engine.grant("team-*", "k", ["manage"])
    with pytest.raises(AccessDenied):
        engine.create_queue("other-a", caller="k")
    engine.create_queue("TEAM-B", caller="k")  # globs match the lower-cased name


def test_naming_a_dlq_needs_send_on_it(engine):
    engine.create_queue("dlq")
    engine.grant("src", "k", ["manage"])
    with pytest.raises(AccessDenied):
        engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 2}}, caller="k")
    engine.grant("dlq", "k", ["send"])
    engine.create_queue("src", {"redrive": {"dlq": "dlq", "max_receives": 2}}, caller="k")


# -- granting ------------------------------------------------------------------------------

def test_only_admins_grant_on_globs(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ALL)
    with pytest.raises(AccessDenied):
        engine.grant("q*", "other", ["send"], caller="k")
    engine.grant("q*", "other", ["send"])  # admin
    assert engine.list_grants(key="other") == [Grant("q*", "other", ["send"])]


def test_only_admins_grant_the_grant_permission(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ALL)
    with pytest.raises(AccessDenied):
        engine.grant("q", "other", ["grant"], caller="k")
    assert engine.list_grants(key="other") == []


def test_non_admins_grant_only_permissions_they_hold_where_they_hold_grant(engine):
    engine.create_queue("q")
    engine.create_queue("r")
    engine.grant("q", "k", ["send", "grant"])
    engine.grant("r", "k", ["send"])
    engine.grant("q", "other", ["send"], caller="k")
    with pytest.raises(AccessDenied):
        engine.grant("q", "other", ["receive"], caller="k")
    with pytest.raises(AccessDenied):
        engine.grant("r", "other", ["send"], caller="k")  # no "grant" on r
    assert engine.list_grants(key="other") == [Grant("q", "other", ["send"])]


def test_grants_accumulate_and_revoke_removes(engine):
    engine.create_queue("q")
    engine.grant("q", "o", ["send"])
    engine.grant("q", "o", ["peek", "send"])
    assert engine.list_grants(key="o") == [Grant("q", "o", ["send", "peek"])]
    engine.revoke("q", "o", ["send"])
    assert engine.list_grants(key="o") == [Grant("q", "o", ["peek"])]
    engine.revoke("q", "o")
    assert engine.list_grants(key="o") == []
    with pytest.raises(AccessDenied):
        engine.get_queue("q", caller="o")


def test_non_admins_revoke_only_permissions_they_hold(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ["send", "grant"])
    engine.grant("q", "o", ["send", "peek"])
    with pytest.raises(AccessDenied):
        engine.revoke("q", "o", ["peek"], caller="k")
    engine.revoke("q", "o", ["send"], caller="k")
    assert engine.list_grants(key="o") == [Grant("q", "o", ["peek"])]


def test_non_admins_revoke_only_where_they_hold_grant(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ["send"])
    engine.grant("q", "o", ["send"])
    with pytest.raises(AccessDenied):
        engine.revoke("q", "o", ["send"], caller="k")
    with pytest.raises(AccessDenied):
        engine.revoke("q*", "o", ["send"], caller="k")
    assert engine.list_grants(key="o") == [Grant("q", "o", ["send"])]


def test_list_grants_filters_by_queue_and_key(engine):
    engine.grant("a", "k1", ["send"])
    engine.grant("b", "k1", ["peek"])
    engine.grant("a", "k2", ["receive"])
    assert engine.list_grants() == [Grant("a", "k1", ["send"]), Grant("b", "k1", ["peek"]),
                                    Grant("a", "k2", ["receive"])]
    assert engine.list_grants(queue="a") == [Grant("a", "k1", ["send"]),
                                             Grant("a", "k2", ["receive"])]
    assert engine.list_grants(queue="a", key="k2") == [Grant("a", "k2", ["receive"])]


@pytest.mark.parametrize("args, field", [
    (("q", "k", ["write"]), "permissions"),
    (("q", "k", []), "permissions"),
    (("q", "", ["send"]), "key"),
    (("bad name", "k", ["send"]), "queue"),
])
def test_grant_arguments_are_checked(engine, args, field):
    with pytest.raises(InvalidArgument) as caught:
        engine.grant(*args)
    assert caught.value.field == field


# -- visibility, globs, lifetime -----------------------------------------------------------

def test_list_queues_shows_only_queues_the_key_may_peek(engine):
    for name in ["alpha", "Beta", "gamma", "delta"]:
        engine.create_queue(name)
    engine.grant("alpha", "k", ["peek"])
    engine.grant("beta", "k", ["send"])
    engine.grant("g*", "k", ["peek", "send"])
    assert engine.list_queues(caller="k").queues == ["alpha", "gamma"]
    assert engine.list_queues().queues == ["alpha", "Beta", "delta", "gamma"]


def test_globs_match_the_lower_cased_name(engine):
    engine.create_queue("Orders-EU")
    engine.grant("orders-*", "k", ["peek"])
    engine.grant("ORDERS-E?", "j", ["peek"])
    assert engine.get_queue("Orders-EU", caller="k").queue == "Orders-EU"
    assert engine.get_queue("orders-eu", caller="j").queue == "Orders-EU"
    with pytest.raises(AccessDenied):
        engine.get_queue("Orders-EU", caller="nobody")


def test_exact_grants_match_ignoring_case(engine):
    engine.create_queue("Orders")
    engine.grant("ORDERS", "k", ["peek"])
    assert engine.get_queue("orders", caller="k").queue == "Orders"


def test_delete_queue_drops_grants_on_its_exact_name_only(engine):
    engine.create_queue("q")
    engine.grant("q", "o", ["send"])
    engine.grant("q*", "o", ["peek"])
    engine.delete_queue("q")
    assert engine.list_grants(key="o") == [Grant("q*", "o", ["peek"])]
    engine.create_queue("q")
    with pytest.raises(AccessDenied):
        engine.send("q", [b"x"], caller="o")
    engine.get_queue("q", caller="o")


def test_grants_survive_reopen(open_engine):
    engine = open_engine()
    engine.create_queue("q")
    engine.grant("q", "k", ["send", "peek"])
    engine.grant("x*", "j", ["manage"])
    engine.close()
    engine = open_engine()
    assert engine.list_grants() == [Grant("x*", "j", ["manage"]),
                                    Grant("q", "k", ["send", "peek"])]
    engine.send("q", [b"x"], caller="k")
    with pytest.raises(AccessDenied):
        engine.receive("q", caller="k")


def test_copy_queue_needs_manage_on_the_new_name_not_the_source(engine):
    engine.create_queue("src")
    engine.grant("src", "k", ["manage", "peek"])
    with pytest.raises(AccessDenied):
        engine.copy_queue("dst", "src", caller="k")
    engine.grant("dst", "k", ["manage"])
    engine.copy_queue("dst", "src", caller="k")
    assert Grant("dst", "k", ALL) in engine.list_grants(key="k")  # the creator's five


def test_list_grants_on_a_queue_needs_grant_there(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ["send", "peek"])
    engine.grant("q", "o", ["send"])
    with pytest.raises(AccessDenied):
        engine.list_grants(queue="q", caller="k")
    engine.grant("q", "k", ["grant"])
    assert [g.key for g in engine.list_grants(queue="q", caller="k")] == ["k", "o"]


def test_a_non_admin_listing_another_keys_grants_is_denied(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ["send"])
    engine.grant("q", "other", ["peek"])
    with pytest.raises(AccessDenied) as denied:
        engine.list_grants(key="other", caller="k")
    assert denied.value.field == "key"
    assert engine.list_grants(key="k", caller="k") == [Grant("q", "k", ["send"])]
    assert engine.list_grants(caller="k") == [Grant("q", "k", ["send"])]


def test_a_non_admin_with_grant_on_a_queue_lists_another_keys_grants_there(engine):
    engine.create_queue("q")
    engine.grant("q", "k", ["send", "grant"])
    engine.grant("q", "other", ["peek"])
    assert engine.list_grants("q", key="other", caller="k") == [Grant("q", "other", ["peek"])]
