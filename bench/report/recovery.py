"""The report of ``bench/workloads/recovery.py``: Markdown and figures from its result.

Recovery from a killed worker (k-means iterations, with and without the loss, and
with fewer workers from the start) and speculation against a straggler; the
result dict is the one the workload saves as ``results/recovery.json``.
"""

from __future__ import annotations

import statistics

import numpy as np
from harness import BUSY_CORES
from harness.results import RESULTS


def summarize_recovery(runs: dict, p: dict) -> dict:
    """Per-iteration and total seconds of each configuration, and their ratios."""
    per_iter: dict[str, list] = {}
    totals: dict[str, list] = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        per_iter[name] = (
            [
                [r["iterations"][i]["seconds"] for r in ok]
                for i in range(p["iterations"])
            ]
            if ok
            else []
        )
        totals[name] = [sum(x["seconds"] for x in r["iterations"]) for r in ok]
    out: dict = {"per_iteration": per_iter, "totals": totals}
    if per_iter.get("no_failure") and per_iter.get("kill"):
        ki = p["kill_iteration"] - 1
        base = [statistics.median(x) for x in per_iter["no_failure"]]
        kill = [statistics.median(x) for x in per_iter["kill"]]
        after = range(ki + 1, p["iterations"])
        out["ratios"] = {
            "kill_iteration": kill[ki] / base[ki],
            "kill_iteration_extra_s": kill[ki] - base[ki],
            "after_kill": (
                statistics.median(kill[i] for i in after)
                / statistics.median(base[i] for i in after)
                if after
                else None
            ),
            "total": statistics.median(totals["kill"])
            / statistics.median(totals["no_failure"]),
        }
        if per_iter.get("fewer") and after:
            fewer = [statistics.median(x) for x in per_iter["fewer"]]
            out["ratios"]["after_kill_vs_fewer"] = statistics.median(
                kill[i] for i in after
            ) / statistics.median(fewer[i] for i in after)
            out["ratios"]["fewer_vs_no_failure"] = statistics.median(
                fewer[i] for i in after
            ) / statistics.median(base[i] for i in after)
    return out

def fmt(x, f=".3f", none="—") -> str:
    return none if x is None else format(x, f)


def mib(x) -> str:
    return "—" if x is None else f"{x / 2**20:.1f}"


def md_row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def render(result: dict) -> str:
    m, p = result["machine"], result["parameters"]
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    g = result["git"]
    lines = [
        "# Recovery from a lost worker and speculation against a straggler, 2 cores",
        "",
        (
            f"Run {result['date']} on `{m['hostname']}`: nproc {m['nproc']} "
            f"(cpu_count {m['cpu_count']}), {m['cpu']}, Linux {m['kernel']}, Python "
            f"{m['python']}. Packages: {pk}. Command: `{p['command']}` (total "
            f"{result['elapsed_s']:.0f} s), at commit `{g['commit']}`"
            + (
                " with uncommitted changes in "
                + ", ".join(f"`{c}`" for c in g.get("changes", g.get("runtime_changes", [])))
                if g.get("dirty", g.get("runtime_dirty"))
                else ""
            )
            + f". Load average before / after: {result['loadavg_before']} / "
            f"{result['loadavg_after']}."
        ),
        "",
    ]
    lines += ["## Headline", "", *headline(result), ""]
    if "recovery" in result:
        lines += render_recovery(result["recovery"], p)
    if "stragglers" in result:
        lines += render_stragglers(result["stragglers"], p)
    lines += render_caveats(result)
    return "\n".join(lines) + "\n"


