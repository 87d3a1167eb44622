"""Checkpoints (runtime/data/checkpoint.py): copy-on-write while the notebook keeps writing,
restore in a fresh process after the driver was killed, and clear errors for
missing, unfinished, corrupt or clashing checkpoints.

A process has one paging cluster at a time and restored arrays must land at
their old offsets, so restores run in fresh interpreters (subprocesses).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from clamor.runtime.data import checkpoint, checkpoint_files
from clamor.runtime.data.checkpoint import CheckpointError
from clamor.runtime.errors import SerializationError
from clamor.runtime.paging import arena

import clamor


def run_script(code: str, *args: str, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter; the JSON it prints last."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- copy-on-write ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=2) as c:
        yield c


def test_checkpoint_holds_the_arena_as_it_was_at_start(cluster, tmp_path):
    gc.collect()
    others = arena.arena_stats()["used"]  # arrays earlier tests in this process left alive: stored too
    n = 8_000_000  # 64 MiB: the writes below overtake the background writer
    a = clamor.asarray(np.arange(n, dtype=np.float64))
    b = clamor.array((1000, 1000), np.int32, fill=7)
    z = clamor.array(16_000_000)  # 128 MiB never written: neither read nor stored
    cluster.run(lambda x: float(x[::4096].sum()), a)  # the workers hold pages of `a`
    ds = cluster.parallelize(np.arange(40), 4).map(lambda x: x * 3).persist()
    ds.count()

    copies = cluster.stats()["driver"]["cow_copies"]
    handle = checkpoint.start(cluster, tmp_path / "ck", {"a": a, "b": b, "z": z}, {"tripled": ds})
    a[:] = -1.0  # right after start, before the pages are written
    b[::2] = 0
    assert cluster.checkpoints.pinned() in ([handle.epoch], [])
    assert cluster.run(lambda x: float(x[:4].sum()), a) == -4.0  # stages see the new values
    a[:] = -2.0  # and again, after a newer epoch
    manifest = handle.result(timeout=120)

    assert handle.done() and handle.error is None
    assert manifest["epoch"] == handle.epoch == cluster.checkpoints.latest
    assert cluster.checkpoints.pinned() == []
    assert cluster.stats()["driver"]["cow_copies"] > copies  # the writes were copied first
    image = checkpoint_files.open_image(tmp_path / "ck")
    off = arena.arena_offset(a)
    np.testing.assert_array_equal(image[off : off + a.nbytes].view(np.float64), np.arange(n))
    off = arena.arena_offset(b)
    np.testing.assert_array_equal(image[off : off + b.nbytes].view(np.int32), 7)
    assert manifest["variables"]["names"] == ["a", "b", "z"]
    assert manifest["pages"]["zero"] >= z.nbytes // cluster.page_size - 1
    stored = os.stat(tmp_path / "ck" / "pages.bin").st_blocks * 512
    assert stored < a.nbytes + b.nbytes + others + (8 << 20)
    assert a.nbytes + b.nbytes + (8 << 20) < manifest["pages"]["bytes"]
    assert manifest["datasets"]["tripled"]["partitions"] == 4
    assert not os.path.exists(tmp_path / "ck.tmp")
    assert a[0] == -2.0  # the notebook's own state is untouched

    again = checkpoint.start(cluster, tmp_path / "ck", {"a": a})  # replaces the old one
    again.result(timeout=120)
    image = checkpoint_files.open_image(tmp_path / "ck")
    off = arena.arena_offset(a)
    assert (image[off : off + a.nbytes].view(np.float64) == -2.0).all()
    assert not os.path.exists(tmp_path / "ck.old")


def test_checkpoint_refuses_what_it_cannot_save(cluster, tmp_path):
    import threading

    with pytest.raises(SerializationError, match="variable 'lock'"):
        checkpoint.start(cluster, tmp_path / "x", {"ok": 1, "lock": threading.Lock()})
    lazy = cluster.parallelize(range(10), 2)
    with pytest.raises(CheckpointError, match="not persisted"):
        checkpoint.start(cluster, tmp_path / "x", datasets={"lazy": lazy})
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "x.tmp")
    assert cluster.checkpoints.pinned() == []


# --- kill the driver, restore in a new one ----------------------------------------------

DRIVER = """
import json, sys, time
import numpy as np
from sklearn.neighbors import KDTree
import clamor
from clamor.runtime.data import checkpoint

