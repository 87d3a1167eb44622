"""The report of ``bench/workloads/overhead.py``: statistics, pairings, goals and
Markdown from its result (``results/overhead.json``).

Pairings (like for like): fused Clamor (the ``clamor`` row) against each peer's
batched program (the faster of its batched rows, per measure), unfused Clamor
(``clamor (no fusion)``) against each peer's task-a-call program; every row is also
shown as a multiple of the two limit rows. Every number the text states is computed
from the result; an explanation not measured here starts with "Hypothesis:".
"""

from __future__ import annotations

from typing import Any

from harness import BUSY_CORES
from harness.results import commit_of, goal, goal_lines, median, median_ci

FUSED, UNFUSED = "clamor", "clamor (no fusion)"
#: Each peer's rows: its task-a-call program, and its batched programs.
UNBATCHED = {"dask": ("dask",), "ray": ("ray",), "ipyparallel": ("ipyparallel",)}
BATCHED = {"dask": ("dask (batched)", "dask (bag)"), "ray": ("ray (batched)",),
           "ipyparallel": ("ipyparallel (chunksize)",)}  # fmt: skip
#: The shortest timed window whose other load the report shows (seconds).
LOAD_WINDOW_S = 1.0
POOL, LOOP = "limit: multiprocessing.Pool", "limit: one Python process"
#: The two measures: (key, the suffix of its fields, unit, digits, what).
MEASURES = (("per_task", "us", "µs", 2, "per task"), ("per_stage", "ms", "ms", 3, "per stage"))


def ok(rows: dict, name: str) -> dict | None:
    r = rows.get(name)
    return r if r and r.get("status") == "ok" else None


def pair_of(name: str) -> str | None:
    """The Clamor row a peer's row is compared with (``None``: not a peer row)."""
    if any(name in v for v in BATCHED.values()):
        return FUSED
    if any(name in v for v in UNBATCHED.values()):
        return UNFUSED
    return None


def fastest(rows: dict, names: tuple[str, ...], key: str) -> str | None:
    """The measured row of ``names`` with the lowest median ``key``."""
    done = [n for n in names if ok(rows, n)]
    return min(done, key=lambda n: rows[n][f"{key}_{unit(key)}"]) if done else None


def unit(key: str) -> str:
    """The suffix of ``key``'s fields (``per_task`` -> ``us``)."""
    return next(u for k, u, *_ in MEASURES if k == key)


def add_stats(result: dict[str, Any]) -> None:
    """Per measured row: median, minimum and 95 % interval of every measure, the paired
    Clamor row and the ratio to it, the multiples of the limits; then the comparisons
    (``result["comparisons"]``) and the goals."""
    rows = result["rows"]
    for r in rows.values():
        if r.get("status") != "ok":
            continue
        for key, u, *_ in MEASURES:
            runs = r[f"{key}_runs_{u}"]
            r[f"{key}_{u}"] = median(runs)
            r[f"{key}_min_{u}"] = min(runs)
            r[f"{key}_max_{u}"] = max(runs)
            r[f"{key}_ci_{u}"] = median_ci(runs)
        r["first_batch_us"] = median(r.get("first_batch_runs_us") or [])
        r["startup_s"] = median(r.get("startup_runs_s") or [])
        # /proc/stat counts in clock ticks: a window under LOAD_WINDOW_S says nothing
        windows = [x for x in r.get("load_runs") or [] if x["wall_s"] >= LOAD_WINDOW_S]
        r["other_cores"] = max((x["other_cores"] for x in windows), default=None)
    for name, r in rows.items():
        if r.get("status") != "ok":
            continue
        for key, u, *_ in MEASURES:
            v = r[f"{key}_{u}"]
            base = pair_of(name)
            if base and ok(rows, base):
                r["pair"] = base
                r[f"{key}_ratio"] = v / rows[base][f"{key}_{u}"]
            for tag, limit in (("limit", POOL), ("loop", LOOP)):
                if ok(rows, limit) and rows[limit][f"{key}_{u}"] > 0:
                    r[f"{key}_x_{tag}"] = v / rows[limit][f"{key}_{u}"]
    result["comparisons"] = comparisons(rows)
    result["goals"] = goals(result["comparisons"], rows, result["parameters"].get("workers", 2))


