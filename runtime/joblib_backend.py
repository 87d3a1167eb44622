"""A joblib backend: scikit-learn's ``n_jobs`` work on the cluster.

::

    with joblib.parallel_config(backend="clamor"):      # the one open cluster, or cluster=...
        GridSearchCV(SVC(), grid, n_jobs=-1).fit(X, y)

joblib hands the backend batches of calls; each becomes a future (runtime/futures.py),
so batches run on every worker at once and joblib's own batching sizes them. A large
numpy argument (``MIN_SHARED_BYTES`` or more) that is not in the arena yet is copied
into it once per backend (once per ``parallel_config`` block), and then travels to every
task as a reference to the arena, which the workers map (on the driver's host) or page
in: no copy of ``X`` per task, as joblib's own memmapping does for loky. Registered as
``"clamor"`` when a cluster starts, if joblib is installed.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from clamor.runtime.errors import ClamorError

#: Arguments at least this large are put in the arena once, not pickled into each batch.
MIN_SHARED_BYTES = 1 << 20



class FuturesCluster(Protocol):
    """What the backend uses of a cluster (``Cluster`` is one)."""

    @property
    def workers(self) -> list[int]: ...

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> concurrent.futures.Future: ...


_registered = False
#: The clusters open in this process (set by :func:`register`: the cluster module's).
_open_clusters: Callable[[], list[FuturesCluster]] = list


def register(open_clusters: Callable[[], list[FuturesCluster]]) -> None:
    """Register the ``"clamor"`` joblib backend (once; nothing without joblib), whose
    default cluster is the one of ``open_clusters()``."""
    global _registered, _open_clusters
    _open_clusters = open_clusters
    if _registered or importlib.util.find_spec("joblib") is None:
        return
    from joblib import register_parallel_backend

    register_parallel_backend("clamor", _backend_class())
    _registered = True


def _backend_class() -> type:
    """:class:`ClamorBackend`, made once joblib is imported (it subclasses joblib's base)."""
    from joblib._parallel_backends import ParallelBackendBase, SequentialBackend

    class ClamorBackend(ParallelBackendBase):
        """Runs joblib's batches as the cluster's futures (``cluster``: default the
        process's one open cluster)."""

        supports_retrieve_callback = True
        default_n_jobs = -1

        def __init__(self, cluster: FuturesCluster | None = None, nesting_level: int | None = None, **kwargs: Any) -> None:
            super().__init__(nesting_level=nesting_level, **kwargs)
            self.cluster = cluster
            self._shared: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id -> (original, arena copy)
            self._futures: weakref.WeakSet = weakref.WeakSet()  # submitted, for abort_everything

        def _cluster(self) -> FuturesCluster:
            if self.cluster is not None:
                return self.cluster
            clusters = _open_clusters()
            if len(clusters) != 1:
                raise ClamorError(
                    f"the clamor joblib backend needs a cluster: {len(clusters)} are open in this "
                    "process; name one with joblib.parallel_config(backend='clamor', cluster=cluster)"
                )
            self.cluster = clusters[0]
            return self.cluster

        def effective_n_jobs(self, n_jobs: int | None) -> int:
            workers = max(1, len(self._cluster().workers))
            if n_jobs is None or n_jobs < 0:
                return workers
            return max(1, n_jobs)

        def configure(self, n_jobs: int = 1, parallel: Any = None, **kwargs: Any) -> int:
            self.parallel = parallel
            return self.effective_n_jobs(n_jobs)

        def submit(self, func: Any, callback: Any = None) -> Any:
            for i, (fn, args, kwargs) in enumerate(getattr(func, "items", ())):  # a BatchedCalls
                func.items[i] = (fn, tuple(self._share(a) for a in args),
                                 {k: self._share(v) for k, v in kwargs.items()})  # fmt: skip
            future = self._cluster().submit(func)
            self._futures.add(future)
            future.get = future.result  # the AsyncResult face joblib may use
            if callback is not None:
                future.add_done_callback(callback)
            return future

        apply_async = submit  # the name joblib before 1.4 calls

        def retrieve_result_callback(self, out: Any) -> Any:
            return out.result()

        def _share(self, value: Any) -> Any:
            """``value``, or its copy in the arena when it is a large array outside it."""
            if not isinstance(value, np.ndarray) or value.nbytes < MIN_SHARED_BYTES or value.dtype.hasobject:
                return value
            from clamor.runtime.paging import arena

            if arena.in_arena(value):
                return value
            entry = self._shared.get(id(value))
            if entry is None or entry[0] is not value:
                entry = self._shared[id(value)] = (value, arena.asarray(value))
            return entry[1]

        def get_nested_backend(self) -> tuple[Any, int | None]:
            return SequentialBackend(nesting_level=self.nesting_level + 1), None

        def abort_everything(self, ensure_ready: bool = True) -> None:
            """joblib gave up (a batch failed): the other batches are cancelled, the
            running ones interrupted on their workers."""
            for future in list(self._futures):
                future.cancel()
            self._futures.clear()

    return ClamorBackend
