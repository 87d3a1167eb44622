"""The clusters of this server's kernels, and queries to them off the IOLoop.

A kernel whose cluster runs has an entry in the registry
(:mod:`clamor.runtime.observe.cluster_registry`): its scheduler's address and credentials.
:class:`ClusterSource` lists the entries of the server's *running* kernels only
and asks their scheduler's ``Observer`` service for snapshots and stats on a
thread pool, so a busy or hung kernel never blocks the server. Answers are
cached for a fraction of a second and concurrent requests for the same answer
share one call: ten open dashboards cost the kernel what one does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from clamor.runtime.observe import cluster_registry, observer
from clamor.runtime.observe.cluster_registry import Entry


class NoSuchCluster(LookupError):
    """No running kernel of this server has a registered cluster with that id (HTTP 404)."""


class ClusterUnavailable(RuntimeError):
    """The cluster is registered but does not answer: closed, exiting or hung (HTTP 503)."""


class ClusterSource:
    """Registry entries of the kernels ``kernel_ids()`` returns, read from ``directories()``.

    ``timeout``: seconds a query may take; ``max_age``: how long an answer is reused.
    """

    def __init__(self, directories: Callable[[], Iterable[str]], kernel_ids: Callable[[], Iterable[str]],
                 timeout: float = 10.0, max_age: float = 0.3, threads: int = 4) -> None:  # fmt: skip
        self._directories = directories
        self._kernel_ids = kernel_ids
        self.timeout = timeout
        self.max_age = max_age
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="clamor-query")
        self._cache: dict[tuple[str, str], tuple[float, float, Any]] = {}
        self._inflight: dict[tuple[str, str, float], asyncio.Future] = {}
        self._clients: dict[tuple[str, float], observer.ObserverClient] = {}  # (kernel id, created)
        self._clients_lock = threading.Lock()
        self._closed = False

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The thread pool for blocking work (queries, rendering views)."""
        return self._pool

    def entries(self) -> dict[str, Entry]:
        """The clusters of this server's running kernels, by kernel id. Entries of exited
        kernels are removed; those of other servers' kernels are left alone."""
        running = set(self._kernel_ids())
        directories = list(dict.fromkeys(str(d) for d in self._directories() if d))
        found = cluster_registry.read_entries(directories)
        entries = {k: e for k, e in found.items() if k in running}
        live = {(e.kernel_id, e.created) for e in entries.values()}
        with self._clients_lock:  # channels to clusters that are gone
            for key in [k for k in self._clients if k not in live]:
                self._clients.pop(key).close()
        return entries

    def entry(self, kernel_id: str) -> Entry:
        entry = self.entries().get(kernel_id)
        if entry is None:
            raise NoSuchCluster(
                f"no Clamor cluster for kernel {kernel_id!r}: the kernel is not running in this "
                "server, or it has not started a cluster (see clamor/api/clusters)"
            )
        return entry

    async def query(self, kernel_id: str, kind: str, timeout: float | None = None) -> Any:
        """``kind`` (``"snapshot"`` or ``"stats"``) from the cluster of ``kernel_id``, at most
        :attr:`max_age` seconds old. Raises :class:`NoSuchCluster` or :class:`ClusterUnavailable`."""
        entry = self.entry(kernel_id)
        key = (kernel_id, kind)
        cached = self._cache.get(key)
        if cached is not None and cached[1] == entry.created and time.monotonic() - cached[0] < self.max_age:
            return cached[2]
        flight = (kernel_id, kind, entry.created)
        future = self._inflight.get(flight)
        if future is None:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self._pool, self._query, entry, kind, timeout or self.timeout)
            future = asyncio.ensure_future(future)
            self._inflight[flight] = future
            future.add_done_callback(lambda _: self._inflight.pop(flight, None))
        try:
            value = await asyncio.shield(future)
        except ClusterUnavailable:
            for other in [k for k in self._cache if k[0] == kernel_id]:
                del self._cache[other]  # no stale answers from a cluster known to be down
            raise
        self._cache[key] = (time.monotonic(), entry.created, value)
        self._forget_gone()
        return value

    def _client(self, entry: Entry) -> observer.ObserverClient:
        """The channel to ``entry``'s cluster, opened once; those of replaced or gone
        clusters are closed."""
        key = (entry.kernel_id, entry.created)
        with self._clients_lock:
            if self._closed:
                raise ClusterUnavailable("the server extension is shutting down")
            client = self._clients.get(key)
            if client is None:
                for old in [k for k in self._clients if k[0] == entry.kernel_id]:
                    self._clients.pop(old).close()
                client = self._clients[key] = observer.ObserverClient(entry.address, entry.credentials)
            return client

    def _query(self, entry: Entry, kind: str, timeout: float) -> Any:
        try:
            return self._client(entry).query(kind, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                why = f"it did not answer in {timeout:g} s (is the kernel busy in native code?)"
            elif code == grpc.StatusCode.UNAVAILABLE and "closed" in (details or ""):
                why = "it is closed"
            elif code == grpc.StatusCode.UNAVAILABLE and "refused" in (details or "").lower():
                why = (f"its scheduler at {entry.address} refuses connections: the cluster was "
                       "closed, or its kernel is exiting")  # fmt: skip
            elif code == grpc.StatusCode.UNAVAILABLE:
                why = f"its scheduler at {entry.address} does not answer ({details})"
            else:
                why = f"{code.name if code else 'error'}: {details}"
            raise ClusterUnavailable(
                f"the Clamor cluster of kernel {entry.kernel_id} is not available: {why}"
            ) from None

    def _forget_gone(self) -> None:
        if len(self._cache) > 64:
            now = time.monotonic()
            for key, (when, _, _) in list(self._cache.items()):
                if now - when > 10 * self.max_age:
                    del self._cache[key]

    def close(self) -> None:
        """Close the channels (a query in flight ends with ``ClusterUnavailable``), then
        wait for the pool's threads; a query after this opens no new channel."""
        with self._clients_lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
