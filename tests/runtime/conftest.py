"""Fixtures of the runtime tests."""

from __future__ import annotations

import gc

import pytest
from clamor.runtime.paging import arena as A


@pytest.fixture
def arena() -> A.Arena:
    """This process's arena, with unreachable arrays of earlier tests collected
    (so that counters measured by a test move only because of that test)."""
    gc.collect()
    return A.get_arena()
