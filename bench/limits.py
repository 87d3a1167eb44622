"""The physical limits on this machine, behind the same interface as the measured
systems (:class:`peers.Session`): what any system could at best do here with the same
table and tasks.

====================  =================================  ===============================
limit                 ``broadcast(table)``               a task ``fn(table, *args)``
====================  =================================  ===============================
numpy                 nothing: one process               every task in turn, in this
                                                         process
shm                   nothing: ``make_table`` puts the   a ``multiprocessing`` pool of
                      table in a ``SharedMemory`` block  ``WORKERS`` processes (forked
                                                         before the table exists) that
                                                         attach the block by name
====================  =================================  ===============================

Both run on the driver's host whatever the network. The pool's helpers (``_shm_view``,
``_shm_task``, ``_shm_init``, ``_ATTACHED``) also serve the shared-memory limits of
``dense.py``, ``kmeans.py``, ``spill.py`` and ``replication.py``, which run tasks of
their own; the pools fork, so what they run is pickled by reference and found in the
forked copy of the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from harness.tables import fmt_bytes
from peers import WORKERS, Session, fill_table


class NumpySession(Session):
    """A limit: one plain numpy process, this one, running every task in turn on the table
    in its own memory."""

    system = "numpy"
    copies = 0

    def broadcast(self, table: np.ndarray) -> np.ndarray:
        return table

    def map(self, fn: Callable, handle: Any, args: Sequence[tuple]) -> list:
        return [fn(handle, *a) for a in args]

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        return [fn(*a) for a in args]

    def restart(self) -> None:
        pass

    def close(self) -> None:
        pass


#: In a pool process of :class:`SharedMemorySession`: the blocks it attached, by name.
_ATTACHED: dict[str, tuple[Any, np.ndarray]] = {}


def _shm_view(name: str, n: int) -> np.ndarray:
    from multiprocessing import shared_memory

    if name not in _ATTACHED:
        block = shared_memory.SharedMemory(name=name)
        _ATTACHED[name] = (block, np.ndarray((n,), np.int64, buffer=block.buf))
    return _ATTACHED[name][1]


def _shm_task(task: tuple) -> Any:
    """In a pool process: ``fn(table, *a)`` on the block ``name``, attached once."""
    fn, name, n, a = task
    return fn(_shm_view(name, n), *a)


def _shm_init() -> None:
    """In a new pool process: SIGTERM ends it quietly (``pool.terminate``), instead of the
    workload child's handler, inherited through fork, raising ``KeyboardInterrupt``."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _shm_call(task: tuple) -> Any:
    fn, a = task
    return fn(*a)


class SharedMemorySession(Session):
    """A limit: ``WORKERS`` ``multiprocessing`` processes (a pool, forked before any table
    exists, so they share none of this process's memory) over tables that live in
    ``multiprocessing.shared_memory`` blocks (:meth:`make_table`); a task attaches its
    block by name, once per process, and reads it in place. Nothing moves: the driver's
    writes land in the block itself."""

    system = "shm"
    copies = 0

    def __init__(self) -> None:
        import multiprocessing
        from multiprocessing import resource_tracker, shared_memory

        self.shared_memory = shared_memory
        self.blocks: list[tuple[Any, np.ndarray]] = []
        # One resource tracker, this process's, shared by the pool: a pool process with a
        # tracker of its own would unlink the blocks it attached when it ends.
        resource_tracker.ensure_running()
        self.context = multiprocessing.get_context("fork")
        self.pool = self.context.Pool(WORKERS, initializer=_shm_init)

    def make_table(self, n: int) -> np.ndarray:
        shm = os.statvfs("/dev/shm")
        if shm.f_bavail * shm.f_frsize < 8 * n + (64 << 20):
            raise RuntimeError(f"/dev/shm has {fmt_bytes(shm.f_bavail * shm.f_frsize)} free, "
                               f"the table needs {fmt_bytes(8 * n)}")  # fmt: skip
        block = self.shared_memory.SharedMemory(
            name=f"clamor-bench-{os.getpid()}-{len(self.blocks)}", create=True, size=8 * n)
        view = np.ndarray((n,), np.int64, buffer=block.buf)
        fill_table(view)
        self.blocks.append((block, view))
        return view

    def broadcast(self, table: np.ndarray) -> tuple[str, int]:
        for block, view in self.blocks:
            if view is table:
                return block.name, len(view)
        raise ValueError("the shared-memory table must come from make_table")

    def map(self, fn: Callable, handle: tuple[str, int], args: Sequence[tuple]) -> list:
        name, n = handle
        return self.pool.map(_shm_task, [(fn, name, n, a) for a in args], chunksize=1)

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        return self.pool.map(_shm_call, [(fn, a) for a in args], chunksize=1)

    def restart(self) -> None:
        """A fresh pool (the blocks stay): its processes attach each block anew."""
        self.pool.terminate()
        self.pool.join()
        self.pool = self.context.Pool(WORKERS, initializer=_shm_init)

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):
                self.pool.terminate()
                self.pool.join()
        finally:
            for block, _ in self.blocks:
                block.close()
                with contextlib.suppress(FileNotFoundError):
                    block.unlink()
            self.blocks = []
