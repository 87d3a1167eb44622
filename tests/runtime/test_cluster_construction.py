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
    ports, threads = listening(), threading.active_count()
    with pytest.raises(error, match=match):
        Cluster(workers=2, **options)
    assert listening() == ports
    assert threading.active_count() == threads
    with Cluster(workers=1) as cluster:  # and the next one starts
        assert cluster.run(abs, -3) == 3