path, work = sys.argv[1], sys.argv[2]
clamor.configure(page_size=64 << 10)
rng = np.random.default_rng(0)
points = rng.random((60_000, 3))
with clamor.shared():
    tree = KDTree(clamor.asarray(points), leaf_size=30)
a = clamor.asarray(np.arange(2_000_000, dtype=np.float64))
queries = rng.random((300, 3))
dist, idx = tree.query(queries, k=5)
np.save(work + "/queries.npy", queries)
np.save(work + "/idx.npy", idx)
cluster = clamor.Cluster(workers=2)
ds = cluster.parallelize(a, 4).map_partitions(lambda x: x * 2).persist()
assert ds.count() == len(a)
handle = checkpoint.start(cluster, path, {"a": a, "tree": tree, "note": "hello"}, {"doubled": ds})
a[:] = -1  # after the checkpoint's start: not in it
handle.result(timeout=120)
pids = [cluster.worker_pid(w) for w in cluster.workers]
print(json.dumps({"epoch": handle.epoch, "workers": pids}), flush=True)
time.sleep(600)
"""

RESTORE = """
import json, sys
import numpy as np
import clamor
from clamor.runtime.paging import arena
from clamor.runtime.data import checkpoint

path, work = sys.argv[1], sys.argv[2]
r = checkpoint.restore(path)
a, tree = r["a"], r["tree"]
out = {"epoch": r.epoch, "page_size": arena.page_size(), "note": r["note"]}
out["a_equal"] = bool(np.array_equal(a, np.arange(2_000_000, dtype=np.float64)))
out["writable"] = bool(a.flags.writeable and np.asarray(tree.data).flags.writeable)
out["in_arena"] = bool(clamor.in_arena(a) and clamor.in_arena(np.asarray(tree.data)))
queries, expected = np.load(work + "/queries.npy"), np.load(work + "/idx.npy")
out["tree_equal"] = bool(np.array_equal(tree.query(queries, k=5)[1], expected))
parts = r.partitions["doubled"]
out["partitions"] = len(parts)
out["parts_equal"] = bool(np.array_equal(np.concatenate(parts), 2 * np.arange(2_000_000.0)))
fresh = clamor.array(1000)  # a new allocation never overlaps the restored blocks
out["no_overlap"] = all(not (o <= arena.arena_offset(fresh) < o + s) for o, s in r.blocks)
with clamor.Cluster(workers=2) as cluster:
    ds = r.to_datasets(cluster)["doubled"]
    out["ds_sum"] = float(ds.map_partitions(lambda x: x + 1).sum())
    out["ds_persisted"] = ds.is_persisted and None not in ds.locations()
    out["remote_tree"] = bool(np.array_equal(
        cluster.run(lambda t, q: t.query(q, k=5)[1], tree, queries, worker=1), expected))
    out["remote_a"] = float(cluster.parallelize(a, 4).sum())
    a[:10] = 1000.0  # the restored arena keeps versioning: workers see the update
    out["remote_a_after"] = float(cluster.run(lambda x: float(x[:10].sum()), a))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_kill_the_driver_then_restore_in_a_new_process(tmp_path):
    path, work = str(tmp_path / "ck"), str(tmp_path)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, path, work],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        line = driver.stdout.readline()
        assert line, driver.stderr.read()[-4000:]
        info = json.loads(line)
        workers = info["workers"]
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in workers):
            assert time.monotonic() < deadline, "workers outlived their killed driver"
            time.sleep(0.1)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in workers:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
        driver.stdout.close()
        driver.stderr.close()

    out = run_script(RESTORE, path, work, timeout=240)
    assert out["epoch"] == info["epoch"] and out["page_size"] == 64 << 10
    assert out["note"] == "hello"
    assert out["a_equal"] and out["writable"] and out["in_arena"] and out["tree_equal"]
    assert out["partitions"] == 4 and out["parts_equal"] and out["no_overlap"]
    n = 2_000_000
    assert out["ds_sum"] == float(2 * np.arange(n, dtype=np.float64).sum() + n)
    assert out["ds_persisted"] and out["remote_tree"]
    assert out["remote_a"] == float(np.arange(n, dtype=np.float64).sum())
    assert out["remote_a_after"] == 10_000.0


