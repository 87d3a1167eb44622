"""Simulated hosts (clamor.testing.netns): the driver's uplink shaping and workers in
namespaces (:class:`~clamor.testing.netns.NamespaceLauncher`).

The benchmarks' network mode (bench/harness/network.py) relies on both: the driver's traffic
to all hosts must share one link (its NIC) while host-to-host traffic does not cross
it, and a cluster's workers must run on the hosts, serving pages to each other on
their own addresses. Needs root (skipped without it), ``ip`` and ``tc`` (``make test`` installs them).
"""

from __future__ import annotations

import numpy as np
import pytest
from clamor.testing import netns

import clamor

pytestmark = pytest.mark.slow

UPLINK = "40mbit"
LINK = "200mbit"


@pytest.fixture
def net(tmp_path):
    with netns.checked(3, tmp_path / "netns") as network:
        yield network


def mbit(rates: list[float]) -> float:
    return sum(rates) * 8 / 1e6


def test_the_uplink_is_shared_by_the_driver_and_not_crossed_by_host_to_host_traffic(net):
    for host in net.hosts:
        net.rate_limit(host, LINK)
    net.shape_uplink(UPLINK)
    assert "rate 40Mbit" in net.uplink_qdisc() and net.uplink == UPLINK
    h0, h1, h2 = net.hosts
    up = netns.rate_bits(UPLINK) / 1e6
    # the driver sending to two hosts at once: both streams share the one uplink
    both = mbit(net.throughput(None, [h0, h1], seconds=1.0))
    assert 0.5 * up < both < 2 * up, f"driver -> 2 hosts: {both:.0f} Mbit/s, uplink {up:.0f}"
    # host to host: limited by the hosts' links only, far above the uplink
    across = mbit(net.throughput(h2, [h0], seconds=1.0))
    assert across > 2 * up, f"host -> host: {across:.0f} Mbit/s, uplink {up:.0f}"
    assert across < 2 * netns.rate_bits(LINK) / 1e6


def _touch(table, pages, per_page):
    """One element of each page, in the given (random) order: single-page faults."""
    import os

    return int(sum(int(table[p * per_page]) for p in pages)), os.getpid()


def test_a_cluster_on_namespaced_hosts_pages_from_the_driver_and_from_peers(net):
    launcher = netns.NamespaceLauncher(net)
    with clamor.Cluster(
        workers=3, launcher=launcher, host=net.driver_address, transport="tcp", replication=True
    ) as cluster:
        hosts = {w["id"]: w["host"] for w in cluster.worker_stats()}
        assert hosts == {w: launcher.host_of(w).address for w in cluster.workers}
        assert sorted(hosts.values()) == [h.address for h in net.hosts]
        for w in cluster.workers:
            pid = cluster.worker_pid(w)
            assert launcher.describe(w) == f"{hosts[w]} pid {pid}"
            assert str(pid) in netns.run("ip", "netns", "pids", launcher.host_of(w).ns).split()

        per_page = cluster.page_size // 8
        n_pages = 64
        table = clamor.array(n_pages * per_page, np.int64)
        table[:] = (np.arange(table.size, dtype=np.int64) * 7919) % 100_003
        order = np.random.default_rng(3).permutation(n_pages).tolist()
        expected = int(table[np.array(order) * per_page].sum())
        first, second, third = cluster.workers
        got, _ = cluster.run_stage([(first, _touch, (table, order, per_page))])[0]
        assert got == expected
        before = cluster.stats()
        got, _ = cluster.run_stage([(second, _touch, (table, order[::-1], per_page))])[0]
        assert got == expected
        stats = cluster.stats()
        assert stats["bytes_served_by_peers"] > before["bytes_served_by_peers"]

        # a worker killed -9 on its host is seen dead; the others still compute exactly
        cluster.kill_worker(third)
        assert not launcher.alive(third) and third not in cluster.workers
        sums = cluster.run_stage([(w, _touch, (table, order, per_page)) for w in cluster.workers])
        assert [s for s, _ in sums] == [expected, expected]
    assert all(not launcher.alive(w) for w in hosts)
    assert all(netns.run("ip", "netns", "pids", h.ns).split() == [] for h in net.hosts)
    net.close()
    assert net.leftovers() == []
