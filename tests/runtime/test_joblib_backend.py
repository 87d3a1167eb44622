"""The "clamor" joblib backend: scikit-learn's n_jobs on the cluster.

Same results as joblib's own loky backend; a large numpy argument reaches the tasks as
the arena's (one copy, mapped by the workers), not pickled into every batch.
"""

from __future__ import annotations

import os
import time

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import clamor


def by_reference(a: np.ndarray) -> bool:
    """On a worker: whether ``a`` came as a reference to the arena (a read-only view of
    the pages the worker maps), not pickled by value (an array of its own)."""
    return a.base is not None and not a.flags.writeable and os.getpid() != DRIVER_PID


DRIVER_PID = os.getpid()


def fails(i: int) -> int:
    if i == 3:
        raise KeyError("three")
    return i


def fails_or_spins(i: int) -> int:
    """Call 0 fails at once; the others would run a minute (in Python: interruptible)."""
    if i == 0:
        raise KeyError("zero")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return i


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=2) as c:
        yield c


def test_grid_search_finds_what_loky_finds(cluster):
    X, y = make_classification(n_samples=600, n_features=20, random_state=0)
    grid = {"C": [0.1, 1, 10], "gamma": ["scale", 0.05]}
    with joblib.parallel_config(backend="loky"):
        reference = GridSearchCV(SVC(), grid, cv=3, n_jobs=2).fit(X, y)
    before = cluster.stats()["tasks_run"]
    with joblib.parallel_config(backend="clamor"):
        search = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(X, y)
    assert search.best_params_ == reference.best_params_
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], reference.cv_results_["mean_test_score"])
    assert cluster.stats()["tasks_run"] > before  # it did run on the cluster


def test_a_large_argument_reaches_the_tasks_in_the_arena(cluster):
    big, small = np.ones(300_000), np.ones(10)  # 2.4 MB and 80 bytes
    with joblib.parallel_config(backend="clamor", cluster=cluster):
        shared = joblib.Parallel(n_jobs=-1)(joblib.delayed(by_reference)(big) for _ in range(6))
        copied = joblib.Parallel(n_jobs=-1)(joblib.delayed(by_reference)(small) for _ in range(2))
    assert shared == [True] * 6 and copied == [False] * 2
    assert not clamor.in_arena(big)  # the caller's array is left as it was


def test_an_error_in_a_call_is_raised_by_parallel(cluster):
    with joblib.parallel_config(backend="clamor"), pytest.raises(KeyError, match="three"):
        joblib.Parallel(n_jobs=2)(joblib.delayed(fails)(i) for i in range(6))
    with joblib.parallel_config(backend="clamor"):
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(abs)(-i) for i in range(4)) == [0, 1, 2, 3]


def test_a_failed_call_stops_the_others_so_the_cluster_is_free_at_once(cluster):
    with joblib.parallel_config(backend="clamor"), pytest.raises(KeyError, match="zero"):
        joblib.Parallel(n_jobs=2, batch_size=1)(joblib.delayed(fails_or_spins)(i) for i in range(4))
    # the spinning calls were cancelled and interrupted: the next call runs now, not in a minute
    assert cluster.submit(lambda: "free").result(timeout=15) == "free"
