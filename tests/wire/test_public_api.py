"""``lamina.wire``: its exported names, and that it stands alone (no client, no server)."""

from __future__ import annotations

import subprocess
import sys

import lamina.wire


def test_public_names_change_only_on_purpose() -> None:
    assert sorted(lamina.wire.__all__) == sorted([
        "DEFAULT_MAX_FRAME_BYTES", "DEFAULT_PORT", "PROTOCOL_VERSION", "Answer",
        "AnswerTooLarge", "ClientConnection", "ClientEvent", "ConnectionEnding", "DeliveryFrame",
        "EntriesAnswer", "FrameReader", "Greeting", "LocalProtocolError", "MapAnswer",
        "PeekAnswer", "PeekEntry", "PeekedFrame", "ProtocolViolation", "ReceiveAnswer",
        "RejectedRequest", "Request", "RequestIdsExhausted", "RequestTooLarge", "Response",
        "SendAnswer", "ServerConnection", "ServerEvent", "UnknownRequestId", "auth_signature",
        "verify_auth_signature",
    ])
    assert all(hasattr(lamina.wire, name) for name in lamina.wire.__all__)


def test_importing_the_codec_loads_neither_the_client_nor_the_server() -> None:
    code = ("import sys, lamina.wire, lamina.wire.framing, lamina.wire.splicing, "
            "lamina.wire.answers, lamina.wire.events, lamina.wire.errors, lamina.wire.protocol\n"
            "print(sorted(m for m in sys.modules if m.startswith(('lamina.client', "
            "'lamina.server'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
