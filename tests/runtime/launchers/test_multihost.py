"""Multi-host clusters through the ssh launcher, on simulated hosts (docs/deployment.md, "SSH").

Two network namespaces joined by a bridge (clamor.testing.netns, testing/netns.py) play two machines,
each with its own sshd; the driver listens on the bridge (198.51.100.1) and starts
two workers on each host through ``SSHLauncher``. Pages travel over TCP (the hosts
are not the driver's), one host's link is shaped by ``tc``, and cutting the other
host's link in the middle of a job loses its workers (missed heartbeats, failed
calls): the job still ends with the exact result, the lost partitions recomputed
from lineage on the surviving host.

Needs root (skipped without it), ``ip``, ``tc`` and OpenSSH (client and
``/usr/sbin/sshd``; ``make test`` installs them). Only 198.51.100.0/24 (TEST-NET-2) is used.
"""

from __future__ import annotations

import glob
import os
import threading
import time

import numpy as np
import pytest
from clamor.runtime.errors import ClamorError
from clamor.runtime.launchers.ssh import SSHLauncher
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.testing import netns

import clamor

pytestmark = pytest.mark.slow

N = 1_500_000  # int64: 12 MB in the arena
PARTS = 16


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """Two hosts with sshd; the first one's link limited to 100 Mbit/s."""
    with netns.checked(2, tmp_path_factory.mktemp("netns"), sshd=True) as network:
        network.rate_limit(network.hosts[0], "100mbit")
        yield network


def launcher(net, **kwargs) -> SSHLauncher:
    kwargs.setdefault("identity_file", net.client_key)
    kwargs.setdefault("ssh_options", net.ssh_options())
    return SSHLauncher([h.address for h in net.hosts], **kwargs)


def token_files() -> list[str]:
    return glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"), "clamor-ssh-token.*"))


@pytest.mark.parametrize("fork", [False, True])
def test_ssh_that_cannot_connect_fails_start_up_with_its_message(net, fork):
    with pytest.raises(ClamorError) as info:
        clamor.Cluster(
            2, host=net.driver_address, launcher=launcher(net, port=2222, fork=fork),
            paging=NullDriverPaging(), timeout=30,
        )  # fmt: skip
    message = str(info.value)
    assert "failed to start" in message and "exited with status 255" in message
    assert any(f"ssh {host.address}" in message for host in net.hosts)  # the first to fail
    assert "Connection refused" in message  # ssh's own words


@pytest.mark.parametrize("fork", [False, True])
def test_a_missing_python_on_the_host_is_named(net, fork):
    with pytest.raises(ClamorError) as info:
        clamor.Cluster(
            2, host=net.driver_address, launcher=launcher(net, python="/nonexistent/python3", fork=fork),
            paging=NullDriverPaging(), timeout=30,
        )  # fmt: skip
    assert "cannot run /nonexistent/python3 on" in str(info.value)
    assert token_files() == []  # the token file was removed anyway


def test_a_driver_on_loopback_is_refused_for_remote_hosts(net):
    with pytest.raises(ClamorError, match="cannot reach a driver listening on 127.0.0.1"):
        clamor.Cluster(2, launcher=launcher(net), paging=NullDriverPaging(), timeout=30)


def _data() -> np.ndarray:
    return clamor.asarray((np.arange(N, dtype=np.int64) * 7919) % 100_003)


def _bounds(i: int) -> tuple[int, int]:
    return i * N // PARTS, (i + 1) * N // PARTS


def test_demand_paging_over_tcp_across_two_hosts(net, tmp_path):
    ssh = launcher(net)
    with clamor.Cluster(
        4, host=net.driver_address, launcher=ssh, transport="auto", log_dir=str(tmp_path)
    ) as cluster:
        hosts = {w["id"]: w["host"] for w in cluster.worker_stats()}
        assert sorted(hosts.values()) == sorted([h.address for h in net.hosts] * 2)
        assert all(not cluster.worker_info(w)["shm"] for w in hosts)  # remote: pages over TCP
        for w, host in hosts.items():
            assert ssh.describe(w) == f"ssh {host} (pid {cluster.worker_pid(w)})"
        # the secret was never on a command line, and no token file is left on the hosts
        token = cluster._credentials.token
        assert all(token not in " ".join(ssh._clients[w].proc.args) for w in hosts)
        assert token_files() == []

        data = _data()
        expected = np.add.reduceat(data, [_bounds(i)[0] for i in range(PARTS)])

        def part_sum(i):
            lo, hi = _bounds(i)
            return int(data[lo:hi].sum())

        sums = cluster.range(PARTS, partitions=PARTS).map(part_sum).collect()
        assert sums == expected.tolist()
        blocks = cluster.range(PARTS, partitions=PARTS).map(
            lambda i: data[slice(*_bounds(i))] * 3 + 1
        ).persist()
        assert blocks.map(lambda b: int(b.sum())).sum() == int((data * 3 + 1).sum())

        stats = cluster.stats()
        assert stats["bytes_served_by_driver"] > 0 and stats["pages_fetched"] > 0
        assert {w["host"] for w in stats["workers"] if w.get("pages_fetched")} == {
            h.address for h in net.hosts
        }
        assert "rate 100Mbit" in net.qdisc(net.hosts[0])

        victim = next(w for w in hosts if hosts[w] == net.hosts[0].address)
        cluster.kill_worker(victim)  # over ssh: kill -9 on the host
        assert ssh.exitcode(victim) == -9 and victim not in cluster.workers
        assert blocks.map(lambda b: int(b.sum())).sum() == int((data * 3 + 1).sum())
    assert all(ssh.exitcode(w) == 0 for w in hosts if w != victim)  # clean shutdowns
    assert (tmp_path / f"worker-{victim}.log").exists()


