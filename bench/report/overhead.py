"""The report of ``bench/workloads/overhead.py``: ratios and Markdown from its result
(``results/overhead.json``): per-task and per-stage overhead against the peers."""

from __future__ import annotations

from harness import BUSY_CORES


def baseline(rows: dict) -> str | None:
    """The Clamor row the ratios are against: the stage API if measured, else the next."""
    for name in ("clamor", "clamor (dataset API)", "clamor (run_stage)"):
        if rows.get(name, {}).get("status") == "ok":
            return name
    return None


def add_ratios(result: dict) -> None:
    rows = result["rows"]
    base = result["baseline"] = baseline(rows)
    if base is None:
        return
    b = rows[base]
    for name, row in rows.items():
        if row.get("status") == "ok" and name != base:
            row["task_ratio"] = row["per_task_us"] / b["per_task_us"]
            row["stage_ratio"] = row["per_stage_ms"] / b["per_stage_ms"]


def headline(result: dict) -> list[str]:
    base = result["baseline"]
    if base is None:
        return ["No Clamor row was measured, so there are no ratios."]
    out = (
        []
        if any(
            not n.startswith("clamor") and r.get("status") == "ok"
            for n, r in result["rows"].items()
        )
        else ["No peer was measured."]
    )
    for name, row in result["rows"].items():
        if name.startswith("clamor") or row.get("status") != "ok":
            continue
        t, s = row["task_ratio"], row["stage_ratio"]
        out.append(
            f"- **{name}/Clamor = {t:.1f}×** per task, **{s:.1f}×** per stage"
            + (f" (Clamor is **slower** than {name} per task)" if t < 1 else "")
            + (f" (Clamor is **slower** than {name} per stage)" if s < 1 else "")
        )
    return out


def ratio_cell(r: dict, key: str, is_base: bool) -> str:
    if is_base:
        return "1 (baseline)"
    if key not in r:
        return "—"
    return f"**{r[key]:.2f}×**"


def render(result: dict) -> str:
    m, p = result["machine"], result["parameters"]
    rows = result["rows"]
    base = result["baseline"]

    def row(*cells) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    def spread(xs: list[float], f: str) -> str:
        return f"{min(xs):{f}}–{max(xs):{f}}"

    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    lines = [
        f"# Overhead of empty tasks on {p['workers']} workers: Clamor vs. Dask, Ray, ipyparallel",
        "",
        (
            f"Run {result['date']} on `{m['hostname']}`: nproc {m['nproc']} "
            f"(cpu_count {m['cpu_count']}), {m['cpu']}, Linux {m['kernel']}, "
            f"Python {m['python']}. Packages: {pk}. Command: `{p['command']}` "
            f"(total {result['elapsed_s']:.0f} s), at commit `{result['git']['commit']}`"
            + (
                " with uncommitted changes"
                if result["git"].get("dirty", result["git"].get("runtime_dirty"))
                else ""
            )
            + f". Load average before / after: {result['loadavg_before']} / "
            f"{result['loadavg_after']}."
        ),
        "",
        (
            f"Parameters: {p['workers']} worker processes per system; per task: one stage of "
            f"N = {p['tasks']} empty tasks, wall time / N, median of R = {p['repeat']} "
            f"repetitions after one untimed warm-up batch of N; per stage: a stage of "
            f"{p['workers']} empty tasks, S = {p['stages']} in a row, wall time / S, median of "
            f"R = {p['repeat']} (after a warm-up of max(10, S/10) stages). Tasks are not "
            "pinned to workers (each scheduler places them), except in the `run_stage` "
            "row. Each system runs alone, in its own child process, one after the other "
            f"({', '.join(p['systems'])})."
        ),
        "",
    ]
    if base is not None:
        lines += [
            f"## Headline (peer ÷ Clamor; Clamor = `{base}` row)",
            "",
            *headline(result),
            "",
        ]
    lines += [
        "## Results",
        "",
        row(
            "system",
            "per task (µs)",
            "per stage (ms)",
            "per-task ratio ÷ Clamor",
            "per-stage ratio ÷ Clamor",
            "per task, min–max (µs)",
            "per stage, min–max (ms)",
            "start-up (s)",
            "other load (cores)",
            "API",
        ),
        row(*["---"] + ["---:"] * 8 + ["---"]),
    ]
    notes = []
    for name, r in rows.items():
        api = r.get("api", "")
        start = f"{r['startup_s']:.1f}" if r.get("startup_s") is not None else ""
        if r.get("status") != "ok":
            lines.append(
                row(name, "—", "—", "—", "—", "", "", start, "", f"{r['reason']}")
            )
            continue
        is_base = name == base
        lines.append(
            row(
                f"**{name}**" if is_base else name,
                f"{r['per_task_us']:.1f}",
                f"{r['per_stage_ms']:.2f}",
                ratio_cell(r, "task_ratio", is_base),
                ratio_cell(r, "stage_ratio", is_base),
                spread(r["per_task_runs_us"], ".1f"),
                spread(r["per_stage_runs_ms"], ".2f"),
                start,
                f"{r['load']['other_cores']:.2f}"
                + (" **perturbed**" if r["load"]["other_cores"] > BUSY_CORES else ""),
                api,
            )
        )
        if r.get("left_behind"):
            notes.append(
                f"- {name}: left {len(r['left_behind'])} process(es) behind after "
                "shutting down (killed by the benchmark): "
                + "; ".join(r["left_behind"])
            )
    for name, r in rows.items():
        if r.get("status") != "ok" and r.get("left_behind"):
            notes.append(
                f"- {name}: left {len(r['left_behind'])} process(es) behind (killed)"
            )
    lines += [
        "",
        (
            "Ratios above 1 mean the peer's overhead is higher than Clamor's. Start-up is "
            "the time to a cluster ready to run tasks (context only, not in the ratios). "
            "Other load: CPU used by processes outside the measured system during its "
            "timed runs (machine busy time from /proc/stat minus the system's own "
            f"processes); above {BUSY_CORES:g} cores the row is flagged as perturbed."
        ),
    ]
    if notes:
        lines += ["", "## Processes left behind", "", *notes]
    else:
        lines += ["", "Every system shut down cleanly: no process was left behind."]
    return "\n".join(lines) + "\n"