def comparisons(rows: dict) -> list[dict[str, Any]]:
    """Per peer, measure and pairing: the peer's fastest row of the kind, the Clamor row,
    their medians and ``peer ÷ clamor`` (above 1: Clamor's overhead is lower)."""
    out = []
    for peer, unbatched in UNBATCHED.items():
        for kind, clamor, names in (("fused vs batched", FUSED, BATCHED[peer]),
                                    ("unfused vs unbatched", UNFUSED, unbatched)):  # fmt: skip
            for key, u, *_ in MEASURES:
                best = fastest(rows, names, key)
                if best is None or not ok(rows, clamor):
                    continue
                a, b = rows[best][f"{key}_{u}"], rows[clamor][f"{key}_{u}"]
                out.append({"peer": peer, "kind": kind, "measure": key, "unit": u, "row": best,
                            "clamor": clamor, "peer_value": a, "clamor_value": b, "ratio": a / b,
                            "candidates": [n for n in names if ok(rows, n)]})  # fmt: skip
    return out


#: Issue 32's goals: fused Clamor this many times below batched Ray per task, and a stage
#: of 2 tasks (on 2 workers) under this many milliseconds.
RAY_BATCHED_PER_TASK, TWO_TASK_STAGE_MS = 5.0, 1.0


def goals(comps: list[dict[str, Any]], rows: dict, workers: int) -> list[dict[str, Any]]:
    """Issue 32's: batched Ray ÷ fused Clamor per task at least 5, and (on 2 workers) a
    2-task stage under 1 ms, as 1 ms ÷ its median; then, per pairing and measure, the
    fastest peer row ÷ the Clamor row at least 1 (Clamor's overhead no higher than any
    peer's, like for like)."""
    out = []
    ray = next((c for c in comps if c["kind"] == "fused vs batched" and c["peer"] == "ray"
                and c["measure"] == "per_task"), None)  # fmt: skip
    if ray is not None:
        out.append(goal(f"per task, fused vs batched: `{ray['row']}` ÷ `{FUSED}` ≥ {RAY_BATCHED_PER_TASK:g}",
                        ray["ratio"], RAY_BATCHED_PER_TASK,
                        f"{ray['peer_value']:.2f} µs against {ray['clamor_value']:.2f} µs"))  # fmt: skip
    if workers == 2 and ok(rows, FUSED):
        stage_ms = rows[FUSED]["per_stage_ms"]
        out.append(goal(f"a stage of 2 tasks under {TWO_TASK_STAGE_MS:g} ms: {TWO_TASK_STAGE_MS:g} ms ÷ `{FUSED}` "
                        "per stage ≥ 1", TWO_TASK_STAGE_MS / stage_ms, 1.0, f"median {stage_ms:.3f} ms"))  # fmt: skip
    for kind, clamor in (("fused vs batched", FUSED), ("unfused vs unbatched", UNFUSED)):
        for key, _, shown, digits, what in MEASURES:
            cs = [c for c in comps if c["kind"] == kind and c["measure"] == key]
            if not cs:
                continue
            c = min(cs, key=lambda c: c["ratio"])
            why = (f"fastest peer: {c['row']}, {c['peer_value']:.{digits}f} {shown} against "
                   f"{clamor} {c['clamor_value']:.{digits}f} {shown}")  # fmt: skip
            out.append(goal(f"{what}, {kind}: the fastest peer ÷ `{clamor}` ≥ 1", c["ratio"], 1.0, why))
    return out


