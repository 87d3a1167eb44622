"""A real JupyterHub for tests, run from deploy/jupyterhub/jupyterhub_config.py.

    with start_hub(tmp_path, users=["alice", "bob"]) as hub:
        hub.start_server("alice")                    # through the Hub REST API
        token = hub.new_token("alice")               # alice's own API token
        hub.user_url("alice")                        # http://127.0.0.1:PORT/user/alice/

The Hub listens on 127.0.0.1 (free ports), keeps its database, cookie secret and
proxy pid file in a temporary folder, logs users in with the DummyAuthenticator
(fixed user list) and runs every single-user server as the current user with
SimpleLocalProcessSpawner, with homes under the temporary folder. A "clamor-admin"
service token (created by the config's CLAMOR_HUB_SERVICE_TOKEN knob) drives the
Hub API. :meth:`Hub.stop` stops the servers through the API, then the Hub (which
stops its proxy and its services), then kills whatever it started that still runs
(and lists it in :attr:`Hub.leftovers`, which tests expect empty).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # jupyter_remote, shared with tests/extension/
from jupyter_remote import api_request

CONFIG = REPO / "deploy" / "jupyterhub" / "jupyterhub_config.py"


#: Where :func:`free_ports` picks: below Linux's ephemeral range (32768-60999 by default),
#: which the kernel hands to every bind of port 0 (the workers' gRPC servers of the tests
#: running beside this one): one of those took a Hub's port before the Hub bound it.
PORTS = range(20_000, 32_000)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (held open together while chosen),
    outside the ephemeral range (:data:`PORTS`)."""
    rng = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            sock = stack.enter_context(socket.socket())
            port = rng.choice(PORTS)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken: another
            if port not in ports:
                ports.append(port)
        return ports


class HubError(RuntimeError):
    """The Hub did not do what was asked; the message ends with its log."""


