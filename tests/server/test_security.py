"""Security over the wire (PROTOCOL.md §3, DESIGN.md §7): the auth handshake and its rules,
permissions per key, key reloads, TLS, and refusing to expose an unprotected server."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import cbor2
import pytest
import trio

from lamina.engine.errors import AccessDenied, Unauthorized
from lamina.engine.results import Grant
from lamina.client import AsyncClient, Client, LaminaConnectionError
from lamina.server.config import ConfigError, ServerConfig
from lamina.server.keyring import KeyFileError, load_keys
from lamina.wire.protocol import auth_signature
from tests.support.servers import ADMIN, ALICE, BOB, KEYS, Certificates, RawConnection, running_server


def frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


def signed(connection: RawConnection, key_id: str, secret: str) -> dict[str, Any]:
    return {"key": key_id, "signature": auth_signature(secret, connection.greeting.nonce, key_id)}


async def test_good_auth_then_requests(tmp_path: Path) -> None:
    async with running_server(tmp_path, keys=KEYS) as server:
        connection = await RawConnection.open(server.port)
        assert connection.greeting.auth_required
        answer = await connection.call("auth", signed(connection, "alice", ALICE.secret))
        assert answer.result == {"key": "alice"}
        assert (await connection.call("ping")).error is None
        second = await connection.call("auth", signed(connection, "alice", ALICE.secret))
        assert second.error["code"] == "InvalidArgument"


@pytest.mark.parametrize("key_id, secret", [("alice", "wrong"), ("nobody", "whatever")])
async def test_failed_auth_closes_with_one_message(tmp_path: Path, key_id: str,
                                                   secret: str) -> None:
    async with running_server(tmp_path, keys=KEYS) as server:
        connection = await RawConnection.open(server.port)
        answer = await connection.call("auth", signed(connection, key_id, secret))
        assert answer.error == {"code": "Unauthorized", "message": "authentication failed"}
        with trio.fail_after(2):
            await connection.wait_closed()


async def test_pre_auth_rules(tmp_path: Path) -> None:
    async with running_server(tmp_path, keys=KEYS) as server:
        connection = await RawConnection.open(server.port)
        # Other ops are refused but the connection stays; pipelined requests wait their turn
        # (one at a time) and the ones after a successful auth run normally.
        nonce = connection.greeting.nonce
        await connection.send_bytes(
            frame([1, "ping", {}])
            + frame([2, "auth", {"key": "admin",
                                 "signature": auth_signature(ADMIN.secret, nonce, "admin")}])
            + frame([3, "create_queue", {"queue": "q"}]))
        first, second, third = [await connection.next_event() for _ in range(3)]
        assert first.error["code"] == "Unauthorized"
        assert second.result == {"key": "admin"}
        assert third.error is None and third.result["queue"] == "q"
        malformed = await RawConnection.open(server.port)
        wrong_type = await malformed.call("auth", {"key": 5, "signature": b""})
        assert wrong_type.error["code"] == "InvalidArgument"
        extra = await malformed.call("auth", {"key": "a", "signature": b"", "x": 1})
        assert extra.error["code"] == "InvalidArgument" and "x" in extra.error["message"]


async def test_before_auth_any_other_op_is_unauthorized_whatever_its_arguments_carry(
        tmp_path: Path) -> None:
    # PROTOCOL §3: before auth, any op but auth is Unauthorized, arguments a request may not
    # carry (a tag, NaN) included, as an unknown argument is; auth itself names its field.
    async with running_server(tmp_path, keys=KEYS) as server:
        connection = await RawConnection.open(server.port)
        for args in ({"x": 1}, {"x": cbor2.CBORTag(1, 5)},
                     {"queue": "q", "messages": [b"m"], "x": float("nan")}):
            answer = await connection.call("send", args)
            assert answer.error["code"] == "Unauthorized", (args, answer.error)
        tagged = await connection.call("auth", {"key": "admin", "signature": cbor2.CBORTag(2, b"")})
        assert tagged.error["code"] == "InvalidArgument"
        assert tagged.error["message"].startswith("signature")


async def test_pre_auth_frames_over_4_kib_are_protocol_errors(tmp_path: Path) -> None:
    async with running_server(tmp_path, keys=KEYS) as server:
        connection = await RawConnection.open(server.port)
        await connection.send_bytes(frame([1, "auth", {"key": "a" * 5000, "signature": b""}]))
        event = await connection.next_event()
        assert event.id == 0 and event.error["code"] == "ProtocolError"
        await connection.wait_closed()
        # After auth, big frames are fine.
        connection = await RawConnection.open(server.port)
        await connection.call("auth", signed(connection, "admin", ADMIN.secret))
        await connection.call("create_queue", {"queue": "q"})
        big = await connection.call("send", {"queue": "q", "messages": [b"x" * 10000]})
        assert big.error is None


async def test_auth_deadline_closes_the_connection(tmp_path: Path) -> None:
    async with running_server(tmp_path, keys=KEYS, auth_timeout_s=0.3) as server:
        connection = await RawConnection.open(server.port)
        started = trio.current_time()
        assert (await connection.call("ping")).error["code"] == "Unauthorized"
        with trio.fail_after(3):
            await connection.wait_closed()
        assert trio.current_time() - started >= 0.25
        late = await RawConnection.open(server.port)
        await late.call("auth", signed(late, "bob", BOB.secret))
        await trio.sleep(0.5)
        assert (await late.call("ping")).error is None  # authenticated: no deadline


async def test_permissions_over_the_wire(tmp_path: Path) -> None:
    async with running_server(tmp_path, keys=KEYS) as server:
        port = server.port
        async with AsyncClient.connect("127.0.0.1", port, key="admin",
                                       secret=ADMIN.secret) as admin, \
                AsyncClient.connect("127.0.0.1", port, key="alice",
                                    secret=ALICE.secret) as alice, \
                AsyncClient.connect("127.0.0.1", port, key="bob", secret=BOB.secret) as bob:
            await admin.create_queue("orders")
            with pytest.raises(AccessDenied):
                await alice.send("orders", [b"x"])
            with pytest.raises(AccessDenied):  # permission before existence
                await alice.get_queue("no-such-queue")
            assert (await alice.list_queues()).queues == []
            assert (await alice.ping()) > 0 and (await alice.server_info()).queues == 1
            await admin.grant("orders", "alice", ["send", "peek", "grant"])
            await alice.send("orders", [b"x"])
            assert (await alice.list_queues()).queues == ["orders"]
            with pytest.raises(AccessDenied):
                await alice.receive("orders")
            with pytest.raises(AccessDenied):  # only admins grant "grant" or on globs
                await alice.grant("orders", "bob", ["grant"])
            await alice.grant("orders", "bob", ["peek"])
            assert await bob.list_grants() == [Grant("orders", "bob", ["peek"])]
            with pytest.raises(AccessDenied):
                await alice.grant("orders", "bob", ["receive"])  # alice lacks it
            await admin.revoke("orders", "alice", ["send"])
            with pytest.raises(AccessDenied):
                await alice.send("orders", [b"y"])
            await admin.grant("own-*", "bob", ["manage"])
            created = await bob.create_queue("own-1")  # the creator gets all five
            assert created.queue == "own-1"
            await bob.send("own-1", [b"mine"])
            assert len(await bob.receive("own-1")) == 1


async def test_sighup_reload_adds_and_removes_keys(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[keys.root]\nsecret = "s1"\nadmin = true\n'
                         '[keys.temp]\nsecret = "s2"\n')
    async with running_server(tmp_path / "data", keys_file=keys_file) as server:
        async with AsyncClient.connect("127.0.0.1", server.port, key="temp",
                                       secret="s2") as temp:
            assert await temp.ping() > 0
            keys_file.write_text('[keys.root]\nsecret = "s1"\nadmin = true\n'
                                 '[keys.new]\nsecret = "s3"\n')
            server.reload_keys()
            with pytest.raises(Unauthorized):
                await temp.ping()  # removed keys stop working on open connections too
        async with AsyncClient.connect("127.0.0.1", server.port, key="new", secret="s3") as new:
            assert await new.ping() > 0
        keys_file.write_text("not = [valid")
        server.reload_keys()  # a broken file keeps the keys in force
        async with AsyncClient.connect("127.0.0.1", server.port, key="new", secret="s3") as new:
            assert await new.ping() > 0


async def test_tls(tmp_path: Path, certificates: Certificates) -> None:
    async with running_server(tmp_path, tls_cert=certificates.cert,
                              tls_key=certificates.key) as server:
        async with AsyncClient.connect("127.0.0.1", server.port,
                                       tls=certificates.client_context) as client:
            await client.create_queue("secure")
            await client.send("secure", [b"over tls"])

        def blocking_client() -> None:
            with Client.connect("127.0.0.1", server.port,
                                tls=certificates.client_context) as sync:
                assert [d.body for d in sync.receive("secure")] == [b"over tls"]
            with Client.connect("127.0.0.1", server.port, tls=certificates.client_context,
                                busy_poll_us=300) as polling:  # polls through TLS too
                polling.send("secure", [b"polled"])
                assert polling.receive("secure", max=1, wait=0.2)[0].body == b"polled"
                assert polling.receive("secure", max=1, wait=0.2) == []
            with pytest.raises(LaminaConnectionError):  # an untrusted certificate
                Client.connect("127.0.0.1", server.port, tls=True, timeout=5)
            with pytest.raises(LaminaConnectionError):  # plain TCP to a TLS port
                Client.connect("127.0.0.1", server.port, timeout=1)

        await trio.to_thread.run_sync(blocking_client)


def test_client_without_credentials_to_an_auth_server(start_server: Any) -> None:
    server = start_server(keys=KEYS)
    with pytest.raises(Unauthorized):
        Client.connect("127.0.0.1", server.port)
    with pytest.raises(Unauthorized):
        Client.connect("127.0.0.1", server.port, key="alice", secret="bad")
    with Client.connect("127.0.0.1", server.port, key="alice", secret=ALICE.secret) as client:
        assert client.ping() > 0


def test_refuses_to_expose_an_unprotected_server(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="non-loopback"):
        ServerConfig(data=tmp_path, host="0.0.0.0").check()
    with pytest.raises(ConfigError, match="non-loopback"):
        ServerConfig(data=tmp_path, host="0.0.0.0", keys=tmp_path / "k").check()
    ServerConfig(data=tmp_path, host="0.0.0.0", insecure=True).check()
    ServerConfig(data=tmp_path, host="0.0.0.0", keys=tmp_path / "k",
                 tls_cert=tmp_path / "c", tls_key=tmp_path / "k").check()
    ServerConfig(data=tmp_path, host="::1").check()
    ServerConfig(data=tmp_path, host="localhost").check()
    from lamina.tools.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--host", "0.0.0.0", "--data", str(tmp_path)])
    assert exit_info.value.code == 2


def test_keys_file_format(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('[keys.a]\nsecret = "x"\nadmin = true\n[keys.b]\nsecret = "y"\n')
    ring = load_keys(path)
    assert ring.get("a").admin and not ring.get("b").admin and len(ring) == 2
    for text, problem in [('[keys.a]\nadmin = true\n', "secret"),
                          ('[keys.a]\nsecret = "x"\nadmin = "yes"\n', "admin"),
                          ('[keys.a]\nsecret = "x"\nrole = 1\n', "role"),
                          ('[other]\n', "other"),
                          ('not toml [', "TOML")]:
        path.write_text(text)
        with pytest.raises(KeyFileError, match=problem):
            load_keys(path)
    with pytest.raises(KeyFileError):
        load_keys(tmp_path / "missing.toml")


@pytest.mark.slow
def test_sighup_rereads_the_keys_file_of_a_running_server(tmp_path: Path,
                                                          spawned: Any) -> None:
    import signal
    import time
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[keys.first]\nsecret = "one"\nadmin = true\n')
    process = spawned("--keys", str(keys_file))
    with Client.connect("127.0.0.1", process.port, key="first", secret="one") as client:
        client.create_queue("q")
    keys_file.write_text('[keys.second]\nsecret = "two"\nadmin = true\n')
    process.signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while "reload" not in process.events() and time.monotonic() < deadline:
        time.sleep(0.05)
    with Client.connect("127.0.0.1", process.port, key="second", secret="two") as client:
        assert client.list_queues().queues == ["q"]
    with pytest.raises(Unauthorized):
        Client.connect("127.0.0.1", process.port, key="first", secret="one")
    process.signal(signal.SIGTERM)
    assert process.wait() == 0
