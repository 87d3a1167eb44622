"""What every benchmark report says about the machine it ran on."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path


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
