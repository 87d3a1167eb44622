"""The measured systems' sessions, Clamor's and its peers', behind one small interface
(:class:`Session`). The broadcast-table workloads (``lookups.py``, ``streaming.py``)
open them by child name (``programs.py``); other workloads start the ones they need.

Every system runs ``WORKERS`` workers (2, local ones by default) and offers the same
operations on a driver-side numpy table, so a workload is written once (the limits offer
them too: ``limits.py``):

====================  =================================  ===============================
system                ``broadcast(table)``               a task ``fn(table, *args)``
====================  =================================  ===============================
clamor                nothing: the table is in the       ``cluster.run_stage`` (tasks
                      arena (``make_table``), tasks      placed round-robin); workers
                      ship a reference and workers       fault in the pages they touch
                      demand-page it
dask                  ``client.scatter(table,            ``client.submit(fn, future,
                      broadcast=True, hash=False)``      ...)``
ray                   ``ray.put(table)``; the object     ``f.remote(ref, ...)``
                      store sized for the data
                      (:func:`ray_store_bytes`)
ipyparallel           ``rc[:].push({name: table})``,     ``view.apply_async(fn,
                      a fresh name per broadcast         Reference(name), ...)``
====================  =================================  ===============================

``run(fn, args)`` runs tasks that take their data by value (no broadcast): the
"ship keys' values" programs, ``table[keys]`` gathered on the driver and passed to
``client.submit(fn, values)``, ``f.remote(values)``, ``view.apply_async(fn, values)``
(Ray and Dask inline such small arguments in the task).

``release(handle, wait=True)`` drops a broadcast and, with ``wait``, returns only when
the system has freed it: Dask when no worker holds its key any more
(``client.has_what``); Ray when the driver's core worker no longer counts a reference to
the object and the object stores hold no more objects than before the first broadcast
plus one copy per store of each broadcast still alive
(``ray._private.internal_api.memory_summary``; Ray frees objects in batches, by default
once a second); ipyparallel when every engine has deleted its name.

Network mode (``programs.open_session(system, network)``, see ``network.py``): the same
operations with each worker on its own simulated host (a ``netns.Network`` built by the
child): Clamor through ``NamespaceLauncher``, Dask's scheduler, Ray's head (0 CPUs) and
ipyparallel's controller on the driver's address and their workers, nodes and engines
started in the hosts' namespaces (:meth:`Session.start_on_hosts`). The limits run on the
driver's host whatever the network.

Task functions are passed in by the workload script: defined there, in the child's
``__main__``, every system pickles them by value, so no worker needs ``bench/`` on its
path. A task returns ``(value, os.getpid())`` so the child can read each worker's RSS and
memory (:func:`harness.usage.worker_memory`) after the stage, while the workers still
hold the table.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

import numpy as np
import psutil
from harness import (
    network as netmode,  # the module; `network` is the argument everywhere here
)
from harness import progress
from harness.tables import fmt_bytes

if TYPE_CHECKING:
    from clamor.testing.netns import Network

#: Workers (engines, nodes' CPUs) of every system: 2, or ``CLAMOR_BENCH_WORKERS`` (the
#: 16-core runs, bench/device/).
WORKERS = int(os.environ.get("CLAMOR_BENCH_WORKERS", "2"))
#: Room an object store keeps beside the copies of the data it must hold.
STORE_HEADROOM = 256 << 20


def ray_store_bytes(data_bytes: int, stores: int = 1) -> int:
    """Ray's ``object_store_memory`` for data of ``data_bytes``: two copies (a re-put
    overlaps the release of the last copy) and :data:`STORE_HEADROOM`, at most the free
    space of ``/dev/shm`` (where the stores live) shared among the ``stores`` object
    stores on this machine, less the headroom; raises if one copy would not fit."""
    shm = os.statvfs("/dev/shm")
    cap = shm.f_bavail * shm.f_frsize // stores - STORE_HEADROOM
    if cap < data_bytes + STORE_HEADROOM:
        raise RuntimeError(f"/dev/shm has room for {fmt_bytes(cap)} per object store, the "
                           f"data needs {fmt_bytes(data_bytes + STORE_HEADROOM)}")  # fmt: skip
    return int(min(2 * data_bytes + STORE_HEADROOM, cap))


# --- the systems ------------------------------------------------------------------------


class Session:
    """One running system with ``WORKERS`` workers (subclasses: one per system)."""

    system = ""
    #: Copies of the table a broadcast makes, per host (bytes moved = nbytes x this).
    copies = WORKERS

    def make_table(self, n: int) -> np.ndarray:
        """``n`` int64 values ``7 i + 3`` where this system's program keeps its table (the
        driver's heap; Clamor: the arena; shared memory: a block)."""
        return make_table(n, arena=False)

    def broadcast(self, table: np.ndarray) -> Any:
        """Make ``table`` available to the tasks; a handle the tasks take as ``table``."""
        raise NotImplementedError

    def release(self, handle: Any, wait: bool = True) -> None:
        """Drop a broadcast table from the workers; with ``wait``, return once the system
        has freed it (raises if it has not within a minute)."""

    def map(self, fn: Callable, handle: Any, args: Sequence[tuple]) -> list:
        """Run ``fn(table, *a)`` for every ``a`` in ``args``, one task each; the results."""
        raise NotImplementedError

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        """Run ``fn(*a)`` for every ``a`` in ``args``, one task each, the arguments shipped
        with the task; the results."""
        raise NotImplementedError

    def restart(self) -> None:
        """A fresh system (new worker processes, nothing cached); the table stays."""
        raise NotImplementedError

    def moved(self) -> int | None:
        """Table bytes moved to workers so far, where the system counts them."""
        return None

    def close(self) -> None:
        raise NotImplementedError

    # --- network mode: the system's worker processes on the simulated hosts ---

    def start_on_hosts(self, network: Network, command: Callable[[Any], list[str]],
                       hosts: Sequence[Any] | None = None) -> None:  # fmt: skip
        """Start ``command(host)`` in the namespace of each of ``hosts`` (default: all;
        output to the network's work directory); :meth:`stop_hosts` ends them."""
        self.procs: list[subprocess.Popen] = getattr(self, "procs", [])
        self.logs: list[tuple[Path, IO]] = getattr(self, "logs", [])
        for host in network.hosts if hosts is None else hosts:
            path = Path(network.workdir) / f"{self.system}-{host.index}.log"
            log = open(path, "ab")  # noqa: SIM115 - closed by stop_hosts
            self.logs.append((path, log))
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", host.ns, *command(host)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            ))  # fmt: skip

    def host_logs(self) -> str:
        """The end of the namespaced processes' output, for error messages."""
        tails = []
        for path, _ in getattr(self, "logs", []):
            text = path.read_text(errors="replace").strip().splitlines()[-3:] if path.exists() else []
            if text:
                tails.append(f"{path.name}: " + " | ".join(text))
        return "; ".join(tails)[-1000:]

    def stop_hosts(self, grace: float = 10.0) -> None:
        """SIGTERM what :meth:`start_on_hosts` started (its session), SIGKILL it after ``grace`` s."""
        procs = getattr(self, "procs", [])
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for _, log in getattr(self, "logs", []):
            log.close()
        self.procs, self.logs = [], []

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        """Poll ``ready()`` until true; raise naming ``what`` and the hosts' output if not."""
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p for p in getattr(self, "procs", []) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = (f"({' '.join(dead[0].args[4:8])} ... exited with {dead[0].returncode})"
                       if dead else f"within {timeout:.0f} s")  # fmt: skip
                raise RuntimeError(f"{self.system}: {what} {why}; {self.host_logs()}")
            time.sleep(0.2)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClamorSession(Session):
    """``clamor.Cluster(workers=WORKERS)``; ``restart()`` gives cold worker caches. On a
    network: one worker per host (``NamespaceLauncher``), pages over TCP."""

    system = "clamor"
    copies = 0

    def __init__(self, network: Network | None = None, **options: Any) -> None:
        import clamor

        self.clamor, self.options, self.network = clamor, options, network
        self.cluster = self._start()

    def _start(self) -> Any:
        options = dict(self.options)
        if self.network is not None:
            options.update(netmode.cluster_options(self.network))
        return self.clamor.Cluster(workers=WORKERS, **options)

    def restart(self) -> None:
        """A fresh cluster (the arena and its arrays stay): workers with empty caches."""
        self.cluster.close()
        self.cluster = self._start()

    def make_table(self, n: int) -> np.ndarray:
        return make_table(n, arena=True)

    def broadcast(self, table: np.ndarray) -> np.ndarray:
        if not self.clamor.in_arena(table):
            raise ValueError("the clamor table must be an arena array (clamor.array)")
        return table  # nothing moves: tasks ship a reference, workers fault pages in

    def map(self, fn: Callable, handle: Any, args: Sequence[tuple]) -> list:
        return self.run(fn, [(handle, *a) for a in args])

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        ids = self.cluster.workers
        return self.cluster.run_stage([(ids[i % len(ids)], fn, a) for i, a in enumerate(args)])

    def counters(self) -> dict[str, int]:
        s = self.cluster.stats()
        keys = ("bytes_served_by_driver", "bytes_served_by_peers", "invalidations",
                "pages_fetched", "faults", "version_log_bytes")  # fmt: skip
        return {k: int(s.get(k, 0)) for k in keys}

    def moved(self) -> int:
        c = self.counters()
        return c["bytes_served_by_driver"] + c["bytes_served_by_peers"]

    def close(self) -> None:
        self.cluster.close()