def headline(result: dict) -> list[str]:
    out = []
    p = result["parameters"]
    rec = result.get("recovery")
    if rec:
        kills = [r for r in rec["runs"]["kill"] if r.get("status") == "ok"]
        ok = [r for rs in rec["runs"].values() for r in rs if r.get("status") == "ok"]
        ki = p["kill_iteration"]
        if "ratios" in rec:
            r = rec["ratios"]
            recovered = all(
                x["iterations"][ki - 1].get("recovered_by_runtime") for x in kills
            )
            mid = all(
                x["iterations"][ki - 1].get("kill", {}).get("mid_iteration")
                for x in kills
            )
            base = statistics.median(rec["per_iteration"]["no_failure"][ki - 1])
            kill = statistics.median(rec["per_iteration"]["kill"][ki - 1])
            out.append(
                f"- **Recovery** (k-means, {p['workers']} workers, one killed "
                f"{rec['kill_delay_s']:.2f} s into iteration {ki}): iteration {ki} took "
                f"{kill:.2f} s instead of {base:.2f} s (**{r['kill_iteration']:.2f}×**, "
                f"{r['kill_iteration_extra_s']:+.2f} s); the {p['iterations']} iterations "
                f"took **{r['total']:.2f}×** as long as without the failure; the iterations "
                f"after it **{fmt(r['after_kill'], '.2f')}×**"
                + (
                    f" (a cluster of {p['workers'] - 1} workers from the start, without a "
                    f"failure: **{r['fewer_vs_no_failure']:.2f}×** in the same iterations)"
                    if "fewer_vs_no_failure" in r
                    else ""
                )
                + ". "
                + (
                    "The runtime recovered by itself (no error reached the program)"
                    if recovered
                    else "**The runtime did not recover by itself**: the action raised and "
                    "the benchmark re-ran the iteration"
                )
                + (
                    ""
                    if mid
                    else " (**the kill did not land mid-iteration in every run**)"
                )
                + "."
            )
        else:
            out.append("- **Recovery**: not measured (see below).")
        if ok:
            eq = all(x.get("equal_to_reference") for x in ok)
            out.append(
                f"- k-means result: **{'equal' if eq else 'NOT equal'}** to the numpy "
                f"reference, bit for bit, in every iteration of every run ({len(ok)} runs"
                f"; largest difference {max(x['max_abs_diff'] for x in ok):.3g})."
            )
    st = result.get("stragglers")
    if st:
        rows = st["rows"]
        names = list(rows)  # the configurations, in the order they ran
        if all(rows[n].get("status") == "ok" for n in names):
            on, off = rows[names[3]], rows[names[2]]
            out.append(
                f"- **Stragglers** (one of {p['straggler_workers']} workers "
                f"{p['slow_factor']:g}× slower, {p['stages']} stages × {p['tasks']} tasks of "
                f"~{p['task_ms']:.0f} ms): speculation on {on['total_s']:.2f} s, off "
                f"{off['total_s']:.2f} s (speculation is **{st['speculation_speedup']:.2f}×** "
                f"faster), no straggler {rows[names[0]]['total_s']:.2f} s; with speculation "
                f"the straggler costs **{on['ratio_to_no_straggler']:.2f}×** the time without "
                f"one, without speculation **{off['ratio_to_no_straggler']:.2f}×**. "
                f"Speculative copies: {fmt(on['counters']['tasks_speculated'], 'd')} (on), "
                f"{fmt(off['counters']['tasks_speculated'], 'd')} (off)."
            )
        else:
            bad = [
                f"{n}: {rows[n].get('reason')}"
                for n in names
                if rows[n].get("status") != "ok"
            ]
            out.append(
                "- **Stragglers**: not every configuration ran: " + "; ".join(bad)
            )
    children = [r["child"] for r in all_runs(result)]
    perturbed = [c for c in children if c["other_cores"] > BUSY_CORES]
    left = sum(len(c["left_behind"]) for c in children)
    out.append(
        f"- Other load: {len(perturbed)} of {len(children)} runs perturbed (other processes "
        f"used more than {BUSY_CORES:g} cores; at most "
        f"{max((c['other_cores'] for c in children), default=0):.2f}). Processes left "
        f"behind: {left}."
    )
    return out


def all_runs(result: dict) -> list[dict]:
    """Every child's record (k-means runs and straggler configurations)."""
    runs = []
    if "recovery" in result:
        runs += [r for rs in result["recovery"]["runs"].values() for r in rs]
    if "stragglers" in result:
        runs += list(result["stragglers"]["rows"].values())
    return [r for r in runs if "child" in r]


