"""What the live dashboard costs a running stage (issue 6: less than 5 % slower).

A real Clamor kernel (jupyter_client) runs the same demand-paging stage (k-d tree
10-NN queries over a tree in the arena, 32 tasks on 2 workers) again and again,
alternately with the dashboard displayed and live, and with no view open. This
process is the front end: it receives every widget message the kernel sends (as
JupyterLab would) and counts them, so the kernel pays for building snapshots,
updating the Bokeh models and sending the changes. The stage time is measured in the
kernel around ``collect()``. Runs alternate on/off in pairs, order flipped each pair,
so drift hits both sides alike; the report gives medians, spreads and the ratio.

    python bench/run.py dashboard            # 9 pairs, ~2 min on 2 cores
    python bench/run.py dashboard --quick    # 3 pairs

Writes bench/results/dashboard.md and dashboard.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import jupyter_client
from harness import progress
from harness.machine import machine, package_versions, provenance
from harness.results import RESULTS, commit_of

SETUP = """
import json, time
import numpy as np
import clamor.widgets
from clamor.demo import geodata
from sklearn.neighbors import KDTree

points = geodata.scaled_points({points}, seed=1)
tree = KDTree(points, leaf_size=40)
rng = np.random.default_rng(3)
queries = points[rng.integers(0, len(points), {queries})] + rng.normal(scale=0.01, size=({queries}, 2))
qs = cluster.parallelize(queries, partitions={tasks})
expected = tree.query(queries[:500], k=10)[1]
view = None

def stage(live):
    global view
    if live and view is None:
        view = clamor.widgets.dashboard(cluster)
        display(view)
        time.sleep(1.0)  # the first snapshot is drawn and sent before timing starts
    if not live and view is not None:
        view.close()
        view = None
    pub = cluster.publisher
    published, built = pub.published, pub.build_seconds
    before = cluster.counters()
    t0, cpu0 = time.perf_counter(), time.process_time()
    out = qs.map_partitions(lambda q: tree.query(q, k=10)[1]).collect()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert np.array_equal(out[:500], expected)
    print(json.dumps({{"live": live, "seconds": seconds, "kernel_cpu": cpu,
                      "snapshots": pub.published - published,
                      "snapshot_seconds": pub.build_seconds - built,
                      **{{k: v - before[k] for k, v in cluster.counters().items()}}}}))
"""


def execute(kc: Any, code: str, timeout: float = 600) -> tuple[list[str], dict[str, int]]:
    """Run ``code``; its stdout lines and the widget messages received meanwhile."""
    msg_id = kc.execute(code)
    lines: list[str] = []
    comm = {"messages": 0, "bytes": 0}
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        kind, content = msg["msg_type"], msg["content"]
        if kind == "comm_msg":
            comm["messages"] += 1
            comm["bytes"] += len(json.dumps(content)) + sum(len(b) for b in msg.get("buffers", []))
        elif kind == "stream" and content["name"] == "stdout":
            lines += content["text"].splitlines()
        elif kind == "error":
            raise RuntimeError("\n".join(content["traceback"]))
        elif (kind == "status" and content["execution_state"] == "idle"
              and msg["parent_header"].get("msg_id") == msg_id):  # fmt: skip
            return lines, comm


def run(pairs: int, points: int, queries: int, tasks: int) -> dict:
    km = jupyter_client.KernelManager(kernel_name="clamor")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        progress("building the tree in the kernel ...")
        execute(kc, SETUP.format(points=points, queries=queries, tasks=tasks))
        execute(kc, "stage(False)")  # warm-up: workers start, pages come in
        runs = []
        for pair in range(pairs):
            for live in ((False, True) if pair % 2 == 0 else (True, False)):
                cpu0 = time.process_time()
                lines, comm = execute(kc, f"stage({live})")
                result = json.loads(next(line for line in lines if line.startswith("{")))
                result.update(comm_messages=comm["messages"], comm_bytes=comm["bytes"],
                              client_cpu=time.process_time() - cpu0)
                runs.append(result)
                progress(f"pair {pair + 1}/{pairs} {'live' if live else 'off '}: "
                         f"{result['seconds']:.3f} s, {result['snapshots']} snapshots, "
                         f"kernel cpu {result['kernel_cpu']:.3f} s, client cpu "
                         f"{result['client_cpu']:.3f} s, "
                         f"{comm['messages']} widget messages")  # fmt: skip
        return {"runs": runs}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(data: dict, params: dict) -> str:
    """The Markdown report: medians, spreads, the paired ratio and what the views cost."""
    runs = data["runs"]
    off = [r for r in runs if not r["live"]]
    on = [r for r in runs if r["live"]]
    ratio = _median(on, "seconds") / _median(off, "seconds")
    pairs = [b["seconds"] / a["seconds"] for a, b in zip(off, on, strict=True)]
    verdict = "met" if ratio < 1.05 else "MISSED"
    commit, dirty = commit_of(data)
    m = data["machine"]
    snapshots = _median(on, "snapshots")
    rows = [
        f"| {name} | {_median(rs, 'seconds'):.3f} | {min(r['seconds'] for r in rs):.3f} | "
        f"{max(r['seconds'] for r in rs):.3f} | {_median(rs, 'kernel_cpu'):.3f} | "
        f"{_median(rs, 'tasks_replaced'):.0f} |"
        for name, rs in (("closed", off), ("open, live", on))
    ]
    build_ms = 1000 * _median(on, "snapshot_seconds") / max(1.0, snapshots)
    return "\n".join([
        "# Dashboard overhead",
        "",
        (f"{data.get('date', '?')}, commit {commit}" + (" with uncommitted changes" if dirty else "")
         + f", {m['nproc']} cores ({m['cpu']}). Command: `{data.get('command', 'not recorded')}`."),
        "",
        (f"Stage: {params['queries']:,} k-d tree 10-NN queries over {params['points']:,} "
        f"points in the arena, {params['tasks']} tasks on 2 workers; {params['pairs']} "
        "on/off pairs, alternating order. The kernel runs under jupyter_client; this "
        "process is the front end and receives every widget message."),
        "",
        "| dashboard | median s | min s | max s | kernel CPU s | tasks replaced |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        (f"**open / closed = {ratio:.3f}** (median of the pairs' ratios "
        f"{statistics.median(pairs):.3f}; goal < 1.05: {verdict})."),
        "",
        (f"While live, per stage: {snapshots:.0f} snapshots ({build_ms:.1f} ms each to "
        f"build), {_median(on, 'comm_messages'):.0f} widget messages, "
        f"{_median(on, 'comm_bytes') / 1024:.0f} KiB sent to the front end. \"tasks "
        "replaced\" counts straggler queue take-backs (speculation), which the 2-core "
        "machine's noise triggers with or without the dashboard."),
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 pairs instead of 9")
    args = parser.parse_args()
    params = {"pairs": 3 if args.quick else 9, "points": 1_000_000, "queries": 300_000, "tasks": 32}
    data = run(params["pairs"], params["points"], params["queries"], params["tasks"])
    data.update(provenance(), date=time.strftime("%Y-%m-%dT%H:%M:%S"), params=params,
                machine=machine(packages=package_versions(["bokeh", "jupyter_bokeh", "ipywidgets"])))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dashboard.json").write_text(json.dumps(data, indent=1))
    text = report(data, params)
    (RESULTS / "dashboard.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
