"""Simulated hosts for multi-host tests: Linux network namespaces on one machine.

:class:`Network` builds a bridge in the root namespace (the driver's address,
``198.51.100.1/24``, from TEST-NET-2, which is never routed) and one namespace per
host, each joined to the bridge by a veth pair (``198.51.100.11``, ``.12``, ...).
:class:`NamespaceLauncher` starts a cluster's workers in the hosts' namespaces (no
ssh needed); :meth:`Network.shape_uplink` makes the driver's traffic to all hosts
share one link (its NIC) and :meth:`Network.throughput` measures what a link carries.
:meth:`Network.start_sshd` runs an OpenSSH server in a host's namespace that accepts
one generated ed25519 client key for root; :meth:`Network.rate_limit` shapes a
host's link with ``tc``; :meth:`Network.cut` takes it down (the host becomes
unreachable, as after a switch or cable failure). :meth:`Network.close` removes it
all, processes in the namespaces included, and checks nothing is left.
:func:`checked` is the tests' way in: it skips the test without root or namespace
permission and fails it when a program is missing, yields the network and always
closes it, asserting that no namespace, link or process of it is left.

Needs root, ``ip`` and ``tc``; for sshd also ``ssh``, ``ssh-keygen`` and
``/usr/sbin/sshd``; :func:`missing_requirements` says what is missing. Names carry the creating
process's id, and leftovers of dead processes are removed first.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import psutil
from clamor.runtime.launchers.base import worker_command
from clamor.runtime.launchers.local import LocalLauncher

SUBNET = "198.51.100"
DRIVER_ADDRESS = f"{SUBNET}.1"
SSHD = "/usr/sbin/sshd"
_NS_RE = re.compile(r"^clamor-(\d+)-h\d+$")
_LINK_RE = re.compile(r"^cl(?:br|v|p)(\d+)(?:h\d+)?$")


def missing_tools(sshd: bool = True) -> list[str]:
    """The programs simulated hosts need that are not installed (``ip``, ``tc``; with
    ``sshd``, the OpenSSH client, ``ssh-keygen`` and server)."""
    missing = [f"{t!r} on PATH" for t in ("ip", "tc", *(("ssh", "ssh-keygen") if sshd else ()))
               if shutil.which(t) is None]  # fmt: skip
    if sshd and not os.access(SSHD, os.X_OK):
        missing.append(f"the OpenSSH server at {SSHD}")
    return missing


def missing_requirements(sshd: bool = True) -> str | None:
    """Why namespaced hosts cannot be built here (``None``: they can). ``sshd=False``:
    without :meth:`Network.start_sshd` (e.g. workers started by :class:`NamespaceLauncher`)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, tc" + (", sshd)" if sshd else ")")
    missing = missing_tools(sshd)
    if missing:
        return "needs " + ", ".join(missing)
    probe = f"clamor-{os.getpid()}-probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"cannot create network namespaces: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _burst(rate: str) -> str:
    """A token-bucket burst for ``rate``: 256 KiB, or 2 ms worth at high rates (tbf needs
    at least a timer tick's worth of bytes to reach its rate)."""
    bits = rate_bits(rate)
    return f"{max(256 << 10, int(bits / 8 * 0.002))}b"


_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def rate_bits(rate: str) -> float:
    """Bits per second of a ``tc`` rate such as ``"100mbit"`` or ``"1gbit"``."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps)\s*", rate.lower())
    if m is None:
        raise ValueError(f"not a tc rate (e.g. 100mbit, 1gbit): {rate!r}")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    return value * 8 if m.group(3) == "bps" else value


# A TCP sink for Network.throughput: bytes received and seconds from first byte to EOF.
_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(60)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(60); buf = bytearray(1 << 20); n = 0; t0 = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    if t0 is None:
        t0 = time.monotonic()
    n += k
print(n, time.monotonic() - (t0 or time.monotonic()))
"""
# A TCP source: sends for argv[3] seconds to argv[1]:argv[2].
_SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
buf = b"x" * (1 << 20); end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.sendall(buf)
c.close()
"""


def run(*command: str, check: bool = True, timeout: float = 30) -> str:
    """Run a command; its stdout. A failure raises with the command's stderr."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _namespace_names() -> list[str]:
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()]