class Hub:
    """A JupyterHub subprocess; :attr:`url` is the proxy's public URL (ends with ``/``)."""

    def __init__(self, proc: subprocess.Popen, url: str, admin_token: str, log_path: Path,
                 users: list[str]) -> None:  # fmt: skip
        self.proc, self.url, self.admin_token = proc, url, admin_token
        self.log_path, self.users = log_path, users
        self._tree: dict[int, psutil.Process] = {}
        #: after :meth:`stop`: what still ran 10 s after the Hub exited (and was killed)
        self.leftovers: list[str] = []

    # --- the Hub REST API, as the clamor-admin service ---

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
        """``(status, JSON body or text)`` of ``/hub/api/{path}``."""
        status, text, _ = api_request(
            f"{self.url}hub/api/{path}", self.admin_token, method, body, timeout=timeout
        )
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def log(self, tail: int = 12_000) -> str:
        """The end of what the Hub (and the servers it spawned) wrote."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def fail(self, what: str) -> HubError:
        return HubError(f"{what}\n--- hub log (end) ---\n{self.log()}")

    def user_url(self, name: str) -> str:
        """The user's single-user server, through the proxy."""
        return f"{self.url}user/{name}/"

    def server(self, name: str) -> dict | None:
        """The user's default server model (``None`` when it is not running)."""
        status, user = self.api("GET", f"users/{name}")
        if status != 200:
            raise self.fail(f"GET users/{name}: HTTP {status}: {user}")
        return (user.get("servers") or {}).get("")

    def start_server(self, name: str, timeout: float = 120.0) -> dict:
        """Start ``name``'s server through the API and wait until it is ready."""
        status, body = self.api("POST", f"users/{name}/server")
        if status not in (201, 202):
            raise self.fail(f"starting {name}'s server: HTTP {status}: {body}")
        deadline = time.monotonic() + timeout
        while True:
            self.note_processes()
            server = self.server(name)
            if server and server.get("ready"):
                return server
            if self.proc.poll() is not None:
                raise self.fail(f"the Hub exited ({self.proc.returncode})")
            if server is None and status == 202:  # the spawn failed and was cleared
                raise self.fail(f"{name}'s server failed to start")
            if time.monotonic() > deadline:
                raise self.fail(f"{name}'s server was not ready within {timeout:g} s")
            time.sleep(0.5)

    def stop_server(self, name: str, timeout: float = 60.0) -> None:
        """Stop ``name``'s server through the API and wait until it is gone."""
        status, body = self.api("DELETE", f"users/{name}/server", timeout=timeout)
        if status not in (202, 204, 400, 404):  # 400: not running
            raise self.fail(f"stopping {name}'s server: HTTP {status}: {body}")
        deadline = time.monotonic() + timeout
        while self.server(name) is not None:
            if time.monotonic() > deadline:
                raise self.fail(f"{name}'s server did not stop within {timeout:g} s")
            time.sleep(0.5)

    def new_token(self, name: str) -> str:
        """A fresh API token of ``name`` (with the user's own permissions)."""
        status, body = self.api(
            "POST", f"users/{name}/tokens", {"note": "clamor deploy test", "expires_in": 1800}
        )
        if status != 201:
            raise self.fail(f"creating a token for {name}: HTTP {status}: {body}")
        return body["token"]

    # --- processes ---

    def note_processes(self) -> None:
        """Note the Hub's descendants (proxy, servers, kernels, workers) while they run,
        so :meth:`stop` can kill any that outlive it."""
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self._tree.setdefault(p.pid, p)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every user's server, then the Hub; kill whatever still runs 10 s later
        (listed in :attr:`leftovers`)."""
        self.note_processes()
        if self.proc.poll() is None:
            for name in self.users:
                with contextlib.suppress(Exception):
                    self.stop_server(name, timeout=timeout / 2)
            self.note_processes()
            self.proc.send_signal(signal.SIGTERM)  # the Hub stops its proxy on the way out
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        procs = list(self._tree.values())
        _, alive = psutil.wait_procs(procs, timeout=10)
        alive = [p for p in alive if _running(p)]  # an exited orphan may stay a zombie
        self.leftovers = [_describe(p) for p in alive]
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return f"{p.pid} (gone)"


@contextlib.contextmanager
def start_hub(workdir: Path, users: list[str], timeout: float = 60.0,
              env: dict[str, str] | None = None) -> Iterator[Hub]:  # fmt: skip
    """Run JupyterHub with the deploy config in ``workdir``; stop it and its processes at the end."""
    port, hub_port, proxy_api_port = free_ports(3)
    admin_token = secrets.token_hex(32)
    environment = {
        **os.environ,
        # the Hub spawns jupyterhub-singleuser by name: this interpreter's, as if its
        # virtual environment were activated (make test PYTHON=venv/bin/python does not)
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "CLAMOR_HUB_IP": "127.0.0.1",
        "CLAMOR_HUB_PORT": str(port),
        "CLAMOR_HUB_HUB_IP": "127.0.0.1",
        "CLAMOR_HUB_HUB_PORT": str(hub_port),
        "CLAMOR_HUB_PROXY_API_PORT": str(proxy_api_port),
        "CLAMOR_HUB_STATE_DIR": str(workdir / "state"),
        "CLAMOR_HUB_AUTHENTICATOR": "dummy",
        "CLAMOR_HUB_USERS": ",".join(users),
        "CLAMOR_HUB_SPAWNER": "simple",
        "CLAMOR_HUB_HOME": str(workdir / "home" / "{username}"),
        "CLAMOR_HUB_SERVICE_TOKEN": admin_token,
        "CLAMOR_HUB_SPAWN_TIMEOUT": "120",
        **(env or {}),
    }
    for key in ("JUPYTERHUB_API_TOKEN", "JUPYTER_TOKEN", "CONFIGPROXY_AUTH_TOKEN"):
        environment.pop(key, None)
    log_path = workdir / "hub.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)],
            stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=workdir,
            start_new_session=True,
        )  # fmt: skip
    hub = Hub(proc, f"http://127.0.0.1:{port}/", admin_token, log_path, users)
    try:
        deadline = time.monotonic() + timeout
        while True:
            hub.note_processes()
            if proc.poll() is not None:
                raise hub.fail(f"JupyterHub exited ({proc.returncode}) while starting")
            with contextlib.suppress(OSError):
                if hub.api("GET", "", timeout=5)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise hub.fail(f"JupyterHub did not answer within {timeout:g} s")
            time.sleep(0.3)
        yield hub
    finally:
        hub.stop()
