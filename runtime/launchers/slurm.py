"""Clamor workers as a Slurm job, started from the notebook (deploy/slurm/README.md).

    import clamor
    from clamor.kernel import session

    session.start(16, launcher=clamor.SlurmLauncher(["--partition=cpu", "--ntasks-per-node=8"]),
                  host="10.1.0.5", tls=True, timeout=900)   # `cluster` is this one now

:meth:`SlurmLauncher.start` writes the cluster's credentials to a 0600 file in your
home directory (``~/.clamor``, which the nodes see), writes one launch key per worker
next to it, and submits ``clamor-workers.sbatch`` with ``sbatch --ntasks=N``: each
Slurm task runs ``clamor-worker --connect ADDR --token-file F --launch-key K``. Both
files are deleted as soon as every worker has registered (the cluster calls
:meth:`release_token_file`), and :meth:`close` cancels the job. ``timeout`` must
cover the time the job waits in the queue.

Slurm does not tell us when one task dies, so the cluster relies on the workers'
heartbeats (as for SSH and Dask workers); :meth:`~clamor.Cluster.kill_worker` is not
available. The driver's ``host`` must be an address the nodes can reach; across a
shared network use ``tls=True``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path

from clamor.runtime.errors import ClamorError
from clamor.runtime.launchers.base import Launcher

#: The batch script submitted for each group of workers (shipped with the package; a copy
#: of your own may be given as ``script=``).
SCRIPT = Path(__file__).resolve().with_name("clamor-workers.sbatch")


def _cancel(scancel: str, jobs: list[str]) -> None:
    """``scancel`` the jobs (finished ones are ignored); used at close and at exit."""
    if jobs:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([scancel, *jobs], capture_output=True, timeout=30, check=False)
        jobs.clear()


def _remove(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    paths.clear()


class SlurmLauncher(Launcher):
    """Workers as the tasks of Slurm batch jobs (one job per :meth:`start`).

    ``sbatch_args``: more ``sbatch`` options (partition, account, nodes, time, ...).
    ``token_dir``: where the 0600 credential and launch-key files go; it must be on a
    file system the nodes share (default ``~/.clamor``). ``python``: the interpreter
    on the nodes (default this one: the same path everywhere, with clamor installed);
    ``""`` runs ``clamor-worker`` from the job's PATH instead.
    ``script``, ``sbatch``, ``scancel``, ``squeue``: the batch script and commands.
    """

    name = "slurm"

    def __init__(
        self,
        sbatch_args: Sequence[str] = (),
        *,
        token_dir: str | os.PathLike = "~/.clamor",
        python: str | None = None,
        script: str | os.PathLike = SCRIPT,
        sbatch: str = "sbatch",
        scancel: str = "scancel",
        squeue: str = "squeue",
    ) -> None:
        super().__init__()
        self.sbatch_args = list(sbatch_args)
        self.token_dir = Path(token_dir).expanduser()
        self.python = sys.executable if python is None else python
        self.script = Path(script)
        self.sbatch, self.scancel, self.squeue = sbatch, scancel, squeue
        self._tag = secrets.token_hex(6)
        self._jobs: list[str] = []
        self._files: list[Path] = []
        self._where: dict[int, tuple[str, int]] = {}  # worker id -> (job id, task index)
        self._finalizer = weakref.finalize(self, _cancel, scancel, self._jobs)
        self._cleanup = weakref.finalize(self, _remove, self._files)
        if shutil.which(sbatch) is None:
            raise ClamorError(f"{sbatch!r} is not on PATH: is this a Slurm login node?")

    # --- files the nodes read ---

    def _private_file(self, name: str, text: str) -> Path:
        """A new file only you can read, in :attr:`token_dir` (created 0700)."""
        self.token_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.token_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._files.append(path)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def release_token_file(self) -> None:
        """Delete the credential and key files (workers read them only at start-up)."""
        _remove(self._files)

    # --- Launcher ---

    def start(self, worker_ids: Iterable[int]) -> None:
        """Submit one job with a task per worker id."""
        ids = list(worker_ids)
        if not ids:
            return
        if not self._finalizer.alive:
            raise RuntimeError("launcher is closed")
        assert self.credentials is not None, "bind() first"
        group = f"{self._tag}-{len(self._jobs)}"
        token = self._private_file(f"cluster-{group}.token", self.credentials.serialize())
        keys = [self.new_launch_key(i) for i in ids]
        key_file = self._private_file(f"cluster-{group}.keys", "\n".join(keys) + "\n")
        env = {
            **os.environ,
            "CLAMOR_CONNECT": self.connect,
            "CLAMOR_TOKEN_FILE": str(token),
            "CLAMOR_LAUNCH_KEYS": str(key_file),
            "CLAMOR_PYTHON": self.python or "",
        }
        command = [self.sbatch, "--parsable", f"--ntasks={len(ids)}",
                   f"--job-name=clamor-{self._tag}", *self.sbatch_args, str(self.script)]  # fmt: skip
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60,
                                  check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClamorError(f"sbatch could not be run: {exc}") from exc
        if done.returncode != 0:
            raise ClamorError(
                f"sbatch refused the workers' job (exit {done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        job = done.stdout.strip().split(";")[0]  # --parsable: "jobid[;cluster]"
        self._jobs.append(job)
        for index, worker_id in enumerate(ids):
            self._where[worker_id] = (job, index)

    def spawn(self, worker_id: int) -> None:
        """One more worker: a job of one task."""
        self.start([worker_id])

    def describe(self, worker_id: int) -> str:
        job, index = self._where.get(worker_id, ("?", -1))
        return f"slurm job {job} task {index}"

    def _running(self) -> bool:
        """Whether any of our jobs is still queued or running (False if unknown)."""
        if not self._jobs or shutil.which(self.squeue) is None:
            return False
        try:
            done = subprocess.run([self.squeue, "-h", "-o", "%i", "-j", ",".join(self._jobs)],
                                  capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0 and bool(done.stdout.strip())

    def close(self, timeout: float = 5.0) -> None:
        """Give the jobs ``timeout`` seconds to end (the workers were told to stop),
        then cancel them; delete any file left."""
        deadline = time.monotonic() + timeout
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.5)
        self._finalizer()
        self._cleanup()

    def __repr__(self) -> str:
        return f"<SlurmLauncher jobs={self._jobs} args={self.sbatch_args}>"
