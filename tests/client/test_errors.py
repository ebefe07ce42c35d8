"""Which connection error a client raises: the kinds of ``lamina.client.errors``."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from lamina.client import (
    AsyncClient,
    Client,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    ConnectTimeout,
)
from tests.support.servers import running_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nothing_listening_is_connect_failed() -> None:
    with pytest.raises(ConnectFailed, match="cannot connect"):
        Client.connect("127.0.0.1", free_port(), timeout=2)


def test_a_listener_that_never_greets_is_connect_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(ConnectTimeout):
            Client.connect("127.0.0.1", listener.getsockname()[1], timeout=0.3)


async def test_async_client_without_a_greeting_is_connect_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(ConnectTimeout):
            async with AsyncClient.connect("127.0.0.1", listener.getsockname()[1], timeout=0.3):
                pass


def test_calls_after_close_are_connection_closed(start_server: Any) -> None:
    server = start_server()
    client = Client.connect("127.0.0.1", server.port)
    client.close()
    with pytest.raises(ConnectionClosed):
        client.ping()


def test_the_server_dropping_the_connection_is_connection_lost(start_server: Any) -> None:
    server = start_server()
    with Client.connect("127.0.0.1", server.port) as client:
        client.ping()
        server.call(lambda: [c.abort() for c in list(server.server.connections)])
        with pytest.raises(ConnectionLost):
            client.ping()


async def test_async_calls_after_the_block_are_connection_closed(tmp_path: Any) -> None:
    async with running_server(tmp_path) as server:
        async with AsyncClient.connect("127.0.0.1", server.port) as client:
            await client.ping()
        with pytest.raises(ConnectionClosed):
            await client.ping()
