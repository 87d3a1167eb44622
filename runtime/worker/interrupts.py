"""Stopping a running task on a worker: an exception raised in the thread that runs it.

When the driver cancels a stage (Ctrl-C, a timeout, a failed task), the attempts it has
running are interrupted: :class:`TaskInterrupted` is raised in the task's thread, as
``KeyboardInterrupt`` is raised in a notebook's (``PyThreadState_SetAsyncExc``, the call
behind ipyparallel's abort and Dask's ``cancel(force=True)`` of a running task). It is
a ``BaseException``: a task's ``except Exception`` does not swallow it.

Python delivers such an exception at its next bytecode check, so it stops a Python loop
or a call that returns, not a long C call (``time.sleep``, a BLAS routine): the
driver kills and replaces a worker whose task does not stop within its grace period.

The exception is raised only while the thread runs the user's code
(:meth:`Interrupter.user_code`): one delivered later would tear the worker's own state
(a page read set half ended, a report half sent). One raised but not delivered by the
time the user's code returns is withdrawn.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Collection, Iterator

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class TaskInterrupted(BaseException):
    """Raised in a task's thread: its stage was cancelled (the result is not wanted)."""


class Interrupter:
    """Raises :class:`TaskInterrupted` in the thread running a given attempt, only while
    that thread runs the user's code, at most once per attempt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: tuple[int, int] | None = None  # (attempt id, thread ident) in user code
        self._raised: int | None = None  # the attempt interrupted, not known to be delivered

    @contextlib.contextmanager
    def user_code(self, attempt_id: int) -> Iterator[None]:
        """The block where attempt ``attempt_id`` may be interrupted (this thread runs it)."""
        me = threading.get_ident()
        with self._lock:
            self._running, self._raised = (attempt_id, me), None
        try:
            yield
        finally:
            with self._lock:
                self._running = None
                raised, self._raised = self._raised == attempt_id, None
            if raised:  # delivered (then this clears nothing) or still pending: withdraw it
                _set_async_exc(ctypes.c_ulong(me), None)

    def interrupt(self, attempt_ids: Collection[int]) -> bool:
        """Raise in the thread running one of ``attempt_ids``, if it runs user code now;
        whether it was raised (now or before)."""
        with self._lock:
            if self._running is None or self._running[0] not in attempt_ids:
                return False
            attempt_id, thread = self._running
            if self._raised != attempt_id:
                self._raised = attempt_id
                _set_async_exc(ctypes.c_ulong(thread), ctypes.py_object(TaskInterrupted))
            return True
