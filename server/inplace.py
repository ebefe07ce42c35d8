"""A read of a few requests after auth, applied and answered in the call that read it.

The usual read of a client awaiting its answers holds one request, or a few. When the applier
idles (server.py rule 6) they are applied and answered by one synchronous call
(``Applier.apply_lone_now``, ``apply_requests_now``): no Work, no coroutine, no task switch.
It runs in a connection's reader task, or in the read hub's for a connection waiting there
(readhub.py). Requests whose answer may be large are applied so only once their bound is
reserved in the connection's outbox (connection.py rule 3, as ``Connection._handle`` does);
a read that cannot be answered so goes to ``_handle`` with nothing reserved.
"""

from __future__ import annotations

from typing import Any

from lamina.wire.protocol import Request

from .budget import BOUNDED_ANSWER_OPS, answer_bound_bytes
from .outbox import Outbox
from .ports import Applier, Requester

__all__ = ["REQUEST_SLICE", "answered_now", "bounded_answered_now", "lone_answered_now"]

#: Requests of one read handed to the applier at a time (connection.py rule 3).
REQUEST_SLICE = 16


def answered_now(applier: Applier, requester: Requester, outbox: Outbox, events: list[Any],
                 started: float, max_frame_bytes: int) -> bool:
    """Apply and answer ``events`` (the events of one read of ``requester``, after auth) now.
    False: not such a read (other events, too many requests), or the applier busy; nothing
    is then applied, and nothing stays reserved."""
    if len(events) == 1:  # the commonest: one request
        request = events[0]
        if type(request) is not Request:
            return False
        return lone_answered_now(applier, requester, outbox, request, started, max_frame_bytes)
    if len(events) > REQUEST_SLICE:
        return False
    bounded = False
    for request in events:
        if type(request) is not Request:
            return False
        if request.op in BOUNDED_ANSWER_OPS:
            bounded = True
    if not bounded:
        return applier.apply_requests_now(requester, events, started)
    if not outbox.reserve_all(events, max_frame_bytes):
        return False
    if applier.apply_requests_now(requester, events, started):
        return True
    for request in events:
        outbox.release(request.id)
    return False


def lone_answered_now(applier: Applier, requester: Requester, outbox: Outbox,
                      request: Request, started: float, max_frame_bytes: int) -> bool:
    """``answered_now`` of a read of one request (after auth)."""
    if request.op not in BOUNDED_ANSWER_OPS:
        return applier.apply_lone_now(requester, request, started)  # (rule 3 holds)
    return bounded_answered_now(applier, requester, outbox, request, started, max_frame_bytes)


def bounded_answered_now(applier: Applier, requester: Requester, outbox: Outbox,
                         request: Request, started: float, max_frame_bytes: int) -> bool:
    """``answered_now`` of a read of one request whose answer may be large (its op is in
    ``BOUNDED_ANSWER_OPS``): applied once its bound is reserved, unless no reservation is
    needed (``Outbox.needs_reservation``)."""
    if not outbox.needs_reservation():
        return applier.apply_lone_now(requester, request, started)  # (rule 3 holds)
    if not outbox.reserve(request.id, answer_bound_bytes(request, max_frame_bytes)):
        return False
    if applier.apply_lone_now(requester, request, started):
        return True
    outbox.release(request.id)
    return False
