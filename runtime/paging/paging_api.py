"""The seam between the control plane and the pager (runtime/paging/pager.py).

The control plane (runtime/cluster.py on the driver, runtime/worker/process.py on each
worker) drives the stage protocol; the pager implements these two protocols.
The ``Null*`` classes are the do-nothing versions used when no arena is shared.

Stage protocol, as run by :meth:`clamor.runtime.cluster.Cluster.run_stage`::

    epoch, pages = driver_paging.begin_stage()       # new epoch, pages to invalidate
    if len(pages): every live worker: worker_paging.invalidate(epoch, pages)
    each task on its worker:
        worker_paging.begin_task(task_epoch)           # task_epoch = epoch, or older on replay
        ... run the task ...
        runs, resident = worker_paging.end_task()       # the read set, packed (read_sets.py)
    driver_paging.end_stage()                          # always, even on failure
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol, runtime_checkable

import numpy as np
from clamor.runtime.credentials import TLSMaterial


class PagingKind(enum.IntEnum):
    """Which :class:`WorkerPaging` a worker builds. The worker resolves it through a
    fixed table of its own (runtime/worker/process.py): the driver chooses among these
    and never names code for the worker to import."""

    NONE = 0  #: no shared arena: :class:`NullWorkerPaging`
    ARENA = 1  #: the native pager (runtime/paging/pager.py's ``WorkerPager``)


@dataclasses.dataclass(frozen=True)
class PagingConfig:
    """What a worker needs to build its paging (:meth:`DriverPaging.worker_config`); it
    travels as the typed ``WorkerConfig.paging`` message (runtime/net/messages.py).

    ``driver_host`` / ``driver_page_port``: the driver's page server; ``bind_host``:
    where the worker serves pages to peers; ``read_sets``: ``"resident"`` or
    ``"exact"``; ``tls``: for the page protocol (``None``: plain TCP); the ``shm_*``
    paths: on the driver's host, ``/proc`` paths of the driver's arena, page state and
    zero-copy mapping (``""``: none); ``page_cache_bytes``: the page-cache budget (0: no
    limit), which the driver fills in from the worker's memory budget.
    """

    kind: PagingKind = PagingKind.NONE
    arena_size: int = 0
    page_size: int = 0
    driver_host: str = ""
    driver_page_port: int = 0
    bind_host: str = "127.0.0.1"
    readahead: bool = True
    read_sets: str = "resident"
    tls: TLSMaterial | None = None
    shm_arena_path: str = ""
    shm_state_path: str = ""
    shm_zap_path: str = ""
    page_cache_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class PagingInfo:
    """What a worker's paging announces once built (:meth:`WorkerPaging.info`): where its
    page server listens, whether it reads the driver's arena through shared memory
    (``shm``) and maps it in place (``zero_copy``), whether pages travel over TLS, and
    its page-cache limit in pages."""

    host: str = ""
    page_port: int = 0
    shm: bool = False
    zero_copy: bool = False
    tls: bool = False
    cache_limit_pages: int = 0


@runtime_checkable
class WorkerPaging(Protocol):
    """Worker side of the pager. ``stats`` may be called while a task runs."""

    def info(self) -> PagingInfo:
        """Sent to the driver once at start-up (``DriverPaging.worker_ready``)."""
        ...

    def begin_task(self, epoch: int) -> None:
        """A task starts; it must read the arena as of ``epoch``."""
        ...

    def end_task(self) -> tuple[bytes, bool]:
        """The task ended; return its read set as :func:`~clamor.runtime.paging.read_sets.encode`
        packs it: runs of ``(first page, count, version)`` (may be a superset of what it
        touched), and whether it is a *resident* read set, whose versions are left zero
        for the driver to fill in (:meth:`DriverPaging.versions_at`)."""
        ...

    def invalidate(self, epoch: int, pages: np.ndarray) -> None:
        """The driver wrote ``pages`` (uint64) and sealed them for ``epoch``: drop cached copies
        (mappings of the driver's own memory stay, at the new version)."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters merged into the worker's stats (e.g. ``cached_pages``, ``faults``):
        integers by name, as the typed ``WorkerStats`` message carries them."""
        ...


@runtime_checkable
class DriverPaging(Protocol):
    """Driver side of the pager."""

    def worker_config(self, worker_id: int, host: str) -> PagingConfig:
        """The paging part of the config a worker receives at registration: its
        ``kind`` names the :class:`WorkerPaging` the worker builds (:class:`PagingKind`)."""
        ...

    def worker_ready(self, worker_id: int, info: PagingInfo) -> None:
        """The worker built its paging; ``info`` is its ``WorkerPaging.info()``."""
        ...

    def begin_stage(self) -> tuple[int, np.ndarray]:
        """A stage starts: return the new epoch and the pages to invalidate on workers (uint64)."""
        ...

    def end_stage(self) -> None:
        """The stage's barrier: all its tasks finished, failed or were lost."""
        ...

    def sealed(self) -> np.ndarray | None:
        """The pages (sorted, uint64) whose version the last :meth:`begin_stage` changed, to
        its epoch: every page written since the one before (``None``: not known)."""
        ...

    def versions_at(self, runs: bytes, epoch: int) -> np.ndarray:
        """The version each page of a resident read set's runs (pages, no versions) has at
        ``epoch``, page after page (uint32). Asked before the next stage start: a
        worker's resident pages show the driver's versions at the task's epoch."""
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

    def info(self) -> PagingInfo:
        return PagingInfo()

    def begin_task(self, epoch: int) -> None:
        pass

    def end_task(self) -> tuple[bytes, bool]:
        return b"", False

    def invalidate(self, epoch: int, pages: np.ndarray) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {}


class NullDriverPaging:
    """No shared arena: epochs count up from 1, nothing is ever invalidated."""

    def __init__(self) -> None:
        self.epoch = 0

    def worker_config(self, worker_id: int, host: str) -> PagingConfig:
        return PagingConfig()

    def worker_ready(self, worker_id: int, info: PagingInfo) -> None:
        pass

    def begin_stage(self) -> tuple[int, np.ndarray]:
        self.epoch += 1
        return self.epoch, np.empty(0, np.uint64)

    def end_stage(self) -> None:
        pass

    def sealed(self) -> np.ndarray | None:
        return np.empty(0, np.uint64)

    def versions_at(self, runs: bytes, epoch: int) -> np.ndarray:
        return np.zeros(0, np.uint32)  # no arena: no worker reads a page

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
