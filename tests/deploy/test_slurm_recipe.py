"""The Slurm launcher (runtime/launchers/slurm.py): the batch script and SlurmLauncher start
real workers.

There is no Slurm here, so ``sbatch``, ``srun``, ``squeue`` and ``scancel`` are small
stand-ins on PATH that do what Slurm does for one node: ``sbatch`` runs the batch
script in the background with ``SLURM_JOB_ID`` and ``SLURM_NTASKS``, ``srun`` runs
its command once per task with ``SLURM_PROCID``, ``scancel`` kills the job. The batch
script, the launcher, the token file handling and the workers are the real ones.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from clamor.runtime.cluster import Cluster

import clamor

from clamor.runtime.launchers.slurm import SCRIPT, SlurmLauncher

SBATCH = f"""#!{sys.executable}
# stand-in for sbatch: run the script in the background as job N, print N (--parsable)
import os, subprocess, sys
args = sys.argv[1:]
ntasks = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--ntasks=")), 1)
script = next(a for a in args if not a.startswith("-"))
jobs = os.environ["FAKE_SLURM_DIR"]
job = str(1000 + len([f for f in os.listdir(jobs) if f.endswith(".pid")]))
env = dict(os.environ, SLURM_JOB_ID=job, SLURM_NTASKS=str(ntasks), SLURM_JOB_NODELIST="localhost")
with open(os.path.join(jobs, f"job-{{job}}.log"), "wb") as log:
    proc = subprocess.Popen(["bash", script], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
with open(os.path.join(jobs, f"job-{{job}}.pid"), "w") as f:
    f.write(str(proc.pid))
print(job)
"""

SRUN = """#!/bin/bash
# stand-in for srun on one node: the command once per task, with SLURM_PROCID
while [[ "$1" == -* ]]; do shift; done
for ((i = 0; i < SLURM_NTASKS; i++)); do SLURM_PROCID=$i "$@" & done
wait
"""

SQUEUE = """#!/bin/bash
# stand-in for squeue -h -o %i -j JOBS: the jobs whose process group still runs
while [ $# -gt 0 ]; do [ "$1" = -j ] && jobs=$2; shift; done
for j in ${jobs//,/ }; do
  pid=$(cat "$FAKE_SLURM_DIR/job-$j.pid" 2>/dev/null) && kill -0 -- "-$pid" 2>/dev/null && echo "$j"
done
exit 0
"""

SCANCEL = """#!/bin/bash
# stand-in for scancel JOB...: kill the job's process group
for j in "$@"; do
  pid=$(cat "$FAKE_SLURM_DIR/job-$j.pid" 2>/dev/null) && kill -KILL -- "-$pid" 2>/dev/null
done
exit 0
"""


def _job_groups(jobs: Path) -> dict[str, int]:
    return {p.stem.removeprefix("job-"): int(p.read_text()) for p in jobs.glob("job-*.pid")}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(_pgid(p) == pgid and p.status() != psutil.STATUS_ZOMBIE for p in psutil.process_iter())


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, psutil.Error):
        return None


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Stand-ins for the Slurm commands on PATH; yields the folder of job records.
    Kills every job's process group at the end."""
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    for name, text in {"sbatch": SBATCH, "srun": SRUN, "squeue": SQUEUE, "scancel": SCANCEL}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(jobs))
    try:
        yield jobs
    finally:
        for pgid in _job_groups(jobs).values():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_slurm_launcher_runs_a_cluster_from_the_batch_script(
    tmp_path: Path, fake_slurm: Path
) -> None:
    token_dir = tmp_path / "home" / ".clamor"
    launcher = SlurmLauncher(["--time=00:10:00"], token_dir=token_dir)
    with Cluster(2, launcher=launcher, timeout=60, log_dir=str(tmp_path)) as cluster:
        # the credentials reached the workers through a private file, gone by now
        assert stat.S_IMODE(token_dir.stat().st_mode) == 0o700
        assert list(token_dir.iterdir()) == []
        (job, pgid), = _job_groups(fake_slurm).items()  # fmt: skip
        assert launcher.describe(1) == f"slurm job {job} task 1"

        # each worker is one task of the job
        workers = cluster.stats()["workers"]
        assert sorted(w["id"] for w in workers) == [0, 1]
        tasks = set()
        for w in workers:
            env = psutil.Process(w["pid"]).environ()
            assert env["SLURM_JOB_ID"] == job
            tasks.add(env["SLURM_PROCID"])
        assert tasks == {"0", "1"}

        x = clamor.asarray(np.arange(1_000_000, dtype=np.float64))
        total = cluster.parallelize(x, partitions=4).map_partitions(lambda p: [float(p.sum())]).sum()
        assert total == float(x.sum())
    # closing the cluster ends the job: no worker, no srun, no script left
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(pgid), (fake_slurm / f"job-{job}.log").read_text()


def test_the_batch_script_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    token.chmod(0o644)
    env = {**os.environ, "CLAMOR_CONNECT": "127.0.0.1:1", "CLAMOR_TOKEN_FILE": str(token)}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert done.returncode == 78
    assert "mode 644" in done.stderr and "chmod 600" in done.stderr


def test_the_batch_script_says_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAMOR_")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert done.returncode != 0
    assert "CLAMOR_CONNECT" in done.stderr
