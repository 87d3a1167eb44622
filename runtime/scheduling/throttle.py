"""CPU throttling of real processes, for ``Cluster.slow_worker`` (fault injection).

A throttled process runs ``1/factor`` of each :data:`PERIOD` and is stopped
(``SIGSTOP``) for the rest, so everything in it (tasks, its page server, its
gRPC threads) runs ``factor`` times slower, as on an overloaded machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

#: Length of one run/stop cycle, in seconds.
PERIOD = 0.05


class Throttle:
    """Slows processes down by duty-cycling them with SIGSTOP / SIGCONT."""

    def __init__(self) -> None:
        self._factors: dict[int, float] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def set(self, pid: int, factor: float) -> None:
        """Run ``pid`` ``factor`` times slower; a factor of 1 (or less) restores full speed."""
        if factor <= 0:
            raise ValueError(f"slow-down factor must be positive, got {factor}")
        with self._lock:
            if factor <= 1:
                self._factors.pop(pid, None)
                return
            self._factors[pid] = float(factor)
            if pid not in self._threads or not self._threads[pid].is_alive():
                thread = threading.Thread(
                    target=self._cycle, args=(pid,), name=f"clamor-throttle-{pid}", daemon=True
                )
                self._threads[pid] = thread
                thread.start()

    def factor(self, pid: int) -> float:
        with self._lock:
            return self._factors.get(pid, 1.0)

    def _cycle(self, pid: int) -> None:
        try:
            while not self._closed.is_set():
                with self._lock:
                    factor = self._factors.get(pid)
                if factor is None:
                    return
                os.kill(pid, signal.SIGCONT)
                if self._closed.wait(PERIOD / factor):
                    return
                os.kill(pid, signal.SIGSTOP)
                self._closed.wait(PERIOD * (1 - 1 / factor))
        except ProcessLookupError:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop throttling everything; every throttled process is left running."""
        self._closed.set()
        with self._lock:
            self._factors.clear()
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout=1.0)