def headline(result: dict[str, Any]) -> list[str]:
    comps, rows = result.get("comparisons") or [], result["rows"]
    if not comps:
        return ["No pair of a Clamor row and a peer row was measured, so there are no ratios."]
    out = []
    for kind, clamor, what in (("fused vs batched", FUSED, "each peer's faster batched program"),
                               ("unfused vs unbatched", UNFUSED, "each peer's task-a-call program")):  # fmt: skip
        cs = [c for c in comps if c["kind"] == kind]
        if not cs:
            continue
        out += [(f"**{kind.capitalize()}** (`{clamor}` against {what}; peer ÷ Clamor, above 1: Clamor's "
                "overhead is lower):"), ""]  # fmt: skip
        for peer in UNBATCHED:
            parts = []
            for key, u, shown, digits, what_m in MEASURES:
                c = next((c for c in cs if c["peer"] == peer and c["measure"] == key), None)
                if c is None:
                    continue
                other = [n for n in c["candidates"] if n != c["row"]]
                also = "; " + ", ".join(f"{n} {rows[n][f'{key}_{u}']:.{digits}f}" for n in other) if other else ""
                parts.append(f"**{c['ratio']:.2f}×** {what_m} ({c['row']} {c['peer_value']:.{digits}f} {shown} vs "
                             f"{c['clamor_value']:.{digits}f}{also})")  # fmt: skip
            if parts:
                out.append(f"- {peer}: " + ", ".join(parts))
        out.append("")
    limits = []
    for name in (FUSED, UNFUSED):
        r = ok(rows, name)
        if r and "per_task_x_limit" in r:
            limits.append(f"`{name}` = {r['per_task_x_limit']:.1f}× `{POOL}` per task"
                          + (f", {r['per_stage_x_limit']:.1f}× per stage" if "per_stage_x_limit" in r else ""))
    if limits:
        out += ["**Against the limit**: " + "; ".join(limits) + ".", ""]
    return out


def fmt(x: float | None, digits: int) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def cell_x(r: dict, field: str) -> str:
    return f"{r[field]:.2f}×" if field in r else "—"


