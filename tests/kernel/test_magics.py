"""The %clamor / %%clamor magics through a real IPython shell (docs/user-guide.md, "In a notebook").

One cluster for the module, started and stopped through the magics (one paging
cluster per process). Output is what the user sees: stdout and stderr of
``shell.run_cell``.
"""

from __future__ import annotations

import _thread
import concurrent.futures
import gc
import re
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from clamor.kernel import session
from clamor.kernel.magics import cells, errors, parsing
from clamor.kernel.magics.progress import ProgressBar, progress
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import clamor

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("colors", "NoColor")
    ip.run_cell("%load_ext clamor")
    session.close()
    session.reset_config()
    yield ip
    session.close()
    session.reset_config()
    ip.reset()  # later tests expect an arena free of this module's arrays
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()


@pytest.fixture(scope="module")
def cluster(shell):
    result = shell.run_cell("%clamor start -n 2")
    assert result.success
    yield session.current()
    shell.run_cell("%clamor stop")


@pytest.fixture
def run(shell, cluster, capsys):
    """``run(source) -> (result, output)``; fails the test on an unexpected error."""
    capsys.readouterr()

    def run(source: str, ok: bool = True):
        result = shell.run_cell(source)
        captured = capsys.readouterr()
        output = ANSI.sub("", captured.out + captured.err)
        if ok and not result.success:
            pytest.fail(f"{source!r} failed:\n{output}")
        if not ok:
            assert not result.success, f"{source!r} should have failed:\n{output}"
            assert "Traceback (most recent call last)" not in output, output  # never a stack dump
        return result, output

    shell.push({"pts": list(range(20)), "np": np, "clamor": clamor})
    return run


def tasks_run(c) -> int:
    return c.stats()["tasks_run"]


# --- a magic before any cluster -------------------------------------------------------------


def test_a_magic_starts_the_default_cluster(shell, capsys):
    before = session.current()
    workers = None if before is None else len(before.workers)
    shell.run_cell("%clamor stop")
    shell.run_cell("%clamor config workers=1")
    shell.push({"pts": list(range(6))})
    capsys.readouterr()
    try:
        result = shell.run_cell("%%clamor map pts\nx + 1")
        out = ANSI.sub("", capsys.readouterr().out)
        assert result.success, out
        assert "starting the default cluster: 1 workers" in out
        assert session.current() is not None and session.current().workers == [0]
        assert shell.user_ns["_"].collect() == [1, 2, 3, 4, 5, 6]
    finally:
        session.set_config("workers", None)
        shell.run_cell("%clamor stop")
        if workers is not None:
            shell.run_cell(f"%clamor start -n {workers}")


# --- the cell operations ------------------------------------------------------------------------


def test_map_last_expression_and_underscore(run):
    result, out = run("%%clamor map pts --as p\ny = p * p\ny + 1")
    ds = result.result
    assert isinstance(ds, clamor.Dataset)
    assert "<Dataset" in out  # the cell's output
    assert run("_")[0].result is ds
    assert ds.collect() == [p * p + 1 for p in range(20)]


def test_last_statement_not_an_expression_gives_none(run):
    ds = run("%%clamor map pts\ny = x * 2")[0].result
    assert ds.collect() == [None] * 20
    ds = run("%%clamor map pts\nif x % 2:\n    'odd'\nelse:\n    'even'")[0].result
    assert ds.collect() == [None] * 20
    ds = run("%%clamor map pts\nif x % 2:\n    return 'odd'\n'even'")[0].result
    assert ds.collect() == ["odd" if x % 2 else "even" for x in range(20)]


def test_into_and_partitions(run, shell):
    result, _ = run("%%clamor map pts --into sq --partitions 3\nx ** 2")
    sq = shell.user_ns["sq"]
    assert sq is result.result and sq.num_partitions == 3
    assert sq.collect() == [x**2 for x in range(20)]
    again = run("%%clamor map sq --partitions 5 --into again\nx")[0].result  # a dataset: repartitioned
    assert again.num_partitions == 5 and sorted(again.collect()) == sorted(sq.collect())


