"""How many workers the notebook's default cluster starts, and the multi-host settings."""

from __future__ import annotations

import pytest
from clamor.kernel import session


@pytest.fixture(autouse=True)
def _fresh_config():
    session.reset_config()
    yield
    session.reset_config()


def test_a_deployment_sets_the_default_worker_count(monkeypatch):
    monkeypatch.setenv("CLAMOR_WORKERS", "3")
    assert session.default_workers() == 3
    session.set_config("workers", 5)  # the notebook's own setting wins
    assert session.default_workers() == 5


def test_without_settings_it_is_one_worker_per_usable_core(monkeypatch):
    monkeypatch.delenv("CLAMOR_WORKERS", raising=False)
    assert session.default_workers() == session.usable_cores() >= 1
    monkeypatch.setenv("CLAMOR_WORKERS", "none")
    assert session.default_workers() == session.usable_cores()


def test_a_bad_worker_count_names_the_variable(monkeypatch):
    monkeypatch.setenv("CLAMOR_WORKERS", "lots")
    with pytest.raises(ValueError, match="CLAMOR_WORKERS='lots'"):
        session.default_workers()


def test_tls_and_host_are_cluster_settings():
    assert session.set_config("tls", "on") is True
    assert session.set_config("host", "198.51.100.1") == "198.51.100.1"
    assert session.OPTIONS["tls"].cluster and session.OPTIONS["host"].cluster
