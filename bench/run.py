#!/usr/bin/env python3
"""Run the benchmarks: every workload in turn and the report, or one workload.

    python bench/run.py [--quick] [--only lookups,kmeans] [--timeout SECONDS] [--network [RATE]]
    python bench/run.py NAME [ARGS]      # one workload, bench/workloads/NAME.py, with its own ARGS

bench/ is laid out as ``workloads/`` (one script per measured job, and the parts some
scripts import, such as ``dense_peers.py``), ``peers.py`` (the sessions of Clamor and
the peers it is compared with), ``limits.py`` (the limits' sessions), ``programs.py``
(the broadcast-table workloads' child names), ``harness/`` (child processes, options,
result rows, the printed table, memory and load, the machine, simulated networks) and
``report/``; this file is the one entry point, so that every workload runs with
``bench/`` on its import path.

Each workload script (``bench/workloads/<name>.py``) runs as a subprocess (with ``--quick`` when
given), one after the other so that they never share the machine; a script that is
missing, fails or overruns its time limit is recorded and the run goes on. Finally
``bench/report/summary.py`` writes ``bench/results/REPORT.md``
(``python bench/run.py report`` writes it alone). A summary of every workload's
status and duration goes to ``bench/results/run.log.json`` and stderr; the exit status
is 1 if any workload failed.

``--network [RATE]`` then also runs the network variants (``lookups``, ``streaming``,
``replication``, ``kdtree``, ``logreg`` with ``--network RATE``: workers on simulated hosts behind links of RATE,
default 1gbit, see ``network.py``), logged as ``<name>-network`` with twice the time
limit. Where network namespaces cannot be built (not root, no ``ip``/``tc``), they are
logged as ``skipped`` with the reason, which does not fail the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import network

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
WORKLOADS = ("lookups", "streaming", "dense", "kdtree", "replication", "spill", "logreg", "kmeans", "overhead",
             "same_host")
#: Every script in workloads/, also those the full run leaves to their own make targets: the
#: modules that run as ``__main__`` (not the parts of a workload its script imports).
ALL_WORKLOADS = tuple(sorted(p.stem for p in (BENCH / "workloads").glob("*.py")
                             if 'if __name__ == "__main__":' in p.read_text()))  # fmt: skip
#: The workloads with a network mode (``--network``), run after all the loopback ones.
NETWORK_WORKLOADS = ("lookups", "streaming", "replication", "kdtree", "logreg")


def run_one(name: str, quick: bool, timeout: float, network: str | None = None) -> dict:
    """Run ``bench/<name>.py`` to completion (or its time limit); what happened. With
    ``network`` (a rate): its network mode, logged as ``<name>-network``."""
    script = BENCH / "workloads" / f"{name}.py"
    if network is not None:
        name = f"{name}-network"
    if not script.exists():
        return {"workload": name, "status": "missing", "detail": f"{script.name} not found"}
    cmd = [sys.executable, str(BENCH / "run.py"), script.stem] + (["--quick"] if quick else [])
    cmd += [f"--network={network}"] if network is not None else []
    print(f"== {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
        status = "ok" if code == 0 else "failed"
        detail = "" if code == 0 else f"exit status {code}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the script and its children
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        status, detail = "failed", f"timed out after {timeout:.0f} s (stopped)"
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    return {"workload": name, "status": status, "detail": detail,
            "seconds": round(time.perf_counter() - t0, 1)}


def run_workload(name: str, argv: list[str]) -> None:
    """``bench/workloads/NAME.py ARGS`` as ``__main__``, in this process."""
    sys.argv = [f"{sys.argv[0]} {name}", *argv]
    runpy.run_path(str(BENCH / "workloads" / f"{name}.py"), run_name="__main__")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ALL_WORKLOADS:
        run_workload(sys.argv[1], sys.argv[2:])
        return
    if sys.argv[1:] == ["report"]:  # only the summary, from the results there are
        from report import summary

        summary.main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="each workload's --quick sizes")
    ap.add_argument("--only", default="", help=f"comma-separated workloads among {','.join(WORKLOADS)}")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per workload (default 1200; quick 300; network variants twice that)")
    network.add_network_argument(ap)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    names = [w.strip() for w in args.only.split(",") if w.strip()] or list(WORKLOADS)
    bad = [w for w in names if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {', '.join(bad)}; choose among {', '.join(WORKLOADS)}")
    timeout = args.timeout or (300.0 if args.quick else 1200.0)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    log = [run_one(w, args.quick, timeout) for w in names]
    if args.network is not None:
        reason = network.missing()
        for w in [w for w in names if w in NETWORK_WORKLOADS]:
            if reason is not None:
                log.append({"workload": f"{w}-network", "status": "skipped", "detail": reason})
                print(f"== {w}-network: skipped ({reason})", file=sys.stderr, flush=True)
            else:
                log.append(run_one(w, args.quick, 2 * timeout, args.network))
    report = subprocess.run([sys.executable, str(BENCH / "run.py"), "report"], cwd=ROOT, check=False)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "run.log.json").write_text(json.dumps(
        {"started": started, "quick": args.quick, "network": args.network, "workloads": log,
         "report": "ok" if report.returncode == 0 else f"exit status {report.returncode}"},
        indent=1) + "\n")
    print("\n| workload | status | seconds | detail |\n|---|---|---:|---|", file=sys.stderr)
    for e in log:
        print(f"| {e['workload']} | {e['status']} | {e.get('seconds', '')} | {e['detail']} |",
              file=sys.stderr)
    failed = [e for e in log if e["status"] not in ("ok", "skipped")] or report.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
