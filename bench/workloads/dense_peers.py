"""The peers' programs of the ``dense`` workload, each a :class:`~dense_runs.System`:
Ray (``ray.put`` of the table, :class:`RaySystem`), Dask (``client.scatter`` with
``broadcast=True``, :class:`DaskSystem`), and each one's values program, the driver
gathering ``table[keys]`` for each task and shipping only those values
(:class:`RayValuesSystem`, :class:`DaskValuesSystem`).

The tasks they run come from ``dense.py`` through ``self.tasks`` (:class:`Tasks`): there,
in the child's ``__main__``, Ray and Dask pickle them by value, so no worker needs
``bench/`` on its path.
"""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
from harness import progress
from harness.tables import fmt_bytes

from workloads.dense_runs import System, Tasks


class RaySystem(System):
    """``peers.RaySession`` (``ray.init(num_cpus=W)``, an object store of twice the table):
    ``ray.put`` once a first pass, every release waited for (untimed)."""

    def __init__(self, p: dict, tasks: Tasks) -> None:
        super().__init__(p, tasks)
        import peers

        peers.WORKERS = self.w  # this child's worker count: the sessions start that many
        self.session = peers.RaySession(object_store_memory=peers.ray_store_bytes(self.data_bytes()))
        self.handle = None
        small = self.session.broadcast(np.arange(1024, dtype=np.int64))
        pids = {pid for _, pid in self.session.map(self.tasks.warm, small, [(0.3,)] * (2 * self.w))}
        self.session.release(small)
        progress(f"  ray: {len(pids)} worker processes warmed up")

    def data_bytes(self) -> int:
        return self.p["table_bytes"]

    def fresh(self) -> None:
        if self.handle is not None:
            self.session.release(self.handle)  # waited for: the store has freed it
            self.handle = None

    def _tasks(self, args: list[tuple]) -> list:
        return self.session.map(self.tasks.lookups, self.handle, args)

    def first(self, args: list[tuple]) -> list:
        t = time.perf_counter()
        self.handle = self.session.broadcast(self.table)
        self.put_s = time.perf_counter() - t
        return self._tasks(args)

    again = _tasks

    def write(self, key: int, delta: int, args: list[tuple]) -> list:
        self.table[key] += delta
        self.session.release(self.handle, wait=False)  # as a Ray program would: drop it, put anew
        return self.first(args)

    def close(self) -> None:
        self.handle = None
        self.session.close()


class ValuesSystem(System):
    """The values programs: the driver draws each task's keys (from its seed, as the task
    would), gathers ``table[keys]`` and ships only those values; a task sums them."""

    copies = 0
    shipped = 0

    def _gather(self, args: list[tuple]) -> list[np.ndarray]:
        return [self.table[self.tasks.keys(sd, sub, self.n, pp, lk)] for sd, sub, pp, lk in args]

    def first(self, args: list[tuple]) -> list:
        t = time.perf_counter()
        values = self._gather(args)
        self.put_s = time.perf_counter() - t  # the gather (the shipping is in the tasks' time)
        self.shipped += sum(v.nbytes for v in values)
        return self.ship(values)

    again = first

    def write(self, key: int, delta: int, args: list[tuple]) -> list:
        self.table[key] += delta
        return self.first(args)

    def ship(self, values: list[np.ndarray]) -> list:
        raise NotImplementedError

    def moved(self) -> int:
        return self.shipped


class RayValuesSystem(ValuesSystem, RaySystem):
    """Ray: ``f.remote(values)`` a task (Ray puts an argument this large in its store)."""

    def data_bytes(self) -> int:
        return self.p["workers"] * self.p["tasks_per_worker"] * self.p["lookups"] * 8

    def ship(self, values: list[np.ndarray]) -> list:
        return self.session.run(self.tasks.sum_values, [(v,) for v in values])

    def fresh(self) -> None:
        pass


class DaskValuesSystem(ValuesSystem):
    """Dask: ``client.scatter`` of the values (a future a task), a ``client.submit`` each."""

    def __init__(self, p: dict, tasks: Tasks) -> None:
        super().__init__(p, tasks)
        import peers

        peers.WORKERS = self.w
        self.session = peers.DaskSession()
        self.client = self.session.client
        self.workers = sorted(self.client.run(os.getpid).values())
        self.client.gather([self.client.submit(self.tasks.sum_values, np.arange(8), pure=False)
                            for _ in range(2 * self.w)])  # fmt: skip

    def ship(self, values: list[np.ndarray]) -> list:
        futures = self.client.scatter(values, hash=False)
        out = self.client.gather([self.client.submit(self.tasks.sum_values, f, pure=False) for f in futures])
        del futures
        return out

    def pids(self, out: list) -> list[int]:
        return self.workers

    def close(self) -> None:
        self.session.close()


class DaskSystem(System):
    def __init__(self, p: dict, tasks: Tasks) -> None:
        super().__init__(p, tasks)
        from dask.distributed import Client, LocalCluster

        self.cluster = self.client = self.future = None
        need, total = self.w * p["table_bytes"], psutil.virtual_memory().total
        if need > 0.6 * total:  # every worker holds its own copy
            raise RuntimeError(f"{self.w} copies of the table ({fmt_bytes(need)}) do not fit in "
                               f"60 % of this machine's {fmt_bytes(total)}")  # fmt: skip
        # LocalCluster's own limit (the machine's memory / W), or room for the table and a
        # transient second copy as it arrives: no worker spills or pauses for its table.
        limit = max(total // self.w, 3 * p["table_bytes"])
        self.cluster = LocalCluster(n_workers=self.w, threads_per_worker=1, processes=True,
                                    dashboard_address=None, memory_limit=limit)  # fmt: skip
        self.client = Client(self.cluster)
        self.client.wait_for_workers(self.w, timeout=300)
        self.workers = sorted(self.client.run(os.getpid).values())
        self.copies = self.w
        small = self.client.scatter(np.arange(1024, dtype=np.int64), broadcast=True, hash=False)
        self.client.gather([self.client.submit(self.tasks.warm, small, 0.1, pure=False)
                            for _ in range(2 * self.w)])  # fmt: skip
        small.release()

    def fresh(self) -> None:
        if self.future is None:
            return
        key = self.future.key
        self.future.release()
        self.future = None
        deadline = time.monotonic() + 60  # until every worker has let go of it
        while time.monotonic() < deadline and any(key in ks for ks in self.client.has_what().values()):
            time.sleep(0.05)

    def _tasks(self, args: list[tuple]) -> list:
        return self.client.gather([self.client.submit(self.tasks.lookups, self.future, *a, pure=False)
                                   for a in args])  # fmt: skip

    def first(self, args: list[tuple]) -> list:
        t = time.perf_counter()
        self.future = self.client.scatter(self.table, broadcast=True, hash=False)
        self.put_s = time.perf_counter() - t
        return self._tasks(args)

    again = _tasks

    def pids(self, out: list) -> list[int]:
        return self.workers

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