def test_filter_flat_map_and_map_partitions(run):
    evens = run("%%clamor filter pts\nx % 2 == 0")[0].result
    assert evens.collect() == [x for x in range(20) if x % 2 == 0]
    pairs = run("%%clamor flat_map pts\n[x, -x]")[0].result
    assert pairs.collect() == [y for x in range(20) for y in (x, -x)]
    sums = run("%%clamor map_partitions pts --partitions 4 --as part\n[sum(part)]")[0].result
    assert sums.collect() == [sum(range(i * 5, i * 5 + 5)) for i in range(4)]


def test_reduce_is_an_action(run, shell):
    result, out = run("%%clamor reduce pts --as u,v --into total\nu + v")
    assert result.result == sum(range(20)) == shell.user_ns["total"]
    assert "190" in out
    shell.push({"arr": np.arange(10.0)})
    assert run("%%clamor reduce arr\nmax(a, b)")[0].result == 9.0


def test_body_uses_notebook_globals_snapshot(run, shell):
    shell.push({"k": 3, "offset": lambda v: v + 100})
    ds = run("%%clamor map pts\noffset(x * k)")[0].result
    shell.push({"k": 1000})  # rebinding after the magic: the dataset keeps its snapshot
    assert ds.collect() == [x * 3 + 100 for x in range(20)]


def test_workers_run_cells_without_ipython(run):
    ds = run("%%clamor map pts\nimport sys\n'IPython' in sys.modules or 'ipykernel' in sys.modules")[0].result
    assert ds.collect() == [False] * 20