def render_recovery(rec: dict, p: dict) -> list[str]:
    ki = p["kill_iteration"]
    lines = [
        "## 1. Recovery from a lost worker (Figure 11)",
        "",
        (
            f"Dense k-means, {p['points']:,} points × {p['dims']} dims float64 "
            f"({p['points'] * p['dims'] * 8 / 2**20:.0f} MiB) in the arena, k = {p['k']}, "
            f"`parallelize(points, partitions={p['partitions']})` (arena slices shipped as "
            "references, demand-paged by the tasks), one action per iteration "
            "(`ds.map_partitions(step).collect()`, the step adds partial sums and counts to "
            f"two accumulators), {p['iterations']} iterations on `Cluster(workers="
            f"{p['workers']})`, R = {p['repeat']} runs of each kind, each in a fresh child "
            f"process and cluster. *Kill*: `cluster.kill_worker(w)` (SIGKILL, w = the highest "
            f"worker id) from a `threading.Timer` {fmt(rec['kill_delay_s'])} s into iteration "
            f"{ki} (half the median time of iterations 2–{p['iterations']} of the first run "
            "without a failure). For context, the same without a failure on "
            f"`Cluster(workers={p['workers'] - 1})` from the start (what the survivors "
            "are). Times: wall time of the action plus the centroid update, median over the "
            "runs (min–max in brackets)."
        ),
        "",
    ]
    per = rec["per_iteration"]
    if not per.get("no_failure"):
        lines += [
            "No run without a failure completed: "
            + "; ".join(str(r.get("reason")) for r in rec["runs"]["no_failure"]),
            "",
        ]
        return lines
    kill_ok = bool(per.get("kill"))
    kills = [r for r in rec["runs"]["kill"] if r.get("status") == "ok"]
    lines += [
        md_row(
            "iteration",
            "no failure (s)",
            "worker killed (s)",
            "killed ÷ no failure",
            f"{p['workers'] - 1} workers, no failure (s)",
            "tasks lost",
            "tasks rerun",
            "tasks recomputed",
            "tasks speculated",
            "MiB paged from driver",
            "live workers",
        ),
        md_row("---:", *["---:"] * 10),
    ]

    def cell(xs):
        med = statistics.median(xs)
        return f"{med:.3f}" + (f" ({min(xs):.3f}–{max(xs):.3f})" if len(xs) > 1 else "")

    def ctr(it, key):
        vals = [r["iterations"][it]["counters"][key] for r in kills]
        if not vals or any(v is None for v in vals):
            return "n/a"
        return "/".join(str(v) for v in vals)

    for i in range(p["iterations"]):
        b = per["no_failure"][i]
        k = per["kill"][i] if kill_ok else None
        lines.append(
            md_row(
                f"**{i + 1}** (kill)" if i + 1 == ki else i + 1,
                cell(b),
                cell(k) if k else "—",
                f"**{statistics.median(k) / statistics.median(b):.2f}×**" if k else "—",
                cell(per["fewer"][i]) if per.get("fewer") else "—",
                ctr(i, "tasks_lost"),
                ctr(i, "tasks_rerun"),
                ctr(i, "tasks_recomputed"),
                ctr(i, "tasks_speculated"),
                "/".join(
                    mib(r["iterations"][i]["counters"]["bytes_served_by_driver"])
                    for r in kills
                )
                or "—",
                "/".join(str(r["iterations"][i]["live_workers"]) for r in kills) or "—",
            )
        )
    tn = rec["totals"]["no_failure"]
    tk = rec["totals"].get("kill") or []
    tf = rec["totals"].get("fewer") or []
    lines.append(
        md_row(
            "**total**",
            cell(tn),
            cell(tk) if tk else "—",
            f"**{rec['ratios']['total']:.2f}×**" if "ratios" in rec else "—",
            cell(tf) if tf else "—",
            "",
            "",
            "",
            "",
            "",
            "",
        )
    )
    lines += [
        "",
        (
            "Counter columns are per iteration of the runs with the kill, one value per run "
            "(`cluster.stats()` before and after the iteration; `n/a`: the runtime does not "
            "report that counter). *MiB paged from driver*: `bytes_served_by_driver` (shm "
            "copies and TCP), i.e. arena pages the workers faulted in during the iteration."
        ),
        "",
        "![time per iteration](recovery_iterations.png)",
        "",
        "### Runs",
        "",
        md_row(
            "run",
            "status",
            "total (s)",
            "kill at (s into it.)",
            "kill returned at (s)",
            "mid-iteration",
            "recovered by the runtime",
            "equal to reference",
            "start-up (s)",
            "other load (cores)",
        ),
        md_row("---", "---", *["---:"] * 8),
    ]
    for name, rs in rec["runs"].items():
        for j, r in enumerate(rs):
            kind = {
                "no_failure": "no failure",
                "kill": "worker killed",
                "fewer": f"no failure, {p['workers'] - 1} workers",
            }[name]
            label = f"{kind} #{j + 1}"
            load = r["child"]["other_cores"]
            if r.get("status") != "ok":
                lines.append(
                    md_row(
                        label,
                        f"{r['status']}: {r.get('reason')}",
                        *[""] * 7,
                        f"{load:.2f}",
                    )
                )
                continue
            kr = r["iterations"][ki - 1] if name == "kill" else {}
            kinfo = kr.get("kill", {})
            rec_cell = "—"
            if name == "kill":
                rec_cell = (
                    "yes"
                    if kr.get("recovered_by_runtime")
                    else (
                        f"**no**: {kr.get('error')} after {kr.get('error_after_s', 0):.3f} s; "
                        "re-run by the benchmark"
                    )
                )
            lines.append(
                md_row(
                    label,
                    "ok",
                    f"{sum(x['seconds'] for x in r['iterations']):.3f}",
                    fmt(kinfo.get("at_s")),
                    fmt(kinfo.get("done_at_s")),
                    ("yes" if kinfo.get("mid_iteration") else "**no**")
                    if kinfo
                    else "—",
                    rec_cell,
                    "yes"
                    if r.get("equal_to_reference")
                    else f"**no** (max diff {r.get('max_abs_diff')})",
                    f"{r['startup_s']:.2f}",
                    f"{load:.2f}" + (" **perturbed**" if load > BUSY_CORES else ""),
                )
            )
    lines += [
        "",
        (
            f"The numpy reference (one process, the same partial sums added in task order) "
            f"took {rec['reference_s']:.1f} s for the {p['iterations']} iterations."
        ),
        "",
    ]
    return lines


