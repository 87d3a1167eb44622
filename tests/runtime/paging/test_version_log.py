"""The version log keeps old page versions exactly as long as lineage needs them."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import clamor


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=2) as c:
        yield c


def test_the_version_log_shrinks_back_once_the_dataset_that_needed_it_is_released(cluster):
    ps = cluster.page_size
    table = clamor.asarray(np.arange(64 * ps // 8, dtype=np.float64))
    keys = cluster.parallelize(np.arange(0, len(table), 97), partitions=4)
    looked_up = keys.map_partitions(lambda ks: table[ks]).persist()
    looked_up.count()  # computed (and kept) at this epoch: recovery may replay it

    table[:] = -1.0  # every page gets a new version; the old ones go to the log
    assert keys.map_partitions(lambda ks: table[ks]).sum() == -len(np.arange(0, len(table), 97))
    kept = cluster.stats()["version_log_bytes"]
    assert kept >= 64 * ps  # still needed to recompute `looked_up` exactly

    looked_up.unpersist()
    del looked_up
    gc.collect()
    keys.count()  # the next stage frees what no lineage needs any more
    assert cluster.stats()["version_log_bytes"] == 0
