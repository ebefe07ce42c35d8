"""Accepting connections: ``trio.serve_listeners`` with the server's own log lines.

When the process is out of file descriptors (or the system out of memory for sockets),
``accept`` fails until a connection closes. trio's loop logs a traceback every 0.1 s while
that lasts; this one logs one JSON line (``event: accept_failed``) at most every
ACCEPT_LOG_INTERVAL_S with how many failures it stands for, and retries every ACCEPT_RETRY_S.
Connections not accepted meanwhile wait in the listen backlog.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from typing import Any, Awaitable, Callable

import trio

__all__ = ["ACCEPT_LOG_INTERVAL_S", "ACCEPT_RETRY_S", "Refusals", "accept_connections"]

log = logging.getLogger("lamina.server")

#: accept(2) errors that mean the process or system is out of a resource for now.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
#: How long to wait before accepting again after such an error.
ACCEPT_RETRY_S = 0.1
#: At most one log line per listener this often while accepting keeps failing.
ACCEPT_LOG_INTERVAL_S = 10.0


async def accept_connections(listeners: list[trio.SocketListener],
                             handler: Callable[[trio.SocketStream], Awaitable[Any]],
                             pool: trio.Nursery) -> None:
    """Run ``handler(stream)`` in ``pool`` for every connection accepted, until cancelled."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_from, listener, handler, pool)


async def _accept_from(listener: trio.SocketListener,
                       handler: Callable[[trio.SocketStream], Awaitable[Any]],
                       pool: trio.Nursery) -> None:
    logged_at = -math.inf
    failures = 0  # since the last line logged
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                raise
            failures += 1
            now = trio.current_time()
            if now - logged_at >= ACCEPT_LOG_INTERVAL_S:
                log.error("cannot accept connections: %s (%s); retrying",
                          os.strerror(exc.errno), errno.errorcode[exc.errno],
                          extra={"event": "accept_failed", "errno": errno.errorcode[exc.errno],
                                 "failures": failures})
                logged_at, failures = now, 0
            await trio.sleep(ACCEPT_RETRY_S)
            continue
        if failures or logged_at > -math.inf:
            log.info("accepting connections again", extra={"event": "accept_resumed",
                                                           "failures": failures})
            logged_at, failures = -math.inf, 0
        pool.start_soon(handler, stream)


class Refusals:
    """Connections closed unserved (the server at ``max_connections``, or stopping), on every
    port: one log line (``event: refused``) at most every ACCEPT_LOG_INTERVAL_S, with how many
    it stands for, so that a flood of connections does not flood the log."""

    def __init__(self) -> None:
        self._logged_at = -math.inf
        self._unlogged = 0

    def refuse(self, reason: str, peer: str) -> None:
        self._unlogged += 1
        now = trio.current_time()
        if now - self._logged_at >= ACCEPT_LOG_INTERVAL_S:
            log.warning("connection refused: %s", reason,
                        extra={"event": "refused", "peer": peer, "refused": self._unlogged})
            self._logged_at, self._unlogged = now, 0
