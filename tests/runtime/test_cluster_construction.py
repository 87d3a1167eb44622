"""A `Cluster` that fails to start releases what it took before it raises.

In a notebook the kernel goes on after the error: the driver pager, the listening
ports and the threads of a failed constructor must not stay behind, or every later
`Cluster(...)` in that kernel fails with "the driver pager is already running".
"""

from __future__ import annotations

import threading

import psutil
import pytest
from clamor.runtime.cluster import Cluster


def _connections(process: psutil.Process, **kind: str) -> list:
    """``net_connections`` (psutil 6), ``connections`` before it."""
    return (getattr(process, "net_connections", None) or process.connections)(**kind)


def listening() -> int:
    return sum(c.status == psutil.CONN_LISTEN for c in _connections(psutil.Process()))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"speculation_factor": 0}, ValueError, "speculation needs factor > 0"),  # after the pager started
        ({"launcher": object()}, TypeError, "launcher must be 'local' or a Launcher"),
        ({"read_sets": "everything"}, ValueError, "read_sets must be one of"),
        ({"transport": "pigeon"}, ValueError, "transport must be one of"),
    ],
)
def test_a_failed_constructor_leaves_the_process_clean(options, error, match):
    ports, threads = listening(), set(threading.enumerate())
    with pytest.raises(error, match=match):
        Cluster(workers=2, **options)
    assert listening() == ports
    # no new thread stays behind (an earlier test's thread may end meanwhile)
    assert set(threading.enumerate()) - threads == set()
    with Cluster(workers=1) as cluster:  # and the next one starts
        assert cluster.run(abs, -3) == 3


@pytest.mark.parametrize("during", ["_throttle", "registry.launcher"])
def test_a_ctrl_c_during_close_still_closes_and_the_next_cluster_starts(during, monkeypatch):
    """The interrupt (here from inside close: stopping the throttle, or while the workers
    are given their seconds to exit) is held until the cluster is closed, then raised:
    the workers are gone, the pager is freed, and a new cluster starts in this process."""
    import _thread

    cluster = Cluster(2, timeout=60)
    pids = [cluster.worker_pid(w) for w in cluster.workers]
    part = cluster
    for name in during.split("."):
        part = getattr(part, name)
    close = part.close

    def interrupted_close(*args, **kwargs):
        _thread.interrupt_main()  # as a notebook's interrupt button, mid-close
        return close(*args, **kwargs)

    monkeypatch.setattr(part, "close", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        cluster.close()
    assert cluster.closed
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    with Cluster(1, timeout=60) as again:
        assert again.run(lambda: 3) == 3