def _link_names() -> list[str]:
    names = []
    for line in run("ip", "-o", "link", "show").splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _kill_namespace_processes(ns: str, timeout: float = 10.0) -> None:
    """SIGKILL every process in namespace ``ns`` and wait until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).split()]
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {ns} do not die")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_stale() -> None:
    """Remove namespaces and links left by test processes that no longer run."""
    for ns in _namespace_names():
        m = _NS_RE.match(ns)
        if m and not psutil.pid_exists(int(m.group(1))):
            _kill_namespace_processes(ns)
            run("ip", "netns", "del", ns, check=False)
    for link in _link_names():
        m = _LINK_RE.match(link)
        if m and not psutil.pid_exists(int(m.group(1))):
            run("ip", "link", "del", link, check=False)


@dataclasses.dataclass
class Host:
    """One simulated machine: a namespace, its address and the root side of its link."""

    index: int
    ns: str
    address: str
    veth: str  # root-namespace end (on the bridge)
    peer: str  # the end inside the namespace
    sshd: subprocess.Popen | None = None

    def run(self, *command: str, check: bool = True, timeout: float = 30) -> str:
        """Run ``command`` inside this host's namespace."""
        return run("ip", "netns", "exec", self.ns, *command, check=check, timeout=timeout)


def claim_subnet(timeout: float = 600.0) -> socket.socket:
    """Hold ``198.51.100.0/24`` for this process until the returned socket is closed.

    The claim is an abstract Unix socket: the kernel drops it when its holder exits, and
    it leaves no file. Two processes that build networks (parallel test workers, a
    benchmark) take turns instead of failing on each other's addresses.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.bind(f"\0clamor-netns-{SUBNET}")
            return sock
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"{SUBNET}.0/24 stayed claimed by another process for "
                                   f"{timeout:g} s: {exc}") from None  # fmt: skip
            time.sleep(0.2)


class Network:
    """A bridge with ``hosts`` namespaced hosts on ``198.51.100.0/24`` (a context manager).

    One network per machine at a time (the addresses are fixed): a second one waits
    until the first is closed (:func:`claim_subnet`).

    ``workdir``: where keys, sshd configs and logs go.
    """

    def __init__(self, hosts: int, workdir: str | os.PathLike) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        self.bridge = f"clbr{pid}"
        self.driver_address = DRIVER_ADDRESS
        self.hosts = [
            Host(i, f"clamor-{pid}-h{i}", f"{SUBNET}.{11 + i}", f"clv{pid}h{i}", f"clp{pid}h{i}")
            for i in range(hosts)
        ]
        self.client_key = self.workdir / "client_ed25519"
        self._made_run_sshd = False
        self._closed = False
        self.uplink: str | None = None  # the driver's link rate (shape_uplink)
        self._claim = claim_subnet()
        remove_stale()
        in_use = run("ip", "-o", "addr", "show", "to", f"{SUBNET}.0/24").strip()
        if in_use:
            self._claim.close()
            raise RuntimeError(f"{SUBNET}.0/24 is already in use here: {in_use}")
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.driver_address}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for h in self.hosts:
            run("ip", "netns", "add", h.ns)
            run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", h.peer)
            run("ip", "link", "set", h.peer, "netns", h.ns)
            run("ip", "link", "set", h.veth, "master", self.bridge)
            run("ip", "link", "set", h.veth, "up")
            run("ip", "-n", h.ns, "link", "set", "lo", "up")
            run("ip", "-n", h.ns, "addr", "add", f"{h.address}/24", "dev", h.peer)
            run("ip", "-n", h.ns, "link", "set", h.peer, "up")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- links ---

    def rate_limit(self, host: Host, rate: str = "100mbit") -> None:
        """Shape ``host``'s link both ways with a token bucket (``tc ... tbf``)."""
        shape = ["root", "tbf", "rate", rate, "burst", _burst(rate), "latency", "50ms"]
        run("tc", "qdisc", "replace", "dev", host.veth, *shape)
        run("ip", "netns", "exec", host.ns, "tc", "qdisc", "replace", "dev", host.peer, *shape)

    def shape_uplink(self, rate: str) -> None:
        """Model the driver's NIC: everything the driver sends to the hosts shares one
        link of ``rate`` (a token bucket on the bridge device).

        The driver's packets to a host leave the root namespace through the bridge
        device (``br_dev_xmit``), so they pass its qdisc; packets from one host to
        another are forwarded between bridge ports and never do, so host-to-host traffic
        is limited only by the hosts' own links (:meth:`rate_limit`). Measured by
        tests/testing/test_netns.py with :meth:`throughput`. Only the driver's sending
        side is shaped: what the hosts send to the driver (requests, results) is
        limited by their own links.
        """
        shape = ["root", "tbf", "rate", rate, "burst", _burst(rate), "latency", "50ms"]
        run("tc", "qdisc", "replace", "dev", self.bridge, *shape)
        self.uplink = rate

    def uplink_qdisc(self) -> str:
        """``tc qdisc show`` of the bridge device (the driver's uplink)."""
        return run("tc", "qdisc", "show", "dev", self.bridge)

    def throughput(
        self, sender: Host | None, receivers: list[Host], seconds: float = 1.0
    ) -> list[float]:
        """Bytes per second a TCP stream from ``sender`` (``None``: the driver) gets to
        each of ``receivers`` (distinct hosts), all streams running at the same time for
        ``seconds``. Sender and receivers are small Python processes (port 29100)."""
        port = 29100
        listeners = []
        try:
            for h in receivers:
                listeners.append(subprocess.Popen(
                    ["ip", "netns", "exec", h.ns, sys.executable, "-c", _RECEIVER, h.address,
                     str(port)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                ))  # fmt: skip
            for proc, h in zip(listeners, receivers, strict=True):
                if proc.stdout.readline().strip() != "listening":  # type: ignore[union-attr]
                    raise RuntimeError(f"throughput receiver on {h.address}: {proc.stderr.read()}")  # type: ignore[union-attr]
            prefix = [] if sender is None else ["ip", "netns", "exec", sender.ns]
            senders = [
                subprocess.Popen(
                    [*prefix, sys.executable, "-c", _SENDER, h.address, str(port), str(seconds)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                )
                for h in receivers
            ]  # fmt: skip
            for proc in senders:
                _, err = proc.communicate(timeout=seconds + 30)
                if proc.returncode != 0:
                    raise RuntimeError(f"throughput sender failed: {err.strip()}")
            rates = []
            for proc, h in zip(listeners, receivers, strict=True):
                out, err = proc.communicate(timeout=30)
                if proc.returncode != 0:
                    raise RuntimeError(f"throughput receiver on {h.address}: {err.strip()}")
                nbytes, elapsed = out.split()
                rates.append(int(nbytes) / max(float(elapsed), 1e-9))
            return rates
        finally:
            for proc in listeners:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def qdisc(self, host: Host) -> str:
        """``tc qdisc show`` of ``host``'s root-side link."""
        return run("tc", "qdisc", "show", "dev", host.veth)

    def cut(self, host: Host) -> None:
        """Take ``host``'s link down: nothing gets in or out of it any more."""
        run("ip", "link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        """Bring ``host``'s link back up."""
        run("ip", "link", "set", host.veth, "up")

    # --- sshd ---

    def _keys(self) -> None:
        if self.client_key.exists():
            return
        for key in (self.client_key, self.workdir / "host_ed25519"):
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "clamor-test", "-f", str(key))
        (self.workdir / "authorized_keys").write_text(
            self.client_key.with_suffix(".pub").read_text()
        )

    def start_sshd(self, host: Host, timeout: float = 10.0) -> None:
        """Run an sshd on ``host``'s address that lets the client key log in as root."""
        self._keys()
        if not os.path.isdir("/run/sshd"):  # the privilege separation directory
            os.makedirs("/run/sshd", mode=0o755)
            self._made_run_sshd = True
        config = self.workdir / f"sshd_{host.index}.conf"
        config.write_text(
            "\n".join([
                f"ListenAddress {host.address}",
                "Port 22",
                f"HostKey {self.workdir / 'host_ed25519'}",
                f"PidFile {self.workdir / f'sshd_{host.index}.pid'}",
                f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "StrictModes no",
                "UsePAM no",
                "PrintMotd no",
                "MaxStartups 64",
                "MaxSessions 64",
                "",
            ])
        )  # fmt: skip
        log = open(self.workdir / f"sshd_{host.index}.log", "ab")  # noqa: SIM115
        with log:
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.ns, SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while True:
            if host.sshd.poll() is not None:
                raise RuntimeError(
                    f"sshd in {host.ns} exited ({host.sshd.returncode}): {self.sshd_log(host)}"
                )
            try:
                with socket.create_connection((host.address, 22), timeout=1.0) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {host.ns} does not accept connections")
            time.sleep(0.05)

    def sshd_log(self, host: Host) -> str:
        path = self.workdir / f"sshd_{host.index}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def ssh_options(self) -> list[str]:
        """``-o`` options for a client of these test sshds (throwaway host keys)."""
        return ["UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no", "LogLevel=ERROR"]

    # --- teardown ---

    def close(self) -> None:
        """Stop the sshds and every process in the namespaces; delete namespaces, links,
        qdiscs and the bridge; raise if any of them is still there."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for h in self.hosts:
            if h.sshd is not None and h.sshd.poll() is None:
                h.sshd.kill()
                h.sshd.wait(10)
            if h.ns in _namespace_names():
                try:
                    _kill_namespace_processes(h.ns)
                except RuntimeError as exc:
                    errors.append(str(exc))
                run("ip", "netns", "del", h.ns, check=False)
            if h.veth in _link_names():
                run("tc", "qdisc", "del", "dev", h.veth, "root", check=False)
                run("ip", "link", "del", h.veth, check=False)
        if self.bridge in _link_names():
            run("ip", "link", "del", self.bridge, check=False)
        if self._made_run_sshd:
            try:
                os.rmdir("/run/sshd")
            except OSError:
                pass
        if left := self.leftovers():
            errors.append(f"left behind: {', '.join(left)}")
        else:
            self._claim.close()  # the next network may come (never over a left-behind one)
        if errors:
            raise RuntimeError("; ".join(errors))

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network that still exist (empty after close)."""
        names, links = set(_namespace_names()), set(_link_names())
        return [h.ns for h in self.hosts if h.ns in names] + [
            n for n in [self.bridge, *(h.veth for h in self.hosts)] if n in links
        ]


@contextmanager
def checked(hosts: int, workdir: str | os.PathLike, *, sshd: bool = False) -> Iterator[Network]:
    """A :class:`Network` of ``hosts`` hosts for a test, removed however the test ends.

    Skips the test without root or namespace permission and fails it when a program is
    missing; ``sshd``: an sshd runs on
    every host (:meth:`Network.start_sshd`). On exit the network is closed and nothing of
    it may be left: no namespace, veth or bridge, and no process in its namespaces.
    """
    import pytest

    if os.geteuid() != 0:
        pytest.skip("simulated hosts need root (network namespaces, veth pairs, tc)")
    for tool in missing_tools(sshd):
        pytest.fail(f"simulated hosts need {tool}: `make test` installs it", pytrace=False)
    reason = missing_requirements(sshd)
    if reason is not None:
        pytest.skip(f"simulated hosts: {reason}")
    network = Network(hosts, workdir)
    try:
        if sshd:
            for host in network.hosts:
                network.start_sshd(host)
        yield network
    finally:
        network.close()  # raises if a namespace's processes do not die or a link stays
        assert network.leftovers() == [], f"left behind: {network.leftovers()}"
        alive = [h.sshd.pid for h in network.hosts if h.sshd is not None and h.sshd.poll() is None]
        assert alive == [], f"sshd processes left: {alive}"


class NamespaceLauncher(LocalLauncher):
    """Clamor workers on a :class:`Network`'s hosts: worker ``i`` runs in host
    ``i % len(hosts)``'s namespace (``ip netns exec NS python -m clamor.runtime.worker.process
    ... --host ADDRESS``), serving pages to its peers on that host's address.

    ``clamor.Cluster(workers=N, launcher=NamespaceLauncher(network),
    host=network.driver_address, transport="tcp")``. ``ip netns exec`` replaces itself
    with the worker (no fork), so the process this launcher starts *is* the worker:
    :meth:`kill`, :meth:`alive`, the driver-death safeguards and the registration's pid
    check work as for local workers. Page traffic crosses the hosts' links (and the
    driver's, if :meth:`Network.shape_uplink` shaped it).
    """

    name = "netns"

    def __init__(self, network: Network, env: dict[str, str] | None = None) -> None:
        super().__init__(env, fork=False)  # each worker starts inside its host's namespace
        if not network.hosts:
            raise ValueError("NamespaceLauncher needs a network with at least one host")
        self.network = network
        self._placing: Host | None = None

    def host_of(self, worker_id: int) -> Host:
        """The simulated host that ``worker_id`` runs on."""
        return self.network.hosts[worker_id % len(self.network.hosts)]

    def spawn(self, worker_id: int) -> None:
        """Start worker ``worker_id`` in its host's namespace."""
        self._placing = self.host_of(worker_id)
        try:
            super().spawn(worker_id)
        finally:
            self._placing = None

    def command(self) -> list[str]:
        """``ip netns exec NS`` + the worker command, serving on the host's address."""
        host = self._placing
        if host is None:
            raise RuntimeError("NamespaceLauncher.command() is only used by spawn()")
        super().command()  # writes the token file (in the shared file system)
        assert self.token_file is not None
        return ["ip", "netns", "exec", host.ns,
                *worker_command(self.connect, self.token_file, host=host.address)]  # fmt: skip

    def describe(self, worker_id: int) -> str:
        """``ADDRESS pid N`` (the host's address and the worker's pid)."""
        if worker_id not in self.worker_ids:
            return super().describe(worker_id)
        return f"{self.host_of(worker_id).address} pid {self.pid(worker_id)}"
