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
    """Host, CPU, core count, kernel and Python; ``extra`` entries are added as given."""
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


def git_state() -> dict:
    """The commit measured, and the uncommitted changes to the code it measures."""
    changes = [  # "XY path" lines: the paths
        line.split(maxsplit=1)[-1]
        for line in git("status", "--porcelain", "--", "runtime", "clamor").splitlines()
        if line.strip()
    ]
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "?",
        "runtime_dirty": bool(changes),
        "runtime_changes": changes,
    }
