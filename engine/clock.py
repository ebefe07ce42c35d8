"""Time sources. The engine takes a callable returning epoch milliseconds, so tests move time
without sleeping; ``EngineClock`` turns any such source into the monotonic engine clock of
DESIGN.md §3."""

from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("lamina.engine.clock")

Clock = Callable[[], int]


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
    whose clock is behind the persisted one), now stands still and one warning is logged.
    """

    __slots__ = ("_source", "last_ms", "_warned")

    def __init__(self, source: Clock, last_ms: int = 0):
        self._source = source
        self.last_ms = last_ms
        self._warned = False

    def now(self) -> int:
        reading = self._source()
        if reading >= self.last_ms:
            self.last_ms = reading
            self._warned = False
        elif not self._warned:
            self._warned = True
            log.warning(
                "clock is %d ms behind the engine clock; holding time at %d",
                self.last_ms - reading, self.last_ms,
            )
        return self.last_ms
