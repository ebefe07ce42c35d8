"""The SQS gateway's security: AWS Signature Version 4 by a Lamina key when the server has
keys (grants apply; forged, unknown-key, expired and unsigned requests refused), HTTPS with
the server's certificate, and bounded requests."""

from __future__ import annotations

import datetime
import http.client
import re
import socket
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.support.sqs import REGION, sqs_client, sqs_server
from tests.support.servers import ADMIN, ALICE, BOB, KEYS, Certificates


def _code(call: Any, **kwargs: Any) -> tuple[str, int]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    response = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_signed_requests_by_keys_and_their_grants(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", keys=KEYS) as running:
        port = running.server.sqs_port
        admin = sqs_client(port, ADMIN.key_id, ADMIN.secret)
        url = admin.create_queue(QueueName="guarded")["QueueUrl"]
        running.engine_job(lambda engine: engine.grant("guarded", ALICE.key_id,
                                                       ["send", "receive"]))
        alice = sqs_client(port, ALICE.key_id, ALICE.secret)
        alice.send_message(QueueUrl=url, MessageBody="from alice")
        got = alice.receive_message(QueueUrl=url, AttributeNames=["SenderId"])["Messages"][0]
        assert got["Attributes"]["SenderId"] == ALICE.key_id
        bob = sqs_client(port, BOB.key_id, BOB.secret)
        assert _code(bob.send_message, QueueUrl=url, MessageBody="x") == ("AccessDenied", 403)
        assert _code(alice.delete_queue, QueueUrl=url) == ("AccessDenied", 403)
        assert _code(alice.get_queue_attributes, QueueUrl=url,
                     AttributeNames=["All"]) == ("AccessDenied", 403)


def test_forged_unknown_unsigned_and_expired_requests_are_refused(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", keys=KEYS) as running:
        port = running.server.sqs_port
        forged = sqs_client(port, ALICE.key_id, "not-alices-secret")
        assert _code(forged.list_queues) == ("SignatureDoesNotMatch", 403)
        unknown = sqs_client(port, "mallory", "whatever")
        assert _code(unknown.list_queues) == ("InvalidClientTokenId", 403)
        wrong_region = sqs_client(port, ALICE.key_id, ALICE.secret, region="eu-west-1")
        assert _code(wrong_region.list_queues) == ("SignatureDoesNotMatch", 403)
        old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=16)
        with mock.patch("botocore.auth.get_current_datetime", return_value=old):
            stale = sqs_client(port, ALICE.key_id, ALICE.secret)
            assert _code(stale.list_queues) == ("RequestExpired", 400)
        near = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=14)
        with mock.patch("botocore.auth.get_current_datetime", return_value=near):
            sqs_client(port, ALICE.key_id, ALICE.secret).list_queues()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/", body="{}", headers={
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "Content-Type": "application/x-amz-json-1.0"})
        response = connection.getresponse()
        assert response.status == 403 and b"MissingAuthenticationToken" in response.read()
        connection.close()


