"""Busy polling: after the server goes idle, the trio loop keeps polling the sockets for a
short window rather than sleeping, when recent traffic says that pays (``lamina serve
--busy-poll-us``).

Why: a CPU with nothing to run halts, and on a virtual machine waking it again (the interrupt
sent by the other CPU when a client's bytes arrive) costs tens of microseconds of latency, and
the caches it refills cost CPU. On the 2-core machine of bench/RESULTS.md one client's ping
round trips ran at 7,500/s with a server that slept between requests and 18,900/s with one
that polled for 100 µs after each; awaited one-message sends went from 4,700/s to 9,300/s.

Polling pays only when the next request comes soon after the server went idle; a window that
passes without a read is CPU spent for nothing, and with sparse traffic that would be all of
it. So the window adapts to the traffic (``PollPolicy``, a ski-rental rule on measured gaps),
and to who read last (rule 6):

1. Every read that ends an idle spell of the server is one observation: the *gap*, how long
   the server was idle before it. Polling for a window ``w`` would have cost ``gap`` of CPU
   for a gap up to ``w`` (and saved a wake-up), and ``w`` plus the wake-up for a longer gap.
   The price of a wake-up is the longest window allowed, ``--busy-poll-us``: polling never
   spends more on a gap than sleeping through it would have cost, twice over at worst.
2. Gaps go to a histogram of ``BUCKETS`` buckets of ``max_window / BUCKETS`` (and one of
   longer gaps), counted with their sums. Every ``EPOCH`` observations the policy picks the
   window, a multiple of the bucket width or none, that would have cost the least over the
   histogram (of windows within ``TIE_SLACK`` of the least, the longest: a catch also saves
   latency, which the cost does not count); then the histogram's weights are halved, so the
   recent traffic counts most. Until the first epoch, and while no window beats sleeping,
   the server does not poll.
3. Gaps are measured whether the server polls or not: asleep, the gap of a read is the wall
   time since the previous read less the CPU time the loop used since then (no task runs to
   watch for it); polling, it is how long the polling task had seen the loop idle. So a
   change of traffic shows in the next epoch, polling or not, with no probing. (Asleep, a
   gap includes the wake-up's delay: the rule leans to sleeping, never to polling.)
4. The window counts from the moment the server goes idle (nothing left to run), not from
   the read, so a request's own work does not use it up; a read while polling starts it
   again, with the window of its reader's policy (none: polling ends at once, not after one
   more pass of the scheduler). Polling is one task taking checkpoints: while it is
   runnable trio polls the sockets without blocking, and every other task runs as usual in
   between (a reader woken by its bytes, the applier, the timer). It never delays them by
   more than one task step. The loop's thread spending more than ``WORK_GAP_S`` of CPU time
   between two of its checkpoints means other tasks ran: the server was not idle. (CPU
   time, not wall time: a loop preempted by other processes did no work, and must not poll
   on for it.)
5. ``--busy-poll-us 0`` turns it off: the task returns at once and ``kick`` does nothing.
6. Each reader (a connection: ``reader_kick``) has a policy of its own, fed the gaps that
   followed its reads: the window after a read is chosen from what came after that reader's
   earlier reads. A consumer's long poll is re-issued right after the send that woke it was
   answered, while the producer's next send waits for its schedule: after the send's read
   polling pays, after the last of the consumer's it does not, and one policy for both would
   poll after every read or after none. One connection of round trips gets what one policy
   for all would give it. Reads without a reader of their own (the SQS gateway's) share one.
7. A reader's policy depends on the read just before too: a read that came soon after
   another reader's (a gap a window could catch, or caught) has a policy per reader it
   followed (``ReaderPolicies``, up to ``CONTEXTS`` of them, the rest sharing the reader's
   own); a read after a longer idle spell, or after its own reader's, has its reader's own.
   A consumer with two connections (its long poll re-issued on one, its deletes on the
   other, in either order) sends two reads after each send that wakes it: whichever comes
   second is followed by a long idle spell, whichever first by a short one, so one policy
   per connection saw half of each and polled a window for nothing after the second; keyed
   by the read before, the two are told apart.

A read that comes while the server is busy (an idle spell under ``MIN_GAP_S``) is no
observation: polling would neither have cost nor saved anything for it.
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Awaitable, Callable

import trio

from lamina.wire.protocol import MAX_BUSY_POLL_US

__all__ = ["BUCKETS", "BusyPoll", "CONTEXTS", "DEFAULT_BUSY_POLL_US", "EPOCH",
           "MAX_BUSY_POLL_US", "PollPolicy", "ReaderPolicies"]

#: The default longest window, and the price of a wake-up (rule 1): long enough for a client
#: on the other CPU to turn an answer into its next request (a Python client takes 30-60 µs).
DEFAULT_BUSY_POLL_US = 100
#: More CPU time than this between two of the polling task's checkpoints means other tasks ran
#: in between. A trio scheduler pass with nothing else to run takes 3.5 µs here at the median
#: and 14 at the 99th percentile, a request's work tens of µs or more: a pass slowed by an
#: interrupt only rarely looks like work (and then it extends the window once).
WORK_GAP_S = 50e-6
#: Rule 2: the histogram's buckets up to the longest window, and the observations between two
#: choices of the window.
BUCKETS = 8
EPOCH = 32
#: Rule 2: windows costing at most this much more than the cheapest count as cheap, and the
#: longest of them is taken: the cost counts CPU, but each read a window catches also saves
#: the latency of a wake-up (the longer window catches more of a ragged tail of gaps). The
#: gaps of round trips traced here (most under 20 µs, a tail to 150) replayed through the rule
#: got windows of 68 µs on average and 81 % of the reads caught at 0.1; 97 µs and 84 % at 0.25.
TIE_SLACK = 0.25
#: Shorter idle spells before a read are no observation (the server was busy).
MIN_GAP_S = 1e-6
#: Rule 7: the readers followed closely that a reader keeps a policy for (each a few hundred
#: bytes, made on the first such read); reads after others share the reader's own policy.
CONTEXTS = 4


class PollPolicy:
    """Rules 1-2: fed the gaps before reads (``observe``), it says how long to poll after the
    server goes idle (``window_s``, 0: sleep). Pure: no clock, no trio."""

    def __init__(self, max_window_s: float) -> None:
        self.max_window_s = max_window_s
        self._bucket_s = max_window_s / BUCKETS
        # Decayed counts and sums of gaps per bucket; the last bucket: longer than the window.
        self._counts = [0.0] * (BUCKETS + 1)
        self._sums = [0.0] * (BUCKETS + 1)
        self._seen = 0  # observations since the last choice
        #: The window to poll for now (0: do not poll).
        self.window_s = 0.0

    def observe(self, gap_s: float) -> None:
        """A read came after the server had been idle ``gap_s`` (rule 1)."""
        index = int(gap_s / self._bucket_s) if gap_s < self.max_window_s else BUCKETS
        if index < BUCKETS:
            self._counts[index] += 1.0
            self._sums[index] += gap_s
        else:
            self._counts[BUCKETS] += 1.0
        self._seen += 1
        if self._seen >= EPOCH:
            self._choose()

    def cost_s(self, window_s: float) -> float:
        """What polling for ``window_s`` (a multiple of the bucket width, or 0) after each
        idle spell would have cost over the histogram, a wake-up priced at the longest
        window (rule 1)."""
        price = self.max_window_s
        caught = int(round(window_s / self._bucket_s)) if self._bucket_s else 0
        spent = sum(self._sums[:caught])
        missed = sum(self._counts[caught:])
        return spent + missed * (window_s + price)

    def _choose(self) -> None:
        """Rule 2: the longest window within ``TIE_SLACK`` of the cheapest, if that beats
        sleeping; then halve the weights."""
        sleeping = self.cost_s(0.0)  # never polling: a wake-up for every gap
        costs = [(self.cost_s(window_s), window_s)
                 for window_s in ((index + 1) * self._bucket_s for index in range(BUCKETS))]
        bound = min(sleeping, min(costs)[0] * (1 + TIE_SLACK))
        self.window_s = max((window_s for cost, window_s in costs
                             if cost <= bound and cost < sleeping), default=0.0)
        self._counts = [count / 2 for count in self._counts]
        self._sums = [total / 2 for total in self._sums]
        self._seen = 0


class ReaderPolicies:
    """Rule 7: one reader's policies: its own (``alone``: reads after an idle spell, or after
    readers past the first ``CONTEXTS``) and one per reader its reads came soon after."""

    __slots__ = ("serial", "alone", "_after")

    def __init__(self, serial: int, max_window_s: float) -> None:
        self.serial = serial  # keys other readers' policies: no reference to this one is kept
        self.alone = PollPolicy(max_window_s)
        self._after: dict[int, PollPolicy] = {}

    def after(self, previous: ReaderPolicies | None) -> PollPolicy:
        """The policy of a read that came soon after one of ``previous`` (None: after an idle
        spell, or a read without a reader of its own)."""
        if previous is None or previous is self:
            return self.alone
        policy = self._after.get(previous.serial)
        if policy is None:
            if len(self._after) >= CONTEXTS:
                return self.alone
            policy = self._after[previous.serial] = PollPolicy(self.alone.max_window_s)
        return policy


class BusyPoll:
    """``kick()`` when a request's bytes arrive (a connection after every read; the SQS gateway
    once per request, on its first bytes); ``run()`` is the polling task (rules 3-5).
    ``clock`` and ``cpu_clock`` (wall time and the loop thread's CPU time, seconds) are
    replaceable for tests."""

    def __init__(self, window_s: float, *, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self.window_s = window_s
        #: The policy of reads without a reader of their own (rule 6).
        self.policy = PollPolicy(window_s)
        self._clock, self._cpu_clock = clock, cpu_clock
        self._polling = False
        self._read = False  # a read came while polling
        #: Rule 6: the policy of the last read (it chooses the window after it, and is fed
        #: the gap that follows), and while polling that of the read before a caught one.
        self._last = self.policy
        self._caught_after = self.policy
        #: Rule 7: the reader of the last read (None: one without a reader of its own).
        self._last_reader: ReaderPolicies | None = None
        self._serials = itertools.count()
        # Rule 3, asleep: a mark to tell how long the server was idle before a read (a moment
        # and the loop's CPU time then). Idle since = wall time since it - CPU time used since.
        self._mark_s, self._mark_cpu_s = clock(), cpu_clock()
        self._wake = trio.Event()
        #: Windows polled, reads that came while polling (each a wake-up saved), the CPU
        #: seconds the polling task spent on its own checkpoints (what polling cost), and of
        #: those the ones after a window's last read (polled for nothing): for tests, for
        #: tuning, and logged when the server stops.
        self.windows = 0
        self.caught = 0
        self.cpu_s = 0.0
        self.wasted_cpu_s = 0.0

    @property
    def window_now_s(self) -> float:
        """The window the last read's reader would poll for (rule 6)."""
        return self._last.window_s

    @property
    def polling(self) -> bool:
        """Whether the server is polling now."""
        return self._polling

    def reader_kick(self) -> Callable[[], None]:
        """``kick`` for one reader (a connection), with policies of its own (rules 6, 7)."""
        return functools.partial(self.kick, ReaderPolicies(next(self._serials), self.window_s))

    def kick(self, reader: ReaderPolicies | None = None) -> None:
        """Bytes were read (by ``reader``; None: one without policies of its own): observe
        the gap before them (rule 3) for the read before, and poll once the server is idle
        again if the policy of this reader after the last read's says so (rules 6, 7)."""
        if not self.window_s:
            return
        if self._polling:
            self._read = True  # the polling task observes its gap
            policy = self.policy if reader is None else reader.after(self._last_reader)
            self._caught_after, self._last = self._last, policy
            self._last_reader = reader
            return
        now, now_cpu = self._clock(), self._cpu_clock()
        idle_s = (now - self._mark_s) - (now_cpu - self._mark_cpu_s)
        self._mark_s, self._mark_cpu_s = now, now_cpu
        if idle_s >= MIN_GAP_S:
            self._last.observe(idle_s)
        if reader is None:
            policy = self.policy
        else:  # rule 7: after an idle spell no window could span, the reader's own
            policy = reader.after(self._last_reader if idle_s < self.window_s else None)
        self._last, self._last_reader = policy, reader
        if policy.window_s:
            self._polling = True
            self.windows += 1
            self._wake.set()

    async def run(self) -> None:
        if not self.window_s:
            return  # rule 5
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self.poll_window(trio.lowlevel.checkpoint)

    async def poll_window(self, checkpoint: Callable[[], Awaitable[object]]) -> None:
        """Take checkpoints until the server has been idle for the policy's window (rule 4):
        a read starts the window again (its gap observed), the work of other tasks between
        two checkpoints pushes its start back by its CPU time."""
        try:
            await self._poll(checkpoint)
        finally:
            self._polling = False

    async def _poll(self, checkpoint: Callable[[], Awaitable[object]]) -> None:
        clock, cpu = self._clock, self._cpu_clock
        idle_since, last_now, last_cpu = clock(), clock(), cpu()
        since_read_cpu_s = 0.0  # polled since the window's last read
        while True:
            await checkpoint()  # rule 4
            now, now_cpu = clock(), cpu()
            worked = now_cpu - last_cpu
            last_cpu = now_cpu
            if self._read:  # requests keep coming: poll on once idle
                self._read = False
                self.caught += 1
                gap_s = last_now - idle_since  # idle until the read's task ran
                if gap_s >= MIN_GAP_S:
                    self._caught_after.observe(gap_s)
                if not self._last.window_s:  # its reader's policy polls no more: sleep now
                    self._mark_s, self._mark_cpu_s = now, now_cpu
                    return
                idle_since = now
                since_read_cpu_s = 0.0
            elif worked > WORK_GAP_S:  # other tasks ran: not idle
                idle_since += worked
            else:
                self.cpu_s += worked
                since_read_cpu_s += worked
                window_s = self._last.window_s  # rule 6: the last reader's
                if now - idle_since >= window_s:  # the window passed without a read
                    self._mark_s, self._mark_cpu_s = idle_since, now_cpu
                    self.wasted_cpu_s += since_read_cpu_s
                    return
            last_now = now
