"""Time sources. The engine takes a callable returning epoch milliseconds, so tests move time
without sleeping; ``EngineClock`` turns any such source into the monotonic engine clock of
DESIGN.md §3."""

from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("lamina.engine.clock")

Clock = Callable[[], int]

# How far ahead of the engine clock the store's clock row may be (docs/STORAGE.md "The
# clock"): an operation writes the row only when ``now`` passes the value it holds.
CLOCK_AHEAD_MS = 100


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class FakeClock:
    """A settable clock for tests: ``clock.advance(1500)`` moves it 1.5 s forward."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    def set(self, ms: int) -> None:
        self.now_ms = ms


class EngineClock:
    """``now = max(source(), last now)``: never goes backwards.

    While the source is behind the last value (a wall-clock step back, or a restart on a machine
    whose clock is behind the persisted one), now stands still and one warning is logged —
    unless it is behind by no more than ``quiet_ms`` before it first catches up (the store
    keeps a ceiling of the clock, up to ``CLOCK_AHEAD_MS`` ahead: a quick restart starts there).
    """

    __slots__ = ("_source", "last_ms", "_warned", "_quiet_ms")

    def __init__(self, source: Clock, last_ms: int = 0, quiet_ms: int = 0):
        self._source = source
        self.last_ms = last_ms
        self._warned = False
        self._quiet_ms = quiet_ms

    def now(self) -> int:
        reading = self._source()
        if reading >= self.last_ms:
            self.last_ms = reading
            if self._warned or self._quiet_ms:  # caught up: a later step back warns again
                self._warned = False
                self._quiet_ms = 0
            return reading
        if not self._warned and self.last_ms - reading > self._quiet_ms:
            self._warned = True
            log.warning(
                "clock is %d ms behind the engine clock; holding time at %d",
                self.last_ms - reading, self.last_ms,
                extra={"event": "clock_behind", "behind_ms": self.last_ms - reading},
            )
        return self.last_ms
