"""A streaming stage's link with its caller (futures): each task's end goes out as it
comes, and the caller may give up on one task while the others run on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: ``on_task(index, result, error)``: a task of a streaming stage ended.
OnTask = Callable[[int, Any, "BaseException | None"], None]


class TaskStream:
    """Made by the caller before the stage runs, handed to ``Executor.execute``.

    ``on_task`` is called on the executor's events thread as each task ends (it must
    not wait). :meth:`cancel` may come from any thread at any time, also before the
    executor has submitted the stage: the executor :meth:`attach`-es once it has, and
    then hears of every cancellation, earlier ones included.
    """

    def __init__(self, on_task: OnTask) -> None:
        self.on_task = on_task
        self._lock = threading.Lock()
        self._cancelled: dict[int, BaseException] = {}
        self._stop: Callable[[int, BaseException], None] | None = None

    def cancel(self, index: int, error: BaseException) -> None:
        """End task ``index`` with ``error`` (stopping it if it runs), unless it ended."""
        with self._lock:
            self._cancelled.setdefault(index, error)
            stop = self._stop
        if stop is not None:
            stop(index, error)

    def attach(self, stop: Callable[[int, BaseException], None]) -> dict[int, BaseException]:
        """The executor's way to stop a task from now on; returns the cancellations so far."""
        with self._lock:
            self._stop = stop
            return dict(self._cancelled)