def test_a_signed_request_changed_in_flight_is_refused(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", keys=KEYS) as running:
        port = running.server.sqs_port
        sqs_client(port, ADMIN.key_id, ADMIN.secret).create_queue(QueueName="q")
        body = '{"QueueName": "q"}'
        request = AWSRequest(method="POST", url=f"http://127.0.0.1:{port}/", data=body,
                             headers={"X-Amz-Target": "AmazonSQS.GetQueueUrl",
                                      "Content-Type": "application/x-amz-json-1.0"})
        SigV4Auth(Credentials(ADMIN.key_id, ADMIN.secret), "sqs", REGION).add_auth(request)
        headers = dict(request.headers.items())

        def send(payload: str, extra: dict[str, str] | None = None) -> tuple[int, bytes]:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("POST", "/", body=payload, headers={**headers, **(extra or {})})
            response = connection.getresponse()
            result = response.status, response.read()
            connection.close()
            return result

        assert send(body)[0] == 200
        status, answer = send('{"QueueName": "other"}')
        assert status == 403 and b"SignatureDoesNotMatch" in answer
        status, answer = send(body, {"X-Amz-Target": "AmazonSQS.DeleteQueue"})
        assert status == 403 and b"SignatureDoesNotMatch" in answer


def test_without_keys_unsigned_requests_are_served(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data") as running:
        connection = http.client.HTTPConnection("127.0.0.1", running.server.sqs_port,
                                                timeout=10)
        connection.request("POST", "/", body="{}", headers={
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "Content-Type": "application/x-amz-json-1.0"})
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b'{"QueueUrls":[]}'
        connection.close()


def test_https_with_the_servers_certificate(tmp_path: Path,
                                            certificates: Certificates) -> None:
    ca_bundle = tmp_path / "ca.pem"  # the test CA, which the client context trusts
    ca_bundle.write_text("".join(_ca_pems(certificates)))
    with sqs_server(tmp_path / "data", tls_cert=certificates.cert,
                    tls_key=certificates.key) as running:
        port = running.server.sqs_port
        sqs = sqs_client(port, scheme="https", verify=str(ca_bundle))
        url = sqs.create_queue(QueueName="secure")["QueueUrl"]
        assert url.startswith(f"https://127.0.0.1:{port}/")
        sqs.send_message(QueueUrl=url, MessageBody="over tls")
        assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "over tls"
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain.request("POST", "/", body="{}", headers={
                "X-Amz-Target": "AmazonSQS.ListQueues"})
            plain.getresponse()
        plain.close()


def _ca_pems(certificates: Certificates) -> list[str]:
    import ssl
    return [ssl.DER_cert_to_PEM_cert(der)
            for der in certificates.client_context.get_ca_certs(binary_form=True)]


def test_requests_are_bounded(tmp_path: Path) -> None:
    from lamina.server.sqs.http import MAX_BODY_BYTES, MAX_HEADER_BYTES
    with sqs_server(tmp_path / "data") as running:
        port = running.server.sqs_port
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.putrequest("POST", "/")
        connection.putheader("X-Amz-Target", "AmazonSQS.ListQueues")
        connection.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413 and b"RequestEntityTooLarge" in response.read()
        connection.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEADER_BYTES
                        + b"\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 431")


def test_any_permission_on_a_queue_finds_its_url(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", keys=KEYS) as running:
        port = running.server.sqs_port
        url = sqs_client(port, ADMIN.key_id, ADMIN.secret).create_queue(
            QueueName="inbox")["QueueUrl"]
        running.engine_job(lambda engine: engine.grant("inbox", ALICE.key_id, ["send"]))
        alice = sqs_client(port, ALICE.key_id, ALICE.secret)
        assert alice.get_queue_url(QueueName="inbox")["QueueUrl"] == url
        bob = sqs_client(port, BOB.key_id, BOB.secret)
        assert _code(bob.get_queue_url, QueueName="inbox") == ("AccessDenied", 403)


def test_a_client_expecting_100_continue_is_told_to_go_on(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data") as running:
        with socket.create_connection(("127.0.0.1", running.server.sqs_port),
                                      timeout=10) as raw:
            body = b"Action=ListQueues"
            raw.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                        b"Content-Type: application/x-www-form-urlencoded\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body))
            assert raw.recv(100).startswith(b"HTTP/1.1 100")
            raw.sendall(body)
            answer = b""
            while b"</ListQueuesResponse>" not in answer:
                chunk = raw.recv(4096)
                assert chunk
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")


def test_a_send_only_key_sends_to_a_fifo_queue(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", keys=KEYS) as running:
        port = running.server.sqs_port
        url = sqs_client(port, ADMIN.key_id, ADMIN.secret).create_queue(
            QueueName="jobs.fifo", Attributes={"FifoQueue": "true",
                                               "ContentBasedDeduplication": "true"})["QueueUrl"]
        running.engine_job(lambda engine: engine.grant("jobs-fifo", ALICE.key_id, ["send"]))
        alice = sqs_client(port, ALICE.key_id, ALICE.secret)
        assert alice.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")["MessageId"]
        assert _code(alice.receive_message, QueueUrl=url) == ("AccessDenied", 403)
        bob = sqs_client(port, BOB.key_id, BOB.secret)
        assert _code(bob.send_message, QueueUrl=url, MessageBody="x",
                     MessageGroupId="g") == ("AccessDenied", 403)


def test_a_manage_only_key_tags_and_configures_a_queue(tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", keys=KEYS) as running:
        port = running.server.sqs_port
        url = sqs_client(port, ADMIN.key_id, ADMIN.secret).create_queue(
            QueueName="managed")["QueueUrl"]
        running.engine_job(lambda engine: engine.grant("managed", ALICE.key_id, ["manage"]))
        alice = sqs_client(port, ALICE.key_id, ALICE.secret)
        alice.tag_queue(QueueUrl=url, Tags={"k": "v"})
        alice.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"})
        assert _code(alice.list_queue_tags, QueueUrl=url) == ("AccessDenied", 403)
        bob = sqs_client(port, BOB.key_id, BOB.secret)
        assert _code(bob.tag_queue, QueueUrl=url, Tags={"k": "x"}) == ("AccessDenied", 403)
        assert _code(bob.set_queue_attributes, QueueUrl=url,
                     Attributes={"DelaySeconds": "2"}) == ("AccessDenied", 403)


def test_a_request_trickling_in_is_cut_off(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from lamina.server.sqs import http as sqs_http
    monkeypatch.setattr(sqs_http, "REQUEST_READ_S", 0.5)
    with sqs_server(tmp_path / "data") as running:
        with socket.create_connection(("127.0.0.1", running.server.sqs_port),
                                      timeout=10) as raw:
            raw.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.3)
            raw.sendall(b"X-Slow: 1\r\n")
            started = time.monotonic()
            assert raw.recv(100) == b""  # closed without an answer
            assert time.monotonic() - started < 5


def test_a_client_that_takes_no_answer_is_disconnected_after_the_idle_timeout(
        tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data", idle_timeout_s=1.0) as running:
        port = running.server.sqs_port
        sqs = sqs_client(port)
        url = sqs.create_queue(QueueName="big")["QueueUrl"]
        for _ in range(10):
            sqs.send_message(QueueUrl=url, MessageBody="x" * 1_000_000)
        connections = running.server.connections
        deadline = time.monotonic() + 10
        while connections:  # boto3's own connection idles out first
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with socket.socket() as raw:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.connect(("127.0.0.1", port))
            body = b'{"QueueUrl": "%s", "MaxNumberOfMessages": 10}' % url.encode()
            raw.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n"
                        b"X-Amz-Target: AmazonSQS.ReceiveMessage\r\n"
                        b"Content-Type: application/x-amz-json-1.0\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 5
            while not connections:
                assert time.monotonic() < deadline, "the connection was never counted"
                time.sleep(0.01)
            # 10 MB of answer, more than the sockets' buffers hold: it stalls, unread.
            deadline = time.monotonic() + 10
            while connections:
                assert time.monotonic() < deadline, "still connected after the idle timeout"
                time.sleep(0.05)


def test_pipelined_requests_are_answered_in_order_before_a_malformed_one_is_refused(
        tmp_path: Path) -> None:
    with sqs_server(tmp_path / "data") as running:
        with socket.create_connection(("127.0.0.1", running.server.sqs_port),
                                      timeout=10) as raw:
            body = b"Action=ListQueues"
            request = (b"POST / HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/x-www-form-urlencoded\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            raw.sendall(request + request + b"\x00 not http\r\n\r\n")
            answers = b""
            while True:
                chunk = raw.recv(65536)
                if not chunk:
                    break
                answers += chunk
            statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answers)
            assert statuses == [b"200", b"200", b"400"]
            assert answers.count(b"</ListQueuesResponse>") == 2
