"""The jupyter-server extension end to end: a real server under ``/prefix/``, a Clamor
kernel started over REST running a demand-paging stage, and the extension's REST API,
dashboard pages, BokehJS, authentication and registry files checked from outside.

The tests share one server and kernel (module scope) and run in file order: the last
one closes the cluster and shuts the kernel down.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from jupyter_remote import (
    JupyterServer,
    RemoteKernel,
    api_get,
    api_request,
    free_port,
    start_jupyter_server,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
from kernelspec_fixture import clamor_kernelspec  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

#: Extensions the test server does not need (they only slow its start).
OTHERS_OFF = {name: False for name in ("jupyterlab", "notebook", "notebook_shim", "ipyparallel",
                                       "jupyter_lsp", "jupyter_server_terminals")}  # fmt: skip
VIEWS = ("heatmap", "replication", "timeline", "lineage")

SETUP = """\
%clamor start -n 2
import numpy as np
table = np.arange(2_000_000, dtype=np.float64)      # 16 MB: the arena (arena_default)
assert clamor.in_arena(table)
ds = cluster.parallelize(list(range(8)), 8)
sums = ds.map(lambda i: float(table[i * 250_000:(i + 1) * 250_000].sum())).persist()
print(sums.count())
"""


@dataclass
class Env:
    server: JupyterServer
    kernel: RemoteKernel

    @property
    def api(self) -> str:
        return f"{self.server.url}clamor/api/clusters/{self.kernel.kernel_id}"

    def get_json(self, url: str, token: str | None = "", status: int = 200) -> dict:
        code, text = api_get(url, self.server.token if token == "" else token)
        assert code == status, f"{url}: HTTP {code}: {text[:500]}"
        return json.loads(text)

    def registry_file(self) -> Path:
        return self.server.runtime_dir / f"clamor-cluster-{self.kernel.kernel_id}.json"


@pytest.fixture(scope="module")
def env(clamor_kernelspec: str) -> Iterator[Env]:  # noqa: F811 - the imported fixture
    with (
        start_jupyter_server(base_url="/prefix/", extensions=OTHERS_OFF) as server,
        RemoteKernel(server.url, server.token, clamor_kernelspec) as kernel,
    ):
        assert kernel.execute(SETUP, timeout=180).strip().endswith("8")
        yield Env(server, kernel)


def test_clusters_lists_exactly_this_kernel(env: Env) -> None:
    rows = env.get_json(f"{env.server.url}clamor/api/clusters")["clusters"]
    assert [r["kernel_id"] for r in rows] == [env.kernel.kernel_id]
    row = rows[0]
    assert row["kernel_name"] == "clamor" and row["workers"] == 2
    assert row["dashboard_url"] == f"/prefix/clamor/dashboard/{env.kernel.kernel_id}"
    assert row["api_url"] == f"/prefix/clamor/api/clusters/{env.kernel.kernel_id}"


def test_registry_file_is_private(env: Env) -> None:
    path = env.registry_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    body = json.loads(path.read_text())
    assert body["kernel_id"] == env.kernel.kernel_id and body["credentials"]


def test_summary_workers_pages_tasks_lineage(env: Env) -> None:
    summary = env.get_json(env.api)
    assert (summary["kernel_id"], summary["workers"], summary["workers_lost"]) == (env.kernel.kernel_id, 2, 0)
    assert summary["stages_run"] >= 1 and summary["tasks_run"] >= 8
    # one host: the workers map the pages in place (zero copy) instead of being served
    assert summary["bytes_mapped"] > 0 and summary["pages_mapped"] > 0

    workers = env.get_json(f"{env.api}/workers")["workers"]
    assert [(w["id"], w["alive"]) for w in workers] == [(0, True), (1, True)]
    assert sum(w["tasks_done"] for w in workers) >= 8

    pages = env.get_json(f"{env.api}/pages")
    assert "table" in {v["name"] for v in pages["variables"]}
    table = env.get_json(f"{env.api}/pages?var=table")
    n = table["totals"]["pages"]
    assert n >= 16_000_000 // table["page_size"]
    assert len(table["pages"]["requests"]) == len(table["pages"]["page"]) == n
    assert set(table["pages"]["variable"]) == {"table"}
    assert table["totals"]["requests"] > 0 and table["totals"]["pages_touched"] > 0
    assert sum(table["pages"]["requests"]) == table["totals"]["requests"]

    tasks = env.get_json(f"{env.api}/tasks")
    [stage] = [s for s in tasks["stages"] if s["tasks"] == 8 and s["status"] == "ok"]
    attempts = [t for t in tasks["tasks"] if t["stage"] == stage["stage"]]
    assert sorted(t["index"] for t in attempts if t["status"] == "ok") == list(range(8))
    assert {t["worker"] for t in attempts} <= {0, 1}
    only = env.get_json(f"{env.api}/tasks?stage={stage['stage']}")["tasks"]
    assert {t["stage"] for t in only} == {stage["stage"]}

    lineage = env.get_json(f"{env.api}/lineage")
    assert lineage["states"] == {"held": 8}
    assert sorted(node["index"] for node in lineage["nodes"]) == list(range(8))
    assert all(node["holder"] in (0, 1) for node in lineage["nodes"])


def test_errors_are_json_404s(env: Env) -> None:
    body = env.get_json(f"{env.server.url}clamor/api/clusters/no-such-kernel", status=404)
    assert "no Clamor cluster for kernel 'no-such-kernel'" in body["message"]
    env.get_json(f"{env.server.url}clamor/api/clusters/no-such-kernel/pages", status=404)
    body = env.get_json(f"{env.api}/pages?var=nothing", status=404)
    assert "no arena variable 'nothing'" in body["message"] and "table" in body["message"]
    status, _ = api_get(f"{env.server.url}clamor/dashboard/no-such-kernel", env.server.token)
    assert status == 404


def test_dashboard_pages_embed_bokeh_served_from_this_server(env: Env) -> None:
    base = f"{env.server.url}clamor/dashboard/{env.kernel.kernel_id}"
    for url in [base] + [f"{base}/{view}" for view in VIEWS] + [f"{base}/heatmap?var=table"]:
        status, page = api_get(url, env.server.token)
        assert status == 200, f"{url}: {status}: {page[:300]}"
        assert page.startswith("<!DOCTYPE html>")
        assert '<script src="/prefix/clamor/static/bokeh/js/bokeh.min.js?v=' in page
        assert "Bokeh.embed.embed_item" in page
        doc = json.loads(re.search(r'id="clamor-doc">(.*?)</script>', page, re.DOTALL).group(1))
        assert doc["root_id"] and doc["doc"]["roots"]
        assert "/prefix/clamor/api/live/" in page
    status, index = api_get(f"{env.server.url}clamor/", env.server.token)
    assert status == 200 and f"/prefix/clamor/dashboard/{env.kernel.kernel_id}" in index

    code, js, headers = api_request(f"{env.server.url}clamor/static/bokeh/js/bokeh.min.js", env.server.token)
    assert code == 200 and "javascript" in headers.get("Content-Type", "")
    assert len(js) > 100_000 and "Bokeh" in js


def test_live_page_gets_patches_as_the_cluster_works(env: Env) -> None:
    status, page = api_get(f"{env.server.url}clamor/dashboard/{env.kernel.kernel_id}", env.server.token)
    assert status == 200
    live = env.server.url.split("/prefix/")[0] + re.search(r'"live_url": "([^"]+)"', page).group(1)
    first = env.get_json(live)
    assert first["seq"] >= 1
    env.kernel.execute("sums2 = ds.map(lambda i: float(table[i * 250_000:(i + 1) * 250_000].max())).collect()")
    deadline = time.monotonic() + 30
    patch = None
    while patch is None and time.monotonic() < deadline:
        time.sleep(0.5)
        reply = env.get_json(live)
        patch = reply["patch"]
    assert patch is not None and patch["events"], "no change reached the page"
    assert reply["seq"] > first["seq"]
    code, body = api_get(f"{env.server.url}clamor/api/live/not-a-session", env.server.token)
    assert code == 410 and "reload" in json.loads(body)["message"]


def test_authentication_and_authorization(env: Env) -> None:
    url = env.server.url
    for token in (None, "wrong-token"):
        for api in ("clamor/api/clusters", f"clamor/api/clusters/{env.kernel.kernel_id}/pages"):
            status, text = api_get(url + api, token)
            assert status == 403, (api, token, status, text[:200])
            assert env.kernel.kernel_id not in text
        for page in ("clamor/", f"clamor/dashboard/{env.kernel.kernel_id}",
                     "clamor/static/bokeh/js/bokeh.min.js"):  # fmt: skip
            status, text, headers = api_request(url + page, token)
            assert status in (302, 403), (page, token, status)
            if status == 302:
                assert headers["Location"].startswith("/prefix/login")


def test_closed_cluster_is_gone_unreachable_is_503_and_shutdown_removes_it(env: Env) -> None:
    entry = json.loads(env.registry_file().read_text())
    env.kernel.execute("cluster.close()")  # behind the session's back
    env.kernel.execute("from clamor.kernel import session\nassert session.current() is None")
    assert not env.registry_file().exists()  # withdrawn once the kernel noticed
    env.get_json(env.api, status=404)
    assert env.get_json(f"{env.server.url}clamor/api/clusters")["clusters"] == []

    # a registered cluster whose scheduler does not answer (closing, hung): 503, said so
    entry["address"] = f"127.0.0.1:{free_port()}"
    fd = os.open(env.registry_file(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    try:
        body = env.get_json(env.api, status=503)
        assert "is not available" in body["message"] and "refuses connections" in body["message"]
        assert env.get_json(f"{env.api}/pages", status=503)["message"] == body["message"]
        status, page = api_get(f"{env.server.url}clamor/dashboard/{env.kernel.kernel_id}", env.server.token)
        assert status == 503 and "refuses connections" in page
    finally:
        env.registry_file().unlink()

    env.kernel.execute("%clamor start -n 1")
    rows = env.get_json(f"{env.server.url}clamor/api/clusters")["clusters"]
    assert [(r["kernel_id"], r["workers"]) for r in rows] == [(env.kernel.kernel_id, 1)]
    assert env.get_json(f"{env.api}/workers")["workers"][0]["alive"]

    env.kernel.shutdown()
    deadline = time.monotonic() + 20
    while env.registry_file().exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not env.registry_file().exists()
    assert env.get_json(f"{env.server.url}clamor/api/clusters")["clusters"] == []
    env.get_json(env.api, status=404)