def render_stragglers(st: dict, p: dict) -> list[str]:
    rows = st["rows"]
    lines = [
        "## 2. Stragglers and speculative replicas (Figure 12)",
        "",
        (
            f"A job of {p['stages']} stages, each one action "
            f"(`cluster.range(s*T, (s+1)*T, partitions=T).map(burn).collect()`) of T = "
            f"{p['tasks']} uniform tasks of single-threaded numpy work ({st['burn_reps']} "
            f"passes over a 512 KiB buffer, calibrated to {st['task_s_calibrated'] * 1000:.0f} "
            f"ms on one idle core here), on `Cluster(workers={p['straggler_workers']}, "
            "speculation=...)`. *Straggler*: `cluster.slow_worker(w, "
            f"{p['slow_factor']:g})` on the highest worker id after an untimed warm-up stage "
            f"(the process runs {1 / p['slow_factor']:.0%} of every 50 ms, SIGSTOP/SIGCONT). "
            f"Total job time, median of R = {p['straggler_repeat']} repetitions in one "
            "cluster per configuration (min–max in brackets). Every result is checked against "
            "the other runs and a few against values computed here."
        ),
        "",
        md_row(
            "configuration",
            "total (s)",
            "÷ no straggler (spec. off)",
            "per stage (s)",
            "tasks speculated",
            "tasks rerun",
            "tasks recomputed",
            "tasks done per worker",
            "results",
            "other load (cores)",
        ),
        md_row("---", *["---:"] * 7, "---", "---:"),
    ]
    for name in rows:  # the configurations, in the order they ran
        r = rows[name]
        load = r["child"]["other_cores"]
        if r.get("status") != "ok":
            lines.append(
                md_row(
                    name, f"{r['status']}: {r.get('reason')}", *[""] * 7, f"{load:.2f}"
                )
            )
            continue
        tot = r["total_runs_s"]
        stage_med = [
            statistics.median(x) for x in zip(*(rep["stage_s"] for rep in r["reps"]))
        ]
        done = r["reps"][-1]["tasks_done_per_worker"]
        slow = r.get("slow_worker")
        c = r["counters"]
        lines.append(
            md_row(
                name,
                f"{r['total_s']:.3f}"
                + (f" ({min(tot):.3f}–{max(tot):.3f})" if len(tot) > 1 else ""),
                f"**{r['ratio_to_no_straggler']:.2f}×**"
                if "ratio_to_no_straggler" in r
                else "—",
                ", ".join(f"{x:.2f}" for x in stage_med),
                fmt(c["tasks_speculated"], "d", "n/a"),
                fmt(c["tasks_rerun"], "d", "n/a"),
                fmt(c["tasks_recomputed"], "d", "n/a"),
                ", ".join(
                    f"w{w}{' (slow)' if slow is not None and str(slow) == w else ''}: {n}"
                    for w, n in sorted(done.items())
                ),
                "ok" if r["results_ok"] else "**wrong**",
                f"{load:.2f}" + (" **perturbed**" if load > BUSY_CORES else ""),
            )
        )
    opt = next(
        (
            r.get("speculation_option")
            for r in rows.values()
            if r.get("speculation_option")
        ),
        {},
    )
    lines += [
        "",
        "Counters: summed over the repetitions (`cluster.stats()` before and after each). "
        "*Tasks done per worker*: in the last repetition, from the scheduler "
        "(a task won by a speculative copy counts for the copy's worker). "
        + (
            "Speculation option of `clamor.Cluster`: "
            + ", ".join(f"`{k}={v!r}`" for k, v in opt.items() if k != "supported")
            + "."
            if opt.get("supported")
            else "`clamor.Cluster` has no `speculation` option in this run."
        ),
        "",
    ]
    if st.get("speculation_speedup"):
        lines += [
            f"Speculation on vs. off with the straggler: **{st['speculation_speedup']:.2f}×** faster.",
            "",
        ]
    lines += ["![stragglers](recovery_stragglers.png)", ""]
    return lines