class DaskSession(Session):
    """``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``."""

    system = "dask"

    def __init__(self, network: Network | None = None) -> None:
        from dask.distributed import Client, LocalCluster

        self.network = network
        self.cluster = self.client = None
        try:
            if network is None:
                self.cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1,
                                            processes=True, dashboard_address=None)  # fmt: skip
            else:  # the scheduler here on the driver's address, a `dask worker` per host
                self.cluster = LocalCluster(n_workers=0, host=network.driver_address,
                                            scheduler_port=0, dashboard_address=None)  # fmt: skip
                address = self.cluster.scheduler_address
                memory = psutil.virtual_memory().total // WORKERS  # as LocalCluster's "auto"
                self.start_on_hosts(network, lambda h: [
                    sys.executable, "-m", "dask", "worker", address, "--nthreads", "1",
                    "--nworkers", "1", "--host", h.address, "--no-dashboard",
                    "--memory-limit", str(memory)])  # fmt: skip
            self.client = Client(self.cluster)
            if network is None:
                self.client.wait_for_workers(WORKERS, timeout=120)
            else:
                self.wait_for(lambda: len(self.client.nthreads()) >= WORKERS,
                              "dask workers did not register")  # fmt: skip
        except BaseException:
            self.close()
            raise

    def broadcast(self, table: np.ndarray) -> Any:
        return self.client.scatter(table, broadcast=True, hash=False)

    def release(self, handle: Any, wait: bool = True) -> None:
        key = handle.key
        handle.release()
        if not wait:
            return
        deadline = time.monotonic() + 60  # wait until the workers let go of it
        while any(key in keys for keys in self.client.has_what().values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"dask: the workers still hold {key} a minute after its release")
            time.sleep(0.02)

    def map(self, fn: Callable, handle: Any, args: Sequence[tuple]) -> list:
        return self.run(fn, [(handle, *a) for a in args])

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        return self.client.gather([self.client.submit(fn, *a, pure=False) for a in args])

    def restart(self) -> None:
        self.close()
        self.__init__(self.network)

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
            if self.cluster is not None:
                self.cluster.close()  # the scheduler tells the namespaced workers to close
        finally:
            self.stop_hosts()


