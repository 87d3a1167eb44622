"""``cluster`` in a Clamor kernel: the session's default cluster, started on first use.

An idle kernel has no worker processes: the proxy starts the default local
cluster (``session.get()``) the first time one of its public attributes is
used (``cluster.workers``, ``cluster.parallelize(...)``, ``cluster.stats()``).
It always refers to the session's *current* cluster, so after
``%clamor start -n 4`` or ``%clamor scale`` it is that one, and after the
cluster is closed the next use starts a new one. Showing it (``repr``, rich
display, tab completion) never starts anything.
"""

from __future__ import annotations

from typing import Any

from clamor.kernel import session
from clamor.runtime.cluster import Cluster

__all__ = ["LazyCluster", "resolve"]


class LazyCluster:
    """A stand-in for the session's :class:`~clamor.Cluster` that starts it on first use."""

    __slots__ = ()

    def get(self) -> Cluster:
        """The session's cluster itself (started now if need be), e.g. to pass it on."""
        if session.current() is None:
            print(f"starting the default cluster: {session.default_workers()} workers "
                  "(%clamor start -n N chooses)")  # fmt: skip
        return session.get()

    @property
    def started(self) -> bool:
        """Whether the session has a cluster now (never starts one)."""
        return session.current() is not None

    def __getattr__(self, name: str) -> Any:
        # Private and special names (IPython's _repr_*_ / _ipython_*_ probes, pickling)
        # must not start workers.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def __dir__(self) -> list[str]:
        public = {n for n in dir(Cluster) if not n.startswith("_")}
        return sorted(public | {"get", "started"})

    def __repr__(self) -> str:
        current = session.current()
        if current is None:
            return "<Clamor cluster: not started; starts on first use (or %clamor start -n N)>"
        return repr(current)

    def _repr_html_(self) -> str:
        """The running cluster's summary (never starts one)."""
        current = session.current()
        if current is None:
            return "<div><b>Clamor cluster</b>: not started; it starts on first use (or <code>%clamor start -n N</code>)</div>"
        return current._repr_html_()

    def __reduce__(self) -> Any:
        raise TypeError(
            "the notebook's `cluster` cannot be shipped to tasks: it lives in the driver "
            "(use it in the cell, not inside a function that runs on the workers)"
        )


def resolve(cluster: Cluster | LazyCluster | None) -> Cluster:
    """The cluster a view shows: the session's for ``None`` (started if need be), the
    real one behind a :class:`LazyCluster`, else ``cluster`` itself."""
    if cluster is None:
        return session.get()
    if isinstance(cluster, LazyCluster):
        return cluster.get()
    return cluster
