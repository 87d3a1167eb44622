"""Waiting in tests for what another thread or process reports a little later.

Counters are bumped after the work they count (a server counts a reply once it is sent;
a one-way notice reaches the driver after the task that sent it has ended), so a test
reads them with :func:`wait_for` instead of at once. Processes told to exit take a
moment too: :func:`still_running`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import psutil


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Return as soon as ``predicate()`` is true; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s" + (f": {what}" if what else "")
        time.sleep(0.01)


def exited(pid: int) -> bool:
    """Whether process ``pid`` no longer runs: gone, or a zombie. A process that exits
    between two looks at it is gone, not an error."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def still_running(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Wait up to ``timeout`` s for every process of ``pids`` to exit; those still running."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (running := [p for p in pids if not exited(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running
