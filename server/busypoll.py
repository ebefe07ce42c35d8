"""Busy polling: after each read the trio loop keeps polling the sockets, rather than sleeping,
for a short window (``lamina serve --busy-poll-us``).

Why: a CPU with nothing to run halts, and on a virtual machine waking it again (the interrupt
sent by the other CPU when a client's bytes arrive) costs tens of microseconds, more than a
small request's whole work. On the 2-core machine of bench/RESULTS.md one client's ping round
trips ran at 7,500/s with a server that slept between requests and 18,900/s with one that
polled for 100 µs after each; awaited one-message sends went from 4,700/s to 9,300/s. Clients
that send again as soon as they have an answer (a round-trip loop, a consumer's delete after
its receive, a producer waiting for its acknowledgement) find the server still awake.

Rules:

1. Polling happens only within ``window_s`` of the last read on any connection, so it spends
   at most that much CPU after the last request; a server without traffic sleeps.
2. Polling is one task taking checkpoints: while it is runnable trio polls the sockets without
   blocking, and every other task runs as usual in between (a reader woken by its bytes, the
   applier, the timer). It never delays them by more than one task step.
3. ``window_s`` 0 turns it off: the task returns at once and ``kick`` does nothing.
"""

from __future__ import annotations

import time

import trio

__all__ = ["BusyPoll", "DEFAULT_BUSY_POLL_US", "MAX_BUSY_POLL_US"]

#: The default window: long enough for a client on the other CPU to turn an answer into its
#: next request (a Python client takes 30-60 µs), short enough that sparse traffic (W3: one
#: request per 500 µs) costs a fifth of a core at most.
DEFAULT_BUSY_POLL_US = 100
#: The longest window allowed (server and clients): polling is for the gap between an answer
#: and the next request, not a way to keep a core busy.
MAX_BUSY_POLL_US = 10_000


class BusyPoll:
    """``kick()`` after every read; ``run()`` is the polling task (rules 1-3)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._until = 0.0
        self._polling = False
        self._wake = trio.Event()

    @property
    def polling(self) -> bool:
        """Whether the task is polling now (within the window of the last read)."""
        return self._polling

    def kick(self) -> None:
        """Bytes were read: keep polling until ``window_s`` from now (rule 1)."""
        if self.window_s:
            self._until = time.perf_counter() + self.window_s
            if not self._polling:
                self._wake.set()

    async def run(self) -> None:
        if not self.window_s:
            return  # rule 3
        clock, checkpoint = time.perf_counter, trio.lowlevel.checkpoint
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._polling = True
            try:
                while clock() < self._until:
                    await checkpoint()  # rule 2
            finally:
                self._polling = False