def test_forked_workers_come_from_one_template_per_host(net, tmp_path):
    ssh = launcher(net, fork=True)
    with clamor.Cluster(4, host=net.driver_address, launcher=ssh, log_dir=str(tmp_path)) as cluster:
        hosts = {w["id"]: w["host"] for w in cluster.worker_stats()}
        assert sorted(hosts.values()) == sorted([h.address for h in net.hosts] * 2)
        assert sorted(ssh._relays) == sorted(h.address for h in net.hosts)  # one ssh client a host
        for w, host in hosts.items():
            assert ssh.describe(w) == f"ssh {host} (pid {cluster.worker_pid(w)})"
        token = cluster._credentials.token  # on the templates' stdin only, never in a file
        assert all(token not in " ".join(r.proc.args) for r in ssh._relays.values())
        assert token_files() == []

        data = _data()
        blocks = cluster.range(PARTS, partitions=PARTS).map(lambda i: data[slice(*_bounds(i))] * 3 + 1).persist()
        assert blocks.map(lambda b: int(b.sum())).sum() == int((data * 3 + 1).sum())

        victim = next(w for w in hosts if hosts[w] == net.hosts[0].address)
        cluster.kill_worker(victim)  # through its template
        assert ssh.exitcode(victim) == -9 and victim not in cluster.workers
        assert blocks.map(lambda b: int(b.sum())).sum() == int((data * 3 + 1).sum())
        assert len(cluster.wait_for_workers(4, timeout=60)) == 4  # its replacement, forked too
        assert len(ssh._relays) == 2
    assert all(ssh.exitcode(w) == 0 for w in hosts if w != victim)  # clean shutdowns
    assert (tmp_path / f"ssh-{net.hosts[0].address}.log").exists()


def _within(seconds: float, job, cluster):
    """``job()``'s result; fails (closing ``cluster`` to free the job) if it hangs."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(job()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        cluster.close()
        pytest.fail(f"the job did not finish within {seconds:g} s of the link cut")
    return result[0]


def test_cutting_a_hosts_link_mid_job_recovers_on_the_other_host(net, tmp_path):
    """With TLS on, as a cluster across hosts would run."""
    cut = net.hosts[1]
    ssh = launcher(net)
    try:
        with clamor.Cluster(
            4, host=net.driver_address, launcher=ssh, log_dir=str(tmp_path), tls=True
        ) as cluster:
            assert all(cluster.worker_info(w)["tls"] for w in cluster.workers)
            data = _data()

            def block(i):
                time.sleep(0.05)  # every worker gets some
                return data[slice(*_bounds(i))] * 3 + 1

            blocks = cluster.range(PARTS, partitions=PARTS).map(block).persist()
            assert blocks.count() == PARTS
            expected = int((data * 3 + 1).sum())
            there = {w["id"] for w in cluster.worker_stats() if w["host"] == cut.address}
            held_there = [i for i, w in enumerate(blocks.locations()) if w in there]
            assert held_there  # the job needs partitions only that host holds

            def slow_sum(block):
                time.sleep(0.2)
                return int(block.sum())

            timer = threading.Timer(0.3, net.cut, (cut,))  # the job takes >= 0.8 s
            timer.start()
            try:
                # loss is noticed ~10 s after the cut (heartbeats, the task streams' pings)
                assert _within(120, lambda: blocks.map(slow_sum).sum(), cluster) == expected
            finally:
                timer.join()
            assert _within(60, lambda: blocks.map(lambda b: int(b.sum())).sum(), cluster) == expected

            stats = cluster.stats()
            lost = {w["id"]: w for w in stats["workers"] if not w["alive"]}
            assert set(lost) == there
            # its task stream's unanswered pings or its missed heartbeats (both take ~10 s), or,
            # when the stage's first try failed on a fetch from it, the interrupt of its
            # cancelled task that it could not answer
            found = ("task stream", "no heartbeat", "did not answer the interrupt")
            assert all(any(f in w["lost"] for f in found) for w in lost.values()), lost
            assert set(cluster.workers) == {w["id"] for w in stats["workers"]} - there
            assert stats["tasks_recomputed"] >= len(held_there)
            graph = blocks.lineage()
            for i in held_there:  # recomputed from lineage on the surviving host
                node = graph.node(("ds", blocks.id, i))
                assert node.state == "recomputed" and node.holder in cluster.workers
    finally:
        net.heal(cut)
