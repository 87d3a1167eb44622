"""Stopping the running attempts of a stage that is over (cancelled, timed out, failed).

The scheduler forgets such attempts at once (their results will be ignored), but the
workers still run them, and the next stage would queue behind them. So each worker
running one is asked to interrupt it (its ``Interrupt`` call: an exception in the task's
thread, runtime/worker/interrupts.py) and given :data:`STOP_GRACE` seconds; a worker
whose task does not stop (a long C call, a wedged process) is killed, and replaced by
the cluster like any lost worker. Spark kills a cancelled stage's tasks the same way
(``interruptOnCancel``), and Dask's nanny restarts a worker that does not respond.

:class:`Stopper` does this on a pool of threads, off the scheduler's event thread (whose
events never wait on a worker); the caller of the cancelled stage waits for it (:meth:`Stopper.wait`), so
that its next action finds the workers free.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence

import grpc
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc

logger = logging.getLogger("clamor.executor")

#: Seconds a worker has to stop a cancelled task before it is killed.
STOP_GRACE = 2.0
#: Workers asked at once (a failed stage on a large cluster asks every worker it ran on).
MAX_THREADS = 32
#: Seconds the Interrupt call may take beyond the grace (a worker busy under the GIL
#: cannot answer at all: it is killed then).
CALL_SLACK = 2.0


class Stopper:
    """Stops cancelled attempts on workers; ``kill(worker, why)`` kills (and marks lost) a
    worker whose attempt did not stop."""

    def __init__(self, kill: Callable[[int, str], None], grace: float = STOP_GRACE) -> None:
        self._kill = kill
        self.grace = grace
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="clamor-stop")
        #: attempts stopped by an interrupt, workers killed because one did not stop
        self.interrupted = self.killed = 0

    def stop(self, worker: int, stub: pb_grpc.WorkerStub, attempts: Sequence[int]) -> None:
        """Interrupt ``attempts`` on ``worker`` (at most one runs there), off this thread."""
        try:
            done = self._pool.submit(self._stop, worker, stub, tuple(attempts))
        except RuntimeError:  # closed: the cluster is closing, its workers with it
            return
        with self._lock:
            self._pending.add(done)
        done.add_done_callback(self._forget)

    def _forget(self, done: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(done)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _stop(self, worker: int, stub: pb_grpc.WorkerStub, attempts: tuple[int, ...]) -> None:
        try:
            request = pb.InterruptRequest(attempt_ids=attempts, grace=self.grace)
            try:
                stopped = stub.Interrupt(request, timeout=self.grace + CALL_SLACK).stopped
                why = f"its task did not stop within {self.grace:g} s of its stage's end"
            except grpc.RpcError as exc:
                stopped = False
                why = f"it did not answer the interrupt of its stage's task ({exc.code().name})"
            if stopped:
                self.interrupted += 1
            else:
                self.killed += 1
                self._kill(worker, why)
        except Exception:  # a pool thread: log, never raise
            logger.exception("stopping the attempts %s on worker %d failed", attempts, worker)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the stops begun so far are over; False if some still run at ``timeout``."""
        timeout = 2 * (self.grace + CALL_SLACK) + 15.0 if timeout is None else timeout
        with self._lock:
            pending = list(self._pending)
        _, late = concurrent.futures.wait(pending, timeout)
        return not late