def render_caveats(result: dict) -> list[str]:
    p = result["parameters"]
    lines = [
        "## Caveats when reading the numbers",
        "",
        (
            f"- {p['workers']} workers share {result['machine']['nproc']} cores. Killing one "
            f"leaves {p['workers'] - 1} workers on {result['machine']['nproc']} cores, so the "
            "iterations after the loss do not lose CPU, unlike the paper's cluster, which lost "
            "a share of its cores; they can even be faster, since fewer processes contend for "
            f"the cores (compare the `{p['workers'] - 1} workers, no failure` column). What "
            "the loss costs here is re-running the lost worker's unfinished tasks and paging "
            "its share of the points into the survivors."
        ),
        (
            "- The points are read from the arena, not from persisted partitions, so a lost "
            "worker loses no data that lineage must recompute: recovery here is re-running the "
            "lost worker's unfinished tasks on the survivors, which page in what they read "
            "(`tasks_recomputed` counts lineage recomputation of lost persisted partitions)."
        ),
        (
            "- In the straggler experiment the slowed worker gives up its CPU to the others while "
            f"stopped, so on {result['machine']['nproc']} cores the "
            f"{p['straggler_workers'] - 1} healthy workers have the cores to themselves; with "
            f"no straggler, {p['straggler_workers']} workers compete for "
            f"{result['machine']['nproc']} cores."
        ),
        (
            "- Both experiments run the real processes on one small VM: other processes perturb "
            f"them (the *other load* column; above {BUSY_CORES:g} cores a run is flagged)."
        ),
    ]
    if result["git"].get("dirty", result["git"].get("runtime_dirty")):
        lines.append(
            "- The tree had uncommitted changes when this ran (listed in the JSON, "
            "`git.changes`): the numbers are for that working tree."
        )
    if result.get("plots_error"):
        lines.append(f"- No plots: {result['plots_error']}")
    return lines + [""]


