"""Permissions per key on queues (DESIGN.md §7), stored in ``meta`` and checked on every
operation called with a ``caller``.

``caller`` is the authenticated key id; ``None`` means unrestricted (embedded use, or an admin
key: the server passes None for admins). Permission is checked before existence, so a key
learns nothing about queues it may not see.

    send     send
    receive  receive, delete, change_visibility, dead
    peek     peek, get_queue, list_tags, stats (and seeing the queue in list_queues)
    manage   set attributes, tags, rewind, redrive, purge, delete_by_id, delete_queue;
             create_queue / copy_queue need it on a grant matching the new name
    grant    grant, revoke, list_grants on that queue
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable, Protocol

import cbor2

from . import keys
from .errors import AccessDenied, InvalidArgument
from .results import Grant
from .store import Store
from .validation import check_batch, check_name

PERMISSIONS = ("send", "receive", "peek", "manage", "grant")
_GLOB_CHARS = frozenset("*?[]")


def check_pattern(value: object, field: str = "queue") -> str:
    """A queue name or a glob over lower-cased names -> its lower-cased form."""
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        raise InvalidArgument(field, "must be a queue name or a glob of 1-64 characters")
    if not _GLOB_CHARS.intersection(value):
        check_name(value, field)
    elif not all(c.isascii() and c.isalnum() or c in "_-*?[]!" for c in value):
        raise InvalidArgument(field, "a glob may hold [A-Za-z0-9_-] and * ? [ ] !")
    return value.lower()


def is_glob(pattern: str) -> bool:
    return bool(_GLOB_CHARS.intersection(pattern))


def check_permissions(value: object, field: str = "permissions") -> list[str]:
    items = check_batch(value, field)
    for item in items:
        if item not in PERMISSIONS:
            raise InvalidArgument(field, f"unknown permission {item!r}; "
                                  f"one of {', '.join(PERMISSIONS)}")
    return sorted(set(items), key=PERMISSIONS.index)


class GrantContext(Protocol):
    """What the grants read of the engine: its store."""

    _store: Store


class Grants:
    """The permissions of keys, owned by the engine: ``check`` before every operation with a
    ``caller``; ``grant`` / ``revoke`` / ``list_grants`` run inside the engine's operation
    frame (``Engine`` opens it)."""

    def __init__(self, context: GrantContext) -> None:
        self._context = context
        self._cache: dict[str, dict[str, set[str]]] | None = None  # filled on first use

    def reset(self) -> None:
        """Forget the cache (the store is the truth again)."""
        self._cache = None

    def _grants(self) -> dict[str, dict[str, set[str]]]:
        """key id -> pattern -> permissions (a cache of the ``G`` rows of ``meta``)."""
        grants = self._cache
        if grants is None:
            grants = {}
            for key, value in Store.items(self._context._store.meta, keys.GRANTS_LOWER,
                                          keys.GRANTS_UPPER):
                key_id, pattern = keys.grant_key_decode(key)
                grants.setdefault(key_id, {})[pattern] = set(cbor2.loads(value))
            self._cache = grants
        return grants

    def permissions(self, caller: str, queue: str) -> set[str]:
        """What ``caller`` holds on ``queue`` (by name and by every glob matching it)."""
        held: set[str] = set()
        name = queue.lower()
        for pattern, permissions in self._grants().get(caller, {}).items():
            if pattern == name or (is_glob(pattern) and fnmatchcase(name, pattern)):
                held |= permissions
        return held

    def check(self, caller: str | None, permission: str, queue: object,
               field: str = "queue") -> None:
        """``AccessDenied`` unless ``caller`` holds ``permission`` on ``queue``."""
        if caller is None:
            return
        if not isinstance(queue, str):
            check_name(queue, field)
        if permission not in self.permissions(caller, queue):  # type: ignore[arg-type]
            raise AccessDenied(f"{field}: key {caller!r} lacks {permission!r} on {queue!r}",
                               field=field)

    def may(self, caller: str | None, permission: str, queue: str) -> bool:
        return caller is None or permission in self.permissions(caller, queue)

    def store_grant(self, key_id: str, pattern: str, permissions: Iterable[str]) -> None:
        store = self._context._store
        held = set(permissions)
        grants = self._grants()
        if held:
            grants.setdefault(key_id, {})[pattern] = held
            store.put(store.meta_h, keys.grant_key(key_id, pattern),
                      cbor2.dumps(sorted(held, key=PERMISSIONS.index)))
        else:
            grants.get(key_id, {}).pop(pattern, None)
            store.delete(store.meta_h, keys.grant_key(key_id, pattern))

    def drop_on(self, name: str) -> None:
        """``delete_queue`` drops every grant on the queue's exact name."""
        pattern = name.lower()
        for key_id, patterns in self._grants().items():
            if pattern in patterns:
                self.store_grant(key_id, pattern, ())

    def grant(self, queue: str, key: str, permissions: list[str], *,
              caller: str | None = None) -> None:
        """Give ``key`` ``permissions`` on ``queue`` (a name or, for admins, a glob)."""
        pattern = check_pattern(queue)
        self._check_key_id(key)
        wanted = check_permissions(permissions)
        if caller is not None:
            if is_glob(pattern) or "grant" in wanted:
                raise AccessDenied("queue: only admin keys grant on globs or grant 'grant'",
                                   field="queue")
            held = self.permissions(caller, pattern)
            if "grant" not in held or not set(wanted) <= held:
                raise AccessDenied(f"permissions: key {caller!r} may grant only "
                                   "permissions it holds, where it holds 'grant'",
                                   field="permissions")
        current = self._grants().get(key, {}).get(pattern, set())
        self.store_grant(key, pattern, current | set(wanted))

    def revoke(self, queue: str, key: str, permissions: list[str] | None = None, *,
               caller: str | None = None) -> None:
        """Take ``permissions`` (default all) on ``queue`` from ``key``."""
        pattern = check_pattern(queue)
        self._check_key_id(key)
        wanted = list(PERMISSIONS) if permissions is None else check_permissions(permissions)
        if caller is not None:
            held = self.permissions(caller, pattern)
            if is_glob(pattern) or "grant" not in held:
                raise AccessDenied(f"queue: key {caller!r} lacks 'grant' on {queue!r}",
                                   field="queue")
            if permissions is None:
                wanted = [p for p in wanted if p in held]
            elif not set(wanted) <= held:
                raise AccessDenied("permissions: a key may revoke only permissions it "
                                   "holds", field="permissions")
        current = self._grants().get(key, {}).get(pattern, set())
        self.store_grant(key, pattern, current - set(wanted))

    def list_grants(self, queue: str | None = None, key: str | None = None, *,
                    caller: str | None = None) -> list[Grant]:
        """Grants, ordered by key then queue pattern; a non-admin sees its own grants, or
        those on a queue where it holds ``grant``."""
        pattern = check_pattern(queue) if queue is not None else None
        if key is not None:
            self._check_key_id(key)
        if caller is not None and key != caller:
            if pattern is None and key is None:
                key = caller
            elif pattern is None:
                raise AccessDenied(f"key: key {caller!r} may list only its own grants, "
                                   "or those on a queue where it holds 'grant'",
                                   field="key")
            elif "grant" not in self.permissions(caller, pattern):
                raise AccessDenied(f"queue: key {caller!r} lacks 'grant' on {queue!r}",
                                   field="queue")
        out = []
        for key_id in sorted(self._grants()):
            if key is not None and key_id != key:
                continue
            for grant_pattern, held in sorted(self._grants()[key_id].items()):
                if pattern is None or grant_pattern == pattern:
                    out.append(Grant(grant_pattern, key_id,
                                     sorted(held, key=PERMISSIONS.index)))
        return out

    @staticmethod
    def _check_key_id(key: object) -> None:
        if not isinstance(key, str) or not 1 <= len(key) <= 128 or "\x00" in key:
            raise InvalidArgument("key", "must be a key id of 1-128 characters")
