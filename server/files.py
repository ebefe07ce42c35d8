"""The file descriptor budget of ``lamina serve``, checked before anything is opened.

Every connection is a descriptor (unauthenticated ones too), and so is every file RocksDB
opens; running out of them mid-flight fails the store's writes (a new WAL file cannot be
created). So the server raises its soft limit to the hard one, then refuses to start when
the hard limit cannot cover ``--max-connections`` plus the store's files plus its own.
"""

from __future__ import annotations

import resource

from lamina.engine.store import MAX_OPEN_FILES, OTHER_OPEN_FILES

__all__ = ["SERVER_FILES", "files_needed", "open_files_problem"]

#: The server's own descriptors: listeners (TCP, metrics), stdio, the event loop's wakeup
#: pipes and epoll, worker threads, files of the keys and TLS material.
SERVER_FILES = 64


def files_needed(max_connections: int) -> int:
    """Descriptors a server with ``max_connections`` may hold at once."""
    return max_connections + MAX_OPEN_FILES + OTHER_OPEN_FILES + SERVER_FILES


def _raise_soft_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (often 1024 vs far more); -> the limit in
    force afterwards (``RLIM_INFINITY`` when unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft


def open_files_problem(max_connections: int) -> str | None:
    """Raise the soft limit; -> why the limit cannot serve ``max_connections``, or None."""
    limit = _raise_soft_limit()
    needed = files_needed(max_connections)
    if limit == resource.RLIM_INFINITY or limit >= needed:
        return None
    most = limit - files_needed(0)
    advice = (f"lower --max-connections to at most {most}" if most >= 1
              else "raise the open-file limit")
    return (f"the open-file limit is {limit}, too low for --max-connections "
            f"{max_connections}: each connection takes a file descriptor and the store and "
            f"server need up to {files_needed(0)} more ({needed} in all); {advice}, or raise "
            f"the hard limit (ulimit -Hn, or LimitNOFILE= for a systemd service)")
