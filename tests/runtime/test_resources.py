"""What a cluster opened is closed in reverse order of opening (runtime/resources.py)."""

from __future__ import annotations

import logging

from clamor.runtime.cluster import Cluster
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.runtime.resources import Resources


def test_the_last_opened_closes_first_each_whatever_the_others_did_and_only_once(caplog):
    closed: list[str] = []
    resources = Resources()
    resources.opened("a", lambda: closed.append("a"))
    resources.opened("b", lambda: 1 / 0)
    resources.opened("c", lambda: closed.append("c"))
    assert resources.names() == ["c", "b", "a"]
    with caplog.at_level(logging.ERROR, logger="clamor.cluster"):
        resources.close()
    assert closed == ["c", "a"]
    assert "closing the cluster: b failed" in caplog.text
    resources.close()
    assert closed == ["c", "a"] and resources.names() == []


def test_a_cluster_stops_its_workers_first_and_its_pager_after_every_reader_of_it():
    with Cluster(1, paging=NullDriverPaging(), timeout=30) as cluster:
        names = cluster._resources.names()
        assert names[0] == "the workers"
        order = {name: i for i, name in enumerate(names)}
        for reader in ("the executor", "the task-stream server", "the scheduler's gRPC server", "the views' publisher"):
            assert order[reader] < order["the pager"], names
        assert order["the task-stream server"] < order["the executor"]  # its end wakes the threads
        assert names[-1] == "the launcher"
    assert cluster._resources.names() == []
