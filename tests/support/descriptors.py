"""Running the test process out of file descriptors for a while."""

from __future__ import annotations

import errno
import os
import resource
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def out_of_descriptors() -> Iterator[None]:
    """Inside the block every descriptor below a lowered soft limit is taken, so ``accept``
    fails with EMFILE; both are given back after it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare: list[int] = []
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    try:
        while True:  # take every free descriptor below the limit
            try:
                spare.append(os.dup(0))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
