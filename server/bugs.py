"""Where a bug becomes an answer: the one place an unexpected exception turns into
``InternalError`` (server.py rule 4): logged with its traceback, and answered to the request
(or group, or gateway call) it broke, while the server goes on."""

from __future__ import annotations

import logging

from lamina.engine.errors import InternalError

__all__ = ["internal_error"]

log = logging.getLogger("lamina.server")


def internal_error(what: str, exc: BaseException, **extra: object) -> InternalError:
    """Log the bug ``exc`` that broke ``what`` (an op, a receive, a group); -> the error that
    answers it (the traceback is logged)."""
    log.error("internal error in %s", what, exc_info=exc,
              extra={"event": "internal_error", **extra})
    return InternalError(f"{what} failed: {type(exc).__name__}: {exc}")
