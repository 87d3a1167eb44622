"""The JupyterLab extension in a real JupyterLab (headless Chromium) under a JupyterHub-like
base_url (``/user/alice/``): a notebook on the Clamor kernel starts a 2-worker cluster and
runs a long stage; the Clamor sidebar lists the kernel's cluster with its workers and the
stage while it runs; its Dashboard button opens the live dashboard as a main-area tab whose
iframe loads from ``{base_url}clamor/dashboard/{kernel_id}`` and keeps updating. Every
request the extension makes stays under the base_url.

Screenshots go to ``$CLAMOR_ARTIFACTS/browser`` (default ``tests/artifacts/browser``):
``labextension-panel.png`` and ``labextension-tab.png`` (copies are in docs/images/).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "widgets"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
from browser import (  # noqa: E402
    artifacts_dir,
    cell_errors,
    chromium,
    jupyterlab,
    new_page,
    open_notebook,
    run_all,
    server_log,
    wait_until_run,
)
from kernelspec_fixture import clamor_kernelspec  # noqa: E402, F401 - a fixture

pytestmark = pytest.mark.slow
BASE_URL = "/user/alice/"
NOTEBOOK = "sidebar.ipynb"
#: 2 workers of 128 MiB each (so that what they keep shows against their budget), a table
#: in the arena and 8 persisted partitions of 4 MB.
SETUP = """\
%clamor config worker_memory=128MiB
%clamor start -n 2
import numpy as np, os, time
STOP = {stop!r}
table = np.arange(4_000_000, dtype=np.float64)
kept = cluster.parallelize(list(range(8)), 8).map(lambda i: table[i * 500_000:(i + 1) * 500_000] * 2).persist()
assert kept.count() == 8"""
#: Until the test creates STOP, each task sleeps 0.25 s (the stage would take over 4 minutes
#: on 2 workers, however slow the machine is at the checks) and reads a slice of the table;
#: then the rest finish at once.
TASKS = 2000
STAGE = f"""\
def slow(i):
    if not os.path.exists(STOP):
        time.sleep(0.25)
    return float(table[(i % 40) * 100_000:(i % 40 + 1) * 100_000].sum())

