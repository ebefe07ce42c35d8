"""One trio wait for the plain-TCP connections waiting for bytes: the read hub.

A connection's reader task that has emptied its socket waits for more bytes. On its own that
is one trio wait a request: trio re-arms the socket in its epoll (one ``epoll_ctl``) and parks
and resumes the task. When several connections are busy (W1's and W2's four clients) the hub
serves them with one wait: a level-triggered ``select.epoll`` where each waiting connection is
registered once; one task waits on that epoll's own fd, polls it, and runs each ready
connection's read step inline (``HubReader.read_step``: read, parse, apply and answer a read
that needs no waiting: inplace.py). One wake-up then serves the requests
that arrived together, and a connection is not re-armed between its requests.

Rules of the hub (each one lives in this file, ``Connection._socket_reads`` keeps its side):

1. Only when it pays: a connection waits in the hub only while reads of several connections
   come close together: its last read came within ``SHARE_WINDOW_S`` of another
   connection's (the connections note their reads in ``last_reader`` and ``last_read_s``).
   A connection whose requests come by themselves (one client of round trips, beside idle
   ones) waits on its own socket as before: through the hub each of its requests would cost
   a poll more and save nothing. A reader whose read in the hub came by itself is handed
   back (its step returns False).
2. A reader stays registered while its steps end with its socket drained, nothing to wait
   for, and rule 1 still holding. A step that needs its task (requests for the applier's
   inbox, a backpressure wait, EOF, a protocol error, a read that did not drain the socket,
   shutdown, a read that came by itself) returns False: the hub unregisters it and
   reschedules its task, which goes on in its own loop with what the step read. A step that
   raises does the same, and the exception is raised in the reader's task: it ends that
   connection only (connection.py rule 7).
3. Cancellation unregisters at once: the parked task's abort callback (trio calls it
   synchronously when the task's cancel scope is cancelled: the idle deadline,
   ``stop_reading``, an abort) unregisters the fd. So when a reader's task runs again its fd
   is in no epoll, and no step runs for a connection whose task has left the wait; the task
   leaves its reading before the socket closes, so a closed fd, whose number the next
   connection may get, is never left registered.
4. Each ready connection gets one step a pass, in the order the poll gave them; a step does
   at most one read, so no connection holds the others back by more than that.
5. Busy polling (busypoll.py) sees the hub's readiness: trio's epoll watches the hub's fd like
   any socket's, and each step calls the connection's ``on_read`` as its own task's reads do.
6. When the hub's task ends (shutdown), every registered reader is handed back to its task
   and no reader joins any more (``open``); then the epoll is closed.
7. The hub never stops the server: should its own epoll calls fail (no step's error: those
   are the readers', rule 2), the failure is logged, every reader is handed back as in rule
   6, and the server goes on with each connection waiting on its own socket.
"""

from __future__ import annotations

import logging
import math
import select
from typing import Protocol

import outcome
import trio

__all__ = ["HubReader", "ReadHub", "SHARE_WINDOW_S"]

log = logging.getLogger("lamina.server")

#: Rule 1: reads of two connections this close together make waiting in the hub pay. W1's
#: four producers read every 0.1-0.2 ms between them; a wake-up of the hub that finds one
#: connection ready costs a poll (about 1-2 µs) more than the connection's own wait.
SHARE_WINDOW_S = 0.001


class HubReader(Protocol):
    def read_step(self) -> bool:
        """One read of the socket, handled now if it can be. True: done, and the socket is
        drained: wait for bytes again. False: the reader's task has more to do (rule 2)."""


class ReadHub:
    """The hub (rules 1-6): ``wait`` parks a reader's task until a step of it needs the task;
    ``run`` is the hub's own task."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._readers: dict[int, tuple[HubReader, trio.lowlevel.Task]] = {}
        #: Readers may join (rule 6).
        self.open = True
        #: Rule 1: who read last (a connection's key) and when (``time.perf_counter``).
        self.last_reader = 0
        self.last_read_s = -math.inf
        #: Passes (one wait and one poll) and the read steps run in them: for tests, and
        #: logged when the server stops.
        self.passes = 0
        self.steps = 0

    @property
    def registered(self) -> int:
        """Readers waiting in the hub now."""
        return len(self._readers)

    async def wait(self, fd: int, reader: HubReader) -> None:
        """Park the calling task until ``reader.read_step()`` returns False or raises (rule 2),
        or the hub ends (rule 6); cancellable (rule 3)."""
        self._readers[fd] = (reader, trio.lowlevel.current_task())
        self._epoll.register(fd, select.EPOLLIN)

        def abort(_: object) -> trio.lowlevel.Abort:
            del self._readers[fd]
            self._epoll.unregister(fd)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def run(self) -> None:
        epoll, readers = self._epoll, self._readers
        try:
            epoll_fd, poll = epoll.fileno(), epoll.poll
            wait_readable, reschedule = trio.lowlevel.wait_readable, trio.lowlevel.reschedule
            while True:
                await wait_readable(epoll_fd)
                ready = poll(0)
                self.passes += 1
                self.steps += len(ready)
                for fd, _ in ready:
                    entry = readers.get(fd)
                    if entry is None:  # handed back earlier in this pass
                        continue
                    reader, task = entry
                    try:
                        stays = reader.read_step()
                        result: outcome.Outcome[None] = outcome.Value(None)
                    except Exception as exc:  # rule 2: raised in the reader's task
                        stays, result = False, outcome.Error(exc)
                    if stays or readers.get(fd) is not entry:
                        continue  # (not registered: the step ended its own connection, rule 3)
                    del readers[fd]
                    reschedule(task, result)  # first: its task goes on whatever follows
                    epoll.unregister(fd)
        except Exception:  # rule 7
            log.exception("the read hub failed; each connection now waits on its own socket",
                          extra={"event": "read_hub_failed"})
        finally:
            self.open = False
            epoll.close()  # drops every registration at once (rule 6)
            for _, task in readers.values():
                trio.lowlevel.reschedule(task, outcome.Value(None))
            readers.clear()
