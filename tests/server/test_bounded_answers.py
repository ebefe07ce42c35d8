"""Answers whose size grows with what is stored fit the smallest ``max_frame`` a server may
run with (PROTOCOL.md §1: 2 MiB), because every count behind them is limited when it grows."""

from __future__ import annotations

from pathlib import Path

from lamina.client import AsyncClient
from lamina.engine import Engine
from lamina.engine.errors import InvalidArgument
from lamina.engine.grants import MAX_GRANTS
from tests.support.servers import running_server

import pytest

MIN_MAX_FRAME = 2 * 1024 * 1024
WIDE_KEY = "\U0001F600" * 124  # 128 characters of four UTF-8 bytes each, with a 4-digit index
WIDE_QUEUE = "q" * 64


async def test_list_grants_of_the_most_grants_fits_the_smallest_frame(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "data") as engine:
        for n in range(MAX_GRANTS - 1):
            engine.grant(WIDE_QUEUE, f"{n:04d}{WIDE_KEY}", ["send", "receive", "peek", "manage"])
        async with running_server(tmp_path, engine=engine, max_frame=MIN_MAX_FRAME) as server:
            async with AsyncClient.connect("127.0.0.1", server.port) as client:
                await client.grant(WIDE_QUEUE, f"last{WIDE_KEY}", ["send", "receive", "peek",
                                                                    "manage", "grant"])
                with pytest.raises(InvalidArgument, match=f"at most {MAX_GRANTS} grants"):
                    await client.grant(WIDE_QUEUE, f"more{WIDE_KEY}", ["send"])
                grants = await client.list_grants()
    assert len(grants) == MAX_GRANTS