# --- errors ------------------------------------------------------------------------------


@pytest.fixture
def small_checkpoint(tmp_path):
    """A checkpoint written by another process (so this one's arena does not hold it)."""
    path = str(tmp_path / "ck")
    run_script(
        """
        import json, sys
        import numpy as np
        import clamor
        from clamor.runtime.data import checkpoint
        a = clamor.asarray(np.arange(300_000, dtype=np.int64))
        m = checkpoint.start(None, sys.argv[1], {"a": a}).result()
        print(json.dumps(m["pages"]))
        """,
        path,
    )
    return path


def test_missing_unfinished_and_corrupt_checkpoints_are_refused(small_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        checkpoint.restore(tmp_path / "nothing")
    os.makedirs(tmp_path / "half.tmp")
    with pytest.raises(CheckpointError, match="unfinished"):
        checkpoint.restore(tmp_path / "half")
    manifest_path = os.path.join(small_checkpoint, "manifest.json")
    with open(manifest_path) as f:
        good = f.read()
    for broken, message in [
        ("{not json", "not valid JSON"),
        (json.dumps({**json.loads(good), "version": 99}), "format version 99"),
        (json.dumps({k: v for k, v in json.loads(good).items() if k != "allocations"}), "incomplete"),
    ]:
        with open(manifest_path, "w") as f:
            f.write(broken)
        with pytest.raises(CheckpointError, match=message):
            checkpoint.restore(small_checkpoint)
    with open(manifest_path, "w") as f:
        f.write(good)
    os.remove(os.path.join(small_checkpoint, "variables.pkl"))
    with pytest.raises(CheckpointError, match="variables.pkl is missing"):
        checkpoint.restore(small_checkpoint)


def test_truncated_or_damaged_pages_and_clashing_arenas_are_refused(small_checkpoint):
    out = run_script(
        """
        import json, os, sys
        import numpy as np
        import clamor
        from clamor.runtime.paging import arena
        from clamor.runtime.data import checkpoint
        path = sys.argv[1]
        pages = os.path.join(path, "pages.bin")
        out = {}
        def attempt(key):
            try:
                checkpoint.restore(path)
                out[key] = "restored"
            except checkpoint.CheckpointError as exc:
                out[key] = str(exc)
        with open(pages, "r+b") as f:
            f.seek(4096 * 3 + 17)
            byte = f.read(1)
            f.seek(4096 * 3 + 17)
            f.write(bytes([byte[0] ^ 0xFF]))
        attempt("flipped")
        out["freed_after_failure"] = arena.arena_stats()["allocations"] == 0
        with open(pages, "r+b") as f:
            f.seek(4096 * 3 + 17)
            f.write(byte)
        size = os.path.getsize(pages)
        os.truncate(pages, size - 1)
        attempt("truncated")
        os.truncate(pages, size)  # the last byte lies past the block: it was a zero
        r = checkpoint.restore(path)
        out["ok"] = bool(np.array_equal(r["a"], np.arange(300_000)))
        attempt("clash")  # the blocks are in use now
        print(json.dumps(out))
        """,
        small_checkpoint,
    )
    assert "does not match its CRC" in out["flipped"] and out["freed_after_failure"]
    assert "pages.bin has" in out["truncated"]
    assert out["ok"]
    assert "already holds data" in out["clash"]


def test_reserve_and_live_blocks():
    a = arena.get_arena()
    offset = a.size - (1 << 20)
    arena.reserve(offset, 1 << 20)
    try:
        assert (offset, 1 << 20) in arena.live_blocks()
        with pytest.raises(clamor.ClamorError, match="already in use"):
            arena.reserve(offset + 4096, 4096)
        with pytest.raises(clamor.ClamorError, match="4 KiB"):
            arena.reserve(offset - 100, 4096)
    finally:
        arena.release(offset)
    assert (offset, 1 << 20) not in arena.live_blocks()
