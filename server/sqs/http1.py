"""HTTP/1.1 for the SQS endpoint, without I/O: requests parsed by httptools (llhttp, the parser
under uvicorn), answers written as bytes.

Rules:

1. Bytes go in with :meth:`RequestParser.feed`; whole requests come out of
   :meth:`RequestParser.next_request`, in order (a pipelining client's requests wait their turn
   in the parser: the caller reads no more bytes while one is waiting). A request refused
   behind whole ones is refused once they are taken, so they are answered first.
2. A request head (target and headers) is at most ``max_header_bytes`` (answer 431); a body
   is at most ``max_body_bytes`` by its ``Content-Length`` or, chunked, as it arrives (413).
   Bytes of an unfinished head are bounded too: llhttp holds a partial header line itself.
   Once a head is in, :attr:`RequestParser.body_bound_bytes` says how much its body may hold
   (for the server's memory budget).
3. Anything llhttp refuses (a malformed line, an invalid method, a protocol upgrade) is 400.
   After any :class:`HttpError` the connection answers it and closes.
4. ``Expect: 100-continue``: :attr:`RequestParser.continue_wanted` says when the client waits
   for leave to send its body; :meth:`RequestParser.continue_sent` records that it got it.
5. An answer carries ``Content-Length`` always and ``Connection: close`` when the connection
   closes after it (the request asked for that, or HTTP/1.0 without keep-alive, or an error);
   the answer to a ``HEAD`` has no body.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from http import HTTPStatus

import httptools

__all__ = ["CONTINUE", "HttpError", "HttpRequest", "RequestParser", "render_response"]

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class HttpError(Exception):
    """The request cannot be served (rules 2, 3): answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class HttpRequest:
    method: str
    #: The request target as sent (path and query), latin-1 decoded.
    target: str
    #: Values by lower-case name; a repeated header's values joined with commas.
    headers: dict[str, str]
    body: bytes
    #: The client keeps the connection for another request (HTTP/1.1 by default).
    keep_alive: bool
    #: It asks for another protocol (refused, rule 3).
    upgrade: bool = False


class RequestParser:
    """One connection's incoming requests (rules 1-4)."""

    def __init__(self, max_header_bytes: int, max_body_bytes: int) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self._parser = httptools.HttpRequestParser(self)
        self._ready: deque[HttpRequest] = deque()
        #: A request has begun and is not complete.
        self.in_request = False
        self._begun = 0  # requests begun so far
        self._fed_in_head = 0
        self._head_done = False
        self._target = b""
        self._header_bytes = 0
        self._headers: dict[str, str] = {}
        self._chunks: list[bytes] = []
        self._body_bytes = 0
        self._expects_continue = False
        self._error: HttpError | None = None  # raised by a callback
        self._refused: HttpError | None = None  # held behind whole requests (feed)

    # -- rule 1 --------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises :class:`HttpError` (rules 2, 3), or, when requests before
        the refused one came whole, lets :meth:`next_request` raise it after them."""
        try:
            self._feed(data)
        except HttpError as exc:
            if not self._ready:
                raise
            self._refused = exc

    def _feed(self, data: bytes) -> None:
        head_pending = self.in_request and not self._head_done
        begun = self._begun
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._ready and self._ready[-1].upgrade:
                self._ready.pop()  # llhttp completes the upgrade request, then stops
            raise HttpError(400, "Protocol upgrades are not served here.") from None
        except httptools.HttpParserCallbackError:
            if self._error is not None:
                raise self._error from None
            raise
        except httptools.HttpParserError as exc:
            raise HttpError(400, f"Malformed HTTP request: {exc}") from None
        if head_pending and self._begun == begun and not self._head_done:
            # Rule 2: llhttp keeps a partial header line itself. What it holds is at most
            # the reads since the one the request began in, plus that one.
            self._fed_in_head += len(data)
            if self._fed_in_head > self.max_header_bytes:
                raise self._too_large(431, "headers")

    def next_request(self) -> HttpRequest | None:
        """The next whole request (None: more bytes are needed); raises the
        :class:`HttpError` of a refused request once those before it are taken."""
        if self._ready:
            return self._ready.popleft()
        if self._refused is not None:
            raise self._refused
        return None

    @property
    def body_bound_bytes(self) -> int:
        """The most the body of the request being read may hold, once its head is in: its
        ``Content-Length``, or (chunked) ``max_body_bytes``; 0 before that and between
        requests (rule 2)."""
        if not (self.in_request and self._head_done):
            return 0
        length = self._headers.get("content-length", "")
        return int(length) if length.isdigit() else self.max_body_bytes

    # -- rule 4 --------------------------------------------------------------------------------

    @property
    def continue_wanted(self) -> bool:
        return self._expects_continue and self.in_request and self._head_done

    def continue_sent(self) -> None:
        self._expects_continue = False

    # -- httptools' callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_request = True
        self._begun += 1
        self._fed_in_head = 0
        self._head_done = False
        self._target = b""
        self._header_bytes = 0
        self._headers = {}
        self._chunks = []
        self._body_bytes = 0
        self._expects_continue = False

    def on_url(self, target: bytes) -> None:
        self._target += target
        self._count_head(len(target))

    def on_header(self, raw_name: bytes, raw_value: bytes) -> None:
        self._count_head(len(raw_name) + len(raw_value) + 4)
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers = self._headers
        headers[name] = f"{headers[name]},{value}" if name in headers else value

    def on_headers_complete(self) -> None:
        self._head_done = True
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            self._fail(413, "body")
        self._expects_continue = self._headers.get("expect", "").lower() == "100-continue"

    def on_body(self, data: bytes) -> None:
        self._expects_continue = False  # the body comes anyway
        self._body_bytes += len(data)
        if self._body_bytes > self.max_body_bytes:
            self._fail(413, "body")
        self._chunks.append(data)

    def on_message_complete(self) -> None:
        parser = self._parser
        chunks = self._chunks
        self._ready.append(HttpRequest(
            parser.get_method().decode("ascii", "replace"), self._target.decode("latin-1"),
            self._headers, chunks[0] if len(chunks) == 1 else b"".join(chunks),
            parser.should_keep_alive(), parser.should_upgrade()))
        self.in_request = False
        self._expects_continue = False
        self._chunks = []

    # -- limits --------------------------------------------------------------------------------

    def _count_head(self, size_bytes: int) -> None:
        self._header_bytes += size_bytes
        if self._header_bytes > self.max_header_bytes:
            self._fail(431, "headers")

    def _fail(self, status: int, what: str) -> None:
        """From a callback: llhttp stops, and ``feed`` raises this error (not llhttp's)."""
        self._error = self._too_large(status, what)
        raise self._error

    def _too_large(self, status: int, what: str) -> HttpError:
        limit = self.max_body_bytes if what == "body" else self.max_header_bytes
        return HttpError(status, f"The request {what} is larger than {limit} bytes.")


def render_response(status: int, headers: list[tuple[str, str]], body: bytes, *,
                    close: bool, head_only: bool = False) -> bytes:
    """One answer (rule 5). ``headers`` are the gateway's own: names and values without
    line breaks."""
    lines = [f"HTTP/1.1 {status} {_reason(status)}\r\n"]
    lines.extend(f"{name}: {value}\r\n" for name, value in headers)
    lines.append(f"Content-Length: {len(body)}\r\n")
    if close:
        lines.append("Connection: close\r\n")
    lines.append("\r\n")
    head = "".join(lines).encode("latin-1")
    return head if head_only or not body else head + body


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status, "Unknown")
