"""Shared test set-up."""

from __future__ import annotations

import cloudpickle
import pytest


@pytest.fixture(autouse=True)
def _ship_test_functions_by_value(request: pytest.FixtureRequest) -> None:
    """Workers cannot import test modules: ship their functions by value, like notebook code."""
    module = request.module
    if module.__name__ not in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.register_pickle_by_value(module)