# --- plots --------------------------------------------------------------------------------


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = result["parameters"]
    rec = result.get("recovery")
    if rec and rec["per_iteration"].get("no_failure"):
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = np.arange(1, p["iterations"] + 1)
        for name, label, colour in (
            ("no_failure", "no failure", "tab:blue"),
            ("kill", f"worker killed in iteration {p['kill_iteration']}", "tab:red"),
            ("fewer", f"no failure, {p['workers'] - 1} workers (context)", "tab:grey"),
        ):
            per = rec["per_iteration"].get(name)
            if not per:
                continue
            med = np.array([statistics.median(x) for x in per])
            lo = np.array([min(x) for x in per])
            hi = np.array([max(x) for x in per])
            style = "--" if name == "fewer" else "-"
            ax.plot(xs, med, style, marker="o", color=colour, label=label, markersize=5)
            if p["repeat"] > 1:
                ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, linewidth=0)
        ax.axvspan(
            p["kill_iteration"] - 0.4,
            p["kill_iteration"] + 0.4,
            color="grey",
            alpha=0.12,
        )
        ax.annotate(
            "worker killed",
            (p["kill_iteration"], 0),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            color="dimgrey",
        )
        ax.set_xticks(xs)
        ax.set_xlabel("iteration")
        ax.set_ylabel("wall time per iteration (s)")
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"k-means, {p['points']:,} × {p['dims']}, k={p['k']}, {p['workers']} workers on "
            f"{result['machine']['nproc']} cores"
            + (f" (median of {p['repeat']}, band: min–max)" if p["repeat"] > 1 else ""),
            fontsize=9,
        )
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "recovery_iterations.png", dpi=150)
        plt.close(fig)
    st = result.get("stragglers")
    if st:
        names = [
            n for n in st["rows"] if st["rows"][n].get("status") == "ok"
        ]
        if names:
            fig, ax = plt.subplots(figsize=(7, 4))
            rows = [st["rows"][n] for n in names]
            med = [r["total_s"] for r in rows]
            err = [
                [r["total_s"] - min(r["total_runs_s"]) for r in rows],
                [max(r["total_runs_s"]) - r["total_s"] for r in rows],
            ]
            colours = [
                "tab:grey"
                if "no straggler" in n
                else ("tab:green" if n.endswith("on") else "tab:red")
                for n in names
            ]
            bars = ax.bar(
                range(len(names)),
                med,
                color=colours,
                yerr=err if p["straggler_repeat"] > 1 else None,
                capsize=4,
            )
            for b, r in zip(bars, rows):
                label = f"{r['total_s']:.2f} s"
                if "ratio_to_no_straggler" in r:
                    label += f"\n{r['ratio_to_no_straggler']:.2f}×"
                top = (
                    max(r["total_runs_s"])
                    if p["straggler_repeat"] > 1
                    else b.get_height()
                )
                ax.annotate(
                    label,
                    (b.get_x() + b.get_width() / 2, top),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 3),
                    textcoords="offset points",
                )
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels([n.replace(", ", "\n") for n in names], fontsize=8)
            ax.set_ylabel("job time (s)")
            ax.set_ylim(0, max(max(r["total_runs_s"]) for r in rows) * 1.25)
            ax.set_title(
                f"{p['stages']} stages × {p['tasks']} tasks of ~{p['task_ms']:.0f} ms, "
                f"{p['straggler_workers']} workers on {result['machine']['nproc']} cores, "
                f"one slowed {p['slow_factor']:g}×\n(median"
                + (
                    f" of {p['straggler_repeat']}, bars: min–max"
                    if p["straggler_repeat"] > 1
                    else ""
                )
                + "; ratios ÷ no straggler, speculation off)",
                fontsize=9,
            )
            fig.tight_layout()
            fig.savefig(RESULTS / "recovery_stragglers.png", dpi=150)
            plt.close(fig)


# --- main -----------------------------------------------------------------------------------
