"""Time limits on actions: ``collect(timeout=...)``, ``cluster.run(..., timeout=...)``,
``Cluster(action_timeout=...)``.

An action sets a deadline for the stages it runs on its own thread (:func:`limit`); the
executor waits for each stage only until then, and then cancels it like a Ctrl-C
(its running tasks are stopped) and raises :class:`~clamor.runtime.errors.ActionTimeoutError`.
Nested limits keep the nearer deadline. A thread-local, so that actions on other
threads (a second notebook thread, a background job) keep their own.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator

_local = threading.local()


def check(seconds: float | None, what: str = "timeout") -> float | None:
    """``seconds`` if it is a valid time limit (a number > 0, or ``None``: none)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0 \
            or math.isnan(seconds):  # fmt: skip
        raise ValueError(f"{what} must be a number of seconds > 0 (or None), not {seconds!r}")
    return float(seconds)


@contextlib.contextmanager
def limit(seconds: float | None, action: str) -> Iterator[None]:
    """Run the block's stages within ``seconds`` (``None``: no limit of its own)."""
    seconds = check(seconds)
    outer = getattr(_local, "deadline", None)
    if seconds is None:
        yield
        return
    at = time.monotonic() + seconds
    if outer is not None and outer[0] <= at:
        yield
        return
    _local.deadline = (at, seconds, action)
    try:
        yield
    finally:
        _local.deadline = outer


def current() -> tuple[float, float, str] | None:
    """This thread's deadline: ``(monotonic time, the limit in seconds, the action)``."""
    return getattr(_local, "deadline", None)
