"""The keys file of DESIGN.md §7: who may connect, with which secret, and who is an admin.

    [keys.alice]
    secret = "a long random string"     # its UTF-8 bytes are the HMAC key of PROTOCOL.md §3
    admin = true                        # optional; admins may do everything

    [keys.reporting]
    secret = "another one"

The server re-reads the file on SIGHUP; a file that fails to load leaves the previous keys in
force. Lookups happen per request, so a removed key stops working on open connections too.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KeyFileError", "KeyRing", "ServerKey", "load_keys"]

#: Same bound as the engine's grant key ids.
MAX_KEY_ID_CHARS = 128


class KeyFileError(ValueError):
    """The keys file is missing, not TOML, or breaks the format above (names the key)."""


@dataclass(frozen=True, slots=True)
class ServerKey:
    key_id: str
    secret: str
    admin: bool = False


class KeyRing:
    """Key id -> :class:`ServerKey`. Immutable; a reload builds a new ring."""

    def __init__(self, keys: dict[str, ServerKey] | None = None) -> None:
        self._keys = dict(keys or {})

    def get(self, key_id: object) -> ServerKey | None:
        return self._keys.get(key_id) if isinstance(key_id, str) else None

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return isinstance(key_id, str) and key_id in self._keys


def _parse_key(key_id: Any, table: Any) -> ServerKey:
    where = f"keys.{key_id}"
    if not isinstance(key_id, str) or not 1 <= len(key_id) <= MAX_KEY_ID_CHARS \
            or "\x00" in key_id:
        raise KeyFileError(f"{where}: a key id is 1-{MAX_KEY_ID_CHARS} characters")
    if not isinstance(table, dict):
        raise KeyFileError(f"{where}: must be a table with secret (and optional admin)")
    unknown = set(table) - {"secret", "admin"}
    if unknown:
        raise KeyFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    secret = table.get("secret")
    if not isinstance(secret, str) or not secret:
        raise KeyFileError(f"{where}.secret: must be a non-empty string")
    admin = table.get("admin", False)
    if type(admin) is not bool:
        raise KeyFileError(f"{where}.admin: must be true or false")
    return ServerKey(key_id, secret, admin)


def load_keys(path: Path) -> KeyRing:
    """Read and check a keys file."""
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(document) - {"keys"}
    if unknown:
        raise KeyFileError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; "
                           "keys go under [keys.<id>]")
    tables = document.get("keys", {})
    if not isinstance(tables, dict):
        raise KeyFileError(f"{path}: keys must be a table of [keys.<id>] tables")
    return KeyRing({key_id: _parse_key(key_id, table) for key_id, table in tables.items()})