def measure_table(result: dict[str, Any], key: str, u: str, shown: str, digits: int, what: str) -> list[str]:
    """One measure's table: median, 95 % interval, min–max, ÷ the paired Clamor row, × the limits."""
    lines = [f"### {what.capitalize()} ({shown})", "",
             (f"| system | median | 95 % interval of the median | min–max | ÷ paired Clamor row | "
             f"× {POOL} | × {LOOP} |"), "|---|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for name, r in result["rows"].items():
        if r.get("status") != "ok":
            lines.append(f"| {name} | — | — | — | — | — | — |")
            continue
        ci = r.get(f"{key}_ci_{u}")
        ci_text = f"{ci[0]:.{digits}f}–{ci[1]:.{digits}f}" if ci else "n/a (< 6 repetitions)"
        pair = f"{r[f'{key}_ratio']:.2f}× `{r['pair']}`" if f"{key}_ratio" in r else "—"
        bold = name in (FUSED, UNFUSED) or name.startswith("limit: ")
        lines.append(f"| {f'**{name}**' if bold else name} | {fmt(r[f'{key}_{u}'], digits)} | {ci_text} | "
                     f"{r[f'{key}_min_{u}']:.{digits}f}–{r[f'{key}_max_{u}']:.{digits}f} | {pair} | "
                     f"{cell_x(r, f'{key}_x_limit')} | {cell_x(r, f'{key}_x_loop')} |")  # fmt: skip
    return lines


def render(result: dict[str, Any]) -> str:
    m, p, rows = result["machine"], result["parameters"], result["rows"]
    versions = {**result.get("versions", {}), **{k: v for k, v in result.get("packages", {}).items() if v}}
    policy = p["fusion_policy"]
    n_batches = -(-p["tasks"] // p["batch"])
    lines = [
        (f"# Overhead of empty tasks on {p['workers']} workers: Clamor vs. Dask, Ray, ipyparallel, "
        "batched and unbatched"), "",
        (f"Run {result['date']} on `{m['hostname']}`: nproc {m['nproc']} (cpu_count {m['cpu_count']}), "
         f"{m['cpu']}, {m.get('memory_gib', '?')} GiB, Linux {m['kernel']}, Python {m['python']}. Versions: "
         + ", ".join(f"{k} {v}" for k, v in versions.items())
         + f". Command: `{result['command']}` (total {result['elapsed_s']:.0f} s), at commit "
         f"`{commit_of(result)[0]}`"
         + (f" with uncommitted changes ({', '.join(result['changes'])})" if commit_of(result)[1] else "")
         + f". Load average before / after: {result['loadavg_before']} / {result['loadavg_after']}."),
        "",
        (f"Protocol: {p['workers']} worker processes per system. Per task: N = {p['tasks']} empty tasks "
         f"submitted at once, wall time ÷ N. Per stage: a stage of {p['workers']} empty tasks, "
         f"S = {p['stages']} in a row, wall time ÷ S. Each row first runs an untimed warm-up batch of N "
         f"(its time is the *first batch* column) and {p['warm_stages']} untimed stages, then "
         f"R = {p['repeat']} timed batches and R timed runs of S stages. {p['passes']} pass(es) over the "
         f"systems ({', '.join(p['systems'])}), each system in a fresh child process, started afresh "
         f"every pass; a row's repetitions of every pass are merged (up to {p['repeat'] * p['passes']} "
         "values: median, min–max and the distribution-free 95 % interval of the median)."),
        "",
        (f"Batches: the peers' batched programs put k = {p['batch']} items in a batch ({n_batches} batches "
         f"of N, {n_batches / p['workers']:.1f} a worker): the chunk Clamor's fusion picks for N tasks on "
         f"{p['workers']} workers (`FusionPolicy`: at least {policy['chunks_per_worker']} chunks a worker, at "
         f"most {policy['max_chunk']} tasks a chunk). A stage of {p['workers']} tasks is "
         + (f"below fusion's threshold ({2 * policy['chunks_per_worker']} tasks), so both Clamor rows run it "
            "a task an attempt" if p["stage_batch"] == 1 else "fused too")
         + f" and the batched peers' batches hold {p['stage_batch']} item(s). Clamor's first batch of a "
         "program runs a task an attempt: fusion needs the program's previous stage to have shown its "
         "tasks tiny, which the warm-up does."),
        "",
        "## Headline", "",
        *headline(result),
    ]  # fmt: skip
    if result.get("goals"):
        lines += ["## Goals", "", *goal_lines(result["goals"]), ""]
    lines += ["## Results", ""]
    for measure in MEASURES:
        lines += [*measure_table(result, *measure), ""]
    lines += ["### Context", "",
              ("| system | first batch (µs a task, cold) | start-up (s) | repetitions (passes) | "
              "other load, largest (cores) | program |"), "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    notes = []
    api = result.get("api", {})
    for name, r in rows.items():
        if r.get("status") != "ok":
            lines.append(f"| {name} | — | — | — | — | {r.get('reason', '')} |")
        else:
            load = r.get("other_cores")
            load_text = f"n/a (timed window < {LOAD_WINDOW_S:g} s)" if load is None else f"{load:.2f}" + (" **perturbed**" if load > BUSY_CORES else "")
            lines.append(f"| {name} | {fmt(r.get('first_batch_us'), 1)} | {fmt(r.get('startup_s'), 1)} | "
                         f"{len(r['per_task_runs_us'])} ({r['passes']}) | {load_text} | {api.get(name, '')} |")
        for failed in r.get("failed_passes", []) if r.get("status") == "ok" else []:
            notes.append(f"- {name}: {failed}")
        if r.get("left_behind"):
            notes.append(f"- {name}: left {len(r['left_behind'])} process(es) behind after shutting down "
                         "(killed by the benchmark): " + "; ".join(r["left_behind"]))  # fmt: skip
    lines += [
        "",
        ("÷ paired Clamor row: the row's median over the median of the Clamor row it is compared with "
         f"(batched peers: `{FUSED}`; unbatched peers: `{UNFUSED}`); above 1, the peer's overhead is higher. "
         "× limit: the row's median over the limit row's. Start-up is the time to a system ready to run "
         "tasks (context only). Other load: CPU used by processes outside the measured system during its "
         "timed runs (machine busy time from /proc/stat minus the system's own processes), the largest "
         f"over the passes; above {BUSY_CORES:g} cores the row is flagged as perturbed."),
        "",
        ("Hypothesis: on a machine with as many cores as workers, every system's driver, scheduler and "
         "workers share the same cores, so the per-task numbers include the driver's own CPU time; with "
         "more cores than workers the gaps between the systems may differ."),
    ]  # fmt: skip
    if notes:
        lines += ["", "## Notes", "", *notes]
    else:
        lines += ["", "Every system shut down cleanly in every pass: no process was left behind."]
    return "\n".join(lines) + "\n"
