"""Waiting in tests for what another thread or process reports a little later.

Counters are bumped after the work they count (a server counts a reply once it is sent;
a one-way notice reaches the driver after the task that sent it has ended), so a test
reads them with :func:`wait_for` instead of at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Return as soon as ``predicate()`` is true; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s" + (f": {what}" if what else "")
        time.sleep(0.01)