total = sum(cluster.parallelize(list(range({TASKS})), {TASKS}).map(slow).collect())
assert total == {TASKS // 40} * table.sum(), total"""

CARD = ".clamor-Panel .clamor-Cluster[data-kernel-id='{kid}']"
DOCK_TAB = ".lm-DockPanel-tabBar .lm-TabBar-tab"


def notebook(path: Path, stop: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "clamor", "display_name": "Clamor (Python 3)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(stop=str(stop))), nbformat.v4.new_code_cell(STAGE)]
    nbformat.write(nb, path)


def card_state(page: Any, kid: str) -> dict[str, Any] | None:
    """What the sidebar shows for the cluster of kernel ``kid`` (None: not listed)."""
    return page.evaluate(
        """(selector) => {
          const card = document.querySelector(selector);
          if (!card) return null;
          const text = (cls) => (card.querySelector(cls) || {}).textContent || '';
          return {title: text('.clamor-Cluster-title'), stage: text('.clamor-Cluster-stage'),
                  served: text('.clamor-Cluster-served'), error: text('.clamor-Cluster-error'),
                  running: card.classList.contains('clamor-mod-running'),
                  workers: [...card.querySelectorAll('.clamor-Worker')].map((w) => w.textContent),
                  buttons: [...card.querySelectorAll('.clamor-ViewButton')].map((b) => b.dataset.view)};
        }""",
        CARD.format(kid=kid),
    )


def done(state: dict[str, Any]) -> int:
    """How many of the stage's tasks the sidebar says are done (-1: no such stage shown)."""
    found = re.search(rf"stage \d+: (\d+)/{TASKS} tasks done", state["stage"])
    return int(found.group(1)) if found else -1


def wait_for_card(page: Any, kid: str, test: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = card_state(page, kid)
        if state is not None and test(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"the sidebar never showed {what}; last: {state}")


@pytest.mark.timeout(300)
def test_sidebar_lists_the_cluster_and_opens_its_views_as_tabs(
    clamor_kernelspec: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    root, stop = tmp_path / "root", tmp_path / "stop"
    root.mkdir()
    notebook(root / NOTEBOOK, stop)
    out = artifacts_dir()
    with jupyterlab(root, kernel=clamor_kernelspec, base_url=BASE_URL) as lab, chromium() as browser:
        assert lab.url.endswith(BASE_URL)
        page = new_page(browser)
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if "clamor" in r.url else None)
        try:
            open_notebook(page, lab, NOTEBOOK)
            kid = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session"
                                ".kernel.id")  # fmt: skip
            run_all(page)
            # the sidebar's tab (JupyterLab's left tab bar), as a user clicks it
            page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id='clamor-sidebar']").click()
            page.wait_for_selector(".clamor-Panel", state="visible", timeout=10_000)

            running = wait_for_card(
                page, kid, lambda s: s["running"] and len(s["workers"]) == 2 and done(s) >= 10,
                timeout=150, what="the cluster's 2 workers running the stage",
            )  # fmt: skip
            assert running["title"] == NOTEBOOK, running  # the notebook's name, from its session
            assert running["stage"].startswith("2 workers · stage "), running
            assert all(w.startswith(f"worker {i}") for i, w in enumerate(running["workers"])), running
            assert all(" / 128.0 MiB" in w and "RSS" in w for w in running["workers"]), running  # vs budget
            assert "pages served:" in running["served"] and not running["error"], running
            assert running["buttons"] == ["dashboard", "heatmap", "replication", "timeline", "lineage"]
            page.screenshot(path=out / "labextension-panel.png")

            page.locator(f"{CARD.format(kid=kid)} .clamor-ViewButton[data-view='dashboard']").click()
            tab = page.locator(f".clamor-View[data-kernel-id='{kid}'][data-view='dashboard']")
            tab.wait_for(state="visible", timeout=10_000)
            current = page.locator(f"{DOCK_TAB}.lm-mod-current").inner_text()
            assert current.startswith(f"Clamor Dashboard · {NOTEBOOK}"), current
            src = tab.locator("iframe").get_attribute("src")
            assert src == f"{lab.url}clamor/dashboard/{kid}", src
            frame = page.frame_locator(f".clamor-View[data-kernel-id='{kid}'] iframe")
            frame.locator("#clamor-state").wait_for(timeout=60_000)
            dashboard = next(f for f in page.frames if f.url == src)
            dashboard.wait_for_function("window.clamorDocument !== undefined", timeout=60_000)
            # it keeps updating while the stage runs: patches applied, status live
            dashboard.wait_for_function("window.clamorUpdates >= 3", timeout=60_000)
            assert dashboard.locator("#clamor-state").inner_text().startswith("live"), server_log(lab)
            # the panel follows the stage too
            wait_for_card(page, kid, lambda s: s["running"] and done(s) > done(running), 30, "progress")
            page.screenshot(path=out / "labextension-tab.png")

            # the same button again activates the open tab instead of opening another
            page.locator(f"{CARD.format(kid=kid)} .clamor-ViewButton[data-view='dashboard']").click()
            assert page.locator(".clamor-View").count() == 1

            stop.touch()
            page.locator(f"{DOCK_TAB}[data-type='document-title']", has_text=NOTEBOOK).click()
            wait_until_run(page, timeout=120)
            idle = wait_for_card(page, kid, lambda s: not s["running"] and "idle" in s["stage"], 30, "idle")
            ran = re.search(r"(\d+) tasks run", idle["stage"])
            assert ran and int(ran.group(1)) >= TASKS, idle
            assert not cell_errors(page)
        except Exception:
            page.screenshot(path=out / "labextension-failed.png")
            print(server_log(lab), *page.errors, sep="\n")
            raise
        finally:
            stop.touch()
        # every request the panel and the tab made went under the base_url
        assert any("/clamor/api/clusters" in url for url in requests), requests
        assert all(url.startswith(lab.url) for url in requests if "/clamor/" in url), requests
        assert not [e for e in page.errors if "clamor" in e.lower()], page.errors
        page.close()
