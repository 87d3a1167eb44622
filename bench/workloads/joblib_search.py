#!/usr/bin/env python3
"""scikit-learn's GridSearchCV through joblib: loky, Dask, Ray and Clamor's backend.

    python bench/run.py joblib_search [--quick] [--repeat R] [--only clamor,loky,dask,ray]

X is N x 256 float64 (N = 1,048,576: 2 GiB; ``--quick``: 131,072, 256 MiB), y from a
seeded linear rule with noise. The search: ``SGDClassifier(loss="log_loss",
max_iter=5, tol=None)`` over ``alpha`` in {1e-5, 1e-4} with 2-fold cross-validation
(4 fits), ``n_jobs=2`` on 2 workers of one thread each. Each system runs the program
its own documentation gives for joblib:

* **loky**: ``joblib.parallel_config(backend="loky")`` (joblib's default: X is memmapped
  into its worker processes, not copied).
* **dask**: a ``LocalCluster(2 workers x 1 thread)`` and ``parallel_config(backend="dask")``
  (joblib's Dask backend scatters large arguments once).
* **ray**: ``ray.init(num_cpus=2)`` and ``ray.util.joblib.register_ray()``,
  ``parallel_config(backend="ray")``.
* **clamor**: a 2-worker cluster and ``parallel_config(backend="clamor")`` (X goes to
  the arena once and reaches the tasks as a reference).

Protocol: every system first runs one untimed search at full size (its start-up, its
copies of X), then R searches (default 3) interleaved system by system (A B C D A B C D
...). Reported: seconds per search, and the peak proportional set size (Pss: shared
pages counted once) of all the system's processes but this one, sampled every 0.1 s
during the timed searches. Every system's ``best_params_`` must equal loky's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import harness  # noqa: F401 - sets up the import path
import numpy as np
import psutil
from harness.results import goal, ratio, row, save, unavailable

SYSTEMS = ("clamor", "loky", "dask", "ray")
WORKERS = 2
CASE = "grid search"


def make_data(n: int, dims: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dims))
    w = rng.standard_normal(dims)
    y = (X @ w + rng.normal(0, 4.0, n) > 0).astype(np.int64)
    return X, y


def search(X: np.ndarray, y: np.ndarray) -> dict:
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import GridSearchCV

    grid = GridSearchCV(SGDClassifier(loss="log_loss", max_iter=5, tol=None, random_state=0),
                        {"alpha": [1e-5, 1e-4]}, cv=2, n_jobs=WORKERS)  # fmt: skip
    return grid.fit(X, y).best_params_


class PssSampler:
    """The peak summed Pss of this process's descendants (the system's workers)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            total = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += child.memory_full_info().pss
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@contextlib.contextmanager
def backend(system: str) -> Iterator[Callable[[], Any]]:
    """The joblib configuration of ``system``; yields the context factory to run in."""
    import joblib

    if system == "loky":
        yield lambda: joblib.parallel_config(backend="loky")
    elif system == "dask":
        from dask.distributed import Client, LocalCluster

        with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
                Client(lc):  # fmt: skip
            yield lambda: joblib.parallel_config(backend="dask")
    elif system == "ray":
        import ray
        from ray.util.joblib import register_ray

        ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR")
        register_ray()
        try:
            yield lambda: joblib.parallel_config(backend="ray")
        finally:
            ray.shutdown()
    else:
        import clamor

        with clamor.Cluster(workers=WORKERS):
            yield lambda: joblib.parallel_config(backend="clamor")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default=",".join(SYSTEMS))
    args = parser.parse_args(argv)
    n = 131_072 if args.quick else 1_048_576
    X, y = make_data(n, 256)
    wanted = [s for s in SYSTEMS if s in args.only.split(",")]
    runnable, rows = [], []
    for system in wanted:
        module = {"loky": "joblib", "dask": "distributed", "ray": "ray", "clamor": "clamor"}[system]
        try:
            __import__(module)
            runnable.append(system)
        except ImportError as exc:
            rows.append(unavailable(system, CASE, f"{module} is not installed here ({exc})"))
    seconds: dict[str, list[float]] = {s: [] for s in runnable}
    peaks: dict[str, int] = {}
    found: dict[str, dict] = {}
    # one system's session at a time (two would share the 2 cores), repetitions
    # interleaved across passes: each pass starts every system afresh and warms it up
    for rep in range(args.repeat):
        for system in runnable:
            with backend(system) as configured:
                with configured():
                    found[system] = search(X, y)  # untimed warm-up: start-up, copies of X
                sampler = PssSampler()
                started = time.perf_counter()
                with configured():
                    found[system] = search(X, y)
                seconds[system].append(time.perf_counter() - started)
                peaks[system] = max(peaks.get(system, 0), sampler.stop())
            print(f"pass {rep + 1}: {system} {seconds[system][-1]:.2f} s, Pss {peaks[system] >> 20} MiB",
                  file=sys.stderr)  # fmt: skip
    reference = found.get("loky")
    for system in runnable:
        wrong = reference is not None and found[system] != reference
        rows.append(row(system, CASE, seconds[system], peak_worker_rss=peaks[system],
                        note=f"best_params_ {found[system]} differ from loky's {reference}" if wrong else "",
                        memory="pss, all processes of the system"))  # fmt: skip
    result = {
        "workload": "joblib_search",
        "title": "GridSearchCV through joblib, 2 workers: loky, Dask, Ray and Clamor",
        "quick": args.quick,
        "params": {"n": n, "dims": 256, "x_bytes": int(X.nbytes), "fits": 4, "repeat": args.repeat,
                   "workers": WORKERS, "command": " ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])])},
        "rows": rows,
    }  # fmt: skip
    peers = [s for s in runnable if s != "clamor"]
    result["goals"] = [goal(f"as fast as {p} or faster", ratio(result, p, CASE), 1.0) for p in peers]
    save(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
