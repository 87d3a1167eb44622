"""What a :class:`~clamor.runtime.cluster.Cluster` shows about itself (its
observability contract): per-worker stats, the cluster's counters, per-page arrays,
snapshots for the views. Read-only: nothing here changes the cluster.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import grpc
from clamor.runtime.net.calls import call_each
from clamor.runtime.net.messages import worker_stats
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.observe import html, snapshots
from clamor.runtime.paging import arena
from clamor.runtime.stage import PartitionKey

if TYPE_CHECKING:
    from clamor.runtime.cluster_workers import Worker, WorkerRegistry
    from clamor.runtime.data.lineage import LineageStore
    from clamor.runtime.observe.telemetry import Telemetry
    from clamor.runtime.paging.memory import Budgets
    from clamor.runtime.paging.paging_api import DriverPaging
    from clamor.runtime.scheduling.executor import Executor
    from clamor.runtime.storage.bulk import BulkServer


#: Worker counters that ``stats()`` also sums over the workers (memory budgets, R3S).
MEMORY_TOTALS = ("evictions", "spilled_to_peers", "spilled_to_disk", "partitions_on_disk")


class ClusterInspector:
    """What ``Cluster`` shows about itself, an owned part of it (``cluster.inspector``;
    ``Cluster.stats()`` and friends delegate here). It reads the parts it is given
    through their public faces and changes none of them; its own state is the views'
    publisher, started on first use, and where the notebook shows its dashboard. It is
    what that publisher observes (:class:`~clamor.runtime.observe.snapshots.Observed`)."""

    def __init__(
        self,
        registry: WorkerRegistry,
        executor: Executor,
        paging: DriverPaging,
        lineage: LineageStore,
        budgets: Budgets,
        *,
        address: str,
        page_size: int,
        bulk: BulkServer | None,
    ) -> None:
        self.registry = registry
        self.lineage = lineage
        self.budgets = budgets
        self.address = address
        self.page_size = page_size
        self._executor = executor
        self._paging = paging
        self._bulk = bulk
        self._publisher: snapshots.Publisher | None = None
        self._lock = threading.Lock()
        #: Where the notebook server shows this cluster's dashboard (the kernel sets it):
        #: the HTML repr links there.
        self.dashboard_path: str | None = None

    def close(self) -> None:
        """Stop the views' publisher, if one was started."""
        with self._lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()

    @property
    def closed(self) -> bool:
        return self.registry.closed

    @property
    def paging(self) -> DriverPaging:
        return self._paging

    @property
    def workers(self) -> list[int]:
        """Ids of the live workers."""
        self.registry.refresh()
        return self.registry.live()

    def holder(self, key: PartitionKey) -> int | None:
        """The worker (or the driver) holding partition ``key``; ``None`` if nobody does."""
        return self._executor.holder(key)

    def worker_stats(self) -> list[dict]:
        """Per worker (lost ones included): ``id``, ``pid``, ``host``, ``address``, ``alive``,
        and for live ones the worker's own stats (``tasks_run``, ``rss_bytes``, paging counters).
        ``ClamorError`` once the cluster is closed."""
        self.registry.check_open()
        self.registry.refresh()
        workers = self.registry.all()
        live = [w for w in workers if w.lost is None]
        replies = dict(zip(map(id, live), call_each(lambda w: w.stub.Stats(pb.StatsRequest(), timeout=10), live)))
        result = []
        for worker in workers:
            entry: dict[str, Any] = {
                "id": worker.id,
                "pid": worker.pid,
                "host": worker.host,
                "address": worker.address,
                "alive": worker.lost is None,
            }
            reply = replies.get(id(worker))
            if isinstance(reply, grpc.RpcError):
                entry["error"] = f"{reply.code().name}: {reply.details()}"
            elif reply is not None:
                entry.update(worker_stats(reply.stats))
                entry.update(id=worker.id, pid=worker.pid, host=worker.host)
            else:
                entry["lost"] = worker.lost
            result.append(entry)
        return result

    def stats(self) -> dict:
        """The observability contract: paging counters, stage and task counts,
        worker totals (``pages_fetched`` / ``bytes_fetched``: copied into a worker's page
        cache; ``pages_mapped`` / ``bytes_mapped``: read in place from the driver's memory
        by workers on its host, zero copy; ``pages_read``: the two together; ``faults``, page-cache ``evictions``, partitions
        ``spilled_to_peers`` / ``spilled_to_disk``, ``partitions_on_disk``) and ``workers``
        (:meth:`worker_stats`, each with its ``memory_budget`` and its two shares);
        ``task_streams``: per worker id, its task stream's message counts each way."""
        stats = dict(self._paging.stats())
        workers = self.worker_stats()
        stats.update(stages_run=self._executor.stages_run, tasks_run=self._executor.tasks_run)
        stats.update(self.counters())
        stats["scheduler"] = self._executor.snapshot()
        for key in ("pages_fetched", "bytes_fetched", "pages_mapped", "faults", *MEMORY_TOTALS):
            stats[key] = sum(w.get(key, 0) for w in workers)
        stats["pages_read"] = stats["pages_fetched"] + stats["pages_mapped"]
        stats["driver_partitions_served_bulk"] = self._bulk.served if self._bulk is not None else 0
        stats["workers"] = workers
        stats["task_streams"] = self._executor.endpoints.stream_counters()
        return stats

    def partitions(self) -> dict[PartitionKey, dict]:
        """Where each kept partition lives: ``key -> {"holder", "tier", "nbytes"}``, where
        ``tier`` is ``"memory"`` or ``"disk"`` (spilled there by its holder)."""
        placement = self._executor.ask(lambda s: s.placement())
        return {k: {"holder": h, "tier": t, "nbytes": n} for k, (h, t, n) in placement.items()}

    def counters(self) -> dict[str, int]:
        """Fault-tolerance counters, without calling the workers: ``tasks_rerun``,
        ``tasks_speculated``, ``tasks_replaced``, ``tasks_lost``, ``tasks_recomputed``,
        ``tasks_interrupted`` (cancelled while running, and stopped), ``tasks_not_stopped``
        (their workers killed instead), ``workers_replaced`` (lost workers started anew)."""
        counters = dict(self._executor.counters())
        counters["tasks_recomputed"] = self.lineage.counters.tasks_recomputed
        counters["workers_replaced"] = self.registry.replaced
        return counters

    @property
    def telemetry(self) -> Telemetry:
        """The attempts, stages and events the driver saw (runtime/observe/telemetry.py)."""
        return self._executor.telemetry

    @property
    def publisher(self) -> snapshots.Publisher:
        """Publishes :class:`~clamor.runtime.observe.snapshots.ClusterSnapshot` s to the views."""
        with self._lock:
            if self._publisher is None:
                self._publisher = snapshots.Publisher(self)
            return self._publisher

    def snapshot(self) -> snapshots.ClusterSnapshot:
        """A snapshot of pages, tasks, events and lineage now (what the views draw)."""
        return self.publisher.snapshot()

    def summary(self) -> dict[str, Any]:
        """What the cluster's HTML repr shows, from the driver's own state (no worker is
        called): ``address``, ``closed``, workers ``live`` / ``lost`` / ``replaced``, its
        ``launcher``, their ``memory_budget``, ``stages_run`` / ``tasks_run``, paged bytes."""
        out: dict[str, Any] = {"address": self.address, "closed": self.registry.closed}
        if self.registry.closed:
            return out
        live = self.workers
        paging = self._paging.stats()
        out.update(
            live=len(live), lost=len(self.registry.all()) - len(live), replaced=self.registry.replaced,
            launcher=self.registry.launcher.name, memory_budget=sum(self.budgets.of(w).total for w in live),
            stages_run=self._executor.stages_run, tasks_run=self._executor.tasks_run,
            dashboard_path=self.dashboard_path,
            **{k: paging.get(k, 0) for k in ("bytes_mapped", "bytes_served_by_driver", "bytes_served_by_peers")},
        )  # fmt: skip
        return out

    def _repr_html_(self) -> str:
        return html.cluster_html(self.summary())

    def scheduler_snapshot(self) -> dict:
        """The scheduler's state as plain data (stages' task counts, per-worker running and
        done, counters), without calling the workers: cheap enough for progress bars."""
        return self._executor.snapshot()

    def page_stats(self, var: Any = None) -> dict:
        """Per-page arrays (``requests``, ``driver_bytes``, ``peer_bytes``, ``holders``,
        ``version``) for the arena array ``var``, or the whole used arena; ``first_page``."""
        if var is None:
            first, count = 0, None
        else:
            first, end = arena.page_span(var, self.page_size)
            count = end - first
        stats = self._paging.page_stats(first, count)
        stats["first_page"] = first
        return stats

    def worker_pid(self, worker_id: int) -> int:
        return self._worker(worker_id).pid

    def worker_info(self, worker_id: int) -> dict:
        """What the worker's pager announced (:class:`~clamor.runtime.paging.paging_api.PagingInfo`
        as a dict): ``host``, ``page_port``, ``shm``, ``zero_copy``, ``tls``, ``cache_limit_pages``."""
        return dataclasses.asdict(self._worker(worker_id).info)

    def _worker(self, worker_id: int) -> Worker:
        worker = self.registry.get(worker_id)
        if worker is None:
            raise KeyError(worker_id)
        return worker
