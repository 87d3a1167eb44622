"""The seam between the control plane and the pager (runtime/paging/pager.py).

The control plane (runtime/cluster.py on the driver, runtime/worker/process.py on each
worker) drives the stage protocol; the pager implements these two protocols.
The ``Null*`` classes are the do-nothing versions used when no arena is shared.

Stage protocol, as run by :meth:`clamor.runtime.cluster.Cluster.run_stage`::

    epoch, pages = driver_paging.begin_stage()       # new epoch, pages to invalidate
    if pages: every live worker: worker_paging.invalidate(epoch, pages)
    each task on its worker:
        worker_paging.begin_task(task_epoch)           # task_epoch = epoch, or older on replay
        ... run the task ...
        runs = worker_paging.end_task()                 # the read set, packed (read_sets.py)
    driver_paging.end_stage()                          # always, even on failure
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class WorkerPaging(Protocol):
    """Worker side of the pager. ``stats`` may be called while a task runs."""

    def info(self) -> dict:
        """Sent to the driver once at start-up (``DriverPaging.worker_ready``)."""
        ...

    def begin_task(self, epoch: int) -> None:
        """A task starts; it must read the arena as of ``epoch``."""
        ...

    def end_task(self) -> bytes:
        """The task ended; return its read set as :func:`~clamor.runtime.paging.read_sets.encode`
        packs it: runs of ``(first page, count, version)`` (may be a superset of what it touched)."""
        ...

    def invalidate(self, epoch: int, pages: list[int]) -> None:
        """Drop cached copies of ``pages``: the driver wrote them before ``epoch``."""
        ...

    def stats(self) -> dict:
        """Counters merged into the worker's stats (e.g. ``cached_pages``, ``faults``)."""
        ...


@runtime_checkable
class DriverPaging(Protocol):
    """Driver side of the pager."""

    def worker_config(self, worker_id: int, host: str) -> dict:
        """Merged into the config a worker receives at registration.

        A ``"paging_factory": "module:callable"`` entry makes the worker build its
        :class:`WorkerPaging` as ``callable(worker_id, config)``.
        """
        ...

    def worker_ready(self, worker_id: int, info: dict) -> None:
        """The worker built its paging; ``info`` is its ``WorkerPaging.info()``."""
        ...

    def begin_stage(self) -> tuple[int, list[int]]:
        """A stage starts: return the new epoch and the pages to invalidate on workers."""
        ...

    def end_stage(self) -> None:
        """The stage's barrier: all its tasks finished, failed or were lost."""
        ...

    def worker_lost(self, worker_id: int) -> None:
        """The worker is gone; forget what it holds."""
        ...

    def trim_versions(self, floor: int) -> int:
        """Free old page versions no stage at epoch ``floor`` or later reads; bytes freed."""
        ...

    def release(self, epoch: int) -> None:
        """No stage reads epochs ``<= epoch`` any more: until the next stage, the
        driver's writes need no copy of the bytes they replace."""
        ...

    def retain(self, epoch: int) -> bool:
        """Epoch ``epoch`` is needed again after a release; ``False`` if its versions
        are gone (a write since kept no copy)."""
        ...

    def stats(self) -> dict:
        """Counters merged into ``Cluster.stats()``."""
        ...

    def version_log_bytes(self) -> int:
        """``stats()["version_log_bytes"]`` alone (asked at every stage start)."""
        ...

    def page_stats(self, first: int = 0, count: int | None = None) -> dict:
        """Per-page counter arrays for pages ``[first, first + count)`` (the views' heatmap)."""
        ...

    def cached_bytes(self, reads: tuple[tuple[int, int], ...]) -> dict[int, int]:
        """Worker -> bytes of these arena ranges ``(offset, nbytes)`` it caches (placement)."""
        ...

    def close(self) -> None:
        """The cluster is closing."""
        ...


class NullWorkerPaging:
    """No shared arena: tasks read nothing, invalidations are no-ops."""

    def info(self) -> dict:
        return {}

    def begin_task(self, epoch: int) -> None:
        pass

    def end_task(self) -> bytes:
        return b""

    def invalidate(self, epoch: int, pages: list[int]) -> None:
        pass

    def stats(self) -> dict:
        return {}


class NullDriverPaging:
    """No shared arena: epochs count up from 1, nothing is ever invalidated."""

    def __init__(self) -> None:
        self.epoch = 0

    def worker_config(self, worker_id: int, host: str) -> dict:
        return {}

    def worker_ready(self, worker_id: int, info: dict) -> None:
        pass

    def begin_stage(self) -> tuple[int, list[int]]:
        self.epoch += 1
        return self.epoch, []

    def end_stage(self) -> None:
        pass

    def worker_lost(self, worker_id: int) -> None:
        pass

    def trim_versions(self, floor: int) -> int:
        return 0

    def release(self, epoch: int) -> None:
        pass

    def retain(self, epoch: int) -> bool:
        return True

    def stats(self) -> dict:
        return {}

    def version_log_bytes(self) -> int:
        return 0

    def page_stats(self, first: int = 0, count: int | None = None) -> dict:
        """No arena: no pages (empty arrays of the pager's dtypes)."""

        wide = ("requests", "driver_bytes", "peer_bytes")
        return {k: np.zeros(0, np.uint64 if k in wide else np.uint32)
                for k in (*wide, "holders", "version")}  # fmt: skip

    def cached_bytes(self, reads: tuple[tuple[int, int], ...]) -> dict[int, int]:
        return {}

    def close(self) -> None:
        pass


def load_factory(spec: str) -> Callable:
    """Resolve a ``"package.module:callable"`` string (dotted attributes allowed)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:callable', got {spec!r}")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec!r} is not callable")
    return obj
