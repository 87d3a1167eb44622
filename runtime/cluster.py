"""The driver's side of the control plane: worker processes and their lifecycle.

:class:`Cluster` starts the ``Scheduler`` gRPC service and local worker
processes, tracks which are alive (process exit, failed calls, missed
heartbeats for remote ones) and runs stages through its
:class:`~clamor.runtime.scheduling.executor.Executor`: ``execute``
for stages built by datasets, ``run`` / ``run_stage`` for plain function calls
on given workers. A task's exception is re-raised in the driver as the same
type, with the remote traceback attached; a worker that dies during a stage
raises :class:`~clamor.runtime.errors.WorkerLostError`. Either way the cluster
stays usable. Its parts, each with its own state: ``registry``, the
:class:`~clamor.runtime.cluster_workers.WorkerRegistry` (registration, liveness, loss,
replacement, scaling); ``inspector``, the
:class:`~clamor.runtime.cluster_inspection.ClusterInspector` (what it shows about
itself, read from the other parts' public faces, and the views' publisher); and its resources, closed in reverse order of
opening (``resources.py``).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - its exit hook registers before ours (see below)
import contextlib
import logging
import os
import resource
import shutil
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

from clamor.runtime import deadlines, joblib_backend
from clamor.runtime.cluster_inspection import ClusterInspector
from clamor.runtime.cluster_workers import SchedulerServicer, WorkerRegistry
from clamor.runtime.credentials import Credentials
from clamor.runtime.data import checkpoint
from clamor.runtime.data.dataset import DatasetSources
from clamor.runtime.data.lineage import LineageStore
from clamor.runtime.errors import ClamorError
from clamor.runtime.futures import ClusterExecutor, ClusterFuture, Dispatcher
from clamor.runtime.launchers.base import Launcher
from clamor.runtime.launchers.local import LocalLauncher
from clamor.runtime.net.calls import call_each
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.shipping import CallRunner, pack_calls, pack_task
from clamor.runtime.net.stream_server import TaskStreamServer
from clamor.runtime.net.transport import (
    create_server,
    format_address,
)
from clamor.runtime.observe import cluster_registry, snapshots
from clamor.runtime.observe.observer import ObserverServicer
from clamor.runtime.observe.telemetry import Telemetry
from clamor.runtime.paging import memory
from clamor.runtime.paging.pager import MAX_WORKERS, WORKER_LIMIT_REASON, DriverPager
from clamor.runtime.paging.paging_api import DriverPaging
from clamor.runtime.paging.read_sets import ReadSet
from clamor.runtime.paging.versions import VersionKeeper
from clamor.runtime.resources import Resources
from clamor.runtime.scheduling.events import interrupts_held
from clamor.runtime.scheduling.executor import Executor
from clamor.runtime.scheduling.streaming import TaskStream
from clamor.runtime.scheduling.throttle import Throttle
from clamor.runtime.stage import PartitionKey, StageSpec, TaskSpec
from clamor.runtime.storage.bulk import BulkClient, BulkServer
from clamor.runtime.storage.spill import spill_folder, sweep_stale_spill_folders

logger = logging.getLogger("clamor.cluster")


#: One task of a stage: ``(worker, fn, args)`` or ``(worker, fn, args, kwargs)``.
Call = tuple[int, Callable, tuple] | tuple[int, Callable, tuple, dict]
#: Open files the driver needs per worker (measured: about 4.3 with 72 workers over TCP:
#: its gRPC channel, page connections, the launcher's pipes); a worker needs one per peer
#: it fetched from. Both stay under a soft limit of 1,024 only up to about 200 workers.
FDS_PER_WORKER = 8


def _raise_open_file_limit(workers: int) -> None:
    """Raise this process's soft limit on open files (local workers inherit it) to what
    ``workers`` need, as far as the hard limit allows."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = 256 + FDS_PER_WORKER * workers
        if soft != resource.RLIM_INFINITY and soft < need:
            raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (OSError, ValueError) as e:
        logger.warning("cannot raise the open file limit for %d workers: %s", workers, e)


