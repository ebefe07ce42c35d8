"""Watching a store's WAL files (``*.log`` in its RocksDB directory) for reuse.

A recycled WAL is the same file under a new name: RocksDB renames an obsolete WAL and writes the
next WAL over it. ``WalWatch`` holds every WAL file it has seen open, so a file deleted instead
keeps its inode until the watch is closed (the file system cannot give that inode to a new
file): a WAL seen under one name and later found under another is reuse, never a coincidence of
inode numbers.
"""

from __future__ import annotations

import os
from pathlib import Path


class WalWatch:
    """``look()`` as often as WALs may come and go; ``reused()``: names a file had."""

    def __init__(self, db_path: Path):
        self.db_path = db_path
        self._held: dict[str, int] = {}  # first name seen -> descriptor

    def _current(self) -> dict[int, str]:
        """inode -> name of the WAL files there now."""
        found: dict[int, str] = {}
        for path in self.db_path.glob("*.log"):
            try:
                found[path.stat().st_ino] = path.name
            except FileNotFoundError:  # gone between the listing and the stat
                pass
        return found

    def look(self) -> None:
        for name in self._current().values():
            if name not in self._held:
                try:
                    self._held[name] = os.open(self.db_path / name, os.O_RDONLY)
                except FileNotFoundError:
                    pass

    def reused(self) -> list[tuple[str, str]]:
        """(first name, name now) of each file seen that is now a WAL of another name."""
        current = self._current()
        pairs = []
        for first, descriptor in self._held.items():
            now = current.get(os.fstat(descriptor).st_ino)
            if now is not None and now != first:
                pairs.append((first, now))
        return pairs

    def close(self) -> None:
        for descriptor in self._held.values():
            os.close(descriptor)
        self._held.clear()
