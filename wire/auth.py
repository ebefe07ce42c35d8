"""PROTOCOL.md §3: the ``auth`` request's signature, computed by clients and checked by servers."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["AUTH_CONTEXT", "auth_signature", "verify_auth_signature"]

#: PROTOCOL §3: domain separation for the auth HMAC.
AUTH_CONTEXT = b"lamina-auth-v1"


def auth_signature(secret: str, nonce: bytes, key_id: str) -> bytes:
    """PROTOCOL §3: HMAC-SHA256(secret, b"lamina-auth-v1" || nonce || key_id UTF-8). The nonce
    binds it to one connection, so a signature seen on the wire cannot be replayed."""
    message = AUTH_CONTEXT + bytes(nonce) + key_id.encode("utf-8")
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()


def verify_auth_signature(secret: str, nonce: bytes, key_id: str, signature: object) -> bool:
    """Whether ``signature`` is right, compared in constant time (no timing oracle)."""
    if type(signature) is not bytes:
        return False
    return hmac.compare_digest(auth_signature(secret, nonce, key_id), signature)
