"""Fixtures for the tests over real servers; the helpers behind them are in ``servers.py``.

``async def`` tests run under ``trio.run`` (no plugin needed).
"""

from __future__ import annotations

import inspect
import signal
import ssl
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest
import trio

from tests.support.servers import Certificates, ServerProcess, ThreadServer, server_thread, spawn_server


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests with trio."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        trio.run(partial(pyfuncitem.obj, **kwargs))
        return True
    return None


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """``start_server(**config)`` -> a ThreadServer on a fresh data directory."""
    managers: list[Any] = []

    def start(**overrides: Any) -> ThreadServer:
        manager = server_thread(tmp_path / f"data{len(managers)}", **overrides)
        running = manager.__enter__()
        managers.append(manager)
        return running

    yield start
    for manager in reversed(managers):
        manager.__exit__(None, None, None)


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Any]:
    """``spawned(*args, data=None)`` -> ServerProcess; killed at the end if still running."""
    processes: list[ServerProcess] = []

    def spawn(*args: str, data: Path | None = None) -> ServerProcess:
        process = spawn_server(data or tmp_path / "data", *args)
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.process.poll() is None:
            process.process.send_signal(signal.SIGKILL)
            process.process.wait(10)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "server.pem", folder / "server.key"
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return Certificates(cert, key, context)
