#!/usr/bin/env python3
"""scikit-learn's GridSearchCV through joblib: loky, Dask, Ray and Clamor's backend.

    python bench/run.py joblib_search [--quick] [--passes P] [--repeat R] [--only clamor,loky,dask,ray]

X is N x 256 float64 (N = 262,144: 512 MiB; ``--quick``: 65,536, 128 MiB; ``--n``), y from
a seeded linear rule with noise. The search: ``SGDClassifier(loss="log_loss",
max_iter=5, tol=None)`` over ``alpha`` in {1e-5, 1e-4} with 2-fold cross-validation
(4 fits), ``n_jobs=2`` on 2 workers of one thread each. Each system runs the program
its own documentation gives for joblib:

* **loky**: ``joblib.parallel_config(backend="loky")`` (joblib's default: X is memmapped
  into its worker processes, not copied).
* **dask**: a ``LocalCluster(2 workers x 1 thread)`` and ``parallel_config(backend="dask")``
  (joblib's Dask backend scatters large arguments once).
* **ray**: ``ray.init(num_cpus=2, object_store_memory=...)`` (sized for the data: four
  copies of X and 1 GiB, so nothing spills) and ``ray.util.joblib.register_ray()``,
  ``parallel_config(backend="ray")``.
* **clamor**: a 2-worker cluster and ``parallel_config(backend="clamor")`` (X goes to
  the arena once and reaches the tasks as a reference).

* **limit: sequential, one process**: ``n_jobs=1`` in this process, no copies at all: the
  parallel ideal on 2 workers is about half of its fitting time plus the final refit.

Protocol: P passes (default 5) over the systems (A B C D A B C D ...), each starting the
system afresh; in a pass a system first runs one untimed search at full size (its
start-up, its copies of X), then R timed searches (default 2). Reported: seconds per
search (median, minimum, 95 % interval over the P x R), and the peak proportional set
size (Pss: shared pages counted once) of all the system's processes but this one,
sampled every 0.1 s during the timed searches. Every system's ``best_params_`` must equal
loky's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import harness  # noqa: F401 - sets up the import path
import numpy as np
import psutil
from harness.results import goal, ratio, row, save, unavailable

SYSTEMS = ("clamor", "loky", "dask", "ray", "limit")
LIMIT = "limit: sequential, one process"
WORKERS = 2
CASE = "grid search"


def make_data(n: int, dims: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dims))
    w = rng.standard_normal(dims)
    y = (X @ w + rng.normal(0, 4.0, n) > 0).astype(np.int64)
    return X, y


def search(X: np.ndarray, y: np.ndarray, n_jobs: int = WORKERS) -> dict:
    from sklearn.linear_model import SGDClassifier
    from sklearn.model_selection import GridSearchCV

    grid = GridSearchCV(SGDClassifier(loss="log_loss", max_iter=5, tol=None, random_state=0),
                        {"alpha": [1e-5, 1e-4]}, cv=2, n_jobs=n_jobs)  # fmt: skip
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
def backend(system: str, x_bytes: int) -> Iterator[Callable[[], Any]]:
    """The joblib configuration of ``system``; yields the context factory to run in."""
    import joblib

    if system == "limit":
        yield lambda: joblib.parallel_config(backend="sequential")
    elif system == "loky":
        yield lambda: joblib.parallel_config(backend="loky")
    elif system == "dask":
        from dask.distributed import Client, LocalCluster

        with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
                Client(lc):  # fmt: skip
            yield lambda: joblib.parallel_config(backend="dask")
    elif system == "ray":
        import ray
        from ray.util.joblib import register_ray

        ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR",
                 object_store_memory=4 * x_bytes + (1 << 30))  # fmt: skip
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
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2, help="timed searches per system and pass")
    parser.add_argument("--n", type=int, default=None, help="rows of X (262,144; quick 65,536)")
    parser.add_argument("--only", default=",".join(SYSTEMS))
    args = parser.parse_args(argv)
    n = args.n or (65_536 if args.quick else 262_144)
    X, y = make_data(n, 256)
    wanted = [s for s in SYSTEMS if s in args.only.split(",")]
    runnable, rows = [], []
    for system in wanted:
        module = {"loky": "joblib", "dask": "distributed", "ray": "ray", "clamor": "clamor",
                  "limit": "sklearn"}[system]  # fmt: skip
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
    for number in range(args.passes):
        for system in runnable:
            n_jobs = 1 if system == "limit" else WORKERS
            with backend(system, X.nbytes) as configured:
                with configured():
                    found[system] = search(X, y, n_jobs)  # untimed warm-up: start-up, copies of X
                sampler = PssSampler()
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    with configured():
                        found[system] = search(X, y, n_jobs)
                    seconds[system].append(time.perf_counter() - started)
                peaks[system] = max(peaks.get(system, 0), sampler.stop())
            print(f"pass {number + 1}: {system} {seconds[system][-args.repeat:]} s, Pss {peaks[system] >> 20} MiB",
                  file=sys.stderr)  # fmt: skip
    reference = found.get("loky")
    for system in runnable:
        wrong = reference is not None and found[system] != reference
        rows.append(row(LIMIT if system == "limit" else system, CASE, seconds[system],
                        peak_worker_rss=peaks[system] or None, checked=not wrong,
                        note=f"best_params_ {found[system]} differ from loky's {reference}" if wrong else "",
                        memory="pss, all processes of the system", limit=system == "limit"))  # fmt: skip
    result = {
        "workload": "joblib_search",
        "title": "GridSearchCV through joblib, 2 workers: loky, Dask, Ray and Clamor",
        "quick": args.quick,
        "params": {"n": n, "dims": 256, "x_bytes": int(X.nbytes), "fits": 4, "passes": args.passes,
                   "repeat": args.repeat, "workers": WORKERS},
        "rows": rows,
    }  # fmt: skip
    peers = [s for s in runnable if s not in ("clamor", "limit")]
    result["goals"] = [goal(f"as fast as {p} or faster", ratio(result, p, CASE), 1.0) for p in peers]
    save(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
