"""AWS Signature Version 4 (header form), verified as SQS does: the access key id is a
Lamina key id, the secret its secret; the signature covers the method, path, query string,
the signed headers (``host`` among them) and the body's SHA-256; the request's time
(``X-Amz-Date``, else ``Date``) is within 15 minutes of the server's clock; the credential
scope is ``DATE/REGION/sqs/aws4_request`` for this gateway's region.

Every failure names its cause; an unknown key and a wrong signature are different SQS codes
(``InvalidClientTokenId``, ``SignatureDoesNotMatch``), as SQS answers them.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from email.utils import parsedate_tz, mktime_tz
from typing import Callable
from urllib.parse import parse_qsl, quote

from .errors import SqsError

__all__ = ["MAX_SKEW_S", "verify"]

#: SQS refuses a request signed more than 15 minutes from its clock.
MAX_SKEW_S = 15 * 60
ALGORITHM = "AWS4-HMAC-SHA256"
_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/aws4_request,"
    r"\s*SignedHeaders=([a-z0-9;\-]+),\s*Signature=([0-9a-f]{64})\s*")
_SPACES = re.compile(r"\s+")


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _request_time(headers: dict[str, str]) -> tuple[float, str]:
    stamp = headers.get("x-amz-date")
    if stamp is not None:
        try:
            parsed = time.strptime(stamp, "%Y%m%dT%H%M%SZ")
        except ValueError:
            raise SqsError("IncompleteSignature", f"X-Amz-Date {stamp[:40]!r} is not "
                           "YYYYMMDDTHHMMSSZ.") from None
        return calendar.timegm(parsed), stamp
    date = headers.get("date")
    parsed_date = parsedate_tz(date) if date else None
    if parsed_date is None:
        raise SqsError("IncompleteSignature", "A signed request needs an X-Amz-Date (or "
                       "Date) header.")
    seconds = mktime_tz(parsed_date)
    return seconds, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(seconds))


def _canonical_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def verify(method: str, target: str, headers: dict[str, str], body: bytes, region: str,
           secret_of: Callable[[str], str | None], now_s: float | None = None) -> str:
    """Check a request's signature; -> the key id that signed it, or raise ``SqsError``.
    ``headers``: lower-case names (repeated headers joined with commas); ``target``: the
    request target as sent (path and query)."""
    authorization = headers.get("authorization")
    if authorization is None:
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication "
                       "Token: this server needs requests signed with AWS Signature "
                       "Version 4 by one of its keys.")
    match = _AUTH_RE.fullmatch(authorization)
    if match is None:
        raise SqsError("IncompleteSignature", "The Authorization header is not an "
                       f"{ALGORITHM} signature (Credential, SignedHeaders, Signature).")
    key_id, scope_date, scope_region, service, signed, signature = match.groups()
    request_s, stamp = _request_time(headers)
    now = time.time() if now_s is None else now_s
    if abs(now - request_s) > MAX_SKEW_S:
        raise SqsError("RequestExpired", f"Signature expired: the request time {stamp} is "
                       f"more than {MAX_SKEW_S // 60} minutes from the server's time "
                       f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}.")
    if scope_date != stamp[:8] or service != "sqs" or scope_region != region:
        raise SqsError("SignatureDoesNotMatch", f"Credential should be scoped to "
                       f"{stamp[:8]}/{region}/sqs/aws4_request.")
    signed_names = signed.split(";")
    if "host" not in signed_names:
        raise SqsError("SignatureDoesNotMatch", "The host header must be signed.")
    secret = secret_of(key_id)
    if secret is None:
        raise SqsError("InvalidClientTokenId", "The security token included in the request "
                       "is invalid: no such key.")
    path, _, query = target.partition("?")
    canonical_headers = "".join(
        f"{name}:{_SPACES.sub(' ', headers.get(name, '').strip())}\n" for name in signed_names)
    payload = headers.get("x-amz-content-sha256") or hashlib.sha256(body).hexdigest()
    if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
        raise SqsError("SignatureDoesNotMatch", "The body does not match its signed "
                       "SHA-256 (x-amz-content-sha256).")
    canonical = "\n".join((method, quote(path or "/", safe="/~"), _canonical_query(query),
                           canonical_headers, signed, payload))
    scope = f"{scope_date}/{scope_region}/{service}/aws4_request"
    to_sign = "\n".join((ALGORITHM, stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()))
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret).encode(), scope_date), scope_region),
                      service), "aws4_request")
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SqsError("SignatureDoesNotMatch", "The request signature we calculated does "
                       "not match the signature you provided. Check your key and signing "
                       "method.")
    return key_id
