"""Network mode of the benchmarks: the workers on simulated hosts behind rate-limited links.

``--network [RATE]`` (``lookups.py``, ``streaming.py``, ``replication.py``, ``kdtree.py``, and
``run.py --network``) runs the same workload with every worker of every system on its
own simulated host (a Linux network namespace, ``clamor.testing.netns``) instead of
loopback. The topology, built inside each system's child process by
:func:`simulated_hosts` and removed in its ``finally``::

    driver (root namespace, 198.51.100.1) ── uplink RATE ──┐
                                                          bridge
    host i (namespace, 198.51.100.11+i) ── link RATE ─────┘   (one host per worker)

* every host's link is a token bucket of ``RATE`` both ways (``Network.rate_limit``);
* the driver's NIC is one link of ``RATE`` too (``Network.shape_uplink``: a token
  bucket on the bridge device, which the driver's packets to the hosts pass and
  forwarded host-to-host packets do not), so a broadcast to H hosts costs H table
  copies through one link, while a host serving a page to another host does not
  load the driver's link. What the hosts send to the driver is limited by their own
  links only.

Default rate: **1gbit** (a commodity cluster's Ethernet). On this 2-core machine an
unshaped stream between namespaces runs at ~14 Gbit/s and two concurrent ones at
~6.5 Gbit/s each (``Network.throughput``, measured while writing this); the peers'
serialisation (pickle, Arrow-free numpy buffers) and Clamor's page servers move a few
GB/s on loopback. At 1 Gbit/s (125 MB/s) every system's bulk transfer is several times
slower than what the CPUs could push, so the links, not the cores, set the times,
as on a real cluster; at 10 Gbit/s this machine would be CPU-bound again. Lower rates
(``--network 500mbit``) only stretch the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator

from clamor.testing import netns

DEFAULT_RATE = "1gbit"


class NetworkUnavailable(RuntimeError):
    """Network mode cannot run here (the message says why)."""


def add_network_argument(ap: argparse.ArgumentParser) -> None:
    """``--network [RATE]``: run on simulated hosts with links of RATE (default 1gbit)."""
    ap.add_argument(
        "--network", nargs="?", const=DEFAULT_RATE, default=None, metavar="RATE",
        help=f"run the workers on simulated hosts (network namespaces) whose links and the "
             f"driver's uplink are limited to RATE (a tc rate; {DEFAULT_RATE} when omitted)",
    )  # fmt: skip


def check_rate(ap: argparse.ArgumentParser, rate: str | None) -> None:
    """Exit with a usage error if ``rate`` is not a ``tc`` rate."""
    if rate is not None:
        try:
            netns.rate_bits(rate)
        except ValueError as exc:
            ap.error(str(exc))


def missing() -> str | None:
    """Why network mode cannot run here (``None``: it can)."""
    reason = netns.missing_requirements(sshd=False)
    return None if reason is None else f"network mode needs Linux network namespaces: {reason}"


def describe(rate: str, hosts: int) -> str:
    """One line for titles and reports."""
    return f"{hosts} simulated hosts, links and driver uplink {rate}"


@contextlib.contextmanager
def simulated_hosts(hosts: int, rate: str, uplink: str | None = None) -> Iterator[netns.Network]:
    """A :class:`netns.Network` of ``hosts`` hosts, each link and the driver's uplink
    (``uplink``, default ``rate``) shaped; removed with everything running in it at exit
    (also on Ctrl-C and the harness's SIGTERM, which the children turn into exceptions)."""
    if (reason := missing()) is not None:
        raise NetworkUnavailable(reason)
    workdir = tempfile.mkdtemp(prefix="clamor-bench-net-")
    try:
        network = netns.Network(hosts, workdir)
        try:
            for host in network.hosts:
                network.rate_limit(host, rate)
            network.shape_uplink(uplink or rate)
            yield network
        finally:
            network.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def cluster_options(network: netns.Network) -> dict:
    """``clamor.Cluster`` options for a cluster whose workers run on ``network``'s hosts
    (one per host, in turn), with the driver on its address and pages over TCP. A new
    launcher each call: one serves one cluster."""
    return {"launcher": netns.NamespaceLauncher(network), "host": network.driver_address,
            "transport": "tcp"}  # fmt: skip


def sweep_stale() -> None:
    """In a parent: remove namespaces and links a killed child left (its pid is gone)."""
    if netns.missing_requirements(sshd=False) is None:
        netns.remove_stale()


@contextlib.contextmanager
def hosts_or_loopback(rate: str | None, hosts: int) -> Iterator[netns.Network | None]:
    """:func:`simulated_hosts` when ``rate`` is given (network mode), else ``None``."""
    if rate is None:
        yield None
        return
    with simulated_hosts(hosts, rate) as network:
        yield network


def workload(name: str, rate: str | None) -> str:
    """The result's workload name: ``<name>-network`` in network mode (loopback results stay)."""
    return name if rate is None else f"{name}-network"


def title(text: str, rate: str | None, hosts: int) -> str:
    """``text``, with the network in network mode."""
    return text if rate is None else f"{text} — network mode ({describe(rate, hosts)})"


def params(rate: str | None, hosts: int) -> dict:
    """What the result's ``params`` record about the network."""
    if rate is None:
        return {"network": "loopback"}
    return {"network": "namespaces", "link_rate": rate, "uplink_rate": rate, "hosts": hosts,
            "topology": "driver uplink -> bridge -> one link per host (tc tbf)"}  # fmt: skip


def require(rate: str | None) -> None:
    """In a parent: exit with the reason if network mode was asked for and cannot run."""
    if rate is not None and (reason := missing()) is not None:
        raise SystemExit(f"--network: {reason}")
