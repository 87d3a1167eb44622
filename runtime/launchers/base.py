"""Launchers start ``clamor-worker`` processes for a cluster: the base class.

A worker is always the same command, ``clamor-worker --connect ADDR --token-file F``
(:func:`worker_command`); launchers differ in where it runs: ``local`` (subprocesses of
the driver, the default; runtime/launchers/local.py), ``ssh`` (ssh.py), ``dask`` (dask.py)
and ``slurm`` (slurm.py). The cluster reserves a worker id, asks the launcher to
:meth:`~Launcher.spawn` it, and the launcher passes a ``--launch-key`` that the worker
echoes when it registers, so the cluster knows which reservation a registering worker
fills.
"""

from __future__ import annotations

import abc
import secrets
import sys
from collections.abc import Iterable

from clamor.runtime.credentials import Credentials


def worker_command(
    connect: str, token_file: str, *, python: str | None = None, host: str | None = None
) -> list[str]:
    """The ``clamor-worker`` command line (run as ``python -m``, so no PATH is needed)."""
    command = [
        python or sys.executable,
        "-m",
        "clamor.runtime.worker.process",
        "--connect",
        connect,
        "--token-file",
        token_file,
    ]
    return command + (["--host", host] if host else [])


class Launcher(abc.ABC):
    """Starts and stops the worker processes of one cluster.

    The cluster calls :meth:`bind` once (its scheduler address and secrets), then
    :meth:`spawn` per reserved worker id, :meth:`claim` when a worker registers,
    and :meth:`close` at the end. Launchers that see their processes (``local``)
    say so with :meth:`observes`; for the others the cluster relies on heartbeats.
    """

    #: Short name shown in stats and error messages.
    name = "launcher"

    def __init__(self) -> None:
        self.connect = ""
        self.credentials: Credentials | None = None
        self.host = "127.0.0.1"
        self.log_dir: str | None = None
        self._keys: dict[str, int] = {}  # launch key -> worker id

    def prepare(self) -> None:
        """Called first by the cluster's constructor: start what takes time and needs no
        address or secret yet (nothing by default)."""

    def bind(
        self, connect: str, credentials: Credentials, *, host: str, log_dir: str | None
    ) -> None:
        """Called once by the cluster before the first :meth:`spawn`."""
        self.connect, self.credentials, self.host, self.log_dir = connect, credentials, host, log_dir

    def new_launch_key(self, worker_id: int) -> str:
        """A fresh key for ``worker_id``'s process (passed as ``--launch-key``)."""
        key = f"{worker_id}-{secrets.token_hex(8)}"
        self._keys[key] = worker_id
        return key

    def claim(self, launch_key: str, pid: int) -> int | None:
        """The worker id reserved for a registering process (``None``: not ours)."""
        return self._keys.pop(launch_key, None) if launch_key else None

    @abc.abstractmethod
    def spawn(self, worker_id: int) -> None:
        """Start the process that will register as ``worker_id``."""

    def start(self, worker_ids: Iterable[int]) -> None:
        """:meth:`spawn` each id."""
        for i in worker_ids:
            self.spawn(i)

    def observes(self, worker_id: int) -> bool:
        """Whether :meth:`alive` and :meth:`exitcode` see the worker's process itself."""
        return False

    def alive(self, worker_id: int) -> bool:
        """Whether the worker's process may still run (``True`` when not observable)."""
        return self.exitcode(worker_id) is None

    def exitcode(self, worker_id: int) -> int | None:
        """``None`` while running (or unknown); the exit status, ``-signal`` if killed."""
        return None

    def wait(self, worker_id: int, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the worker to exit; its exit code or ``None``."""
        return self.exitcode(worker_id)

    def describe(self, worker_id: int) -> str:
        """Where the worker runs, for messages (e.g. ``pid 123`` or ``ssh node1``)."""
        return f"{self.name} worker {worker_id}"

    def kill(self, worker_id: int, pid: int | None = None, timeout: float = 10.0) -> int | None:
        """SIGKILL the worker's process (``pid``, as it registered); its exit code if known."""
        raise NotImplementedError(f"the {self.name} launcher cannot kill workers")

    def release_token_file(self) -> None:
        """Remove any token file written for start-up (workers read it only then)."""

    @abc.abstractmethod
    def close(self, timeout: float = 5.0) -> None:
        """Give workers ``timeout`` seconds to exit on their own, then stop the rest."""
