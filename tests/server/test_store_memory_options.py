"""``lamina serve``'s bounds of the store's memory: options with their defaults in the help,
checked before anything opens, handed to the engine."""

from __future__ import annotations

import argparse

import pytest

from lamina.engine import MemoryBounds
from lamina.engine.storememory import DEFAULT_BLOCK_CACHE_BYTES, DEFAULT_WRITE_BUFFER_BYTES
from lamina.server.config import ConfigError, add_serve_arguments, config_from_args


def _parse(*argv: str):
    parser = add_serve_arguments(argparse.ArgumentParser(prog="lamina serve"))
    return config_from_args(parser.parse_args(list(argv)))


def test_the_store_memory_options_have_their_defaults_in_the_help() -> None:
    text = add_serve_arguments(argparse.ArgumentParser(prog="lamina serve")).format_help()
    assert "--write-buffer-bytes" in text and str(DEFAULT_WRITE_BUFFER_BYTES) in text
    assert "--block-cache-bytes" in text and str(DEFAULT_BLOCK_CACHE_BYTES) in text
    assert _parse().memory == MemoryBounds()


def test_the_store_memory_options_reach_the_engine_bounds() -> None:
    config = _parse("--write-buffer-bytes", str(64 << 20), "--block-cache-bytes", str(16 << 20))
    assert config.memory == MemoryBounds(write_buffer_bytes=64 << 20,
                                         block_cache_bytes=16 << 20)


@pytest.mark.parametrize("argv, option", [
    (("--write-buffer-bytes", "1048576"), "--write-buffer-bytes"),
    (("--block-cache-bytes", "0"), "--block-cache-bytes"),
])
def test_store_memory_below_the_minimum_is_refused(argv, option) -> None:
    with pytest.raises(ConfigError, match=option):
        _parse(*argv)
