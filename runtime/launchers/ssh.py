"""The ``ssh`` launcher: workers on other machines, started with the OpenSSH client.

``Cluster(8, host="10.0.0.5", launcher=SSHLauncher(["node1", "node2"]))`` places the
workers round-robin on the hosts. Each worker is one ``ssh`` client process here that
runs, on its host::

    sh -c 'umask 077; f=$(mktemp ...); cat >"$f"; python -m clamor.runtime.worker.process
           --connect ADDR --token-file "$f" --remove-token-file --launch-key K ...'

The cluster's secret travels on ssh's stdin into a fresh 0600 file that the worker
deletes as soon as it has read it: it never appears on a command line nor in a file
others can read. The worker's output comes back through ssh into ``worker-<id>.log``
in the cluster's ``log_dir`` (default: the driver's stderr).

With ``fork=True`` each host instead runs one ssh client and, at its end, one template
process (runtime/worker/template.py, ``--stdio``) that has imported everything and forks
the host's workers on request, as the local launcher's template does: a host starting
many workers pays one Python start-up. The secret then travels once per host, on the
template's stdin, and each worker gets it through a pipe; the workers' output comes
back, mixed, into ``ssh-<host>.log``; a kill goes through the template.

Liveness: a cut link leaves ssh hanging, so the cluster relies on heartbeats
(:meth:`SSHLauncher.observes` is ``False``); the ssh client's exit status (the
remote one, forwarded; 255 when ssh itself failed) explains a worker's end. Remote
workers exit on their own a few seconds after the driver has gone (the worker's
heartbeat watchdog); locally no ssh client outlives the launcher
(:meth:`SSHLauncher.close`, ``weakref.finalize``), and if the driver is SIGKILLed
its ssh clients end with their workers. A call to a worker whose link was cut
fails through gRPC keepalive (runtime/net/transport.py) rather than at its deadline.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import IO

from clamor.runtime.errors import ClamorError
from clamor.runtime.launchers.base import Launcher, worker_command
from clamor.runtime.launchers.forkserver import ForkedWorker, ForkServer, PipeChannel

#: ``-o`` options given to every ssh call after the caller's (the first value of an
#: option wins in ssh, so ``ssh_options`` override these). ``ServerAlive*`` makes a
#: client whose link is cut exit (status 255) after ~15 s instead of hanging forever.
DEFAULT_SSH_OPTIONS: tuple[str, ...] = (
    "ConnectTimeout=10",
    "ServerAliveInterval=5",
    "ServerAliveCountMax=3",
    "ControlPersist=no",  # a multiplexing master must not outlive its session
)
#: Exit status of the OpenSSH client when ssh itself failed (connection, authentication).
SSH_FAILED = 255
#: Exit status of the remote wrapper when the worker's python cannot be run.
_NO_PYTHON = 127
_TAIL_BYTES = 4096
#: Stands for the remote token file (``"$f"`` in the script) in the worker command.
_TOKEN_FILE = "\0token-file"


def _bare_host(host: str) -> str:
    """``host`` without ``user@`` and IPv6 brackets."""
    return host.rpartition("@")[2].strip("[]")


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(_bare_host(host))
    except ValueError:
        return None


class _Client:
    """One ssh client process and the thread copying its output to the log."""

    def __init__(self, host: str, proc: subprocess.Popen, out: IO[bytes] | None, stream: IO[bytes] | None = None) -> None:
        self.host = host
        self.proc = proc
        self._stream = stream if stream is not None else proc.stdout  # what it copies
        self.remote_pid: int | None = None
        self.killed = False  # the remote process was SIGKILLed by kill()
        self.tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self._out = out
        self.reader = threading.Thread(target=self._copy, name="clamor-ssh-output", daemon=True)
        self.reader.start()

    def _copy(self) -> None:
        fd = self._stream.fileno()  # type: ignore[union-attr]
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            self.tail.append(data)
            self._tail_bytes += len(data)
            while self._tail_bytes - len(self.tail[0]) >= _TAIL_BYTES:
                self._tail_bytes -= len(self.tail.popleft())
            try:
                if self._out is not None:
                    self._out.write(data)
                    self._out.flush()
                else:
                    os.write(2, data)
            except (OSError, ValueError):  # the log was closed under us: keep draining
                pass

    def output_tail(self, lines: int = 3) -> str:
        """The last non-empty ``lines`` of its output (ssh's and the worker's), one line."""
        text = b"".join(self.tail).decode(errors="replace")
        kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)[-600:]


def _reap(clients: dict[int, _Client], logs: list[IO], forks: dict[str, ForkServer] | None = None,
          relays: dict[str, _Client] | None = None, grace: float = 2.0) -> None:  # fmt: skip
    """Stop the hosts' templates, end every ssh client still running (SIGTERM, then
    SIGKILL) and close the logs."""
    for server in (forks or {}).values():
        server.close()
    for relay in (relays or {}).values():
        relay.reader.join(2.0)
        if relay.proc.stderr is not None:
            relay.proc.stderr.close()
    running = [c.proc for c in clients.values() if c.proc.poll() is None]
    for proc in running:
        try:
            proc.terminate()
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
    for client in clients.values():
        client.reader.join(2.0)
        if client.proc.stdout is not None:
            client.proc.stdout.close()
    for f in logs:
        f.close()


class SSHLauncher(Launcher):
    """Workers on ``hosts`` (``"node"`` or ``"user@node"``), round-robin, through ``ssh``.

    ``user``, ``port``, ``identity_file``: ssh's ``-l``, ``-p``, ``-i`` (``None``: what
    the ssh configuration says). ``python``: the interpreter on the hosts (default
    :data:`sys.executable`: the same path on every host, with clamor installed).
    ``ssh_options``: extra ``-o`` options (``"Key=value"``; items starting with ``-``
    are passed as they are), placed before :data:`DEFAULT_SSH_OPTIONS` so they win.
    ``known_hosts_file`` / ``strict_host_key_checking`` (``True``/``False`` or
    ``"accept-new"``): ssh's ``UserKnownHostsFile`` / ``StrictHostKeyChecking``
    (``None``: the ssh configuration's). ``env``: variables set for the workers
    (visible on the remote command line: no secrets). ``ssh``: the client to run.
    ``BatchMode=yes`` always: ssh never prompts. Workers on a host given as an IP
    address serve on that address; otherwise on the host's address facing the driver.
    ``fork``: one ssh client and one template process per host, which forks its workers
    (see the module's docstring).
    """

    name = "ssh"

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        user: str | None = None,
        port: int | None = None,
        identity_file: str | os.PathLike | None = None,
        python: str | None = None,
        ssh_options: Sequence[str] = (),
        known_hosts_file: str | os.PathLike | None = None,
        strict_host_key_checking: bool | str | None = None,
        env: Mapping[str, str] | None = None,
        ssh: str = "ssh",
        fork: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(hosts, str):
            hosts = [hosts]
        self.hosts = [str(h) for h in hosts]
        if not self.hosts:
            raise ValueError("SSHLauncher needs at least one host")
        for host in self.hosts:
            if not host or host.startswith("-") or any(c.isspace() for c in host):
                raise ValueError(f"not a host name for ssh: {host!r}")
        self.python = python or sys.executable
        self.env = dict(env or {})
        for key in self.env:
            if not key.isidentifier():
                raise ValueError(f"not an environment variable name: {key!r}")
        self._base = [ssh, "-T", "-x", "-a", "-o", "BatchMode=yes"]
        if user is not None:
            self._base += ["-l", user]
        if port is not None:
            self._base += ["-p", str(int(port))]
        if identity_file is not None:
            self._base += ["-i", os.fspath(identity_file), "-o", "IdentitiesOnly=yes"]
        if known_hosts_file is not None:
            self._base += ["-o", f"UserKnownHostsFile={os.fspath(known_hosts_file)}"]
        if strict_host_key_checking is not None:
            value = strict_host_key_checking
            value = {True: "yes", False: "no"}.get(value, value) if isinstance(value, bool) else value
            self._base += ["-o", f"StrictHostKeyChecking={value}"]
        for option in [*ssh_options, *DEFAULT_SSH_OPTIONS]:
            self._base += [option] if option.startswith("-") else ["-o", option]
        self.fork = fork
        self._spawned = 0
        self._clients: dict[int, _Client] = {}
        self._logs: list[IO] = []
        self._forks: dict[str, ForkServer] = {}  # host -> its template (fork=True)
        self._relays: dict[str, _Client] = {}  # host -> its template's ssh client, stderr copied
        self._forked: dict[int, tuple[str, ForkedWorker]] = {}
        self._finalizer = weakref.finalize(self, _reap, self._clients, self._logs, self._forks, self._relays)

    # --- commands ---

    def ssh_command(self, host: str, remote: str) -> list[str]:
        """The ssh command line running the shell command ``remote`` on ``host``."""
        return [*self._base, "--", host, remote]

    def remote_script(self, host: str, launch_key: str) -> str:
        """The ``sh`` script that stores stdin as the token file and runs the worker.

        The worker removes the token file once read; the script removes it too if the
        worker could not (it did not start, or failed first).
        """
        bind = _bare_host(host) if _ip_literal(host) is not None else None
        command = worker_command(self.connect, _TOKEN_FILE, python=self.python, host=bind)
        command += ["--remove-token-file", "--launch-key", launch_key]
        worker = ['"$f"' if arg == _TOKEN_FILE else shlex.quote(arg) for arg in command]
        return "\n".join([
            "umask 077",
            'f=$(mktemp "${TMPDIR:-/tmp}/clamor-ssh-token.XXXXXXXX") || exit 72',
            'cat >"$f" || { rm -f "$f"; exit 72; }',
            *self._python_check('rm -f "$f"; '),
            self._env_prefix() + " ".join(worker),
            'rc=$?; rm -f "$f"; exit $rc',
        ])  # fmt: skip

    def template_script(self, host: str) -> str:
        """The ``sh`` script that runs the host's worker template on its stdin and stdout."""
        python = shlex.quote(self.python)
        return "\n".join([
            *self._python_check(),
            "exec " + self._env_prefix() + f"{python} -m clamor.runtime.worker.template --stdio",
        ])  # fmt: skip

    def _python_check(self, cleanup: str = "") -> list[str]:
        """Script lines that exit with :data:`_NO_PYTHON`, saying so, if the host cannot run
        the workers' python (``cleanup``: shell run first)."""
        python = shlex.quote(self.python)
        return [f"if ! command -v {python} >/dev/null 2>&1; then",
                f'  {cleanup}echo "clamor: cannot run {python} on $(uname -n)" >&2; exit {_NO_PYTHON}',
                "fi"]  # fmt: skip

    def _env_prefix(self) -> str:
        """``env K=V ... `` for the workers' variables (empty without any)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"env {env} " if env else ""

    def _template(self, host: str) -> ForkServer:
        """``host``'s template (started on first use: one ssh client for all its workers)."""
        if (server := self._forks.get(host)) is not None:
            return server
        assert self.credentials is not None, "bind() first"

        def start() -> tuple[subprocess.Popen, PipeChannel]:
            out = self._open_log(f"ssh-{_bare_host(host)}.log")
            proc = subprocess.Popen(
                self.ssh_command(host, "sh -c " + shlex.quote(self.template_script(host))),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # notebook interrupts (SIGINT to the group) spare it
            )  # fmt: skip
            self._relays[host] = _Client(host, proc, out, stream=proc.stderr)
            return proc, PipeChannel(proc.stdin, proc.stdout)  # type: ignore[arg-type]

        def ended(proc: subprocess.Popen) -> str:
            relay = self._relays[host]
            relay.reader.join(1.0)  # ssh has exited: what it said may still be in the pipe
            tail = relay.output_tail() or "no output"
            if proc.returncode == SSH_FAILED:
                return f"ssh failed ({tail})"
            return f"its template exited with status {proc.returncode} ({tail})"

        server = self._forks[host] = ForkServer(
            start=start, greeting={"credentials": self.credentials.serialize()}, ended=ended
        )
        return server

    def _open_log(self, name: str) -> IO[bytes] | None:
        if self.log_dir is None:
            return None
        out = open(os.path.join(self.log_dir, name), "ab")  # noqa: SIM115 - closed with the launcher
        self._logs.append(out)
        return out

    def _check_reachable(self, host: str) -> None:
        """A driver on a loopback address cannot be reached from another machine."""
        ip = _ip_literal(host)
        driver = _ip_literal(self.connect.rpartition(":")[0])
        if ip is not None and driver is not None and driver.is_loopback and not ip.is_loopback:
            raise ClamorError(
                f"workers on {host} cannot reach a driver listening on {driver}: pass "
                "Cluster(host=...) an address of this machine that the hosts can reach"
            )

    # --- the Launcher interface ---

    def spawn(self, worker_id: int) -> None:
        """Start ``ssh HOST sh -c ...`` for ``worker_id`` on the next host (round-robin)."""
        if not self._finalizer.alive:
            raise RuntimeError("launcher is closed")
        if worker_id in self._clients or worker_id in self._forked:
            raise ValueError(f"worker {worker_id} was already started")
        assert self.credentials is not None, "bind() first"
        host = self.hosts[self._spawned % len(self.hosts)]
        self._check_reachable(host)
        self._spawned += 1
        if self.fork:
            bind = _bare_host(host) if _ip_literal(host) is not None else None
            # clamor-worker's arguments; the template adds --token-file (a pipe of its own)
            argv = ["--connect", self.connect, *(["--host", bind] if bind else []),
                    "--launch-key", self.new_launch_key(worker_id)]  # fmt: skip
            self._template(host).spawn([(argv, None)], lambda forked: self._forked.update({worker_id: (host, forked[0])}))
            return
        out = self._open_log(f"worker-{worker_id}.log")
        script = self.remote_script(host, self.new_launch_key(worker_id))
        proc = subprocess.Popen(
            self.ssh_command(host, "sh -c " + shlex.quote(script)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # notebook interrupts (SIGINT to the group) spare it
        )
        self._clients[worker_id] = _Client(host, proc, out)
        try:  # the secret goes through ssh's stdin into the 0600 file, then EOF
            proc.stdin.write(self.credentials.serialize().encode())  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:  # ssh failed at once: exitcode() and describe() say why
            pass

    def claim(self, launch_key: str, pid: int) -> int | None:
        """The reserved id of a registering worker; remembers its remote ``pid``."""
        worker_id = super().claim(launch_key, pid)
        if worker_id is not None and worker_id in self._clients:
            self._clients[worker_id].remote_pid = pid
        return worker_id

    @property
    def worker_ids(self) -> list[int]:
        return sorted([*self._clients, *self._forked])

    def host_of(self, worker_id: int) -> str:
        """The ssh host (as given) that ``worker_id`` was started on."""
        if worker_id in self._forked:
            return self._forked[worker_id][0]
        return self._clients[worker_id].host

    def exitcode(self, worker_id: int) -> int | None:
        """``None`` while the ssh client runs; then the worker's exit status as ssh
        forwarded it (``-signal`` if it was killed), or 255 if ssh itself failed. A forked
        worker's: as its template reported it (its template's, if it was never forked)."""
        if worker_id in self._forked:
            return self._forked[worker_id][1].poll()
        client = self._clients.get(worker_id)
        code = None if client is None else client.proc.poll()
        if code is None or client is None:
            return None
        if client.killed:
            return -signal.SIGKILL
        if 128 < code < 128 + 65:  # the remote shell's "killed by signal N"
            return 128 - code
        return code

    def wait(self, worker_id: int, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the ssh client to exit; :meth:`exitcode`."""
        proc = self._process(worker_id)
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        return self.exitcode(worker_id)

    def _process(self, worker_id: int) -> subprocess.Popen | ForkedWorker | None:
        """What stands for the worker here: its ssh client, or its forked worker."""
        if worker_id in self._forked:
            return self._forked[worker_id][1]
        client = self._clients.get(worker_id)
        return client.proc if client is not None else None

    def describe(self, worker_id: int) -> str:
        """``ssh HOST (pid N)``; once ssh failed, with the end of its output."""
        if worker_id in self._forked:
            host, forked = self._forked[worker_id]
            if forked.error is not None:
                return f"ssh {host} ({forked.error})"
            return f"ssh {host} (pid {forked.pid})" if forked.forked else f"ssh {host} (not forked yet)"
        client = self._clients.get(worker_id)
        if client is None:
            return super().describe(worker_id)
        if client.remote_pid is not None:
            text = f"ssh {client.host} (pid {client.remote_pid})"
        else:
            text = f"ssh {client.host} (ssh client pid {client.proc.pid})"
        code = client.proc.poll()
        if code is not None and code != 0 and not client.killed:
            client.reader.join(1.0)  # ssh has exited: what it said may still be in the pipe
            tail = client.output_tail()
            if code == SSH_FAILED and client.remote_pid is not None:
                text += f", ssh connection lost ({tail or 'no output'})"
            elif code == SSH_FAILED:
                text += f", ssh failed ({tail or 'no output'})"
                if "Host key verification failed" in tail:
                    text += (
                        "; add the host's key to known_hosts, or pass "
                        "SSHLauncher(..., strict_host_key_checking='accept-new')"
                    )
            elif tail:
                text += f", output ends: {tail}"
        return text

    def kill(self, worker_id: int, pid: int | None = None, timeout: float = 10.0) -> int | None:
        """SIGKILL the worker (``ssh HOST kill -9 PID``, at most ``timeout`` s), end its
        ssh client; the exit code (``-9`` if the remote kill succeeded). A forked worker is
        killed by its template."""
        if worker_id in self._forked:
            forked = self._forked[worker_id][1]
            forked.kill()
            return self.wait(worker_id, timeout)
        client = self._clients[worker_id]
        pid = pid if pid is not None else client.remote_pid
        deadline = time.monotonic() + timeout
        if pid is not None and client.proc.poll() is None:
            try:
                done = subprocess.run(
                    self.ssh_command(client.host, f"kill -9 {int(pid)}"),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
                client.killed = done.returncode == 0
            except subprocess.TimeoutExpired:
                pass  # the host is unreachable: the worker's watchdog will end it
        try:
            client.proc.wait(max(0.1, min(2.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            client.proc.kill()
            client.proc.wait()
        return self.exitcode(worker_id)

    def close(self, timeout: float = 5.0) -> None:
        """Give workers ``timeout`` seconds to exit on their own, then end the ssh clients
        (remote workers exit once the driver is gone: the worker's watchdog)."""
        if not self._finalizer.alive:
            return
        deadline = time.monotonic() + timeout
        for proc in [self._process(w) for w in self.worker_ids]:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self._finalizer()

    def __repr__(self) -> str:
        return f"<SSHLauncher {', '.join(self.hosts)}: {len(self._clients) + len(self._forked)} workers>"
