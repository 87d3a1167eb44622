"""Futures: ``cluster.submit(fn, *args)`` returns at once, the call runs on a worker.

A :class:`ClusterFuture` is a ``concurrent.futures.Future`` (``result``, ``exception``,
``add_done_callback``, ``cancel``, ``concurrent.futures.wait`` / ``as_completed``) that
can also be awaited in an async cell. ``cluster.executor()`` is a
``concurrent.futures.Executor`` over the same, for libraries that take one.

How they run: a :class:`Dispatcher` thread gathers the calls submitted and runs them as
one *streaming* stage (the scheduler tells each task's end as it comes:
runtime/scheduling/scheduler.py), so each future resolves as soon as its task ends,
and a task's error fails its future alone. Calls submitted while a stage runs go in
the next one: stages run one at a time (each is an epoch of the arena: a call reads
the arena as it was when its stage began). A call is pickled when it is submitted, so
an argument that cannot be shipped fails there, naming it. ``cancel()`` works on a
running call too, as Dask's does (``concurrent.futures`` only cancels calls not
started): its task is interrupted on its worker (as Ctrl-C would,
runtime/worker/interrupts.py), the others of its stage run on, and the future is
cancelled at once.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import _base
from typing import Any

from clamor.runtime.errors import ClamorError
from clamor.runtime.scheduling.streaming import TaskStream

logger = logging.getLogger("clamor.futures")

#: ``run(payloads, workers, stream)``: run the packed calls as one streaming stage (the
#: cluster's); ``stream.on_task(index, result, error)`` as each ends; returns when all ended.
RunBatch = Callable[[list[bytes], list[int | None], TaskStream], None]


class ClusterFuture(concurrent.futures.Future):
    """A ``concurrent.futures.Future`` of a call on the cluster; ``await`` it in async code."""

    def __init__(self) -> None:
        super().__init__()
        self._stop: Callable[[], None] | None = None  # set while its call runs

    def __await__(self) -> Any:
        return asyncio.wrap_future(self).__await__()

    def cancel(self) -> bool:
        """Cancel the call, also while it runs (its task is interrupted on its worker);
        ``False`` only if it has ended."""
        if super().cancel():
            return True
        with self._condition:  # as ``Future.cancel`` and ``set_running_or_notify_cancel`` do
            if self._state != _base.RUNNING or self._stop is None:
                return False
            self._state = _base.CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        self._invoke_callbacks()
        self._stop()
        return True


class Dispatcher:
    """Runs submitted calls in batches, one streaming stage at a time, on a thread of
    its own (started with the first call). ``value_of(result)``: a task result's value."""

    def __init__(self, run: RunBatch, value_of: Callable[[Any], Any]) -> None:
        self._run = run
        self._value_of = value_of
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[ClusterFuture, bytes, int | None]] = collections.deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        #: Values to hand to their futures, off the scheduler's events thread (a large one
        #: is fetched from its worker; a done-callback may take time).
        self._ended: collections.deque[tuple[ClusterFuture, Any, BaseException | None]] = collections.deque()

    def submit(self, payload: bytes, worker: int | None = None) -> ClusterFuture:
        """A future of the packed call ``payload`` (on ``worker``, or any)."""
        future = ClusterFuture()
        with self._cond:
            if self._closed:
                raise ClamorError("the cluster is closed")
            self._queue.append((future, payload, worker))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="clamor-futures", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return future

    def close(self) -> None:
        """Fail the futures not started with "the cluster is closed" (the running ones fail
        with their stage); the thread ends."""
        with self._cond:
            self._closed = True
            waiting, self._queue = list(self._queue), collections.deque()
            self._cond.notify_all()
        for future, _, _ in waiting:
            if future.set_running_or_notify_cancel():
                future.set_exception(ClamorError("the cluster was closed before this call ran"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = [item for item in self._queue if item[0].set_running_or_notify_cancel()]
                self._queue.clear()
            if batch:
                self._run_batch(batch)

    def _run_batch(self, batch: list[tuple[ClusterFuture, bytes, int | None]]) -> None:
        futures = [future for future, _, _ in batch]

        def on_task(index: int, result: Any, error: BaseException | None) -> None:
            with self._cond:
                self._ended.append((futures[index], result, error))
                self._cond.notify_all()

        stream = TaskStream(on_task)
        for index, future in enumerate(futures):
            future._stop = functools.partial(stream.cancel, index, concurrent.futures.CancelledError())
        resolver = threading.Thread(target=self._resolve, args=(futures,), name="clamor-futures-done", daemon=True)
        resolver.start()
        try:
            self._run([p for _, p, _ in batch], [w for _, _, w in batch], stream)
        except BaseException as exc:  # noqa: BLE001 - the stage failed: its futures not ended get it
            with self._cond:
                self._ended.extend((f, None, exc) for f in futures)
                self._cond.notify_all()
        resolver.join()

    def _resolve(self, futures: list[ClusterFuture]) -> None:
        """Hand each ended task's value (or error) to its future, until every task ended."""
        left = {id(future) for future in futures}
        while left:
            with self._cond:
                while not self._ended:
                    self._cond.wait()
                future, result, error = self._ended.popleft()
            if id(future) not in left:
                continue  # a stage's failure after its task had ended
            left.discard(id(future))
            if future.done():
                continue  # cancelled while it ran
            try:
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(self._value_of(result))
            except BaseException as exc:  # noqa: BLE001 - fetching a large value failed
                if not future.done():
                    future.set_exception(exc)


class ClusterExecutor(concurrent.futures.Executor):
    """A ``concurrent.futures.Executor`` on the cluster (``cluster.executor()``)."""

    def __init__(self, submit: Callable[..., ClusterFuture]) -> None:
        self._submit = submit
        self._shutdown = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> ClusterFuture:
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        return self._submit(fn, *args, **kwargs)

    def map(self, fn: Callable, *iterables: Iterable, timeout: float | None = None,
            chunksize: int = 1) -> Iterator[Any]:  # fmt: skip
        futures = [self._submit(fn, *args) for args in zip(*iterables)]
        return (f.result(timeout) for f in futures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls; the cluster itself stays open (it is not this executor's)."""
        self._shutdown = True
