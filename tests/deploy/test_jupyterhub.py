"""A real JupyterHub serves the Clamor kernel to two users (deploy/jupyterhub/).

JupyterHub runs deploy/jupyterhub/jupyterhub_config.py on 127.0.0.1 (hub_process.py:
free ports, state in a temporary folder, users alice and bob, every server run as the
current user with its own home). Each user's server is started through the Hub REST
API; each user, with their own API token, runs a demo notebook on the Clamor kernel
through the proxy (``/user/NAME/``), and the notebook's results are checked. Then the
clamor extension behind the Hub: alice's cluster list and dashboard answer alice's
token and refuse bob's. The servers are stopped through the API, then the Hub, and
nothing it started may survive.

The second test is the shared-pool mode: the Hub runs a Dask pool itself
(``CLAMOR_HUB_POOL_WORKERS``), both users' kernels borrow Clamor workers from it with
``DaskLauncher(Client())``, and their worker processes are disjoint children of the
pool's Dask workers.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import psutil
import pytest
from clamor.kernel import cli
from clamor.testing.requirements import require_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: jupyter_remote
from hub_process import REPO, free_ports, start_hub
from jupyter_remote import RemoteKernel, api_get

NOTEBOOKS = REPO / "notebooks"
USERS = ["alice", "bob"]

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _proxy_installed() -> None:
    """JupyterHub needs its proxy, configurable-http-proxy, from npm."""
    require_program("configurable-http-proxy")


@pytest.fixture
def kernelspec_path(tmp_path: Path) -> str:
    """A JUPYTER_PATH entry with a "clamor" kernelspec running this interpreter.

    Installed into a temporary prefix rather than relying on the machine's: the
    servers run with their own HOME, so a ``--user`` kernelspec would be invisible
    to them (the Hub passes JUPYTER_PATH on to the servers, see the config's env_keep).
    """
    prefix = tmp_path / "prefix"
    cli.install(cli.DEFAULT_NAME, prefix=str(prefix))
    return str(prefix / "share" / "jupyter")


def _accuracy(outputs: list[str]) -> float:
    match = re.search(r"training accuracy ([\d.]+)%", outputs[-1])
    assert match, f"no accuracy in the notebook's last output: {outputs[-1]!r}"
    return float(match.group(1))


@pytest.mark.timeout(300)
def test_two_users_run_notebooks_on_the_clamor_kernel_behind_the_hub(
    tmp_path: Path, kernelspec_path: str
) -> None:
    with start_hub(tmp_path, USERS, env={"JUPYTER_PATH": kernelspec_path}) as hub:
        for name in USERS:
            server = hub.start_server(name)
            assert server["url"] == f"/user/{name}/"
        tokens = {name: hub.new_token(name) for name in USERS}

        # each server offers the Clamor kernel, and only to its own user
        for name in USERS:
            status, text = api_get(hub.user_url(name) + "api/kernelspecs", tokens[name])
            assert status == 200, text
            assert "clamor" in json.loads(text)["kernelspecs"], text
        assert api_get(hub.user_url("alice") + "api/kernelspecs", tokens["bob"])[0] == 403

        with (
            RemoteKernel(hub.user_url("alice"), tokens["alice"], kernel_name="clamor") as alice,
            RemoteKernel(hub.user_url("bob"), tokens["bob"], kernel_name="clamor") as bob,
        ):
            # the kernels run inside their users' servers, each with its own home
            for name, kernel in (("alice", alice), ("bob", bob)):
                where = kernel.execute(
                    "import os; print(os.environ['JUPYTERHUB_USER'], os.path.expanduser('~'))"
                ).split()
                assert where == [name, str(tmp_path / "home" / name)]

            # alice trains the parameter-server model; bob runs k-means; both on two
            # workers of their own (the notebooks assert their own results too)
            out = alice.run_notebook(NOTEBOOKS / "logistic_regression.ipynb", timeout=150)
            assert _accuracy(out) > 95.0
            out = bob.run_notebook(NOTEBOOKS / "kmeans.ipynb", timeout=150)
            assert "iteration 9: inertia" in "".join(out)
            hub.note_processes()  # kernels and workers too: none may outlive the Hub
            for kernel in (alice, bob):
                summary = kernel.execute(
                    "s = cluster.stats(); print(s['stages_run'], len(s['workers']))"
                ).split()
                stages, workers = map(int, summary)
                assert stages >= 5 and workers >= 1

            # the extension behind the Hub: alice's clusters are alice's alone
            clusters = hub.user_url("alice") + "clamor/api/clusters"
            status, text = api_get(clusters, tokens["alice"])
            assert status == 200, text
            assert alice.kernel_id in text and bob.kernel_id not in text
            status, text = api_get(f"{clusters}/{alice.kernel_id}/workers", tokens["alice"])
            assert status == 200, text
            assert api_get(clusters, tokens["bob"])[0] == 403
            assert api_get(f"{clusters}/{alice.kernel_id}/workers", tokens["bob"])[0] == 403
            assert api_get(clusters)[0] == 403  # no token at all
            status, text = api_get(hub.user_url("bob") + "clamor/api/clusters", tokens["bob"])
            assert status == 200 and bob.kernel_id in text and alice.kernel_id not in text

            dashboard = hub.user_url("alice") + f"clamor/dashboard/{alice.kernel_id}"
            assert api_get(dashboard, tokens["bob"])[0] == 403
            status, text = api_get(dashboard, tokens["alice"])
            assert status == 200, text[:2000]
            assert "<html" in text.lower()

        for name in USERS:
            hub.stop_server(name)
            assert hub.server(name) is None
    assert hub.proc.returncode is not None
    assert hub.leftovers == [], "processes the Hub left behind"


POOL_CELL = """
import os
import numpy as np
from dask.distributed import Client
from clamor.kernel import session
from clamor.runtime.launchers.dask import DaskLauncher

client = Client(timeout=60)  # DASK_SCHEDULER_ADDRESS, set for every server by the Hub
client.wait_for_workers(2, timeout=60)
session.start(2, launcher=DaskLauncher(client), timeout=90)  # `cluster` is this one now
x = clamor.asarray(np.arange(2_000_000, dtype=np.float64))  # 16 MiB in the arena
total = cluster.parallelize(x, partitions=4).map_partitions(lambda p: [float(p.sum())]).sum()
assert total == float(x.sum()), (total, float(x.sum()))
print(os.environ["DASK_SCHEDULER_ADDRESS"], *sorted(w["pid"] for w in cluster.stats()["workers"]))
"""


def _ancestors(pid: int) -> list[str]:
    """The command lines of ``pid``'s ancestors, nearest first."""
    return [" ".join(p.cmdline()) for p in psutil.Process(pid).parents()]


@pytest.mark.timeout(300)
def test_users_borrow_their_own_workers_from_the_shared_pool(
    tmp_path: Path, kernelspec_path: str
) -> None:
    pool = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    env = {
        "JUPYTER_PATH": kernelspec_path,
        "CLAMOR_HUB_POOL_WORKERS": "2",  # the Hub runs the pool: 2 Dask worker processes
        "CLAMOR_HUB_POOL_PORT": pool.rsplit(":", 1)[1],
    }
    with start_hub(tmp_path, USERS, env=env) as hub:
        for name in USERS:
            hub.start_server(name)
        tokens = {name: hub.new_token(name) for name in USERS}
        with (
            RemoteKernel(hub.user_url("alice"), tokens["alice"], kernel_name="clamor") as alice,
            RemoteKernel(hub.user_url("bob"), tokens["bob"], kernel_name="clamor") as bob,
        ):
            pids = {}
            for name, kernel in (("alice", alice), ("bob", bob)):
                address, *worker_pids = kernel.execute(POOL_CELL, timeout=150).split()
                assert address == pool
                pids[name] = {int(p) for p in worker_pids}
                assert len(pids[name]) == 2
                hub.note_processes()  # the pool's workers and kernels' workers too
            # never the same worker process for two users: each cluster starts its own,
            # inside the pool's Dask workers (not under the user's kernel)
            assert not pids["alice"] & pids["bob"]
            for pid in pids["alice"] | pids["bob"]:
                assert any("dask_worker" in c for c in _ancestors(pid)), _ancestors(pid)
            status, text = api_get(
                f"{hub.user_url('alice')}clamor/api/clusters/{alice.kernel_id}/workers",
                tokens["alice"],
            )
            assert status == 200, text
            listed = {w["pid"] for w in json.loads(text)["workers"] if w.get("alive", True)}
            assert listed == pids["alice"]
            assert api_get(
                f"{hub.user_url('alice')}clamor/api/clusters/{alice.kernel_id}/workers",
                tokens["bob"],
            )[0] == 403
        for name in USERS:
            hub.stop_server(name)
    assert hub.leftovers == [], "processes the Hub left behind"
