"""The cluster registry (runtime/observe/cluster_registry.py; the kernel's side in
kernel/registration.py): the private files through which a notebook server finds
its kernels' clusters (written 0600, read back, refused when unsafe, withdrawn)."""

from __future__ import annotations

import gc
import json
import os
import stat
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from clamor.kernel import registration
from clamor.runtime.cluster import Cluster
from clamor.runtime.observe import cluster_registry as registry
from clamor.runtime.observe import observer
from clamor.runtime.paging.paging_api import NullDriverPaging


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(1, paging=NullDriverPaging(), timeout=30) as c:
        yield c


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "runtime"  # not there yet: publish creates it, 0700


def test_publish_writes_a_private_entry_that_reads_back(cluster: Cluster, folder: Path) -> None:
    path = registry.publish(cluster, "k-1", folder)
    try:
        assert path == folder / "clamor-cluster-k-1.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        body = json.loads(path.read_text())
        assert (body["kernel_id"], body["pid"], body["address"]) == ("k-1", os.getpid(), cluster.address)
        [entry] = registry.read_entries([folder]).values()
        assert entry.kernel_id == "k-1" and entry.alive and entry.workers == 1
        assert entry.credentials == cluster._credentials
        # what the server does with it: ask the cluster, token-authenticated
        assert observer.query(entry.address, entry.credentials, "stats")["workers"][0]["alive"]
    finally:
        registry.withdraw(cluster)
    assert not path.exists()
    assert registry.read_entries([folder]) == {}


def test_the_entry_follows_a_scale_of_the_cluster(folder: Path) -> None:
    with Cluster(1, paging=NullDriverPaging(), timeout=30) as cluster:
        registry.publish(cluster, "k-6", folder)
        try:
            cluster.scale(2)
            [entry] = registry.read_entries([folder]).values()
            assert entry.workers == 2
            cluster.scale(1)
            [entry] = registry.read_entries([folder]).values()
            assert entry.workers == 1
        finally:
            registry.withdraw(cluster)


def test_unsafe_or_stale_entries_are_not_trusted(cluster: Cluster, folder: Path) -> None:
    path = registry.publish(cluster, "k-2", folder)
    try:
        path.chmod(0o640)  # readable by the group: refused, left alone
        assert registry.read_entries([folder]) == {}
        assert path.exists()
        path.chmod(0o600)
        assert list(registry.read_entries([folder])) == ["k-2"]
        # an entry whose kernel process is gone (SIGKILLed kernel): ignored and removed
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        stale = folder / "clamor-cluster-k-3.json"
        body = json.loads(path.read_text()) | {"kernel_id": "k-3", "pid": int(dead.stdout)}
        fd = os.open(stale, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        (folder / "clamor-cluster-bad.json").write_text("{not json")
        (folder / "clamor-cluster-bad.json").chmod(0o600)
        assert list(registry.read_entries([folder])) == ["k-2"]
        assert not stale.exists()
    finally:
        registry.withdraw(cluster)


def test_a_new_cluster_replaces_the_entry_and_the_old_one_cannot_remove_it(folder: Path) -> None:
    first = Cluster(1, paging=NullDriverPaging(), timeout=30)
    second = Cluster(1, paging=NullDriverPaging(), timeout=30)
    refs = [weakref.ref(first), weakref.ref(second)]
    try:
        registry.publish(first, "k-4", folder)
        registry.publish(second, "k-4", folder)
        first.close()
        del first
        gc.collect()  # the first cluster's finalizer must not remove the second's entry
        assert refs[0]() is None
        [entry] = registry.read_entries([folder]).values()
        assert entry.address == second.address
        registry.withdraw(second)
        assert registry.read_entries([folder]) == {}
        # and a collected cluster's entry goes with it
        registry.publish(second, "k-5", folder)
        second.close()
        del second
        gc.collect()
        assert refs[1]() is None
        assert registry.read_entries([folder]) == {}
    finally:
        for ref in refs:
            if (c := ref()) is not None:
                c.close()


def test_refresh_follows_the_notebook_namespace(folder: Path) -> None:
    mine = Cluster(1, paging=NullDriverPaging(), timeout=30)
    try:
        namespace = {"x": 1, "c": mine}
        registration.refresh(namespace, "k-6", folder)  # a cluster the user's cell made
        assert [e.address for e in registry.read_entries([folder]).values()] == [mine.address]
        registration.refresh(namespace, "k-6", folder)  # idempotent
        assert len(registry.read_entries([folder])) == 1
        mine.close()  # closed behind the session's back: withdrawn after the cell
        registration.refresh(namespace, "k-6", folder)
        assert registry.read_entries([folder]) == {}
    finally:
        mine.close()
        registry.withdraw(mine)


def test_outside_a_jupyter_kernel_nothing_is_written(cluster: Cluster) -> None:
    assert registration.kernel_id() is None
    assert registration.publish(cluster) is None
