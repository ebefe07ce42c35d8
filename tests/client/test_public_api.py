"""``lamina.client`` is the client's one public import path; the old paths warn and alias it."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import lamina.client
from lamina.client import errors
from lamina.engine.errors import LaminaError


def test_public_names_change_only_on_purpose() -> None:
    assert sorted(lamina.client.__all__) == sorted([
        "DEFAULT_PORT", "AsyncClient", "Client", "message",
        "AsyncLeaseKeeper", "LeaseKeeper",
        "Delivery", "Grant", "PeekPage", "Peeked", "QueueInfo", "QueuePage", "Redriven",
        "Rewound", "Sent", "ServerInfo", "TagInfo", "VisibilityChanged",
        "ConnectFailed", "ConnectTimeout", "ConnectionClosed", "ConnectionLost",
        "LaminaConnectionError", "ServerProtocolViolation",
        "AccessDenied", "InternalError", "InvalidArgument", "InvalidQueueName", "InvalidReceipt",
        "InvalidRedrivePolicy", "LaminaError", "MessageNotFound", "MessageTooLarge",
        "NoDeadLetterQueue", "ProtocolError", "QueueAlreadyExists", "QueueFull",
        "QueueNotFound", "RewindDisabled", "RewindOutOfRange", "StaleReceipt",
        "TagAlreadyExists", "TagNotFound", "TooManyQueues", "TooManyTags", "Unauthorized",
        "Unavailable", "UnknownOperation",
    ])
    assert all(hasattr(lamina.client, name) for name in lamina.client.__all__)


def test_connection_errors_are_one_subtree_of_the_one_error_tree() -> None:
    for name in errors.__all__:
        kind = getattr(errors, name)
        assert issubclass(kind, errors.LaminaConnectionError)
        assert issubclass(kind, LaminaError) and issubclass(kind, ConnectionError)
        assert kind.code == "ConnectionError"
    assert issubclass(errors.ConnectTimeout, errors.ConnectFailed)


@pytest.mark.parametrize("old, new", [
    ("lamina.server.client", "lamina.client"),
    ("lamina.server.operations", "lamina.client.operations"),
    ("lamina.server.lease", "lamina.client.lease"),
    ("lamina.server.protocol", "lamina.wire.protocol"),
    ("lamina.server.framing", "lamina.wire.framing"),
])
def test_old_import_paths_warn_and_alias_the_new_objects(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
               for w in caught)
    current = importlib.import_module(new)
    for name in current.__all__:
        assert getattr(alias, name) is getattr(current, name), name


def test_old_framing_path_still_has_the_splicing_encoders_and_the_head_encoder() -> None:
    from lamina.engine.records import cbor_head
    from lamina.wire import splicing

    sys.modules.pop("lamina.server.framing", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        alias = importlib.import_module("lamina.server.framing")
    assert alias.encode_head is cbor_head
    for name in splicing.__all__:
        assert getattr(alias, name) is getattr(splicing, name), name
