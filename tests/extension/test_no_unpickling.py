"""The notebook server never unpickles what a kernel sends it: the extension asks a
kernel's Observer service and reads typed messages (runtime/observe/observed_messages.py).
Checked twice: no module on the server's path imports an unpickler, and a real query
through the extension's ClusterSource, with the REST API's bodies built from its
answers, calls none."""

from __future__ import annotations

import ast
import asyncio
import json
import marshal
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
from clamor.extension import api
from clamor.extension.clusters import ClusterSource
from clamor.runtime.cluster import Cluster
from clamor.runtime.observe import cluster_registry

REPO = Path(__file__).resolve().parents[2]
#: What the notebook server runs to read a kernel's cluster (the extension, the registry
#: it reads, the Observer's client and the messages' readers).
SERVER_PATH = [*sorted((REPO / "extension").glob("*.py")), REPO / "runtime/observe/cluster_registry.py",
               REPO / "runtime/observe/observer.py", REPO / "runtime/observe/observed_messages.py"]  # fmt: skip
#: Modules that unpickle, and names that do (a partition key's decoder unpickles a user's key).
UNPICKLING_MODULES = {"pickle", "_pickle", "cloudpickle", "marshal", "dill", "clamor.runtime.net.shipping"}
UNPICKLING_NAMES = {"loads", "load", "Unpickler", "shipping", "decode_key", "key_from_bytes"}


def imported(path: Path) -> set[str]:
    """The modules and the names ``path`` imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("path", SERVER_PATH, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_on_the_servers_path_imports_an_unpickler(path: Path) -> None:
    assert imported(path) & (UNPICKLING_MODULES | UNPICKLING_NAMES) == set()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A cluster with the arena's pager (page counters, driver stats) and a persisted dataset."""
    with Cluster(2, timeout=60) as c:
        kept = c.parallelize(np.arange(1000), 4).map(abs).persist()  # alive while the module runs
        kept.count()
        yield c


def test_queries_through_the_extension_unpickle_nothing(cluster: Cluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    server_calls: list[str] = []

    def on_the_server() -> bool:
        """This test's thread builds the REST API's bodies; ClusterSource's pool queries.
        (The kernel answers on threads of its own, in this process too.)"""
        thread = threading.current_thread()
        return thread is threading.main_thread() or thread.name.startswith("clamor-query")

    def watched(module: object, name: str) -> None:
        original = getattr(module, name)

        def call(*args: object, **kwargs: object) -> object:
            if on_the_server():
                server_calls.append(f"{module.__name__}.{name}")  # type: ignore[attr-defined]
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    cluster_registry.publish(cluster, "k-1", tmp_path)
    source = ClusterSource(lambda: [str(tmp_path)], lambda: ["k-1"], max_age=0)
    try:
        for module, name in [(pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"),
                             (cloudpickle, "loads"), (cloudpickle, "load"), (marshal, "loads")]:  # fmt: skip
            watched(module, name)

        async def ask() -> list:
            return await asyncio.gather(source.query("k-1", "snapshot"), source.query("k-1", "stats"))

        snapshot, stats = asyncio.run(ask())
        bodies = [api.summary("k-1", cluster.address, stats, snapshot), api.workers(snapshot, stats),
                  api.pages(snapshot), api.lineage(snapshot), api.tasks(snapshot)]  # fmt: skip
        json.dumps(bodies, allow_nan=False)
    finally:
        monkeypatch.undo()
        source.close()
        cluster_registry.withdraw(cluster)
    assert server_calls == []
    assert [w.id for w in snapshot.workers] == cluster.workers == [w["id"] for w in stats["workers"]]
    assert stats["tasks_run"] >= 4 and stats["write_tracking"] in ("async", "trap")
    assert snapshot.lineage.states().get("held") == 4
