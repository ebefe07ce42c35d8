"""``--profile FILE``: py-spy sampling the server process during a workload's measured phase.

The file's suffix picks py-spy's format: ``.svg`` a flame graph, ``.json`` speedscope, anything
else ``raw`` (collapsed stacks, one ``frame;frame;... count`` line per stack: what
:func:`top_functions` reads). Sampling is ``--nonblocking`` so the server is not paused.

py-spy samples wall time of threads that are not idle, so a server that is runnable but not
running (preempted: on a shared 2-core machine every response that wakes a client can hand
it the CPU) is charged to whatever line it stopped at, typically the socket write. With
``gil=True`` (``--profile-gil``) only samples holding the GIL count: closer to the Python CPU
time, leaving out system calls (which release the GIL).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

__all__ = ["AREAS", "PySpy", "by_area", "top_functions"]

_FORMATS = {".svg": "flamegraph", ".json": "speedscope"}


def _py_spy() -> str:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy")
    return found


class PySpy:
    """``start()`` attaches to ``pid``; ``stop()`` ends the recording and writes ``output``."""

    def __init__(self, pid: int, output: Path, rate_hz: int = 1000, gil: bool = False) -> None:
        self.pid, self.output, self.rate_hz = pid, output, rate_hz
        self._process: subprocess.Popen[bytes] | None = None
        self._command = [_py_spy(), "record", "--pid", str(pid), "--rate", str(rate_hz),
                         "--nonblocking", "--format", _FORMATS.get(output.suffix, "raw"),
                         "--output", str(output), *(["--gil"] if gil else [])]

    def start(self) -> None:
        self._process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            _, err = self._process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, err = self._process.communicate()
        if not self.output.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")


def _samples(raw: Path) -> Iterator[tuple[str, int]]:
    """The (stack, samples) lines of a ``raw`` profile. Lines are split at newlines only (a
    frame's text may hold a carriage return), and a line without a stack and a count, as a
    profile cut off mid-line, is skipped."""
    for line in raw.read_bytes().decode(errors="replace").split("\n"):
        stack, _, count_text = line.rpartition(" ")
        if stack and count_text.strip().isdigit():
            yield stack, int(count_text)


def top_functions(raw: Path, limit: int = 30) -> tuple[int, list[tuple[str, int, int]]]:
    """From a ``raw`` profile: (total samples, [(function, self samples, inclusive samples)])
    sorted by inclusive samples. A function is ``name (file:line)`` as py-spy names frames,
    with the line number dropped so a function's lines add up."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for stack, count in _samples(raw):
        total += count
        frames = [_function(frame) for frame in stack.split(";")]
        self_counts[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    rows = [(name, self_counts[name], inclusive[name]) for name in inclusive]
    rows.sort(key=lambda row: -row[2])
    return total, rows[:limit]


#: Where a server sample belongs, by the first rule (in this order) any of whose words appears
#: in one of its frames: the engine's own work first, then the server's layers, trio last.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine: db.write (Store.flush)", ("Store.flush",)),
    ("engine: send loop (append: md5, record, batch put, Sent)", ("appending.py",
                                                                  "Appender.append")),
    ("engine: receive (Lessor, leases, receipts)", ("MessagingOps.receive", "Lessor.")),
    ("engine: delete", ("MessagingOps.delete",)),
    ("engine: send, the rest (counters, checks)", ("MessagingOps.send",)),
    ("engine: operation frame and the rest", ("lamina/engine/",)),
    ("metrics (prometheus_client)", ("prometheus_client", "ServerMetrics")),
    ("server: write answers (queue_frame: os.write)", ("Outbox.queue_frame",)),
    ("server: encode answers (CBOR)", ("Connection.answer", "ServerConnection.respond",
                                       "encode_response", "encode_message")),
    ("server: parse requests (framing, CBOR decode)", ("ServerConnection.receive_data",
                                                       "decode_item", "FrameReader")),
    ("server: socket reads (receive_some)", ("SocketStream.receive_some", "trio/_socket.py")),
    ("server: dispatch (check_request, apply_operation)", ("dispatch.py",
                                                           "Server._apply_request")),
    ("server: waiting receives", ("waiters.py", "receives.py")),
    ("server: busy polling", ("busypoll.py",)),
    ("server: applier and group commit", ("GroupApplier.", "groups.py")),
    ("server: connection reader (channels to the applier)", ("Connection._reader",
                                                             "Connection._handle",
                                                             "trio/_channel.py")),
    ("trio: scheduler, cancel scopes, epoll", ("trio/",)),
)


def by_area(raw: Path) -> tuple[int, list[tuple[str, int]]]:
    """From a ``raw`` server profile: (total samples, [(area, samples)]) by :data:`AREAS`,
    largest first; what matches no rule is "other"."""
    counts: Counter[str] = Counter()
    total = 0
    for stack, count in _samples(raw):
        frames = stack.split(";")
        area = next((name for name, words in AREAS
                     if any(word in frame for frame in frames for word in words)), "other")
        counts[area] += count
        total += count
    return total, counts.most_common()


def main(argv: list[str] | None = None) -> int:
    """``python -m lamina.bench.profiler RAW [US_PER_UNIT]``: the areas and the top functions
    of a raw profile; with ``US_PER_UNIT`` (CPU µs per message or request) also µs per area."""
    args = sys.argv[1:] if argv is None else argv
    path, scale = Path(args[0]), float(args[1]) if len(args) > 1 else None
    total, areas = by_area(path)
    print(f"{total} samples")
    for name, count in areas:
        share = count / total
        print(f"{share * 100:5.1f}%" + (f" {share * scale:8.1f} µs" if scale else "") + f"  {name}")
    print()
    _, rows = top_functions(path)
    for name, own, inclusive in rows:
        print(f"{inclusive / total * 100:5.1f}% incl {own / total * 100:5.1f}% self  {name}")
    return 0


def _function(frame: str) -> str:
    """``send (lamina/engine/messaging.py:163)`` -> ``send (lamina/engine/messaging.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


if __name__ == "__main__":
    sys.exit(main())
