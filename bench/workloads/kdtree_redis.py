"""The Redis program of the ``kdtree`` workload (:class:`RedisRunner`): Debian's
``redis-server`` started privately on 127.0.0.1 (a free port, a temporary directory, no
persistence), every point loaded with pipelined ``GEOADD``, then per query
``GEOSEARCH FROMLONLAT lon lat BYRADIUS r km ASC COUNT 10`` with the smallest radius
that returns 10, found by doubling from :data:`R0_KM` (:func:`redis_search`).

Redis measures great-circle distance while the tree is Euclidean on (lat, lon), so its
answer is checked against the exact haversine 10-NN (:func:`haversine_reference`,
:func:`overlap`). It ships no task function: nothing here runs on a worker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from workloads.kdtree_runner import LEAF, K, Runner

R0_KM = 0.25  # the first GEOSEARCH radius; doubled until 10 come back
REDIS_BATCH = 2000  # commands per pipeline round trip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_search(r: Any, queries: np.ndarray) -> tuple[list[list[int]], np.ndarray, int]:
    """Per query, the members GEOSEARCH returns at the smallest doubled radius giving 10;
    the radius used per query and the number of GEOSEARCH commands sent."""
    radius = np.full(len(queries), R0_KM)
    found: list[list[int]] = [[] for _ in queries]
    pending = list(range(len(queries)))
    commands = 0
    while pending:
        short = []
        for start in range(0, len(pending), REDIS_BATCH):
            batch = pending[start:start + REDIS_BATCH]
            pipe = r.pipeline(transaction=False)
            for i in batch:
                lat, lon = queries[i]
                pipe.execute_command("GEOSEARCH", "pts", "FROMLONLAT", float(lon), float(lat),
                                     "BYRADIUS", float(radius[i]), "km", "ASC", "COUNT", K)  # fmt: skip
            commands += len(batch)
            for i, members in zip(batch, pipe.execute(), strict=True):
                if len(members) >= K:
                    found[i] = [int(m) for m in members]
                else:
                    radius[i] *= 2
                    short.append(i)
        pending = short
    return found, radius, commands


def haversine_reference(points: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The exact great-circle 10-NN of each query (indices into ``points``)."""
    from sklearn.neighbors import BallTree

    lo, hi = queries.min(axis=0) - 1.0, queries.max(axis=0) + 1.0  # 1 degree around the region
    near = np.flatnonzero(((points >= lo) & (points <= hi)).all(axis=1))
    tree = BallTree(np.radians(points[near]), metric="haversine")
    return near[tree.query(np.radians(queries), k=K)[1]]


def overlap(a: list[list[int]] | np.ndarray, b: np.ndarray) -> float:
    """Mean fraction of each query's 10 neighbours in ``a`` that are also in ``b``."""
    return float(np.mean([len(set(x) & set(y.tolist())) / K for x, y in zip(a, b, strict=True)]))


class RedisRunner(Runner):
    """A private redis-server on 127.0.0.1 (no persistence); GEOADD, then GEOSEARCH."""

    name = "redis"

    def __init__(self, points: np.ndarray, queries: np.ndarray, args: argparse.Namespace, net: Any) -> None:
        super().__init__(points, queries)
        import redis
        from sklearn.neighbors import KDTree

        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.access(server, os.X_OK):
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.queries, self.n = queries, len(points)
        self.ref_kd = KDTree(points, leaf_size=LEAF).query(queries, k=K)[1]
        self.ref_hav = haversine_reference(points, queries)
        lon = np.clip(points[:, 1], -180.0, 180.0)  # GEOADD rejects |lon| > 180 (none near the region)
        self.commands = []  # GEOADD argument lists of 10,000 points each, made untimed
        for s in range(0, len(points), 10_000):
            flat: list = []
            for j in range(s, min(s + 10_000, len(points))):
                flat += (float(lon[j]), float(points[j, 0]), str(j))
            self.commands.append(flat)
        self.tmp = tempfile.TemporaryDirectory(prefix="clamor-kdtree-redis-")
        port = free_port()
        self.proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", self.tmp.name, "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--logfile", os.path.join(self.tmp.name, "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.r = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.r.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"redis-server did not start (exit {self.proc.poll()})") from None
                time.sleep(0.05)
        self.answer: list | None = None

    def fresh(self) -> None:
        self.r.flushall()

    def first(self) -> list:
        t0 = time.perf_counter()
        pipe = self.r.pipeline(transaction=False)
        for flat in self.commands:
            pipe.execute_command("GEOADD", "pts", *flat)
            if len(pipe) >= 20:
                pipe.execute()
        pipe.execute()
        self.ship.append(time.perf_counter() - t0)
        return self.again()

    def again(self) -> list:
        found, self.radius, self.sent = redis_search(self.r, self.queries)
        return found

    def settle(self) -> None:
        if self.r.zcard("pts") != self.n:
            self.fresh()
            self.first()

    def mark(self) -> None:
        self.n0 = self.r.info("stats")

    def count(self, case: str) -> int:
        n0, n1 = self.n0, self.r.info("stats")
        return (n1["total_net_input_bytes"] - n0["total_net_input_bytes"]
                + n1["total_net_output_bytes"] - n0["total_net_output_bytes"])  # fmt: skip

    def check(self, found: list) -> tuple[bool, str]:
        if (loaded := self.r.zcard("pts")) != self.n:
            return False, f"WRONG: {loaded} members loaded, expected {self.n}"
        hav = overlap(found, self.ref_hav)
        self.fields.update({"overlap_haversine": hav, "overlap_kdtree": overlap(found, self.ref_kd),
                            "geosearch_per_query": self.sent / len(self.queries),
                            "radius_km_median": float(np.median(self.radius)),
                            "radius_km_max": float(self.radius.max())})  # fmt: skip
        self.answer = self.answer or found
        if found != self.answer or hav < 0.99:
            return False, f"WRONG: overlap with the exact haversine 10-NN {hav:.3f} (< 0.99) or passes differ"
        return True, ""

    def rss(self, parts: list) -> int:
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.tmp.cleanup()
