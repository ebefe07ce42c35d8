"""Busy polling: when requests keep coming, the trio loop keeps polling the sockets for a short
window after the server goes idle, rather than sleeping (``lamina serve --busy-poll-us``).

Why: a CPU with nothing to run halts, and on a virtual machine waking it again (the interrupt
sent by the other CPU when a client's bytes arrive) costs tens of microseconds, more than a
small request's whole work. On the 2-core machine of bench/RESULTS.md one client's ping round
trips ran at 7,500/s with a server that slept between requests and 18,900/s with one that
polled for 100 µs after each; awaited one-message sends went from 4,700/s to 9,300/s. Clients
that send again as soon as they have an answer (a round-trip loop, a consumer's delete after
its receive, a producer waiting for its acknowledgement) find the server still awake.

Polling pays only when the next request comes within the window; otherwise the window is CPU
spent for nothing, and with sparse traffic (a request now and then) that would be all of it.
So polling adapts:

1. The window counts from the moment the server goes idle (nothing left to run), not from the
   read, so a request's own work does not use it up.
2. Polling is armed by a read that comes within the window of the server going idle (polling
   would have caught it): requests keep arriving within the window. How long the server was
   idle before a read is the wall time since the previous read less the CPU time its loop
   used since then (no task runs to watch for it). A read after a longer sleep does not arm
   polling: the server handles it and sleeps again, at no cost beyond two clock reads. Reads
   while polling keep it polling; a window that passes without a read ends it. So round trip
   after round trip polls, and a request now and then costs no polling at all.
3. Polling that does not pay backs off: after ``BACK_OFF_MISSES`` windows in a row that caught
   no read (traffic in short bursts, each window polled for nothing after its burst), only one
   chance to arm in ``PROBE_EVERY`` arms it, until a window catches a read again.
4. Polling is one task taking checkpoints: while it is runnable trio polls the sockets without
   blocking, and every other task runs as usual in between (a reader woken by its bytes, the
   applier, the timer). It never delays them by more than one task step. The loop's thread
   spending more than ``WORK_GAP_S`` of CPU time between two of its checkpoints means other
   tasks ran: the server was not idle. (CPU time, not wall time: a loop preempted by other
   processes did no work, and must not poll on for it.)
5. ``window_s`` 0 turns it off: the task returns at once and ``kick`` does nothing.
"""

from __future__ import annotations

import time

import trio

from lamina.wire.protocol import MAX_BUSY_POLL_US

__all__ = ["BusyPoll", "DEFAULT_BUSY_POLL_US", "MAX_BUSY_POLL_US"]

#: The default window: long enough for a client on the other CPU to turn an answer into its
#: next request (a Python client takes 30-60 µs), short enough that a window polled for nothing
#: after each burst of requests (rule 3 keeps those few) costs little.
DEFAULT_BUSY_POLL_US = 100
#: More CPU time than this between two of the polling task's checkpoints means other tasks ran
#: in between. A trio scheduler pass with nothing else to run takes 3.5 µs here at the median
#: and 14 at the 99th percentile, a request's work tens of µs or more: a pass slowed by an
#: interrupt only rarely looks like work (and then it extends the window once).
WORK_GAP_S = 50e-6
#: Rule 3: windows in a row that caught nothing before polling backs off, and then one chance
#: to arm in how many is taken (a probe: the traffic may have changed).
BACK_OFF_MISSES = 3
PROBE_EVERY = 16


class BusyPoll:
    """``kick()`` when a request's bytes arrive (a connection after every read; the SQS gateway
    once per request, on its first bytes); ``run()`` is the polling task (rules 1-5)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._polling = False
        self._read = False  # a read came while polling
        # A mark to tell how long the server was idle before a read (rule 2): a moment, and
        # the loop's CPU time then. Idle since = wall time since it - CPU time used since it.
        self._mark_s = -float("inf")
        self._mark_cpu_s = 0.0
        self._misses = 0  # windows in a row that caught no read (rule 3)
        self._chances = 0  # chances to arm while backing off (rule 3)
        self._wake = trio.Event()
        #: Windows polled (each ends with one window polled for nothing), reads that came
        #: while polling (each a wake-up saved), and the CPU seconds the polling task spent
        #: on its own checkpoints (what polling cost): for tests and for tuning.
        self.windows = 0
        self.caught = 0
        self.cpu_s = 0.0

    @property
    def polling(self) -> bool:
        """Whether the server is polling now (rule 2)."""
        return self._polling

    def kick(self) -> None:
        """Bytes were read: arm polling if they came within the window of the server going
        idle, unless it is backing off (rules 2-3)."""
        if not self.window_s:
            return
        if self._polling:
            self._read = True
            return
        now, now_cpu = time.perf_counter(), time.thread_time()
        idle_s = (now - self._mark_s) - (now_cpu - self._mark_cpu_s)
        self._mark_s, self._mark_cpu_s = now, now_cpu
        if idle_s <= self.window_s and self._may_arm():
            self._polling = True
            self.windows += 1
            self._wake.set()

    def _may_arm(self) -> bool:
        """Rule 3: always, unless the last windows caught nothing; then one chance in
        ``PROBE_EVERY``."""
        if self._misses < BACK_OFF_MISSES:
            return True
        self._chances += 1
        return self._chances % PROBE_EVERY == 0

    async def run(self) -> None:
        if not self.window_s:
            return  # rule 5
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self._poll()
            finally:
                self._polling = False

    async def _poll(self) -> None:
        """Take checkpoints until the server has been idle for the window (rules 1, 3, 4):
        a read starts the window again, the work of other tasks between two checkpoints
        pushes its end back by its CPU time."""
        clock, cpu, window_s = time.perf_counter, time.thread_time, self.window_s
        checkpoint = trio.lowlevel.checkpoint
        end, last_cpu = clock() + window_s, cpu()
        caught = 0
        while True:
            await checkpoint()  # rule 4
            now, now_cpu = clock(), cpu()
            worked = now_cpu - last_cpu
            last_cpu = now_cpu
            if self._read:  # requests keep arriving: poll on once idle
                self._read = False
                caught += 1
                end = now + window_s
            elif worked > WORK_GAP_S:  # other tasks ran: not idle (rule 1)
                end += worked
            else:
                self.cpu_s += worked
                if now >= end:  # a whole window without a read
                    self._mark_s, self._mark_cpu_s = now - window_s, now_cpu
                    self.caught += caught
                    self._misses = 0 if caught else self._misses + 1
                    return
