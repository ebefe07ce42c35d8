"""Fixtures and the trio runner for these tests (``tests/support/fixtures.py``)."""

from tests.support.fixtures import *  # noqa: F401,F403