# --- the cluster ------------------------------------------------------------------


_open_clusters: weakref.WeakSet = weakref.WeakSet()


def open_clusters() -> list[Cluster]:
    """The clusters of this process that are not closed."""
    return [c for c in list(_open_clusters) if not c.closed]


def _close_open_clusters() -> None:
    """Close the clusters a program left open when the interpreter exits. A thread exit
    hook (threading's, as concurrent.futures uses) so that it runs before Python joins the
    gRPC server's threads, which wait on their workers' task streams until the cluster
    closes; registered after concurrent.futures' own, so it runs first."""
    for cluster in list(_open_clusters):
        try:
            cluster.close()
        except Exception:
            logger.exception("closing %r at exit failed", cluster)


threading._register_atexit(_close_open_clusters)


class Cluster(DatasetSources):
    """Worker processes and the scheduler that drives them.

    ``workers``: how many (default ``os.cpu_count()``); ``host``: the address the
    scheduler and the driver's page server listen on (and local workers too).
    ``launcher``: where workers run: ``"local"`` (subprocesses here, the default) or a
    :class:`~clamor.runtime.launchers.base.Launcher` such as ``SSHLauncher(hosts)`` or
    ``DaskLauncher(client)``; remote workers need ``host`` to be an address they can
    reach. ``tls``: mutual TLS with a per-cluster CA on gRPC and the page protocol
    (for multi-host clusters; the token is checked either way). Paging: ``page_size`` (default
    the arena's; like every size option, bytes or a string such as ``"256KiB"``), ``transport`` (``"auto"``: workers on this host map the arena's pages
    without copying them, others fetch over TCP; ``"shm"``: map, on any host;
    ``"shm-copy"``: copy each page from shared memory into a private cache, as
    before zero copy; ``"tcp"``), ``replication`` (redirect requests for held
    pages to peers), ``readahead`` (batch sequential faults), ``read_sets``
    (``"resident"``: workers keep pages mapped across tasks and a task's read set is every
    page its worker has resident at its epoch, so a repeated stage faults nothing;
    ``"exact"``: every task starts unmapped and records just the pages it touches, at a
    fault per page per task; docs/paging.md). ``paging``: replaces the
    arena pager (tests use the no-op one). ``timeout``: seconds to wait for all workers to be
    ready. ``log_dir``: where worker logs go (default: the driver's stdout/stderr).
    Stragglers: with ``speculation``, a task running longer than
    ``speculation_factor`` times its stage's median (and its usual wait for a busy
    worker's report) gets a copy on an idle worker;
    the first result wins. A lost worker's running tasks are rerun elsewhere.
    Tiny tasks: with ``fuse``, a stage of many plain tasks whose program ran
    under 0.2 ms a task last time runs them in chunks, one attempt per chunk
    (runtime/scheduling/fusion.py); results and errors stay per task.
    Memory (R3S): ``worker_memory`` is each worker's budget (``"4GiB"``, bytes,
    or ``{worker id: size}``; default: a fair share of this host's memory among the
    workers), split between cached arena pages (evicted beyond their share, CLOCK) and
    kept partitions: 1/8 for pages on a worker that maps the driver's pages in place, 3/4
    on one that copies them (runtime/paging/memory.py); ``spill`` says where partitions
    beyond it go: ``"peer"`` (the worker
    with the most free memory, then local disk) or ``"disk"``.
    Failures: a lost worker is replaced by a new one (a new id), up to ``restarts`` a minute
    (default: as many as the cluster has workers, at least 3; 0: never); a task whose
    worker was lost 3 times while it ran there fails its stage with
    :class:`~clamor.runtime.errors.TaskCrashedError` (it runs alone after the first time).
    ``action_timeout``: seconds any action may run (default none; ``timeout=`` per action);
    an action past it, or interrupted (Ctrl-C), has its running tasks stopped.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        host: str = "127.0.0.1",
        page_size: int | str | None = None,
        transport: str = "auto",
        replication: bool = True,
        readahead: bool = True,
        read_sets: str = "resident",
        paging: DriverPaging | None = None,
        timeout: float = 60.0,
        log_dir: str | None = None,
        speculation: bool = True,
        speculation_factor: float = 2.0,
        fuse: bool = True,
        launcher: str | Launcher = "local",
        tls: bool = False,
        worker_memory: memory.Size | Mapping[int, memory.Size] | None = None,
        spill: str = "peer",
        restarts: int | None = None,
        action_timeout: float | None = None,
    ) -> None:
        n = (os.cpu_count() or 1) if workers is None else workers
        if n < 1:
            raise ValueError(f"a cluster needs at least one worker, got {n}")
        if n > MAX_WORKERS:
            raise ValueError(f"a cluster has at most {MAX_WORKERS:,} workers, got {n:,}: {WORKER_LIMIT_REASON}")
        _raise_open_file_limit(n)
        #: Seconds an action may run before it is stopped (``None``: no limit); an action's
        #: own ``timeout=`` overrides it.
        self.action_timeout = deadlines.check(action_timeout, "action_timeout")
        restarts = max(3, n) if restarts is None else restarts
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ValueError(f"restarts must be a whole number >= 0, not {restarts!r}")
        if isinstance(launcher, str):
            if launcher != "local":
                raise ValueError(
                    f"launcher must be 'local' or a Launcher instance (e.g. "
                    f"clamor.SSHLauncher(hosts), clamor.DaskLauncher(client)), not {launcher!r}"
                )
            launcher = LocalLauncher()
        elif not isinstance(launcher, Launcher):
            raise TypeError(
                f"launcher must be 'local' or a Launcher instance (e.g. clamor.SSHLauncher(hosts), "
                f"clamor.DaskLauncher(client)), not {type(launcher).__name__}"
            )
        self.budgets = memory.Budgets(worker_memory, local_workers=n)
        self.spill = memory.check_spill(spill)
        # made by the first worker that spills to disk, removed at close (killed workers' files
        # too); a SIGKILLed driver's is removed by the next cluster started on this host
        sweep_stale_spill_folders()
        self._spill_dir = spill_folder(os.getpid(), f"{id(self):x}")
        self.host = host
        self._credentials = Credentials.generate(tls=tls)
        self._token = self._credentials.token
        #: What it opened, closed in reverse order (runtime/resources.py): by close(), by a
        #: failure of this constructor, or when it is collected unclosed.
        self._resources = resources = Resources()
        try:  # open the parts in order, each registered as it opens
            opened = self._resources.opened
            launcher.prepare()  # e.g. the local workers' template starts while the rest is set up
            opened("the launcher", lambda: launcher.close(timeout=0))
            spill_dir = self._spill_dir
            opened("the spill folder", lambda: shutil.rmtree(spill_dir, ignore_errors=True))
            self._paging: DriverPaging = paging if paging is not None else DriverPager(
                page_size=page_size,
                token=self._token.encode(),
                tls=self._credentials.tls,
                host=host,
                transport=transport,
                replication=replication,
                readahead=readahead,
                read_sets=read_sets,
            )
            opened("the pager", self._paging.close)
            #: The lineage of the partitions its datasets keep (runtime/data/lineage.py).
            self.lineage = LineageStore()
            #: What the driver's version log keeps: epoch pins, release, trimming.
            self.versions = VersionKeeper(self._paging, self.lineage)
            #: Its checkpoints being written, and the epoch of the last one done.
            self.checkpoints = checkpoint.CheckpointLog()
            self._throttle = Throttle()
            opened("the throttle", self._throttle.close)
            me = weakref.ref(self)  # the executor's thread must not keep the cluster alive
            self._executor = Executor(
                self._paging,
                poll=lambda: (c := me()) and c.registry.refresh(),
                unstaffed=lambda: (c := me()) and c.registry.unstaffed(),
                unreachable=lambda w, why: (c := me()) and c.registry.on_unreachable(w, why),
                min_ref_bytes=lambda: (c := me()) and (c.page_size or None),
                versions=self.versions,
                speculation=speculation,
                speculation_factor=speculation_factor,
                fuse=fuse,
                bulk=None if tls else BulkClient(self._token.encode()),
                kill=lambda w, why: (c := me()) and c.registry.kill_unresponsive(w, why),
            )
            executor = self._executor  # not the cluster: closing must not keep it alive
            opened("the executor", lambda: (executor.close(), executor.join()))
            # calls submitted as futures (their thread must not keep the cluster alive either)
            self._futures = Dispatcher(lambda *a: (c := me()) and c._run_futures(*a), self._executor.value_of)
            store = self._executor.driver_store  # not the cluster: its server must not keep it alive
            self._bulk = None if tls else BulkServer(self._token.encode(), host, store.lookup)
            if self._bulk is not None:
                opened("the bulk server", self._bulk.close)
                self._executor.driver_bulk_address = format_address(host, self._bulk.port)

            self._streams = TaskStreamServer(self._token.encode(), host, tls=self._credentials.tls,
                                             link_of=executor.link_of, on_results=executor.task_finished,
                                             on_end=executor.stream_ended,
                                             gather=executor.gathering,
                                             vouch=lambda w: bool((c := me()) and c.registry.vouch(w)))  # fmt: skip
            opened("the task-stream server", self._streams.close)
            #: Its workers: registration, liveness, loss, replacement, scaling.
            self.registry = WorkerRegistry(
                n, launcher=launcher, paging=self._paging, executor=executor, budgets=self.budgets,
                spill=self.spill, spill_dir=self._spill_dir, credentials=self._credentials,
                streams=self._streams, restarts=restarts, start_timeout=timeout,
            )  # fmt: skip
            scheduler = SchedulerServicer(self.registry)
            self._server, self.address = create_server(
                self._token,
                [
                    (pb_grpc.add_SchedulerServicer_to_server, scheduler),
                    (pb_grpc.add_ObserverServicer_to_server, ObserverServicer(self)),
                ],
                host=host,
                max_workers=max(8, min(64, n + 4)),
                tls=self._credentials.tls,
                control=True,
            )
            server = self._server
            opened("the scheduler's gRPC server", lambda: server.stop(grace=None))
            #: What it shows about itself (stats, counters, snapshots for the views).
            self.inspector = ClusterInspector(
                self.registry, executor, self._paging, self.lineage, self.budgets,
                address=self.address, page_size=self.page_size, bulk=self._bulk,
            )  # fmt: skip
            opened("the views' publisher", self.inspector.close)
            channels = self.registry.channels
            opened("the channels to the workers", lambda: [c.close() for c in list(channels)])
            launcher.bind(self.address, self._credentials, host=host, log_dir=log_dir)
            opened("the workers", lambda: launcher.close(timeout=0))  # first: kill what still runs
        except BaseException:
            resources.close()  # a failed constructor leaves the process clean
            raise
        _open_clusters.add(self)
        joblib_backend.register(open_clusters)  # joblib.parallel_config(backend="clamor")
        self._finalizer = weakref.finalize(self, resources.close)
        try:
            self.registry.start(n, timeout)
        except BaseException:
            self.close()
            raise

    # --- stages ---

    def execute(self, stage: StageSpec) -> list[Any]:
        """Run ``stage`` on the workers to its barrier; the ``reply`` values in index order.

        The :class:`~clamor.runtime.stage.StageRunner` entry point used by datasets.
        A task's exception is raised here as the same type (remote traceback
        attached) and the stage's other attempts are cancelled; a lost worker
        raises :class:`WorkerLostError`. The cluster stays usable either way.
        """
        self.registry.check_open()
        for task in stage.tasks:
            if task.worker is not None:
                self.registry.live_worker(task.worker)
        return self._executor.execute(stage, lambda: self.workers)

    def run(
        self, fn: Callable, *args: Any, worker: int | None = None, epoch: int | None = None,
        timeout: float | None = None, **kwargs: Any,
    ) -> Any:  # fmt: skip
        """Run ``fn(*args, **kwargs)`` as a one-task stage on ``worker`` (``None``: any live
        worker); return its result. ``timeout``: seconds before it is stopped
        (:class:`~clamor.runtime.errors.ActionTimeoutError`; default the cluster's
        ``action_timeout``)."""
        return self.run_stage([(worker, fn, args, kwargs)], epoch=epoch, timeout=timeout)[0]

    def run_stage(self, calls: Sequence[Call], epoch: int | None = None, timeout: float | None = None) -> list:
        """Run ``(worker, fn, args[, kwargs])`` calls as one stage (worker ``None``: any);
        results in call order.

        ``epoch``: run the tasks at this older epoch (a replay) instead of the new one.
        Every call is pickled before anything is sent; the first failure is raised.
        ``timeout``: as in :meth:`run`.
        """
        self.registry.check_open()
        packed = pack_calls([(fn, args, rest[0] if rest else None) for _, fn, args, *rest in calls],
                            self.page_size or None)  # fmt: skip
        tasks = [TaskSpec(i, worker=call[0], payload=payload)
                 for i, (call, payload) in enumerate(zip(calls, packed.payloads))]  # fmt: skip
        with self.time_limit(timeout, "run"):
            return self.execute(StageSpec(CallRunner(packed.shared), tasks, epoch=epoch))

    # --- futures ---

    def submit(self, fn: Callable, *args: Any, worker: int | None = None, **kwargs: Any) -> ClusterFuture:
        """Run ``fn(*args, **kwargs)`` on a worker (``worker``: that one) and return at once:
        a ``concurrent.futures.Future`` of its result, awaitable in async code
        (runtime/futures.py). Pickled now: what cannot be shipped fails here."""
        self.registry.check_open()
        return self._futures.submit(pack_task(fn, args, kwargs, self.page_size or None), worker)

    def map(self, fn: Callable, *iterables: Iterable) -> list[ClusterFuture]:
        """:meth:`submit` ``fn`` once per element (zipped, as the builtin ``map``): the futures."""
        return [self.submit(fn, *args) for args in zip(*iterables)]

    def executor(self) -> ClusterExecutor:
        """A ``concurrent.futures.Executor`` whose calls run on the cluster."""
        return ClusterExecutor(self.submit)

    def _run_futures(self, payloads: list[bytes], workers: list[int | None], stream: TaskStream) -> None:
        """The futures' dispatcher: run their calls as one streaming stage."""
        tasks = [TaskSpec(i, worker=w, payload=p) for i, (w, p) in enumerate(zip(workers, payloads))]
        self._executor.execute(StageSpec(CallRunner(), tasks, name="futures"), lambda: self.workers,
                               stream=stream)  # fmt: skip

    def time_limit(self, seconds: float | None, action: str = "the action") -> contextlib.AbstractContextManager:
        """The stages this thread runs in the block finish within ``seconds`` (``None``: the
        cluster's ``action_timeout``), or are cancelled with their running tasks stopped
        (:class:`~clamor.runtime.errors.ActionTimeoutError`)."""
        return deadlines.limit(self.action_timeout if seconds is None else seconds, action)

    # --- checkpoints ---

    def checkpoint(
        self, path: str, variables: dict[str, Any] | None = None, datasets: dict | None = None
    ) -> checkpoint.CheckpointHandle:
        """Start writing the arena, ``variables`` and persisted ``datasets`` to ``path``.

        Returns at once (the notebook keeps running and may keep writing arrays); the
        checkpoint holds the arena as it was now (copy-on-write through the version
        log). ``handle.wait()`` / ``handle.result()``; ``clamor.restore(path)`` in a
        fresh process brings everything back.
        """
        self.registry.check_open()
        return checkpoint.start(self, path, variables, datasets)

    # --- page versions ---

    def keep_versions(self, epoch: int) -> contextlib.AbstractContextManager[None]:
        """Keep the page versions epoch ``epoch`` reads while the block runs (replays,
        checkpoints); otherwise the version log frees what no lineage needs. Raises
        :class:`ClamorError` if they are gone already: the driver wrote pages after that
        epoch's stage, when nothing pinned it."""
        return self.versions.keep(epoch)

    def seal_epoch(self) -> int | None:
        """Seal a new arena epoch between two stages and pin its page versions until
        :meth:`release_epoch` (a checkpoint reads the arena as of it while the notebook
        writes on); ``None`` if this cluster's paging keeps no versions."""
        self.registry.check_open()
        if not isinstance(self._paging, DriverPager):
            return None
        return self._executor.seal_epoch(lambda: self.workers)

    def release_epoch(self, epoch: int) -> None:
        """Unpin an epoch :meth:`seal_epoch` gave."""
        self.versions.unpin(epoch)

    def read_page(self, page: int, epoch: int, out: Any) -> None:
        """Arena page ``page`` as epoch ``epoch`` read it, into the writable buffer ``out``."""
        self._paging.read_version_into(page, epoch, out)

    @property
    def last_epoch(self) -> int:
        """The arena epoch the last successful stage's tasks read (its own, or the replayed one)."""
        return self._executor.last_epoch

    @property
    def last_read_sets(self) -> list[ReadSet]:
        """The ``(page, version)`` read set of each task of the last stage, in index order:
        with ``read_sets="resident"`` (the default) every page its worker had mapped at
        the task's epoch, a superset of what it touched; with ``"exact"``, just those."""
        return self._executor.last_read_sets

    def fetch(self, key: PartitionKey) -> Any:
        """Bring partition ``key`` to the driver (in chunks) from its holder."""
        return self._executor.fetch(key)

    def put(self, key: PartitionKey, value: Any) -> None:
        """Keep ``value`` in the driver as partition ``key``; workers fetch it on use."""
        self._executor.put(key, value)

    def drop(self, keys: Iterable[PartitionKey]) -> None:
        """Free partitions wherever they are held; unknown keys are ignored."""
        self._executor.drop(keys)

    def holder(self, key: PartitionKey) -> int | None:
        """The worker (or ``DRIVER``) holding partition ``key``; ``None`` if nobody does."""
        return self._executor.holder(key)

    # --- inspection and faults ---

    @property
    def fuse(self) -> bool:
        """Whether a stage of tiny tasks may run them in chunks (``fuse`` at construction;
        settable, e.g. to compare)."""
        return self._executor.fusion.enabled

    @fuse.setter
    def fuse(self, on: bool) -> None:
        self._executor.fusion.enabled = bool(on)

    @property
    def workers(self) -> list[int]:
        """Ids of the live workers."""
        return self.inspector.workers

    @property
    def closed(self) -> bool:
        return self.registry.closed

    # what it shows about itself: see ClusterInspector

    def worker_stats(self) -> list[dict]:
        """Per worker: its id, pid, host, liveness and its own counters (:meth:`ClusterInspector.worker_stats`)."""
        return self.inspector.worker_stats()

    def stats(self) -> dict:
        """Paging, stage, task and worker counters (:meth:`ClusterInspector.stats`)."""
        return self.inspector.stats()

    def partitions(self) -> dict[PartitionKey, dict]:
        """Where each kept partition lives (:meth:`ClusterInspector.partitions`)."""
        return self.inspector.partitions()

    def counters(self) -> dict[str, int]:
        """Fault-tolerance counters, no worker called (:meth:`ClusterInspector.counters`)."""
        return self.inspector.counters()

    @property
    def telemetry(self) -> Telemetry:
        """The attempts, stages and events the driver saw."""
        return self.inspector.telemetry

    @property
    def publisher(self) -> snapshots.Publisher:
        """Publishes snapshots to the views (started on first use)."""
        return self.inspector.publisher

    def snapshot(self) -> snapshots.ClusterSnapshot:
        """Pages, tasks, events and lineage now, as the views draw them."""
        return self.inspector.snapshot()

    def summary(self) -> dict[str, Any]:
        """What its HTML repr shows (:meth:`ClusterInspector.summary`)."""
        return self.inspector.summary()

    def _repr_html_(self) -> str:
        return self.inspector._repr_html_()

    def scheduler_snapshot(self) -> dict:
        """The scheduler's state as plain data, no worker called."""
        return self.inspector.scheduler_snapshot()

    def page_stats(self, var: Any = None) -> dict:
        """Per-page arrays for an arena array or the whole arena (:meth:`ClusterInspector.page_stats`)."""
        return self.inspector.page_stats(var)

    def worker_pid(self, worker_id: int) -> int:
        return self.inspector.worker_pid(worker_id)

    def worker_info(self, worker_id: int) -> dict:
        """What the worker's pager announced (:meth:`ClusterInspector.worker_info`)."""
        return self.inspector.worker_info(worker_id)

    @property
    def dashboard_path(self) -> str | None:
        """Where the notebook server shows its dashboard (set by the kernel; the HTML repr links there)."""
        return self.inspector.dashboard_path

    @dashboard_path.setter
    def dashboard_path(self, path: str | None) -> None:
        self.inspector.dashboard_path = path

    def wait_for_workers(self, n: int | None = None, timeout: float | None = None) -> list[int]:
        """Wait until ``n`` workers are live (default: as many as the cluster should have)
        or no replacement is starting any more; the live workers."""
        return self.registry.wait_for_workers(n, timeout)

    def scale(self, n: int, timeout: float | None = None) -> list[int]:
        """Grow or shrink to ``n`` live workers while the cluster runs; the live workers
        (:meth:`WorkerRegistry.scale <clamor.runtime.cluster_workers.WorkerRegistry.scale>`)."""
        live = self.registry.scale(n, timeout)
        cluster_registry.update(self)  # the notebook server's cluster list shows the new size
        return live

    @property
    def paging(self) -> DriverPaging:
        """The driver side of the pager (a :class:`DriverPager` unless replaced)."""
        return self._paging

    @property
    def page_size(self) -> int:
        return int(getattr(self._paging, "page_size", 0))

    def kill_worker(self, worker_id: int) -> None:
        """SIGKILL a worker's process (fault injection) and wait until it has exited (the
        cluster then replaces it, while its ``restarts`` last)."""
        self.registry.kill_worker(worker_id)

    def slow_worker(self, worker_id: int, factor: float) -> None:
        """Make a worker's process run ``factor`` times slower (CPU duty cycle; 1 restores it)."""
        worker = self.registry.get(worker_id)
        if worker is None or not worker.local:
            raise ValueError(f"worker {worker_id} was not started by this cluster")
        self._throttle.set(worker.pid, factor)

    # --- lifetime ---

    @property
    def credentials(self) -> Credentials:
        """Its secrets (the token; with TLS, its CA and keys): what a worker or an observer
        (the notebook server's dashboard) needs to talk to it."""
        return self._credentials

    def close(self) -> None:
        """Shut the workers down (SIGKILL for stragglers) and stop the scheduler. Idempotent.

        A checkpoint still being written is finished first (it reads the pager's tables).
        A Ctrl-C meanwhile is held until the cluster is closed, then raised: an interrupted
        close would leave the pager and workers behind, and no cluster could start again."""
        if self.registry.closed:
            return
        with interrupts_held():
            self.checkpoints.wait()
            live = self.registry.close()
            if live is None:
                return
            try:
                self._futures.close()
                self.inspector.close()
                self._throttle.close()
                # On its task stream where it has one (a write each: no call, no reply to
                # wait for), else by a call; also by a call where attempts were launched:
                # an idle worker runs its first attempt on its stream's reader, which reads
                # the shutdown only once that task returns. (A call fails where the worker
                # is exiting already.) Then the launcher waits for them to exit.
                to_call = set(self._executor.endpoints.shut_down(w.id for w in live))  # not linked
                with contextlib.suppress(ClamorError):
                    to_call |= self._executor.ask(lambda s: {w for w in s.workers if s.running(w)})
                call_each(lambda w: w.stub.Shutdown(pb.ShutdownRequest(), timeout=2),
                          [w for w in live if w.id in to_call])  # fmt: skip
                self.registry.launcher.close(timeout=5.0)  # let them exit on their own first
            finally:
                self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.registry.closed else f"{len(self.registry.live())} workers"
        return f"<Cluster {self.address} {state}>"
