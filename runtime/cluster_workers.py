"""A cluster's workers (:class:`WorkerRegistry`, ``cluster.registry``): registration,
readiness, heartbeats, how a worker is found lost (its process exited, its task stream
ended, it stopped answering), replacement of lost workers, and growing and shrinking
(``scale``). It owns its state and its lock; the cluster and its inspector reach it
through its public methods only.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING

import grpc
from clamor.runtime.errors import ClamorError, WorkerLostError
from clamor.runtime.exitcodes import describe_exit, process_runs
from clamor.runtime.net.messages import (
    decode_key,
    paging_config_message,
    spill_message,
    worker_info,
)
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.transport import connect, format_address
from clamor.runtime.paging.pager import MAX_WORKERS, WORKER_LIMIT_REASON
from clamor.runtime.paging.paging_api import DriverPaging, PagingInfo

if TYPE_CHECKING:
    from clamor.runtime.credentials import Credentials
    from clamor.runtime.launchers.base import Launcher
    from clamor.runtime.net.stream_server import TaskStreamServer
    from clamor.runtime.paging.memory import Budgets
    from clamor.runtime.scheduling.executor import Executor

logger = logging.getLogger("clamor.cluster")

#: A worker whose process its launcher cannot see is lost after this long without a heartbeat.
HEARTBEAT_TIMEOUT = 10.0
#: Seconds between the heartbeats of a worker whose process its launcher sees (its
#: liveness is the process's, so its heartbeats only tell it the driver still answers):
#: each costs the driver about a millisecond of CPU, a thousand workers a core at one a second.
OBSERVED_HEARTBEAT_EVERY = 5
#: How often a waiting stage checks that its workers' processes are still alive.
POLL_INTERVAL = 0.1
#: How long a retried Register waits for the first attempt's answer (then it is a new one).
REGISTER_PATIENCE = 30.0
#: How long a retried Ready waits for the first attempt to finish adding the worker.
READY_RETRY_WAIT = 30.0
#: ``Cluster(restarts=n)``: at most n lost workers are replaced within this many seconds
#: (a worker that dies as it starts must not be restarted forever).
RESTART_WINDOW = 60.0


@dataclasses.dataclass
class Worker:
    id: int
    pid: int
    host: str
    address: str
    channel: grpc.Channel
    stub: pb_grpc.WorkerStub
    local: bool  # its launcher sees the process (a local subprocess)
    ready: bool = False
    announced: bool = False  # its Ready call came (and is being, or was, answered)
    lost: str | None = None  # how it was lost
    #: A thread is finding out how it ended (and may kill it): only that one marks it lost,
    #: so the reason is the one that thread gives, not "killed by signal 9" seen meanwhile.
    ending: bool = False
    #: Retired by :meth:`WorkerRegistry.scale`: counted out as lost, and not replaced.
    retired: bool = False
    #: Set once the pager and the executor know it is lost (later callers wait for it).
    lost_told: threading.Event = dataclasses.field(default_factory=threading.Event)
    info: PagingInfo = dataclasses.field(default_factory=PagingInfo)  # its WorkerPaging.info()
    last_heartbeat: float = dataclasses.field(default_factory=time.monotonic)


class SchedulerServicer(pb_grpc.SchedulerServicer):
    """The ``Scheduler`` service; holds the registry weakly so that the cluster can be collected."""

    def __init__(self, registry: WorkerRegistry) -> None:
        self._registry = weakref.ref(registry)

    def _get(self, context) -> WorkerRegistry:
        registry = self._registry()
        if registry is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the cluster is closed")
        return registry

    def Register(self, request, context):
        return self._get(context).on_register(request)

    def Ready(self, request, context):
        self._get(context).on_ready(request.worker_id, request.info)
        return pb.ReadyReply()

    def Heartbeat(self, request, context):
        return pb.HeartbeatReply(ok=self._get(context).on_heartbeat(request.worker_id))

    def SpillPeers(self, request, context):
        peers = self._get(context).spill_peers(request.worker_id, request.nbytes)
        return pb.SpillPeersReply(peers=[pb.SpillPeer(worker_id=w, address=a, free=f) for w, a, f in peers])

    def FetchPartition(self, request, context):
        store = self._get(context).executor.driver_store
        key = decode_key(request.key)
        if key not in store:
            context.abort(grpc.StatusCode.NOT_FOUND, f"the driver holds no partition {key!r}")
        return store.chunks(key)


class WorkerRegistry:
    """A cluster's workers, under its own lock (module docstring).

    ``n``: the workers it starts with (ids ``0..n-1``); ``launcher`` starts them;
    ``paging`` and ``executor`` learn of each one ready and each one lost; ``budgets``,
    ``spill``, ``spill_dir`` and ``streams`` make up a worker's configuration;
    ``restarts``: lost workers replaced within :data:`RESTART_WINDOW`; ``start_timeout``:
    seconds a starting worker gets to be ready.
    """

    def __init__(
        self, n: int, *, launcher: Launcher, paging: DriverPaging, executor: Executor, budgets: Budgets,
        spill: str, spill_dir: str, credentials: Credentials, streams: TaskStreamServer, restarts: int,
        start_timeout: float,
    ) -> None:  # fmt: skip
        self.launcher, self.executor = launcher, executor
        self._paging, self.budgets = paging, budgets
        self._spill, self._spill_dir, self._streams = spill, spill_dir, streams
        self._credentials = credentials
        self._cond = threading.Condition()
        self._workers: dict[int, Worker] = {}
        #: The gRPC channels to the workers (closed with the cluster).
        self.channels: list[grpc.Channel] = []
        self._next_id = n
        self._size = n  # what replacements of lost workers keep it at
        self._start_timeout = start_timeout
        self._restarts = restarts
        self._restarted: collections.deque[float] = collections.deque()  # when, in the window
        self._starting = 0  # replacements started and not ready (or failed) yet
        self._unreplaced = ""  # why the last lost worker has no replacement
        #: Lost workers started anew.
        self.replaced = 0
        self._spawning = threading.Lock()
        #: launch key -> [pid, reply or None while being answered]: a worker whose Register
        #: call timed out on its side retries it, and gets the same id and reply again.
        self._registrations: dict[str, list] = {}
        self.closed = False

    # --- the cluster's side ---

    def start(self, n: int, timeout: float) -> None:
        """Start the first ``n`` workers and wait until they are ready (``ClamorError``
        naming the ones that are not)."""
        try:
            with self._spawning:
                self.launcher.start(range(n))
            self._wait_ready(range(n), timeout)
        finally:
            self._release_start_files()  # read by now: do not leave it behind

    def close(self) -> list[Worker] | None:
        """From now on the registry is closed: the live workers then (``None`` if it was
        closed already)."""
        with self._cond:
            if self.closed:
                return None
            self.closed = True
            return [w for w in self._workers.values() if w.lost is None]

    def check_open(self) -> None:
        """``ClamorError`` once the registry, and so the cluster, is closed."""
        if self.closed:
            raise ClamorError("the cluster is closed")

    def live(self) -> list[int]:
        """The ids of the ready workers not lost, sorted."""
        with self._cond:
            return self._live_ids()

    def all(self) -> list[Worker]:
        """Every worker that registered (lost ones included), by id."""
        with self._cond:
            return sorted(self._workers.values(), key=lambda w: w.id)

    def get(self, worker_id: int) -> Worker | None:
        """The worker of that id (lost or not), or ``None``."""
        return self._workers.get(worker_id)

    def kill_worker(self, worker_id: int) -> None:
        """SIGKILL a worker's process (fault injection) and wait until it has exited (it
        is then replaced, while the restarts last)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            raise ValueError(f"no worker {worker_id} (workers: {self.live()})")
        if not self._kill(worker, "(kill_worker)", must=True):
            raise ValueError(f"worker {worker_id} was not started by this cluster")

    # --- scheduler service callbacks (gRPC threads) ---

    def on_register(self, request: pb.RegisterRequest) -> pb.RegisterReply:
        """Give the registering process its id and configuration. A retry (its call timed
        out on a loaded machine while the first one was being answered: same launch key,
        same pid) gets the first answer: a new id would leave the first one registered
        but never ready, and the cluster's start would wait for it until its timeout."""
        key = request.launch_key
        with self._cond:
            entry = self._registrations.get(key) if key else None
            retry = entry is not None and entry[0] == request.pid
            if retry and self._cond.wait_for(lambda: entry[1] is not None, timeout=REGISTER_PATIENCE):
                logger.info("worker %d registered again (a retry): pid %d", entry[1].worker_id, request.pid)
                return entry[1]
            if key:
                entry = self._registrations[key] = [request.pid, None]
        try:
            reply = self._register(request)
        except BaseException:
            with self._cond:
                if key and self._registrations.get(key) is entry:
                    del self._registrations[key]
            raise
        if key:
            with self._cond:
                entry[1] = reply
                self._cond.notify_all()
        return reply

    def _register(self, request: pb.RegisterRequest) -> pb.RegisterReply:
        """A new registration: claim the launcher's reserved id (or the next free one)."""
        with self._cond:
            worker_id = self.launcher.claim(request.launch_key, request.pid)
            local = worker_id is not None and self.launcher.observes(worker_id)
            if worker_id is None:
                worker_id, self._next_id = self._next_id, self._next_id + 1
        paging = self._paging.worker_config(worker_id, request.host)
        if paging.shm_zap_path:  # maps the driver's pages in place: a small page cache
            self.budgets.zero_copy.add(worker_id)
        budget = self.budgets.of(worker_id)
        config = pb.WorkerConfig(
            memory_budget=budget.total, zero_copy=budget.zero_copy, spill=spill_message(self._spill),
            spill_dir=self._spill_dir, task_stream_port=self._streams.port,
            task_stream_unix=self._streams.unix_name,
            paging=paging_config_message(dataclasses.replace(paging, page_cache_bytes=budget.page_cache)),
            heartbeat_every=OBSERVED_HEARTBEAT_EVERY if local else 1,
        )  # fmt: skip
        channel = connect(request.address, self._credentials.token, tls=self._credentials.tls)
        worker = Worker(
            worker_id,
            request.pid,
            request.host,
            request.address,
            channel,
            pb_grpc.WorkerStub(channel),
            local,
        )
        with self._cond:
            self.channels.append(channel)
            self._workers[worker_id] = worker
            self._cond.notify_all()
        logger.info("worker %d registered: pid %d at %s", worker_id, request.pid, request.address)
        return pb.RegisterReply(worker_id=worker_id, config=config)

    def on_ready(self, worker_id: int, message: pb.WorkerInfo) -> None:
        """``message``: what its pager announced, and the port of its bulk server (if any).
        A retry (its call timed out on a loaded driver while the first was being answered)
        waits for the first instead of adding the worker twice."""
        worker = self._workers[worker_id]
        with self._cond:
            if worker.announced:
                self._cond.wait_for(lambda: worker.ready or worker.lost is not None, READY_RETRY_WAIT)
                return
            worker.announced = True
        try:
            self._make_ready(worker, message)
        except BaseException:
            with self._cond:
                worker.announced = False  # a retry may try again
            raise

    def _make_ready(self, worker: Worker, message: pb.WorkerInfo) -> None:
        worker_id = worker.id
        info, bulk_port = worker_info(message)
        self._paging.worker_ready(worker_id, info)
        bulk = format_address(worker.host, bulk_port) if bulk_port else ""
        self.executor.worker_added(worker_id, worker.stub, worker.address, bulk)  # before it is used
        with self._cond:
            worker.info = info
            worker.ready = True
            self._cond.notify_all()

    def on_unreachable(self, worker_id: int, details: str) -> None:
        """A call to a worker failed: find out how it ended (off the calling thread)."""
        worker = self._workers.get(worker_id)
        if worker is None or self.closed or not self._claim_end(worker):
            return

        threading.Thread(
            target=lambda: self._mark_lost(worker, f"{details}; {self._how_ended(worker, True)}"),
            name="clamor-lost",
            daemon=True,
        ).start()

    def _how_ended(self, worker: Worker, unreachable: bool = False) -> str:
        """:meth:`_how_lost`, or why it is not known: the claimant of a worker's end
        (:meth:`_claim_end`) must mark it lost whatever the launcher raises."""
        try:
            return self._how_lost(worker, unreachable)
        except Exception as exc:  # noqa: BLE001 - it is lost whatever the launcher says
            return f"its end could not be found out ({type(exc).__name__}: {exc})"

    def _claim_end(self, worker: Worker) -> bool:
        """Become the one thread that finds out how ``worker`` ended and marks it lost;
        False if it is lost already or another thread is at it."""
        with self._cond:
            if worker.lost is not None or worker.ending:
                return False
            worker.ending = True
            return True

    def on_heartbeat(self, worker_id: int) -> bool:
        with self._cond:
            worker = self._workers.get(worker_id)
            if worker is None or worker.lost is not None:
                return False
            worker.last_heartbeat = time.monotonic()
            return True

    def spill_peers(self, worker_id: int, nbytes: int) -> list[tuple[int, str, int]]:
        """R3S's placement: the other live workers with room for ``nbytes`` in their partition
        budget (by what the driver knows they keep in memory), most free memory first."""
        held = self.executor.ask(lambda s: s.memory_held())
        with self._cond:
            addresses = {w.id: w.address for w in self._workers.values() if w.lost is None}
        free = self.budgets.free(held, exclude=worker_id, at_least=nbytes)
        return [(w, addresses[w], room) for w, room in free if w in addresses]

    # --- liveness ---

    def _wait_ready(self, ids: range, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                pending = [i for i in ids if not (i in self._workers and self._workers[i].ready)]
                if not pending:
                    return
                dead = [i for i in pending if self.launcher.exitcode(i) is not None]
                if dead or time.monotonic() >= deadline:
                    problem = [self._startup_state(i) for i in (dead or pending)]
                    what = "failed to start" if dead else f"did not come up within {timeout:g} s"
                    raise ClamorError(f"{len(problem)} worker(s) {what}: " + "; ".join(problem))
                self._cond.wait(POLL_INTERVAL)

    def _startup_state(self, worker_id: int) -> str:
        code = self.launcher.exitcode(worker_id)
        if code is not None:
            state = describe_exit(code)
        elif worker_id in self._workers:
            state = "registered but not ready"
        else:
            state = "running but never registered"
        return f"worker {worker_id} ({self.launcher.describe(worker_id)}) {state}"

    def _process_alive(self, worker: Worker) -> bool:
        """A local worker: its process has not exited. A remote one: a heartbeat came
        within :data:`HEARTBEAT_TIMEOUT`, or its task stream is still connected (its kernel
        keeps the TCP link checked while a task holds the worker's GIL, heartbeats and all)."""
        if worker.local:
            return self.launcher.alive(worker.id)
        if time.monotonic() - worker.last_heartbeat < HEARTBEAT_TIMEOUT:
            return True
        link = self.executor.link_of(worker.id)
        return link is not None and link.connected

    def vouch(self, worker_id: int) -> bool:
        """Whether a worker silent on its task stream still lives (the stream's poller asks
        before it ends the stream): a local one if its process runs or sleeps (a task
        holding the GIL: a long C call), not if it is stopped or gone; a remote one always
        (the kernel's keepalive on its TCP stream finds a dead host or a cut link)."""
        worker = self._workers.get(worker_id)
        if worker is None or worker.lost is not None or self.closed:
            return False
        return not worker.local or process_runs(worker.pid)

    def _how_lost(self, worker: Worker, unreachable: bool = False) -> str:
        """Describe a lost worker's end; a local worker that still runs is killed first. An
        ``unreachable`` remote one (its task stream ended) gets 2 s to tell its exit status."""
        if not worker.local:
            silent = time.monotonic() - worker.last_heartbeat
            how = "" if unreachable else f"no heartbeat for {silent:.1f} s; "
            code = self.launcher.wait(worker.id, 2.0) if unreachable else self.launcher.exitcode(worker.id)
            where = self.launcher.describe(worker.id)
            return f"{how}{where}" + ("" if code is None else f" {describe_exit(code)}")
        code = self.launcher.wait(worker.id, 2.0)
        if code is None:  # unreachable but running: it cannot be trusted any more
            code = self.launcher.kill(worker.id)
            return f"unreachable (no reply); killed: {describe_exit(code)}"
        return f"pid {worker.pid} {describe_exit(code)}"

    def _mark_lost(self, worker: Worker, how: str) -> WorkerLostError:
        with self._cond:
            first = worker.lost is None
            if first:
                worker.lost = how
        error = WorkerLostError(worker.id, worker.lost)
        if first:
            logger.log(logging.INFO if worker.retired else logging.WARNING, "worker %d lost: %s", worker.id, how)
            try:
                self._paging.worker_lost(worker.id)
                self.executor.worker_lost(worker.id, error)
                if not worker.retired:
                    self._replace(worker.id)  # before lost_told: see unstaffed
            finally:
                worker.lost_told.set()
        else:  # e.g. kill_worker racing a failed call: return only once the loss is known
            worker.lost_told.wait(10.0)
        return error

    # --- growing and shrinking ---

    def scale(self, n: int, timeout: float | None = None) -> list[int]:
        """Grow or shrink to ``n`` live workers while the cluster runs; the live workers.

        Growing starts the missing workers (a replacement already starting counts) under new ids (local ones forked from the
        template) and returns once they are ready (``timeout``: default the cluster's start
        timeout); a running stage uses them as they come. Shrinking retires the newest
        workers: each is counted out as a lost worker would be (its running tasks run
        again on the others, its kept partitions are recomputed from lineage when next
        needed) but not replaced, then asked to exit. Results stay exact either way. A
        worker lost later is replaced as before (one for one, while the restarts last).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"a cluster needs at least one worker, got {n!r}")
        with self._cond:
            self.check_open()
            live = self._live_ids()
            grow = max(0, n - len(live) - self._starting)  # replacements starting count as live
            if self._next_id + grow > MAX_WORKERS:
                raise ValueError(f"cannot grow to {n:,} workers: {WORKER_LIMIT_REASON}")
            self._size = n
            new = range(self._next_id, self._next_id + grow)
            self._next_id, self._starting = new.stop, self._starting + grow
        if not new:
            for worker_id in sorted(live)[n:]:
                self._retire(self._workers[worker_id])
            return self.live()
        try:
            with self._spawning:
                self.launcher.start(new)
            self._wait_ready(new, self._start_timeout if timeout is None else timeout)
        finally:
            with self._cond:
                self._starting -= grow
                self._cond.notify_all()
            self._release_start_files()
        return self.live()

    def _retire(self, worker: Worker) -> None:
        """Count ``worker`` out (as lost, not replaced), then have its process exit."""
        worker.retired = True
        if self._claim_end(worker):
            self._mark_lost(worker, "retired (scale)")
        try:
            worker.stub.Shutdown(pb.ShutdownRequest(), timeout=2)
        except grpc.RpcError:
            pass  # gone already, or wedged: killed below
        if worker.local and self.launcher.wait(worker.id, 5.0) is None:
            self.launcher.kill(worker.id)

    # --- replacing lost workers ---

    def _replace(self, lost: int) -> None:
        """Start a new worker in place of ``lost`` (as Dask's nanny restarts its worker),
        under a new id, while the restart budget lasts: the cluster keeps its size. It
        joins like the first ones (registration, then ready) on a thread of its own."""
        with self._cond:
            if self.closed:
                return
            now = time.monotonic()
            while self._restarted and now - self._restarted[0] > RESTART_WINDOW:
                self._restarted.popleft()
            if len(self._restarted) >= self._restarts or self._next_id >= MAX_WORKERS:
                why = WORKER_LIMIT_REASON if self._next_id >= MAX_WORKERS else (
                    f"{len(self._restarted)} were replaced in the last {RESTART_WINDOW:g} s "
                    f"(restarts={self._restarts})")
                logger.warning("worker %d is not replaced: %s", lost, why)
                self._unreplaced = f"worker {lost} was lost ({self._workers[lost].lost}) and not replaced: {why}"
                return
            self._restarted.append(now)
            new, self._next_id = self._next_id, self._next_id + 1
            self._starting += 1
        self.budgets.inherit(new, lost)
        threading.Thread(target=self._start_replacement, args=(lost, new),
                         name="clamor-replace", daemon=True).start()  # fmt: skip

    def _start_replacement(self, lost: int, new: int) -> None:
        try:
            with self._spawning:  # a launcher writes its start-up files once
                self.launcher.spawn(new)
            self._wait_ready(range(new, new + 1), self._start_timeout)
            self.replaced += 1
            logger.info("worker %d replaces lost worker %d", new, lost)
        except Exception as exc:  # noqa: BLE001 - a failed replacement leaves the cluster smaller
            if not self.closed:
                logger.warning("worker %d, started in place of lost worker %d, did not join: %s",
                               new, lost, exc)  # fmt: skip
                with self._cond:
                    self._unreplaced = f"worker {new}, started in place of lost worker {lost}, did not join: {exc}"
        finally:
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()
            self._release_start_files()

    def _release_start_files(self) -> None:
        """Remove the launcher's token file once no worker is starting (read by then)."""
        with self._cond:
            if self._starting:
                return
        with self._spawning:
            self.launcher.release_token_file()

    def wait_for_workers(self, n: int | None = None, timeout: float | None = None) -> list[int]:
        """Wait until ``n`` workers are live (default: as many as the cluster started with)
        or no replacement is starting any more; the live workers."""
        n = self._size if n is None else n
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                live = self._live_ids()
                left = None if deadline is None else deadline - time.monotonic()
                if len(live) >= n or not self._starting or (left is not None and left <= 0):
                    return live
                self._cond.wait(POLL_INTERVAL if left is None else min(POLL_INTERVAL, left))

    def _live_ids(self) -> list[int]:
        """(Under ``_cond``.) The ids of the ready workers not lost, sorted."""
        return sorted(w.id for w in self._workers.values() if w.ready and w.lost is None)

    def _kill(self, worker: Worker, why: str, must: bool = False) -> bool:
        """SIGKILL ``worker`` and mark it lost, saying ``why`` after how it ended; False if
        its launcher cannot kill it (then, with ``must``, it is left as it was; else it is
        marked lost all the same: it cannot be trusted)."""
        claimed = self._claim_end(worker)  # the reason is this one, not what a refresh sees
        try:
            code = self.launcher.kill(worker.id, worker.pid)
            ended, killed = "killed" if code is None else describe_exit(code), True
        except (NotImplementedError, KeyError):
            if must:
                if claimed:
                    with self._cond:
                        worker.ending = False
                return False
            ended, killed = "could not be killed by its launcher", False
        self._mark_lost(worker, f"{self.launcher.describe(worker.id)} {ended} {why}")
        return killed

    def kill_unresponsive(self, worker_id: int, why: str) -> None:
        """The executor's call: a worker did not stop a cancelled task (``why``)."""
        worker = self._workers.get(worker_id)
        if worker is not None and not self.closed and worker.lost is None:
            self._kill(worker, f"({why})")

    def refresh(self) -> None:
        """Mark local workers whose process has exited as lost (not while closing: they exit)."""
        if self.closed:
            return
        with self._cond:
            candidates = [w for w in self._workers.values()
                          if w.lost is None and w.ready and not w.ending]  # fmt: skip
        for worker in candidates:
            if not self._process_alive(worker) and self._claim_end(worker):
                self._mark_lost(worker, self._how_ended(worker))

    def unstaffed(self) -> str | None:
        """Why no worker can take a task, now or later: none is live, none is starting
        (nor a loss being handled, which may start one). ``None`` if one can."""
        with self._cond:
            if self.closed or self._starting or any(
                (w.lost is None and w.ready) or (w.lost is not None and not w.lost_told.is_set())
                for w in self._workers.values()
            ):
                return None
            return f"{self._unreplaced or 'every worker was lost'}; cluster.scale(n) starts new ones"

    def live_worker(self, worker_id: int) -> Worker:
        worker = self._workers.get(worker_id)
        if worker is None or not worker.ready:
            raise ValueError(f"no worker {worker_id} (workers: {self.live()})")
        if worker.lost is not None:
            raise WorkerLostError(worker_id, worker.lost)
        return worker
