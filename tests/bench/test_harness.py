"""The benchmark harness's statistics and bookkeeping (bench/harness, bench/report): what
every number in REPORT.md and the README's table passes through."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from harness.children import merge
from harness.machine import provenance
from harness.results import median_ci
from report import summary


def test_the_median_interval_is_the_binomial_order_statistics():
    xs = [float(x) for x in range(10, 0, -1)]  # unsorted on purpose
    assert median_ci(xs) == (2.0, 9.0)  # n = 10: x(2)..x(9), 97.9 % coverage
    assert median_ci(xs[:6]) == (5.0, 10.0)  # n = 6: only min..max reaches 95 %
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # too few runs for 95 %
    assert median_ci([float(x) for x in range(100)]) == (39.0, 60.0)


def test_passes_merge_into_one_row_per_system_and_case():
    one = [{"system": "ray", "case": "1%", "seconds": [1.0], "note": "", "peak_worker_rss": 5, "rss_runs": [5]}]
    two = [{"system": "ray", "case": "1%", "seconds": [2.0], "note": "slow", "peak_worker_rss": 3, "rss_runs": [3]},
           {"system": "clamor", "case": "1%", "seconds": [0.5], "note": ""}]
    rows = merge([one, two])
    ray = next(r for r in rows if r["system"] == "ray")
    assert ray["seconds"] == [1.0, 2.0] and ray["rss_runs"] == [5, 3] and ray["peak_worker_rss"] == 5
    assert ray["passes"] == 2 and ray["note"] == "slow"
    assert next(r for r in rows if r["system"] == "clamor")["passes"] == 1


def test_provenance_names_the_commit_the_machine_and_the_command():
    p = provenance(["bench/run.py", "lookups", "--quick"])
    assert p["commit"] != "?" and isinstance(p["dirty"], bool)
    assert p["machine"]["nproc"] >= 1 and p["machine"]["memory_gib"] > 0
    assert p["command"].endswith("lookups --quick") and p["versions"]["numpy"]


def test_the_readme_table_is_generated_from_the_results(tmp_path, monkeypatch):
    result = {"workload": "w", "title": "t", "date": "2026-11-26T00:00:00", "commit": "abc", "dirty": True,
              "machine": {"hostname": "h", "nproc": 16, "cpu": "cpu", "memory_gib": 128.0},
              "rows": [{"system": "clamor", "case": "c", "seconds": [1.0] * 10},
                       {"system": "ray", "case": "c", "seconds": [3.0] * 10},
                       {"system": "dask", "case": "c", "seconds": [2.0] * 10},
                       {"system": "limit: numpy, one process", "case": "c", "seconds": [0.5] * 10, "limit": True}]}
    table = summary.headline_table([result])
    assert "dask: 2.00×" in table[2] and "2.00× (numpy, one process)" in table[2] and "`abc`+" in table[2]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{summary.README_BEGIN}\nold\n{summary.README_END}\nafter\n")
    monkeypatch.setattr(summary, "README", readme)
    summary.write_readme(table)
    text = readme.read_text()
    assert "old" not in text and "dask: 2.00×" in text and text.endswith("after\n")
    md = "\n".join(summary.section(result))
    assert "with uncommitted changes" in md and "| 10 | 2.00× |" in md
    json.dumps(result)  # plain data


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "bench" / "results").glob("*.json")))
def test_every_committed_result_is_readable_by_the_report(name):
    data = json.loads((summary.RESULTS / name).read_text())
    if summary.is_common(data):
        summary.section(data) if not summary.is_dense(data) else summary.dense_section(data)


def test_run_lists_the_workload_scripts_not_the_parts_they_import():
    import run

    assert {"dense", "kdtree", "logreg", "lookups", "same_host"} <= set(run.ALL_WORKLOADS)
    parts = {p.stem for p in (run.BENCH / "workloads").glob("*_*.py")
             if 'if __name__ == "__main__":' not in p.read_text()}  # fmt: skip
    assert {"dense_peers", "kdtree_report", "logreg_data"} <= parts
    assert not parts & set(run.ALL_WORKLOADS)


def _overhead_result(workers: int, clamor_us: float, ray_us: float, stage_ms: float) -> dict:
    def row(per_task_us: float, per_stage_ms: float) -> dict:
        return {"status": "ok", "per_task_runs_us": [per_task_us] * 6, "per_stage_runs_ms": [per_stage_ms] * 6}

    return {"parameters": {"workers": workers},
            "rows": {"clamor": row(clamor_us, stage_ms), "ray (batched)": row(ray_us, 3.0),
                     "clamor (no fusion)": row(50.0, stage_ms), "ray": row(800.0, 3.0)}}  # fmt: skip


def test_the_empty_task_goals_are_issue_32s_against_batched_ray_and_the_2_task_stage():
    from report import overhead

    result = _overhead_result(2, clamor_us=3.0, ray_us=18.0, stage_ms=1.2)
    overhead.add_stats(result)
    first, second = result["goals"][:2]
    assert (first["target"], first["value"], first["met"]) == (5.0, 6.0, True)
    assert "ray (batched)" in first["goal"]
    assert (second["value"], second["met"]) == (pytest.approx(1 / 1.2), False)
    assert "2 tasks under 1 ms" in second["goal"]

    result = _overhead_result(16, clamor_us=4.0, ray_us=18.0, stage_ms=0.5)  # 16 tasks a stage
    overhead.add_stats(result)
    assert result["goals"][0]["met"] is False
    assert not any("under 1 ms" in g["goal"] for g in result["goals"])


def test_the_dashboard_report_names_the_commit_its_json_measured_not_the_checkout():
    from workloads import dashboard

    run = {"seconds": 1.0, "kernel_cpu": 0.2, "tasks_replaced": 0, "snapshots": 3,
           "snapshot_seconds": 0.01, "comm_messages": 9, "comm_bytes": 4096}  # fmt: skip
    params = {"pairs": 1, "points": 10, "queries": 10, "tasks": 2}
    data = {"runs": [{**run, "live": False}, {**run, "live": True}], "params": params,
            "commit": "abc1234", "dirty": True, "date": "2026-11-28T03:00:00",
            "command": "python bench/run.py dashboard", "machine": {"nproc": 2, "cpu": "test"}}  # fmt: skip
    text = dashboard.report(data, params)
    assert "2026-11-28T03:00:00, commit abc1234 with uncommitted changes, 2 cores (test)." in text
    assert "Command: `python bench/run.py dashboard`" in text


def test_the_lookups_100_percent_goal_says_what_the_same_stage_of_empty_tasks_costs():
    from workloads import lookups

    def r(system, case, secs):
        return {"system": system, "case": case, "seconds": secs, "bytes_moved": 0, "note": ""}

    rows = [r("clamor", "100%", [0.010] * 6), r("ray (ship keys' values)", "100%", [0.015] * 6),
            r("clamor", lookups.FLOOR, [0.008] * 6)]  # fmt: skip
    g = lookups.time_goal(rows, "ray", "100%", 2.0, "at 100 %")
    assert g["value"] == pytest.approx(1.5) and not g["met"]
    assert "tasks that return at once (the same arguments and writes) takes 0.008 s, 80% of Clamor's" in g["why"]
    assert "1.88x is the most a faster lookup could give here" in g["why"]
    assert "return at once" not in lookups.time_goal(rows[:2], "ray", "100%", 2.0, "at 100 %")["why"]