def test_arena_global_is_demand_paged(run, shell, cluster):
    page = cluster.page_size
    big = clamor.asarray(np.arange(64 * page // 8, dtype=np.float64))  # 64 pages
    shell.push({"big": big, "idx": [0, 5 * page // 8, 40 * page // 8]})
    read = cluster.stats()["pages_read"]  # mapped in place on this host, or copied
    ds = run("%%clamor map idx --as i\nbig[i] * 2")[0].result
    assert ds.collect() == [2.0 * i for i in shell.user_ns["idx"]]
    pages = cluster.stats()["pages_read"] - read
    assert 1 <= pages < 64 // 2  # a few pages, not the array


# --- bad input ----------------------------------------------------------------------------------


def test_malformed_lines_print_usage(run):
    out = run("%%clamor map\nx", ok=False)[1]
    assert "required: SRC" in out and "usage: %%clamor map" in out
    out = run("%clamor kill w-x", ok=False)[1]
    assert "not a worker id" in out and "usage: %clamor kill WORKER" in out
    out = run("%%clamor map pts --partitions zero\nx", ok=False)[1]
    assert "--partitions" in out and "usage:" in out
    out = run("%%clamor reduce pts --as a\na", ok=False)[1]
    assert "reduce binds 2 names" in out
    out = run("%clamor map pts", ok=False)[1]
    assert "needs a cell body" in out
    out = run("%%clamor map pts --into 'a b'\nx", ok=False)[1]
    assert "not a valid variable name" in out
    out = run("%%clamor map pts\n# only a comment\n", ok=False)[1]
    assert "the cell body is empty" in out


def test_unknown_subcommand_lists_the_valid_ones(run):
    out = run("%clamor stats", ok=False)[1]
    assert "unknown subcommand 'stats'" in out and "did you mean 'status'" in out
    assert "valid: start, status, scale, stop, kill, slow, checkpoint, restore, config" in out
    out = run("%%clamor mapp pts\nx", ok=False)[1]
    assert "unknown operation 'mapp'" in out and "map, filter" in out


def test_unknown_source_names_what_exists(run, shell):
    shell.push({"n": 5, "a": np.zeros(3), "b": [1, 2]})
    out = run("%%clamor map ptz\nx", ok=False)[1]
    assert "no variable 'ptz'; datasets and arrays here: " in out
    listed = out.split("here: ")[1].strip().split(", ")
    assert {"a", "b", "pts"} <= set(listed) and "n" not in listed
    out = run("%%clamor map n\nx", ok=False)[1]
    assert "'n' (int) is not a dataset, array or sequence" in out


def test_syntax_error_is_reported_before_anything_is_sent(run, cluster):
    before = tasks_run(cluster)
    out = run("%%clamor map pts\ny = x\nfor\n", ok=False)[1]
    assert "line 3" in out and "SyntaxError" in out and "for" in out
    assert tasks_run(cluster) == before


def test_unpicklable_closure_names_the_variable(run, shell, cluster):
    shell.push({"lock": threading.Lock()})
    before = tasks_run(cluster)
    out = run("%%clamor map pts\nwith lock:\n    x", ok=False)[1]
    assert "SerializationError: cannot ship" in out and "global 'lock'" in out
    assert len(out.strip().splitlines()) <= 3
    assert tasks_run(cluster) == before


def _short_error_at_line_4(out: str) -> None:
    """The user sees the cell's frame, line 4 with its source, and the exception; no runtime frame."""
    assert "Traceback of the cell, on a worker" in out, out
    assert re.search(r'File "<clamor-cell-\d+>", line 4, in <clamor reduce>', out), out
    assert "raise ValueError(f'too big: {c}')" in out and "ValueError: too big:" in out
    assert "runtime/" not in out and len(out.strip().splitlines()) <= 6


def test_worker_exception_in_a_partial_points_at_the_cell_line(run):
    # one partition: the body fails inside the partial, in the stage's only task
    body = "c = a + b\nif c > 20:\n    raise ValueError(f'too big: {c}')\nc"
    out = run(f"%%clamor reduce pts --partitions 1\n{body}", ok=False)[1]
    _short_error_at_line_4(out)
    assert "too big: 21" in out  # 0 + 1 + ... + 6
    full = run("%clamor traceback")[1]
    assert "runtime/" in full and "line 4" in full and "partial" in full


def test_worker_exception_in_the_combine_points_at_the_cell_line(run, shell):
    # four partitions of [5, 5]: every partial is 10, so only combining two partials fails
    shell.push({"fives": [5] * 8})
    body = "c = a + b\nif c > 10:\n    raise ValueError(f'too big: {c}')\nc"
    out = run(f"%%clamor reduce fives --partitions 4\n{body}", ok=False)[1]
    _short_error_at_line_4(out)
    assert "too big: 20" in out
    full = run("%clamor traceback")[1]
    assert "combine" in full and "line 4" in full


def test_a_cell_raising_in_the_driver_points_at_the_cell_line():
    """Cell code run in this process (not a stage's task) is shortened the same way."""
    body = "c = a + b\nif c > 20:\n    raise ValueError(f'too big: {c}')\nc"
    cell = cells.compile_cell(body, ("a", "b"), {}, kind="reduce", header="%%clamor reduce pts")
    with pytest.raises(ValueError) as info:
        cell.fn(20, 6)
    text = errors.short_lines(info.value)[0]
    assert text.startswith("Traceback of the cell, in the driver"), text
    assert re.search(r'File "<clamor-cell-\d+>", line 4, in <clamor reduce>', text), text
    assert "raise ValueError(f'too big: {c}')" in text and text.endswith("ValueError: too big: 26")


def test_interrupt_keeps_the_cluster_usable(run, shell):
    """Ctrl-C during a stage, as a kernel gets it: SIGINT raises KeyboardInterrupt in the
    main thread. The handler is set for the test: a process started in the background by
    a non-interactive shell (``make test &`` in a script, nohup, some CI runners) starts
    with SIGINT ignored, Python leaves it so, and ``interrupt_main`` then does nothing.
    Pressed from 1 s on, every 0.3 s until the cell ends (a KeyboardInterrupt that lands
    in a finalizer is printed and dropped by Python)."""
    shell.push({"slowpts": list(range(24)), "time": time})
    done = threading.Event()

    def press_ctrl_c() -> None:
        if not done.wait(1.0):
            _thread.interrupt_main()
            while not done.wait(0.3):
                _thread.interrupt_main()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    try:
        out = run("%%clamor reduce slowpts\ntime.sleep(0.25)\na + b", ok=False)[1]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(SIGINT's handler before the test: {previous!r})") from None
    finally:
        try:  # a press that lands after the cell ended must not fail the test
            done.set()
            presser.join()
            time.sleep(0.01)
        except KeyboardInterrupt:
            pass
        signal.signal(signal.SIGINT, previous)
    assert "interrupted; the cluster is still usable" in out
    assert run("%%clamor reduce pts\na + b")[0].result == 190


# --- line subcommands -----------------------------------------------------------------------------


def test_status(run, cluster):
    out = run("%clamor status")[1]
    assert f"cluster at {cluster.address}: 2 of 2 workers alive" in out
    assert "pages read" in out and "mapped in place" in out
    header = next(line for line in out.splitlines() if line.startswith("worker"))
    assert header.split() == ["worker", "pid", "host", "alive", "tasks", "pages", "cached", "rss"]
    for w in cluster.worker_stats():
        assert re.search(rf"^{w['id']}\s+{w['pid']}\s+\S+\s+yes\s+\d+", out, re.MULTILINE), out


def test_slow_and_restore(run, cluster):
    pid = cluster.worker_pid(0)
    assert f"worker 0 (pid {pid}) now runs 10x slower" in run("%clamor slow 0")[1]
    assert "runs at full speed again" in run("%clamor slow 0 1")[1]
    assert "no worker 9; workers: 0, 1" in run("%clamor slow 9", ok=False)[1]
    assert "the factor must be at least 1" in run("%clamor slow 0 0.5", ok=False)[1]


def test_config(run, shell):
    out = run("%clamor config")[1]
    for key in session.OPTIONS:
        assert key in out
    out = run("%clamor config partitions=3 progress=off")[1]
    try:
        assert "partitions = 3" in out and "progress = False" in out
        assert session.config["partitions"] == 3 and session.config["progress"] is False
        assert run("%%clamor map pts\nx")[0].result.num_partitions == 3
    finally:
        run("%clamor config partitions=none progress=on")
    assert session.config["partitions"] is None and session.config["progress"] is True
    assert "needs a positive int" in run("%clamor config workers=-2", ok=False)[1]
    assert "did you mean 'workers'" in run("%clamor config wokers=2", ok=False)[1]
    assert "expected key=value" in run("%clamor config workers", ok=False)[1]
    assert "applies at the next" in run("%clamor config speculation=true")[1]
    run("%clamor config worker_memory=2GiB spill=disk")
    try:
        assert session.config["worker_memory"] == "2GiB" and session.config["spill"] == "disk"
    finally:
        run("%clamor config worker_memory=none spill=peer")
    assert "a size such as 4GiB" in run("%clamor config worker_memory=lots", ok=False)[1]
    assert "one of peer, disk" in run("%clamor config spill=tape", ok=False)[1]


RESTORE = """
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("colors", "NoColor")
ip.run_cell("%load_ext clamor")
assert ip.run_cell("%clamor restore {path}").success
w, meta = ip.user_ns["w"], ip.user_ns["meta"]
print("sum", w.sum(), "meta", meta, "arena", __import__("clamor").in_arena(w))
"""


def test_checkpoint_and_restore(run, shell, tmp_path):
    w = clamor.asarray(np.arange(300_000, dtype=np.float64))
    shell.push({"w": w, "meta": {"k": 3}})
    out = run(f"%clamor checkpoint {tmp_path}/ck w meta")[1]
    assert "checkpoint of w, meta to" in out and "continues in the background" in out
    from clamor.kernel.magics import commands

    assert commands.checkpoints[-1].wait(30)
    assert "done" in run("%clamor status")[1].split("checkpoint")[-1]
    assert "no variable 'nope'" in run(f"%clamor checkpoint {tmp_path}/ck2 nope", ok=False)[1]
    assert "CheckpointError" in run(f"%clamor restore {tmp_path}/missing", ok=False)[1]
    # this process's arena still holds the arrays: restore in a fresh one, like a new kernel
    fresh = subprocess.run([sys.executable, "-c", RESTORE.format(path=tmp_path / "ck")],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert "restored from" in fresh.stdout and "w, meta" in fresh.stdout
    assert f"sum {w.sum()} meta {{'k': 3}} arena True" in fresh.stdout
    run("del w, meta")
    shell.push({"lock": threading.Lock(), "small": [1, 2]})
    out = run(f"%clamor checkpoint {tmp_path}/everything")[1]
    assert "small" in out.split("started")[0] and "lock" in out.split("left out")[1]
    assert commands.checkpoints[-1].wait(30) and commands.checkpoints[-1].error is None


def test_lineage(run, shell):
    run("%%clamor map pts --partitions 4 --into kept\nx * 10")
    out = run("%clamor lineage kept")[1]
    assert out.count("not computed") >= 4
    run("kept.persist().count()")
    out = run("%clamor lineage kept")[1]
    rows = [line.split() for line in out.splitlines() if re.match(r"^\d+\s+held", line)]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert all(r[2] in ("0", "1") and r[3].isdigit() for r in rows)
    assert "from dataset" in out
    assert "datasets here: " in run("%clamor lineage pts", ok=False)[1]
    run("kept.unpersist(); del kept")


def test_views_print_their_text_summary_outside_a_notebook(run, shell):
    """A terminal IPython has no widget front end: the views print what they show."""
    with clamor.shared():
        shell.push({"hot": clamor.asarray(np.arange(200_000, dtype=np.float64))})
    run("%%clamor map_partitions pts --partitions 4 --into sums\n[float(hot[:50_000].sum()) + len(x)]")
    run("sums.collect()")
    out = run("%clamor heatmap hot")[1]
    assert "hot" in out and "pages" in out
    assert "arena pages" in run("%clamor heatmap")[1] or "pages" in run("%clamor heatmap")[1]
    assert "worker" in run("%clamor timeline")[1]
    assert "mapped in place" in run("%clamor replication")[1]  # one host: zero copy, nothing served
    out = run("%clamor dashboard")[1]
    assert out.startswith("Clamor dashboard:") and "worker" in out
    assert "holds no arena arrays" in run("%clamor heatmap pts", ok=False)[1]
    assert "no variable 'nope'" in run("%clamor heatmap nope", ok=False)[1]
    assert "not a dataset: 'hot'" in run("%clamor dashboard hot", ok=False)[1]
    run("del hot, sums")


def test_help_lists_every_subcommand(run):
    out = run("%clamor?")[1]
    for command in [*parsing.LINE_COMMANDS, *parsing.CELL_COMMANDS]:
        assert command in out
    assert "usage: %clamor SUBCOMMAND" in run("%clamor")[1]


@pytest.mark.filterwarnings("ignore:`Completer.complete` is pending deprecation")
def test_completion(shell, cluster):
    assert shell.complete("st", "%clamor st")[1] == ["start", "status", "stop"]
    assert shell.complete("m", "%%clamor m")[1] == ["map", "map_partitions"]
    shell.push({"kept_ds": cluster.range(3)})
    assert shell.complete("kep", "%clamor lineage kep")[1] == ["kept_ds"]
    assert "pts" in shell.complete("p", "%%clamor map p")[1]
    assert shell.complete("--i", "%%clamor map pts --i")[1] == ["--into"]
    assert shell.complete("part", "%clamor config part")[1] == ["partitions="]


# --- progress -----------------------------------------------------------------------------------


def test_progress_bar_in_a_terminal(run, shell):
    shell.push({"time": time, "slowpts": list(range(8))})
    run("%clamor config progress_delay=0")
    try:
        out = run("%%clamor reduce slowpts\ntime.sleep(0.1)\na + b")[1]
    finally:
        run("%clamor config progress_delay=1")
    assert "\r[" in out and "tasks" in out and " done" in out
    assert re.search(r"(\d+)/\1 tasks", out), out


def test_progress_disabled_and_quick_actions_show_nothing(run):
    assert "tasks" not in run("%%clamor reduce pts\na + b")[1]  # under the 1 s delay
    run("%clamor config progress=false progress_delay=0")
    try:
        assert "tasks" not in run("%%clamor reduce pts\na + b")[1]
    finally:
        run("%clamor config progress=true progress_delay=1")


def test_progress_bar_in_a_notebook(shell, cluster):
    ds = cluster.parallelize(list(range(6)), 6).map(lambda v: time.sleep(0.1) or v)
    with capture_output() as captured, progress(cluster, delay=0, notebook=True) as bar:
        assert ds.count() == 6
    assert isinstance(bar, ProgressBar)
    htmls = [o.data.get("text/html", "") for o in captured.outputs]
    assert any("<progress" in h for h in htmls)
    final = captured.outputs[-1].data
    assert re.match(r"\[#+\] (\d+)/\1 tasks, .* done$", final["text/plain"]), final
    assert "tasks/s" in final["text/plain"]
    assert "done" in final["text/html"]


# --- restarting ---------------------------------------------------------------------------------


def test_kill_a_worker_then_work_goes_on(run, cluster, shell):
    pid = cluster.worker_pid(1)
    out = run("%clamor kill 1")[1]
    assert f"worker 1 (pid {pid}) killed" in out
    assert re.search(r"^1\s+\d+\s+\S+\s+no: ", run("%clamor status")[1], re.MULTILINE)
    assert "already lost" in run("%clamor kill 1", ok=False)[1]
    assert run("%%clamor reduce pts\na + b")[0].result == 190
    run("%clamor start -n 2")


def test_start_refuses_to_lose_persisted_datasets(run, shell):
    old = session.current()
    shell.push({"mine": old})
    run("%%clamor map pts --into held\nx")
    run("held.persist().count()")
    out = run("%clamor start -n 3", ok=False)[1]
    assert "persisted datasets held would be lost" in out and "--force" in out
    assert session.current() is old
    out = run("%clamor start -n 3 --force")[1]
    assert "3 workers" in out and "cannot be used" in out
    assert session.current().workers == [0, 1, 2]
    assert shell.user_ns["mine"] is session.current()  # names of the old cluster follow
    assert "belongs to a cluster that was stopped" in run("%%clamor map held\nx", ok=False)[1]
    run("del held, mine")
    run("%clamor start -n 2 --force")


def test_scale_grows_and_shrinks_the_same_cluster_and_its_datasets_go_on(run):
    cluster = session.current()
    run("%%clamor map pts --into held\nx * 2")
    want = run("held.persist().collect()")[0].result
    out = run("%clamor scale 4")[1]
    assert "-> 4 workers" in out
    assert session.current() is cluster and len(cluster.workers) == 4
    out = run("%clamor scale 1")[1]
    assert "-> 1 workers" in out and len(cluster.workers) == 1
    assert run("held.collect()")[0].result == want  # partitions of the retired workers recomputed
    run("del held")
    run("%clamor scale 2")
    assert len(cluster.workers) == 2


def test_stop_then_status(shell, cluster, capsys):
    shell.run_cell("%clamor stop")
    shell.run_cell("%clamor status")
    shell.run_cell("%clamor stop")
    out = capsys.readouterr().out
    assert "cluster stopped" in out and "no cluster is running" in out
    shell.run_cell("%clamor start -n 2")


# --- building blocks ------------------------------------------------------------------------------


def test_session_config_validation():
    assert session.set_config("partitions", "4") == 4
    session.set_config("partitions", None)
    with pytest.raises(KeyError, match="unknown config key 'nope'"):
        session.set_config("nope", 1)
    with pytest.raises(ValueError, match="config 'progress' needs true or false"):
        session.set_config("progress", "maybe")
    with pytest.raises(ValueError, match="one of auto, shm, tcp"):
        session.set_config("transport", "udp")


def test_compile_cell_line_numbers_and_snapshot():
    compiled = cells.compile_cell("y = x + k\n\n1 / y", ["x"], {"k": 1, "unused": 2}, header="%%clamor map a")
    assert compiled.captured == ("k",)
    assert compiled.fn(1) == 0.5
    with pytest.raises(ZeroDivisionError) as info:
        compiled.fn(-1)
    lines = errors.short_lines(info.value)[0]
    assert f'File "{compiled.filename}", line 4' in lines and "1 / y" in lines
    with pytest.raises(SyntaxError) as syntax:
        cells.compile_cell("a = (\n", ["x"], {})
    assert syntax.value.filename.startswith(cells.CELL_FILE_PREFIX)


def test_remote_frames_keep_the_cell_and_what_it_called():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/runtime/ops.py", line 112, in __call__\n'
        "    return [self.f(x) for x in items(part)]\n"
        '  File "<clamor-cell-999>", line 3, in <clamor map>\n'
        '  File "/lib/helper.py", line 9, in helper\n'
        "    raise KeyError(k)\n"
        "KeyError: 'k'\n"
    )
    cells.register_source("<clamor-cell-999>", "%%clamor map a\ny = x\nhelper(y)\n")
    frames, tail = errors.remote_frames(text)
    assert frames == [
        '  File "<clamor-cell-999>", line 3, in <clamor map>',
        "    helper(y)",
        '  File "/lib/helper.py", line 9, in helper',
        "    raise KeyError(k)",
    ]
    assert tail == ["KeyError: 'k'"]


def test_progress_bar_counts_without_a_cluster_call():
    snaps = iter([
        {"stages": {}, "workers": {0: {"running": 0, "tasks_done": 5}}},
        {"stages": {7: {"total": 4, "done": 1}}, "workers": {0: {"running": 1, "tasks_done": 6}}},
        {"stages": {}, "workers": {0: {"running": 0, "tasks_done": 9}}},
    ])  # fmt: skip
    fake = SimpleNamespace(scheduler_snapshot=lambda: next(snaps))
    bar = ProgressBar(fake, notebook=False)
    bar.poll()
    bar.poll()
    assert (bar.done, bar.total) == (1, 4) and "w0:1+1" in bar.text()
    bar.started -= 2.0  # 1 task in 2 s: 0.5 a second, 3 to go
    assert ", 0.5 tasks/s, ETA 6 s |" in bar.text() and "ETA" not in bar.text("done")
    bar.poll()
    assert (bar.done, bar.total) == (4, 4)
    bar.succeeded = False
    assert bar.done == 4  # by the workers' counts


def test_progress_bar_counts_the_bytes_workers_read_from_the_arena():
    reads = iter([0, 1 << 20, 3 << 20])
    snap = {"stages": {1: {"total": 2, "done": 1}}, "workers": {0: {"running": 1, "tasks_done": 1}}}
    fake = SimpleNamespace(scheduler_snapshot=lambda: snap,
                           paging=SimpleNamespace(stats=lambda: {"bytes_mapped": next(reads)}))  # fmt: skip
    bar = ProgressBar(fake, notebook=False)
    bar.poll()
    bar.poll()
    assert "1.0 MiB paged" in bar.text()
    bar.poll()
    assert "3.0 MiB paged" in bar.text()


def test_background_runs_the_cell_off_the_kernel_thread_and_gives_a_future(run, shell):
    """``--background``: the cell returns at once with a future of the work's result (a
    dataset collected, a reduction's value); the kernel runs other cells meanwhile."""
    started = time.monotonic()
    result, _ = run("%%clamor map pts --background --into later\nimport time\ntime.sleep(0.3)\nx * 2")
    assert time.monotonic() - started < 1.0  # 20 elements on 2 workers would take longer
    future = shell.user_ns["later"]
    assert isinstance(future, concurrent.futures.Future) and result.result is future
    assert run("1 + 1")[0].result == 2  # the kernel goes on
    assert future.result(timeout=60) == [2 * i for i in range(20)]
    total = run("%%clamor reduce pts --background\na + b")[0].result
    assert total.result(timeout=60) == 190
    failed = run("%%clamor map pts --background\n1 / 0")[0].result
    assert isinstance(failed.exception(timeout=60), ZeroDivisionError)
