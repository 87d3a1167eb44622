"""The command line that ``lookups.py``, ``streaming.py`` and ``kmeans.py`` share:
``--quick --repeat --passes --only --timeout --wait-idle`` and the hidden
``--child``/``--child-out`` of their child processes (:func:`arguments`), and the
systems ``--only`` names (:func:`systems`). ``choices``: the script's child names, in
the order it runs them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def arguments(description: str, quick_help: str, choices: Sequence[str]) -> argparse.ArgumentParser:
    """The options every workload script takes; ``choices``: its child names."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--repeat", type=int, default=None, help="timed repetitions per case and pass")
    ap.add_argument("--passes", type=int, default=None,
                    help="passes over the systems (A B A B ...), each starting every system afresh "
                         "with an untimed warm-up; the rows merge every pass's repetitions")  # fmt: skip
    ap.add_argument("--only", default=",".join(choices),
                    help=f"comma-separated systems among {','.join(choices)}")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=900.0, metavar="SECONDS",
                    help="time limit per system, start-up to shut-down")  # fmt: skip
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each system, wait up to SECONDS for the machine to go quiet")  # fmt: skip
    ap.add_argument("--child", choices=choices, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return ap


def systems(ap: argparse.ArgumentParser, only: str, choices: Sequence[str]) -> list[str]:
    """The systems of ``--only``, in the order of ``choices``; a usage error for others."""
    chosen = [s.strip() for s in only.split(",") if s.strip()]
    bad = [s for s in chosen if s not in choices]
    if bad:
        ap.error(f"unknown system(s) {', '.join(bad)}; choose among {', '.join(choices)}")
    return [s for s in choices if s in chosen]