class RayHandle:
    """A broadcast on Ray: the ``ObjectRef`` of the table, held here alone so that
    :meth:`RaySession.release` can drop the last reference and wait for the free."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref


class RaySession(Session):
    """``ray.init(num_cpus=2, object_store_memory=...)``; tasks ``@ray.remote(num_cpus=1)``.
    On a network: the head here on the driver's address with 0 CPUs (so no task runs on
    it), and one ``ray start --address HEAD --node-ip-address HOST --num-cpus 1
    --object-store-memory ...`` node per host. ``object_store_memory``: every store's size
    (``None``: Ray's default, 30 % of the memory; the workloads pass
    :func:`ray_store_bytes` of their largest table)."""

    system = "ray"
    copies = 1  # one copy in this host's object store, read in place by its workers

    def __init__(self, network: Network | None = None, object_store_memory: int | None = None) -> None:
        import ray

        self.ray, self.network, self.store = ray, network, object_store_memory
        self.remotes: dict[Callable, Any] = {}
        self.gcs = ""
        self.settled: int | None = None  # the object stores' objects with no broadcast alive
        self.live = 0  # broadcasts not yet released
        self.stores = 1 if network is None else len(network.hosts) + 1  # each may hold a copy
        store = {} if object_store_memory is None else {"object_store_memory": int(object_store_memory)}
        if network is None:  # "local": a new instance, never one found in /tmp/ray
            ray.init("local", num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR", **store)
            return
        try:
            ray.init("local", num_cpus=0, include_dashboard=False, logging_level="ERROR",
                     _node_ip_address=network.driver_address, **store)  # fmt: skip
            self.gcs = gcs = ray.get_runtime_context().gcs_address
            node_store = [] if object_store_memory is None else [
                "--object-store-memory", str(int(object_store_memory))]  # fmt: skip

            def node(h: Any) -> list[str]:
                return [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", gcs,
                        "--node-ip-address", h.address, "--num-cpus", "1", "--block",
                        "--disable-usage-stats", *node_store]  # fmt: skip

            # One node at a time, a second try each: on 2 busy cores a node whose agent
            # starts too slowly takes its raylet down with it (`ray start` exits with 1).
            for i, host in enumerate(network.hosts):
                for attempt in (1, 2):
                    self.start_on_hosts(network, node, [host])
                    try:
                        self.wait_for(lambda i=i: ray.cluster_resources().get("CPU", 0) > i,
                                      f"ray node on {host.address} did not join")  # fmt: skip
                        break
                    except RuntimeError as exc:
                        if attempt == 2:
                            raise
                        progress(f"  ray: {exc}; starting it again")
                        failed = self.procs.pop()
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(failed.pid, signal.SIGTERM)
                        try:
                            failed.wait(10)
                        except subprocess.TimeoutExpired:
                            os.killpg(failed.pid, signal.SIGKILL)
                            failed.wait()
            self.copies = len(network.hosts)  # the table travels to each node's object store
        except BaseException:
            self.close()
            raise

    def plasma(self) -> tuple[int, int]:
        """(MiB used, objects) in the object stores, summed over the nodes."""
        from ray._private import internal_api

        text = internal_api.memory_summary(stats_only=True)
        found = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", text)
        if found is None:
            raise RuntimeError(f"ray: no object store statistics in {text[:200]!r}")
        return int(found[1]), int(found[2])

    def broadcast(self, table: np.ndarray) -> RayHandle:
        if self.settled is None:  # what the stores hold with no broadcast alive (untimed)
            self.settled = self.plasma()[1]
        handle = RayHandle(self.ray.put(table))
        self.live += 1
        return handle

    def release(self, handle: RayHandle, wait: bool = True) -> None:
        oid = handle.ref.hex()
        handle.ref = None  # the last reference: Ray frees the object (in its next batch)
        self.live -= 1
        if not wait:
            return
        core = self.ray._private.worker.global_worker.core_worker
        deadline = time.monotonic() + 60
        while True:  # the driver counts no reference, and the stores hold only live broadcasts
            counted = {k.decode() if isinstance(k, bytes) else str(k)
                       for k in core.get_all_reference_counts()}  # fmt: skip
            if oid not in counted and self.plasma()[1] <= (self.settled or 0) + self.live * self.stores:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray: object {oid} not freed a minute after its release "
                                   f"(object store: {self.plasma()})")  # fmt: skip
            time.sleep(0.02)

    def map(self, fn: Callable, handle: RayHandle, args: Sequence[tuple]) -> list:
        return self.run(fn, [(handle.ref, *a) for a in args])

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        if fn not in self.remotes:
            self.remotes[fn] = self.ray.remote(num_cpus=1)(fn)
        remote = self.remotes[fn]
        return self.ray.get([remote.remote(*a) for a in args])

    def restart(self) -> None:
        self.close()
        self.__init__(self.network, self.store)

    def close(self) -> None:
        try:
            if self.ray.is_initialized():
                self.ray.shutdown()  # the driver and the head it started
        finally:
            self.stop_hosts()  # `ray start --block` stops its node on SIGTERM
            # `ray start` records the cluster for later `ray.init()` calls: not ours to leave
            current = Path(tempfile.gettempdir(), "ray", "ray_current_cluster")
            with contextlib.suppress(OSError):
                if self.gcs and current.read_text().strip() == self.gcs:
                    current.unlink()


class IpyparallelSession(Session):
    """``ipp.Cluster(n=2)`` started here; a load-balanced view for the tasks."""

    system = "ipyparallel"

    def __init__(self, network: Network | None = None) -> None:
        import ipyparallel as ipp

        self.ipp, self.rc, self.network, self.count = ipp, None, network, 0
        try:
            if network is None:
                self.cluster = ipp.Cluster(n=WORKERS, log_level=40)
                self.rc = self.cluster.start_and_connect_sync()
            else:  # the controller here on the driver's address, an engine per host
                self.cluster = ipp.Cluster(n=0, log_level=40, controller_ip=network.driver_address)
                self.cluster.start_controller_sync()
                engine_file = os.path.join(self.cluster.profile_dir, "security",
                                           f"ipcontroller-{self.cluster.cluster_id}-engine.json")  # fmt: skip
                self.start_on_hosts(network, lambda h: [
                    sys.executable, "-m", "ipyparallel.engine", f"--file={engine_file}",
                    "--log-level=40"])  # fmt: skip
                self.rc = self.cluster.connect_client_sync()
                self.wait_for(lambda: len(self.rc.ids) >= WORKERS, "ipyparallel engines did not register")
            self.rc.wait_for_engines(WORKERS, timeout=120)
            self.dview, self.view = self.rc[:], self.rc.load_balanced_view()
        except BaseException:
            self.close()
            raise

    def broadcast(self, table: np.ndarray) -> Any:
        self.count += 1  # a name of its own: a release never drops a later broadcast
        name = f"clamor_bench_table_{self.count}"
        self.dview.push({name: table}, block=True)
        return self.ipp.Reference(name)

    def release(self, handle: Any, wait: bool = True) -> None:
        self.dview.execute(f"del {handle.name}", block=wait)

    def map(self, fn: Callable, handle: Any, args: Sequence[tuple]) -> list:
        return self.run(fn, [(handle, *a) for a in args])

    def run(self, fn: Callable, args: Sequence[tuple]) -> list:
        return [r.get() for r in [self.view.apply_async(fn, *a) for a in args]]

    def restart(self) -> None:
        self.close()
        self.__init__(self.network)

    def close(self) -> None:
        try:
            if self.rc is not None:
                if getattr(self, "procs", None):  # engines this session started on the hosts
                    with contextlib.suppress(Exception):
                        self.rc.shutdown(targets="all", block=True)
                self.rc.close()
            with contextlib.suppress(Exception):  # e.g. it never started
                self.cluster.stop_cluster_sync()
        finally:
            self.stop_hosts()


def make_table(n: int, arena: bool) -> np.ndarray:
    """``n`` int64 values ``7 i + 3``, in the clamor arena if ``arena``, filled in chunks
    (no temporary the size of the table). int64, so a sum of looked-up values is exact."""
    if arena:
        import clamor

        return fill_table(clamor.empty(n, np.int64))
    return fill_table(np.empty(n, np.int64))


def fill_table(table: np.ndarray, chunk: int = 8 << 20) -> np.ndarray:
    """Write ``7 i + 3`` at every ``i`` of the int64 ``table``, ``chunk`` values at a time."""
    for a in range(0, len(table), chunk):
        b = min(len(table), a + chunk)
        np.multiply(np.arange(a, b, dtype=np.int64), 7, out=table[a:b])
        table[a:b] += 3
    return table
