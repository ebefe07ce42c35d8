"""The SQS endpoint's HTTP/1.1 layer on its own: requests in, answers out, no sockets."""

from __future__ import annotations

import pytest

from lamina.server.sqs.http1 import CONTINUE, HttpError, RequestParser, render_response

HEADERS_MAX = 1024
BODY_MAX = 4096


def parser() -> RequestParser:
    return RequestParser(HEADERS_MAX, BODY_MAX)


def post(body: bytes, *extra: bytes) -> bytes:
    return (b"POST /000000000000/q?x=1 HTTP/1.1\r\nHost: h\r\n" + b"".join(extra)
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def test_a_request_fed_in_pieces_comes_out_whole() -> None:
    requests = parser()
    raw = post(b"Action=ListQueues", b"X-Amz-Date: 20261125T000000Z\r\n")
    for byte in range(len(raw) - 1):
        requests.feed(raw[byte:byte + 1])
        assert requests.next_request() is None
    requests.feed(raw[-1:])
    request = requests.next_request()
    assert request is not None
    assert (request.method, request.target, request.body) == (
        "POST", "/000000000000/q?x=1", b"Action=ListQueues")
    assert request.headers["x-amz-date"] == "20261125T000000Z"
    assert request.keep_alive and not requests.in_request


def test_pipelined_requests_come_out_in_order() -> None:
    requests = parser()
    requests.feed(post(b"first") + post(b"second") + b"GET /third HTTP/1.1\r\nHost: h\r\n\r\n")
    assert [r.body for r in iter(requests.next_request, None)] == [b"first", b"second", b""]


def test_repeated_headers_are_joined_with_commas_and_names_lowered() -> None:
    requests = parser()
    requests.feed(post(b"", b"X-Thing: a\r\n", b"x-THING: b\r\n"))
    request = requests.next_request()
    assert request is not None and request.headers["x-thing"] == "a,b"


def test_a_chunked_body_is_joined() -> None:
    requests = parser()
    requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    request = requests.next_request()
    assert request is not None and request.body == b"abcde"


def test_http_1_0_without_keep_alive_closes_after_its_answer() -> None:
    requests = parser()
    requests.feed(b"GET /?Action=ListQueues HTTP/1.0\r\nHost: h\r\n\r\n")
    request = requests.next_request()
    assert request is not None and not request.keep_alive
    requests = parser()
    requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    request = requests.next_request()
    assert request is not None and not request.keep_alive


def test_a_body_over_the_limit_is_refused_by_its_length_before_it_comes() -> None:
    requests = parser()
    with pytest.raises(HttpError) as caught:
        requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n"
                      % (BODY_MAX + 1))
    assert caught.value.status == 413 and "body" in caught.value.message


def test_a_chunked_body_over_the_limit_is_refused_as_it_comes() -> None:
    requests = parser()
    requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (1000, b"a" * 1000)
    with pytest.raises(HttpError) as caught:
        for _ in range(5):
            requests.feed(chunk)
    assert caught.value.status == 413


def test_headers_over_the_limit_are_refused_whole_or_unfinished() -> None:
    whole = parser()
    with pytest.raises(HttpError) as caught:
        whole.feed(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * HEADERS_MAX + b"\r\n\r\n")
    assert caught.value.status == 431
    unfinished = parser()  # one header line that never ends: llhttp would hold all of it
    unfinished.feed(b"GET / HTTP/1.1\r\nX-Big: ")
    with pytest.raises(HttpError) as caught:
        for _ in range(HEADERS_MAX // 100 + 2):
            unfinished.feed(b"a" * 100)
    assert caught.value.status == 431


def test_a_long_body_before_a_pipelined_request_does_not_count_as_its_head() -> None:
    requests = parser()
    body = b"b" * (BODY_MAX - 10)
    requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body))
    requests.feed(body + b"GET / HTTP/1.1\r\nHost")  # the next head begins, unfinished
    requests.feed(b": h\r\n\r\n")
    assert [r.method for r in iter(requests.next_request, None)] == ["POST", "GET"]


@pytest.mark.parametrize("raw", [
    b"\x00\x01 garbage\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: nope\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
])
def test_what_the_parser_refuses_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(HttpError) as caught:
        parser().feed(raw)
    assert caught.value.status == 400


def test_a_client_expecting_100_continue_is_told_once_then_sends_its_body() -> None:
    requests = parser()
    requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 3\r\n\r\n")
    assert requests.continue_wanted
    requests.continue_sent()
    assert not requests.continue_wanted
    requests.feed(b"abc")
    request = requests.next_request()
    assert request is not None and request.body == b"abc"
    assert CONTINUE.startswith(b"HTTP/1.1 100 ")


def test_a_body_sent_without_waiting_needs_no_100_continue() -> None:
    requests = parser()
    requests.feed(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 6\r\n\r\nabc")
    assert not requests.continue_wanted


def test_an_answer_has_its_length_and_says_when_the_connection_closes() -> None:
    answer = render_response(200, [("Content-Type", "text/xml")], b"<ok/>", close=False)
    assert answer == (b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: 5\r\n"
                      b"\r\n<ok/>")
    closing = render_response(413, [], b"big", close=True)
    assert closing.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert b"\r\nConnection: close\r\n" in closing and closing.endswith(b"\r\n\r\nbig")


def test_the_answer_to_a_head_request_has_no_body() -> None:
    answer = render_response(400, [], b"refused", close=False, head_only=True)
    assert answer.endswith(b"Content-Length: 7\r\n\r\n")


def test_a_request_refused_behind_whole_ones_is_refused_after_they_are_taken() -> None:
    requests = parser()
    requests.feed(post(b"first") + b"\x00 not http\r\n\r\n")
    first = requests.next_request()
    assert first is not None and first.body == b"first"
    with pytest.raises(HttpError) as caught:
        requests.next_request()
    assert caught.value.status == 400
