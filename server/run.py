"""Running ``lamina serve`` as a process: logging, signals, exit codes.

    SIGTERM / SIGINT   graceful shutdown (server.py rule 5), exit code 0
    SIGHUP             re-read the keys file
    exit code 2        a bad command line or keys file, or an open-file limit too low for
                       --max-connections; 1: the server could not start or failed

``tools/cli.py`` calls :func:`run_server` with the config of ``config.py``; :func:`serve` does
the same from an argv of its own.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal

import trio

from lamina.engine import DataDirectoryError

from .config import ConfigError, ServerConfig, add_serve_arguments, config_from_args
from .files import open_files_problem
from .keyring import KeyFileError
from .logs import configure_logging
from .server import Server

__all__ = ["run_server", "serve"]

log = logging.getLogger("lamina.server")


async def _run_until_signalled(server: Server) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            # Everything made while starting (modules, the engine's state) is long-lived:
            # keep it out of the collector's full scans, which would otherwise pause every
            # request now and then for milliseconds.
            gc.freeze()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    server.reload_keys()
                    continue
                log.info("received %s", signal.Signals(signum).name,
                         extra={"event": "signal", "signal": signal.Signals(signum).name})
                server.request_stop()
                break


def run_server(config: ServerConfig) -> int:
    """Run ``lamina serve`` with ``config`` until SIGTERM/SIGINT; -> the exit code (0 after a
    graceful shutdown, 2 for a bad configuration, 1 when the server cannot start)."""
    configure_logging()
    try:
        config.check()
        server = Server(config)
    except (ConfigError, KeyFileError) as exc:
        log.error("%s", exc, extra={"event": "config_error"})
        return 2
    problem = open_files_problem(config.max_connections)
    if problem is not None:
        log.error("%s", problem, extra={"event": "config_error"})
        return 2
    try:
        trio.run(_run_until_signalled, server)
    except Exception as exc:
        cause = _first_start_error(exc)
        if cause is not None:  # cannot bind, cannot read a TLS file, a data directory in use
            log.error("cannot serve: %s", cause, extra={"event": "start_failed"})
        else:
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # type: ignore[assignment]
            log.error("server failed: %s: %s", type(exc).__name__, exc,
                      exc_info=exc, extra={"event": "failed"})
        return 1
    return 0


def _first_start_error(exc: BaseException) -> OSError | DataDirectoryError | None:
    """What kept the server from starting inside ``exc``, if it says so itself: an OSError
    (cannot bind, cannot read a TLS file...) or a ``DataDirectoryError`` (in use by another
    process, damaged)."""
    if isinstance(exc, (OSError, DataDirectoryError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_start_error(inner)
            if found is not None:
                return found
    return None


def serve(argv: list[str] | None = None) -> int:
    """``lamina serve [options]`` on its own: parse ``argv`` and run."""
    parser = add_serve_arguments(argparse.ArgumentParser(prog="lamina serve"))
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    return run_server(config)
