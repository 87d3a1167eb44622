"""The scheduler's events, run one batch at a time, in the order posted.

The scheduler's state machine is not thread-safe: its events (a stage submitted, tasks
finished, a worker lost, ...) are queued and run in order, one thread at a time, under
one lock. The loop thread runs what is posted with :meth:`EventLoop.post`. A thread may
instead run what it posts itself (:meth:`EventLoop.post_here`) unless another thread is
running events: that saves waking the loop thread (a thread switch) for every result
message a task stream's reader gets, and for every stage the caller starts. The main
thread holds Ctrl-C meanwhile (:func:`interrupts_held`), so that a ``KeyboardInterrupt``
never stops an event half done. The one thread reading every plain task stream
(runtime/net/stream_server.py) gathers what it read in one wake-up and runs it itself
(:meth:`EventLoop.gathering`), waiting for a thread running events: handing its results
over had that thread and the reader take turns with the GIL. Events queued together run
as one batch (up to 1,024), so that their launches to one worker go in one message.
"""

from __future__ import annotations

import _signal
import collections
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: An event: called with the scheduler state, it returns the instructions to carry out.
Event = Callable[[Any], list]


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C, a notebook's interrupt) while the block runs; raise the
    ``KeyboardInterrupt`` after it if one came. Only the main thread gets SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    # _signal, not signal: the latter's enum conversion of the handler it returns (a
    # ValueError caught inside) made the pair cost 16 us, 0.8 us this way: every stage pays it
    previous = _signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        _signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if came:
        raise KeyboardInterrupt


class EventLoop:
    """Runs queued events with ``run_batch(events)``, in order, on one thread at a time."""

    def __init__(self, run_batch: Callable[[list[Event]], None]) -> None:
        self._run_batch = run_batch
        self._queue: collections.deque[Event] = collections.deque()
        self._wake = threading.Condition()
        self._lock = threading.Lock()  # held by the thread running events
        self._stopped = False
        self._here = threading.local()  # .gathering: this thread is in gathering()
        #: The thread running events now (``None``: none).
        self.runner: threading.Thread | None = None
        self.thread = threading.Thread(target=self._loop, name="clamor-scheduler", daemon=True)
        self.thread.start()

    def post(self, event: Event) -> None:
        """Queue ``event`` for the loop thread."""
        self._queue.append(event)
        with self._wake:
            self._wake.notify()

    def post_here(self, events: list[Event]) -> None:
        """Queue ``events`` and run what is queued on this thread, unless another thread
        is running events (it runs these too, or the loop thread does); in
        :meth:`gathering`, on its way out. A ``KeyboardInterrupt`` that came meanwhile
        is raised once they ran."""
        self._queue.extend(events)
        if getattr(self._here, "gathering", False):
            return
        if self._lock.acquire(blocking=False):
            try:
                with interrupts_held():
                    self._drain()
            finally:
                self._lock.release()
            if not self._queue:
                return
        with self._wake:
            self._wake.notify()

    @contextlib.contextmanager
    def gathering(self) -> Iterator[None]:
        """What this thread posts with :meth:`post_here` meanwhile runs as one batch on the
        way out, here, after the events another thread is running (whose events must
        never wait on this one: they do no blocking I/O)."""
        self._here.gathering = True
        try:
            yield
        finally:
            self._here.gathering = False
            if self._queue and not self._stopped:
                with self._lock:
                    self._drain()

    def stop(self) -> None:
        """Run no more events; the loop thread returns."""
        self._stopped = True
        with self._wake:
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopped:
                    self._wake.wait()
            if self._stopped:
                return
            with self._lock:
                self._drain()

    def _drain(self) -> None:
        """Run the queued events, in batches (this thread holds ``_lock``)."""
        self.runner = threading.current_thread()
        try:
            while self._queue and not self._stopped:
                self._run_batch([self._queue.popleft() for _ in range(min(1024, len(self._queue)))])
        finally:
            self.runner = None
