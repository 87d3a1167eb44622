"""What every benchmark report says about the machine it ran on."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

#: The repository's root (benchmarks report its commit).
ROOT = Path(__file__).resolve().parents[2]


def machine(**extra: object) -> dict:
    """Host, CPU, core count, memory, kernel and Python; ``extra`` entries are added as given."""
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        **extra,
    }


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution (``None`` if absent)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git(*args: str) -> str:
    """``git ARGS`` in the repository, its output stripped ("" when git is unavailable)."""
    try:
        return subprocess.run(
            ["git", *args],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


#: Packages whose versions every result names (the peers and what they run on).
VERSIONED = ("numpy", "ray", "dask", "distributed", "ipyparallel", "joblib", "scikit-learn", "redis",
             "mpi4py", "pyspark", "grpcio", "cloudpickle")


def git_state() -> dict:
    """The commit measured, and the uncommitted changes in the tree (the results
    folder aside: a run writes there)."""
    changes = [  # "XY path" lines: the paths
        line.split(maxsplit=1)[-1]
        for line in git("status", "--porcelain", "--untracked-files=no", "--", ".",
                        ":(exclude)bench/results").splitlines()  # fmt: skip
        if line.strip()
    ]
    return {"commit": git("rev-parse", "--short", "HEAD") or "?", "dirty": bool(changes), "changes": changes}


def provenance(argv: list[str] | None = None) -> dict:
    """Where a result comes from: the commit and whether the tree differed from it, the
    machine, the exact command (``argv``: default this process's) and the versions."""
    import sys

    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve() if args else None
    if script is not None and script.parent == ROOT / "bench" / "workloads":
        args = ["python bench/run.py", script.stem, *args[1:]]  # run.py runs it in place (runpy)
    elif script is not None and script.is_relative_to(ROOT):
        args = [f"python {script.relative_to(ROOT)}", *args[1:]]
    launched = os.environ.get("CLAMOR_BENCH_TREE_COMMIT")  # a copied tree whose .git lags (bench/device)
    return {**git_state(), **({"tree_commit": launched} if launched else {}), "machine": machine(),
            "command": " ".join(args),
            "versions": {k: v for k, v in package_versions(VERSIONED).items() if v}}
