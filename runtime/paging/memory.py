"""Per-worker memory budgets (after R3S).

A worker's budget is split in two fixed shares: one for its cache of arena
pages (the native pager evicts with CLOCK beyond it) and one for the
partitions it keeps (the partition store spills beyond it: to the peer with
the most free memory, then to local disk). Fixed shares keep the worker's
memory predictable: it stays within the budget plus the process's own
overhead, whatever mix of pages and partitions a job uses.

The split depends on how the worker reads the arena. On the driver's host it maps
the driver's pages in place (zero copy): N workers share one copy, and its page
cache holds only private copies of old versions (pages the driver wrote during a
stage), so that share is small. Elsewhere (or with ``transport="shm-copy"``) every
page it reads is a copy in its cache, which then gets most of the budget, so that a
table that fits is not evicted and fetched again every pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import psutil
from clamor.runtime.paging.arena import Size, format_bytes, to_bytes

#: The page cache's share of the budget of a worker that copies the pages it reads.
COPYING_CACHE_SHARE = 0.75
#: ... and of one that maps them in place (zero copy): private old versions only.
ZERO_COPY_CACHE_SHARE = 0.125
#: Of the host's memory, what the default budgets of its local workers add up to
#: (the rest is for the driver, the kernel and the system).
HOST_SHARE = 0.75
#: Where partitions beyond a worker's budget go.
SPILL_POLICIES = ("peer", "disk")


@dataclasses.dataclass(frozen=True)
class WorkerBudget:
    """A worker's memory budget in bytes and its two shares."""

    total: int
    zero_copy: bool = False

    @property
    def page_cache(self) -> int:
        return int(self.total * (ZERO_COPY_CACHE_SHARE if self.zero_copy else COPYING_CACHE_SHARE))

    @property
    def partitions(self) -> int:
        return self.total - self.page_cache

    def as_dict(self) -> dict[str, int]:
        """The stats' view: ``memory_budget``, ``page_cache_budget``, ``partition_budget``."""
        return {
            "memory_budget": self.total,
            "page_cache_budget": self.page_cache,
            "partition_budget": self.partitions,
        }

    def __str__(self) -> str:
        return (
            f"{format_bytes(self.total)} ({format_bytes(self.page_cache)} page cache, "
            f"{format_bytes(self.partitions)} partitions)"
        )


def fair_share(local_workers: int) -> int:
    """The default budget: :data:`HOST_SHARE` of this host's memory over its local workers."""
    return int(psutil.virtual_memory().total * HOST_SHARE) // max(1, local_workers)


class Budgets:
    """The budget of each worker of a cluster, from ``Cluster(worker_memory=...)``.

    ``worker_memory``: one size for every worker, ``{worker id: size}`` (workers not
    named get the default), or ``None`` (the default: :func:`fair_share` among
    ``local_workers``). Sizes are bytes or strings such as ``"4GiB"``.
    """

    def __init__(self, worker_memory: Size | Mapping[int, Size] | None, local_workers: int) -> None:
        self.default = fair_share(local_workers)
        self.per_worker: dict[int, int] = {}
        self.zero_copy: set[int] = set()  # workers that map the driver's pages in place
        if isinstance(worker_memory, Mapping):
            for worker, size in worker_memory.items():
                if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
                    raise ValueError(f"worker_memory keys must be worker ids (ints >= 0), not {worker!r}")
                if worker >= local_workers:
                    raise ValueError(f"worker_memory names worker {worker}, but the cluster's workers "
                                     f"are 0..{local_workers - 1}")  # fmt: skip
                self.per_worker[worker] = to_bytes(size, f"worker_memory[{worker}]")
        elif worker_memory is not None:
            self.default = to_bytes(worker_memory, "worker_memory")

    def of(self, worker: int) -> WorkerBudget:
        return WorkerBudget(self.per_worker.get(worker, self.default), worker in self.zero_copy)

    def inherit(self, new: int, lost: int) -> None:
        """Worker ``new`` replaces ``lost``: it gets the budget ``lost`` was given."""
        if lost in self.per_worker:
            self.per_worker[new] = self.per_worker[lost]

    def free(self, held: Mapping[int, int], exclude: int, at_least: int) -> list[tuple[int, int]]:
        """R3S's spill targets: ``(worker, free partition memory)`` of the workers in ``held``
        (worker -> partition bytes it keeps in memory) but ``exclude`` with room for
        ``at_least`` bytes, most free first (lowest id on ties)."""
        free = [(w, self.of(w).partitions - used) for w, used in held.items() if w != exclude]
        return sorted((f for f in free if f[1] >= at_least), key=lambda f: (-f[1], f[0]))


def check_spill(spill: str) -> str:
    if spill not in SPILL_POLICIES:
        raise ValueError(f"spill must be one of {SPILL_POLICIES}, not {spill!r}")
    return spill
