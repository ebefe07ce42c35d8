"""The client commands of ``lamina`` (tools/commands.py) against a real server over loopback:
tables for people, JSON for scripts, clear errors and exit codes."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lamina.client import Client
from lamina.tools.cmdvalues import parse_server, parse_time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- queue ----------------------------------------------------------------------------------------


def test_queue_create_info_set_list_purge_delete(server: Any, lamina: Any) -> None:
    ran = lamina(server, "queue", "create", "orders", "visibility_timeout=60", "rewind=3600")
    assert ran.code == 0 and "created queue orders" in ran.out
    assert "visibility_timeout" in ran.out and "60" in ran.out

    info = lamina(server, "queue", "info", "orders", "--json").json()
    assert info["queue"] == "orders"
    assert info["attributes"]["visibility_timeout"] == 60
    assert info["stats"]["messages"] == 0

    ran = lamina(server, "queue", "set", "orders", "polling_wait=5", "--json")
    assert ran.code == 0 and ran.json()["attributes"]["polling_wait"] == 5

    lamina(server, "queue", "create", "other")
    lines = lamina(server, "queue", "list", "--json").lines()
    assert lines == [{"queue": "orders"}, {"queue": "other"}]
    table = lamina(server, "queue", "list", "--prefix", "ord").out
    assert "orders" in table and "other" not in table

    lamina(server, "send", "orders", "a", "b", "c")
    ran = lamina(server, "queue", "purge", "orders")
    assert ran.code == 0 and "purged 3 messages" in ran.out

    assert lamina(server, "queue", "delete", "orders").code == 0
    ran = lamina(server, "queue", "info", "orders")
    assert ran.code == 1
    assert "QueueNotFound" in ran.err and ran.out == ""


def test_queue_set_reads_json_values_and_redrive_policy(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "dead")
    lamina(server, "queue", "create", "work")
    ran = lamina(server, "queue", "set", "work", 'redrive={"dlq": "dead", "max_receives": 3}',
                 "--json")
    assert ran.json()["attributes"]["redrive"] == {"dlq": "dead", "max_receives": 3}
    ran = lamina(server, "queue", "set", "work", "visibility_timeout=forever")
    assert ran.code == 1 and "InvalidArgument" in ran.err


# --- send, receive, peek ----------------------------------------------------------------------------


def test_send_then_receive_with_delete(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "send", "q", "hello", "world", "--priority", "2", "--attribute",
                 "color=red", "--attribute", "size=3", "--json")
    sent = ran.lines()
    assert ran.code == 0 and len(sent) == 2 and all("id" in line for line in sent)

    received = lamina(server, "receive", "q", "--max", "5", "--delete", "--json").lines()
    assert [m["body"] for m in received] == ["hello", "world"]
    assert [m["id"] for m in received] == [line["id"] for line in sent]
    first = received[0]
    assert first["attributes"] == {"color": "red", "size": 3}
    assert first["priority"] == 2 and first["dequeue_count"] == 1 and first["deleted"]
    assert set(first["receipt"]) == {"$base64"}

    empty = lamina(server, "receive", "q", "--wait", "0")
    assert empty.code == 0 and "0 messages" in empty.out


def test_receive_table_leaves_messages_leased(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    lamina(server, "send", "q", "one")
    ran = lamina(server, "receive", "q")
    assert ran.code == 0 and "one" in ran.out and "1 message leased" in ran.out
    peeked = lamina(server, "peek", "q", "--start", "0", "--json").json()
    assert [m["state"] for m in peeked["messages"]] == ["inflight"]


def test_send_reads_bodies_from_stdin_lines(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "send", "q", "first", "-", stdin="line one\nline two\n")
    assert ran.code == 0 and "sent 3 messages" in ran.out
    bodies = [m["body"] for m in lamina(server, "receive", "q", "--max", "10", "--json").lines()]
    assert bodies == ["first", "line one", "line two"]


def test_binary_bodies_travel_as_base64(server: Any, lamina: Any) -> None:
    payload = bytes(range(256))
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "send", "q", base64.b64encode(payload).decode(), "--base64")
    assert ran.code == 0
    message = lamina(server, "receive", "q", "--json").lines()[0]
    assert base64.b64decode(message["body"]["$base64"]) == payload
    assert lamina(server, "send", "q", "not base64!", "--base64").code == 2


def test_send_delay_and_topic(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    lamina(server, "send", "q", "later", "--delay", "60", "--topic", "t1")
    page = lamina(server, "peek", "q", "--start", "0", "--json").json()
    assert page["messages"][0]["state"] == "delayed"
    assert page["messages"][0]["topic"] == "t1"
    assert lamina(server, "receive", "q", "--json").lines() == []


def test_send_entry_errors_exit_1_and_name_the_entry(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "send", "q", "x", "--priority", "99")
    assert ran.code == 1 and "message 0: InvalidArgument" in ran.err
    assert lamina(server, "send", "q").code == 2  # nothing to send


def test_peek_pages_and_ids(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ids = [line["id"] for line in lamina(server, "send", "q", *"abcde", "--json").lines()]
    page = lamina(server, "peek", "q", "--start", "0", "--max", "2", "--json").json()
    assert [m["id"] for m in page["messages"]] == ids[:2] and page["next"] is not None
    rest = lamina(server, "peek", "q", "--start", "0", "--after", str(page["next"]), "--max",
                  "10", "--json").json()
    assert [m["id"] for m in rest["messages"]] == ids[2:]
    table = lamina(server, "peek", "q", "--max", "3")
    assert table.code == 0 and "active" in table.out
    ran = lamina(server, "peek", "q", "--ids", ids[0], "0000000900000000000000000")
    assert ran.code == 1 and "MessageNotFound" in ran.err and ids[0] in ran.out


def test_peek_shows_the_dequeues_of_a_message_received_once_then_deleted(
        server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q", "rewind=60")  # deleted messages stay retained
    lamina(server, "send", "q", "first", "second")
    lamina(server, "receive", "q", "--delete")
    peeked = lamina(server, "peek", "q", "--start", "0", "--json").json()["messages"]
    assert [(m["state"], m["dequeue_count"]) for m in peeked] == [("deleted", 1), ("active", 0)]
    table = lamina(server, "peek", "q", "--start", "0")
    deleted_row = next(line for line in table.out.splitlines() if "deleted" in line)
    assert " 1 " in deleted_row


# --- tags, rewind, redrive, stats ------------------------------------------------------------------


def test_tags_create_list_receive_delete(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    lamina(server, "send", "q", "plain")
    lamina(server, "send", "q", "red one", "--attribute", "color=red")
    ran = lamina(server, "tag", "create", "q", "audit", "--start", "oldest", "--filter",
                 "color=red")
    assert ran.code == 0 and "created tag audit" in ran.out and "oldest" in ran.out
    tags = {t["tag"]: t for t in lamina(server, "tag", "list", "q", "--json").lines()}
    assert set(tags) == {"audit", "default"}
    assert tags["audit"]["filter"]["attributes"] == {"color": "red"}
    assert "audit" in lamina(server, "tag", "list", "q").out
    got = lamina(server, "receive", "q", "--tag", "audit", "--max", "10", "--json").lines()
    assert [m["body"] for m in got] == ["red one"]
    assert lamina(server, "tag", "delete", "q", "audit").code == 0
    assert lamina(server, "tag", "delete", "q", "audit").code == 1


def test_rewind_delivers_again(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q", "rewind=3600")
    lamina(server, "send", "q", "again")
    assert len(lamina(server, "receive", "q", "--delete", "--json").lines()) == 1
    ran = lamina(server, "rewind", "q", "10m")
    assert ran.code == 0 and "default" in ran.out
    again = lamina(server, "receive", "q", "--json").lines()
    assert [m["body"] for m in again] == ["again"]
    assert lamina(server, "rewind", "q", "2d").code == 1  # RewindOutOfRange


def test_redrive_moves_dead_letters_back(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "dead")
    lamina(server, "queue", "create", "work", 'redrive={"dlq": "dead", "max_receives": 5}')
    lamina(server, "send", "work", "poison")
    with Client.connect("127.0.0.1", server.port) as client:
        assert client.dead("work", client.receive("work")) == [None]
    dry = lamina(server, "redrive", "dead", "--dry-run", "--json").json()
    assert dry["moved"] == 1 and dry["dry_run"]
    ran = lamina(server, "redrive", "dead", "--source", "work")
    assert ran.code == 0 and "moved 1" in ran.out
    assert [m["body"] for m in lamina(server, "receive", "work", "--json").lines()] == ["poison"]


def test_stats_of_a_queue_and_of_the_server(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    lamina(server, "send", "q", "a", "b")
    days = lamina(server, "stats", "q", "--json").lines()
    assert days and days[0]["sent"] == 2
    assert "sent" in lamina(server, "stats", "q").out
    info = lamina(server, "stats", "--json").json()
    assert info["queues"] == 1 and info["connections"] >= 1
    assert "version" in lamina(server, "stats").out


# --- errors, auth, TLS -------------------------------------------------------------------------------


def test_connection_refused_exits_2(lamina: Any) -> None:
    ran = lamina(None, "queue", "list", "--server", f"127.0.0.1:{free_port()}")
    assert ran.code == 2 and "connection error" in ran.err and "cannot connect" in ran.err


def test_missing_ca_file_is_a_connection_error(server: Any, lamina: Any, tmp_path: Path) -> None:
    ran = lamina(server, "queue", "list", "--ca", str(tmp_path / "missing.pem"))
    assert ran.code == 2 and "missing.pem" in ran.err


def test_bad_command_lines_exit_2(server: Any, lamina: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        lamina(server, "rewind", "q", "yesterday-ish")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        lamina(server, "queue", "create", "q", "no-equals-sign")


def test_auth_from_options_and_environment(auth_server: Any, lamina: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ran = lamina(auth_server, "queue", "list")
    assert ran.code == 1 and "Unauthorized" in ran.err
    ran = lamina(auth_server, "queue", "create", "q", "--key", "admin", "--secret",
                 "admin-secret")
    assert ran.code == 0
    monkeypatch.setenv("LAMINA_KEY", "admin")
    monkeypatch.setenv("LAMINA_SECRET", "admin-secret")
    assert lamina(auth_server, "queue", "list", "--json").lines() == [{"queue": "q"}]
    monkeypatch.setenv("LAMINA_KEY", "alice")
    monkeypatch.setenv("LAMINA_SECRET", "alice-secret")
    ran = lamina(auth_server, "send", "q", "x")
    assert ran.code == 1 and "AccessDenied" in ran.err


def test_tls_with_a_ca_file(tmp_path: Path, lamina: Any) -> None:
    trustme = pytest.importorskip("trustme")
    from tests.support.servers import server_thread
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    with server_thread(tmp_path / "data", tls_cert=cert, tls_key=key) as tls_server:
        ran = lamina(tls_server, "queue", "create", "q", "--ca", str(ca_file))
        assert ran.code == 0, ran.err
        ran = lamina(tls_server, "queue", "list", "--tls")  # the system CAs do not know ours
        assert ran.code == 2 and "connection error" in ran.err
        ran = lamina(tls_server, "queue", "list", "--timeout", "1")  # plain text against TLS
        assert ran.code == 2 and "connection error" in ran.err


# --- values ----------------------------------------------------------------------------------------


def test_server_addresses() -> None:
    assert parse_server("example:9000") == ("example", 9000)
    assert parse_server("example") == ("example", 7766)
    assert parse_server(":9000") == ("127.0.0.1", 9000)
    assert parse_server("[::1]:9000") == ("::1", 9000)


def test_times() -> None:
    assert parse_time("1700000000000").ms == 1_700_000_000_000
    assert parse_time("15m").ago_ms == 900_000
    assert parse_time("500ms").ago_ms == 500
    assert parse_time("2026-01-01T00:00:00Z").ms == 1_767_225_600_000
    assert parse_time("2026-01-01T01:00:00+01:00").ms == 1_767_225_600_000
    assert parse_time("oldest", words=("oldest", "now")).word == "oldest"


# --- a real process ------------------------------------------------------------------------------------


def _lamina_process(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lamina.tools.cli", *argv], input=stdin,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_lamina_as_a_subprocess(server: Any) -> None:
    address = f"127.0.0.1:{server.port}"
    assert _lamina_process("queue", "create", "jobs", "--server", address).returncode == 0
    sent = _lamina_process("send", "jobs", "-", "--server", address, "--json",
                           stdin="build\ntest\n")
    assert sent.returncode == 0 and len(sent.stdout.splitlines()) == 2
    got = _lamina_process("receive", "jobs", "--max", "10", "--delete", "--server", address)
    assert got.returncode == 0
    assert "build" in got.stdout and "test" in got.stdout and "2 messages deleted" in got.stdout
    refused = _lamina_process("queue", "list", "--server", f"127.0.0.1:{free_port()}")
    assert refused.returncode == 2 and "connection error" in refused.stderr


def test_help_lists_every_client_command() -> None:
    shown = _lamina_process("--help").stdout
    for command in ("queue", "tag", "send", "receive", "peek", "rewind", "redrive", "stats",
                    "bench"):
        assert command in shown


def test_queue_attributes_in_dotted_form_set_the_redrive_policy_as_the_help_says(
        server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "errors")
    ran = lamina(server, "queue", "create", "work", "visibility_timeout=60", "redrive.dlq=errors",
                 "redrive.max_receives=5", "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["attributes"]["redrive"] == {"dlq": "errors", "max_receives": 5}
    ran = lamina(server, "queue", "set", "work", "redrive.dlq=errors",
                 "redrive.max_receives=2", "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["attributes"]["redrive"] == {"dlq": "errors", "max_receives": 2}


def test_a_dotted_queue_attribute_beside_its_whole_value_is_a_usage_error(
        server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "errors")
    ran = lamina(server, "queue", "create", "work", "redrive=null", "redrive.dlq=errors")
    assert ran.code == 2 and "redrive" in ran.err
    assert lamina(server, "queue", "info", "work").code == 1  # nothing was created


@pytest.mark.parametrize("argv", [["receive", "q", "--max", "0"], ["receive", "q", "--max", "-3"],
                                  ["queue", "list", "--limit", "0"],
                                  ["queue", "list", "--limit", "-1"]])
def test_a_count_below_one_is_refused_not_taken_for_none_or_all(server: Any, lamina: Any,
                                                                argv: list[str]) -> None:
    lamina(server, "queue", "create", "q")
    with pytest.raises(SystemExit) as exc:
        lamina(server, *argv)
    assert exc.value.code == 2


def test_bodies_and_attributes_may_follow_options(server: Any, lamina: Any) -> None:
    ran = lamina(None, "queue", "create", "--server", f"127.0.0.1:{server.port}", "q",
                 "visibility_timeout=60", "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["attributes"]["visibility_timeout"] == 60
    ran = lamina(server, "send", "q", "--priority", "1", "urgent", "--topic", "t", "now")
    assert ran.code == 1 and "not both" in ran.err  # both bodies sent, both refused
    ran = lamina(server, "send", "q", "--priority", "1", "urgent", "--delay", "0", "now")
    assert ran.code == 0, ran.err
    received = lamina(server, "receive", "q", "--max", "5", "--json").lines()
    assert [(m["body"], m["priority"]) for m in received] == [("urgent", 1), ("now", 1)]


def test_send_cuts_its_requests_by_encoded_bytes_not_characters(tmp_path: Path,
                                                                lamina: Any) -> None:
    """1000 bodies of 1000 three-byte characters: 10^6 characters, 3 MB, over a 2 MiB frame."""
    from tests.support.servers import server_thread
    with server_thread(tmp_path / "data", max_frame=2 * 1024 * 1024) as small:
        lamina(small, "queue", "create", "q")
        ran = lamina(small, "send", "q", "-", "--json", stdin=("€" * 1000 + "\n") * 1000)
        assert ran.code == 0, ran.err
        assert len(ran.lines()) == 1000


def test_tag_match_without_a_filter_is_refused_not_ignored(server: Any, lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "tag", "create", "q", "t", "--match", "any")
    assert ran.code == 2 and "--match goes with --filter" in ran.err
    assert [t["tag"] for t in lamina(server, "tag", "list", "q", "--json").lines()] == [
        "default"]


def test_a_filter_attribute_given_twice_is_refused_not_overwritten(server: Any,
                                                                   lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "tag", "create", "q", "t", "--filter", "color=red", "--filter",
                 "color=blue", "--match", "any")
    assert ran.code == 2 and "color" in ran.err
    ran = lamina(server, "tag", "create", "q", "t", "--filter", "a.b=1", "--json")
    assert ran.code == 0 and ran.json()["filter"]["attributes"] == {"a.b": 1}


def test_a_message_attribute_given_twice_is_refused_not_overwritten(server: Any,
                                                                    lamina: Any) -> None:
    lamina(server, "queue", "create", "q")
    ran = lamina(server, "send", "q", "x", "--attribute", "n=1", "--attribute", "n=2")
    assert ran.code == 2 and "--attribute: given more than once: n" in ran.err
    assert lamina(server, "receive", "q", "--json").lines() == []


def test_demo_runs_and_on_a_directory_in_use_says_so_without_a_traceback(
        tmp_path: Path, lamina: Any) -> None:
    from lamina.engine import Engine
    ran = lamina(None, "demo", "--data", str(tmp_path / "demo"))
    assert ran.code == 0 and "sent 3 messages" in ran.out
    with Engine.open(tmp_path / "busy"):  # as a `lamina serve` on the default directory
        ran = lamina(None, "demo", "--data", str(tmp_path / "busy"))
    assert ran.code == 1 and ran.out == ""
    assert ran.err.startswith("lamina demo: ") and "in use" in ran.err
    assert len(ran.err.splitlines()) == 1


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "soon"])
def test_a_connect_timeout_that_is_not_a_positive_number_of_seconds_is_a_usage_error(
        server: Any, lamina: Any, timeout: str) -> None:
    with pytest.raises(SystemExit) as exc:
        lamina(server, "queue", "list", "--timeout", timeout)
    assert exc.value.code == 2


def test_bodies_that_look_like_markup_print_as_they_are(server: Any, lamina: Any) -> None:
    """Before, a body such as ``[/foo]`` crashed the table after the messages were deleted."""
    lamina(server, "queue", "create", "q")
    lamina(server, "send", "q", "[/foo]", "[bold]x[/bold]")
    ran = lamina(server, "peek", "q", "--max", "5")
    assert ran.code == 0 and "[/foo]" in ran.out and "[bold]x[/bold]" in ran.out
    ran = lamina(server, "receive", "q", "--max", "5", "--delete")
    assert ran.code == 0 and "[/foo]" in ran.out and "[bold]x[/bold]" in ran.out


def test_inspect_tables_print_filters_that_look_like_markup_as_they_are(
        tmp_path: Path, lamina: Any) -> None:
    from lamina.engine import Engine
    with Engine.open(tmp_path / "data") as engine:
        engine.create_queue("q")
        engine.create_tag("q", "t", filter={"attributes": {"a": "[/x]"}, "match": "all"})
    ran = lamina(None, "inspect", str(tmp_path / "data"), "tags", "q")
    assert ran.code == 0 and '"[/x]"' in ran.out
