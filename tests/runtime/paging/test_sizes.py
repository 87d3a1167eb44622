"""Every size option of the API reads the same forms: bytes, ``"256KiB"``, ``"4GiB"``, ``"512M"``."""

from __future__ import annotations

import numpy as np
import pytest
from clamor.runtime.paging.arena import to_bytes

import clamor


@pytest.mark.parametrize(
    ("size", "expected"),
    [(4096, 4096), ("256KiB", 256 << 10), ("256K", 256 << 10), ("4GiB", 4 << 30), ("512M", 512 << 20),
     (" 64 kib ", 64 << 10), ("1048576", 1 << 20)],
)
def test_a_size_in_any_form_is_bytes(size, expected):
    assert to_bytes(size, "page_size") == expected


def test_a_bad_size_names_the_option_and_the_forms():
    with pytest.raises(ValueError, match=r"page_size='huge' is not a size \(e.g. 32GiB"):
        to_bytes("huge", "page_size")
    with pytest.raises(TypeError, match="worker_memory must be a size like '4GiB'"):
        to_bytes(1.5, "worker_memory")
    with pytest.raises(ValueError, match="arena_size must be positive"):
        to_bytes(0, "arena_size")


@pytest.mark.slow
def test_a_cluster_takes_its_page_size_as_a_string():
    x = clamor.array(3 * (64 << 10) // 8, np.float64)
    x[:] = 1.0
    with pytest.raises(ValueError, match="page_size='big' is not a size"):
        clamor.Cluster(workers=1, page_size="big")  # refused before anything starts
    with clamor.Cluster(workers=1, page_size="64KiB") as cluster:
        assert cluster.page_size == 64 << 10
        assert cluster.run(lambda a: float(a.sum()), x) == float(len(x))
