"""Shipping by reference: arena arrays travel as ArenaRefs, everything else by value."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import types

import numpy as np
import pytest
from clamor.demo import geodata
from clamor.runtime.net import shipping
from clamor.runtime.paging import arena
from sklearn.neighbors import KDTree

import clamor

PAGE = arena.page_size()


def test_an_arena_array_ships_as_a_few_bytes_and_comes_back_as_a_view():
    x = clamor.array(1 << 20, np.float64)  # 8 MiB
    x[::1000] = 7.0
    payload = shipping.dumps({"x": x, "view": x[10:500_000:3]})
    assert len(payload) < 2000
    back = shipping.loads(payload)
    assert np.array_equal(back["x"], x) and np.array_equal(back["view"], x[10:500_000:3])
    assert arena.arena_offset(back["x"]) == arena.arena_offset(x)
    assert not back["x"].flags.writeable


def test_negative_strides_and_2d_views_round_trip():
    x = clamor.array((512, 1024), np.float32)
    x[:] = np.arange(x.size, dtype=np.float32).reshape(x.shape)
    for view in (x[::-1], x[:, ::-2], x.T, x[100:200, 3]):
        assert np.array_equal(shipping.loads(shipping.dumps(view)), view)


def test_functions_by_value_keep_the_file_their_code_came_from():
    """Tracebacks on workers name the cell or notebook input (cloudpickle alone says
    ``<dynamic-code>`` since 3.1.3)."""
    scope: dict = {}
    exec(compile("def f(x):\n    return 1 / x\n", "<ipython-input-7>", "exec"), scope)  # noqa: S102 - a notebook cell
    back = shipping.loads(shipping.dumps(scope["f"]))
    assert back.__code__.co_filename == "<ipython-input-7>" and back(4) == 0.25
    with pytest.raises(ZeroDivisionError) as info:
        back(0)
    assert info.traceback[-1].frame.code.raw.co_filename == "<ipython-input-7>"


def cell(source: str) -> dict:
    """The namespace of a notebook cell that ran ``source`` (its functions pickle by value)."""
    scope: dict = {"__name__": "__main__"}
    exec(compile(source, "<clamor-cell-1>", "exec"), scope)  # noqa: S102 - a notebook cell
    return scope


def test_a_program_packed_again_with_the_same_immutable_inputs_is_not_pickled_again():
    scope = cell("import math\nK = 3\ndef f(ctx, *, z=2):\n    return K * z + math.pi\n")
    first = shipping.pack_program(scope["f"])
    assert shipping.pack_program(scope["f"]) is first  # an iterative loop's next stage
    scope["K"] = 4  # a global it reads, rebound: pickled again, with the new value
    second = shipping.pack_program(scope["f"])
    assert second is not first and shipping.loads(second)(None) == 8 + math.pi


def test_a_program_with_a_mutable_input_is_pickled_every_time():
    scope = cell("W = [1.0]\ndef f(ctx):\n    return W[0]\n")
    assert shipping.loads(shipping.pack_program(scope["f"]))(None) == 1.0
    scope["W"][0] = 2.0  # the same list, changed in place
    assert shipping.loads(shipping.pack_program(scope["f"]))(None) == 2.0


def test_small_heap_and_object_arrays_travel_by_value():
    small = clamor.array(PAGE // 16, np.float64)  # half a page: cheaper by value
    heap = np.ones(1 << 18)
    objects = np.array([{"a": 1}, None], dtype=object)
    assert arena.in_arena(small) and not arena.in_arena(heap)
    for x in (small, heap, objects):
        back = shipping.loads(shipping.dumps(x))
        assert np.array_equal(back, x)
        assert not arena.in_arena(back)
    assert len(shipping.dumps(heap)) > heap.nbytes


PLAIN = [np.arange(1024), np.zeros((3, 4), np.float32), np.array(3.5), np.zeros((0, 3)), np.arange(3, dtype=">i4"),
         np.array(["ab", "c"]), np.array([b"x"]), np.ones(3, bool), np.ones(2, np.complex128), np.ones(3, np.float16)]
OTHERS = [np.array(["2020-01-01"], dtype="M8[ns]"), np.array([5], dtype="m8[s]"), np.zeros((2, 3), order="F"),
          np.arange(10)[::2], np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
          np.zeros(2, dtype=np.dtype("i4", metadata={"unit": "m"}))]


@pytest.mark.parametrize("x", PLAIN + OTHERS, ids=lambda x: f"{x.dtype.str}{list(x.shape)}")
def test_an_array_by_value_comes_back_as_numpys_pickle_would_bring_it(x):
    for writeable in (True, False):
        x = x.copy(order="K") if writeable else x
        x.flags.writeable = writeable
        back, numpys = shipping.loads(shipping.dumps(x)), pickle.loads(pickle.dumps(x, pickle.HIGHEST_PROTOCOL))
        for a in (back, numpys):
            assert a.dtype == x.dtype and a.dtype.str == x.dtype.str
            assert dict(a.dtype.metadata or {}) == dict(x.dtype.metadata or {})  # numpy 2.0: {} or None
            assert a.shape == x.shape and np.array_equal(a, x)
        assert back.flags.writeable == numpys.flags.writeable
        assert back.flags.c_contiguous == numpys.flags.c_contiguous
        assert back.flags.f_contiguous == numpys.flags.f_contiguous


def test_a_plain_array_ships_as_its_bytes_and_its_dtypes_name():
    """Not numpy's reduction, which pickles the dtype object through the pickler's hooks
    (twice the time for an 8 KiB array)."""
    for x in PLAIN:
        data = shipping.dumps(x)
        assert b"dtype" not in data and len(data) < x.nbytes + 200, x
    assert all(b"dtype" in shipping.dumps(x) for x in OTHERS)


@pytest.fixture(scope="module")
def tree_and_points():
    points = geodata.scaled_points(1_000_000, seed=3)
    with clamor.shared():
        # KDTree keeps a float64 C-contiguous input as is, so the input must be in the arena too.
        tree = KDTree(clamor.asarray(points), leaf_size=40)
    return tree, points


def tree_pages(tree: KDTree, page_size: int) -> set[int]:
    pages: set[int] = set()
    for a in tree.get_arrays():
        if arena.in_arena(a):
            off = arena.arena_offset(a)
            pages.update(range(off // page_size, (off + a.nbytes - 1) // page_size + 1))
    return pages


def test_a_kdtree_built_in_shared_lives_in_the_arena_and_ships_by_reference(tree_and_points):
    tree, _ = tree_and_points
    data, idx_array, _node_data, node_bounds = tree.get_arrays()
    assert arena.in_arena(data) and arena.in_arena(idx_array) and arena.in_arena(node_bounds)
    payload = shipping.dumps(tree)
    assert len(payload) < 64 << 10  # the tree is > 24 MiB
    back = shipping.loads(payload)
    q = np.array([[37.77, -122.42]])
    assert np.array_equal(back.query(q, k=10)[1], tree.query(q, k=10)[1])


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [4 << 10, 256 << 10, 4 << 20], ids=["4KiB", "256KiB", "4MiB"])
def test_kdtree_queries_on_a_worker_fetch_a_small_fraction_of_the_tree(tree_and_points, page_size):
    tree, points = tree_and_points
    rng = np.random.default_rng(0)
    region = points[geodata.in_region(points, ((37.3, 37.9), (-122.5, -121.9)))]  # around San Francisco
    queries = region[rng.integers(0, len(region), 200)] + rng.normal(scale=0.01, size=(200, 2))
    expected_dist, expected_idx = tree.query(queries, k=10)

    with clamor.Cluster(workers=1, page_size=page_size, transport="tcp") as c:
        dist, idx = c.run(lambda t, q: t.query(q, k=10), tree, queries)
        fetched = c.worker_stats()[0]["pages_fetched"]
    assert np.array_equal(idx, expected_idx) and np.allclose(dist, expected_dist)
    total = len(tree_pages(tree, page_size))
    # At 4 MiB the whole tree is 7 pages; a query cannot touch fewer than 2 (data and index).
    assert fetched <= max(0.25 * total, 2), (fetched, total)


def test_the_arguments_a_stages_calls_share_are_pickled_once():
    table = np.arange(100_000, dtype=np.int64)  # 800 KB, not in the arena: by value
    calls = [(np.take, (table, [i]), None) for i in range(50)]
    packed = shipping.pack_calls(calls)
    assert len(packed.payloads) == 50
    assert table.nbytes < len(packed.shared) < 2 * table.nbytes  # once, with np.take
    assert max(map(len, packed.payloads)) < 200
    # a call alone carries everything in its own payload
    alone = shipping.pack_calls(calls[:1])
    assert alone.shared == b"" and len(alone.payloads[0]) > table.nbytes


def appended(items: list, value: object) -> list:
    items.append(value)
    return items


def test_a_packed_call_runs_with_fresh_copies_of_the_shared_objects():
    from clamor.runtime.stage import TaskContext

    shared = ["x"]
    packed = shipping.pack_calls([(appended, (shared, i), None) for i in range(3)])
    runner = shipping.loads(shipping.dumps(shipping.CallRunner(packed.shared)))  # as a worker has it
    results = [runner(TaskContext(i, (), None, None, p)) for i, p in enumerate(packed.payloads)]
    assert results == [["x", 0], ["x", 1], ["x", 2]] and shared == ["x"]


def _as_a_worker_runs(calls: list) -> list:
    """The calls packed, then run one after another by one unpickled runner (a stage's
    calls on one worker)."""
    from clamor.runtime.stage import TaskContext

    packed = shipping.pack_calls(calls)
    runner = shipping.loads(shipping.dumps(shipping.CallRunner(packed.shared)))
    return [runner(TaskContext(i, (), None, None, p)) for i, p in enumerate(packed.payloads)]


def test_a_stages_shared_function_is_loaded_once_per_worker_and_keeps_its_state_between_calls():
    def count(table, key, seen=[]):  # noqa: B006 - the state under test
        seen.append(key)
        return len(seen), int(table[key])

    table = np.arange(4)
    table.flags.writeable = False  # as an arena array reaches a worker
    assert _as_a_worker_runs([(count, (table, k), None) for k in range(3)]) == [(1, 0), (2, 1), (3, 2)]


def test_a_shared_writable_array_is_each_calls_own_copy():
    def bump(a, i):
        a[i] += 1
        return a.tolist()

    a = np.zeros(3, np.int64)
    assert _as_a_worker_runs([(bump, (a, i), None) for i in range(3)]) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert a.tolist() == [0, 0, 0]


def test_a_call_that_cannot_be_pickled_is_named_among_many():
    import threading

    lock = threading.Lock()
    calls = [(abs, (-1,), None), (abs, (-2,), None), (len, (lock,), None)]
    with pytest.raises(clamor.SerializationError, match="argument 0"):
        shipping.pack_calls(calls)


def _scan_for_submodules(code, packages) -> set[str]:
    """cloudpickle's rule, as cloudpickle applies it (a scan of every imported module): a
    submodule of a package the function names counts when each part of its name after
    the package's is a name in the code."""
    found = set()
    for package in packages:
        if isinstance(package, types.ModuleType) and getattr(package, "__package__", None):
            prefix = package.__name__ + "."
            found |= {name for name in list(sys.modules)
                      if name.startswith(prefix) and set(name[len(prefix):].split(".")) <= set(code.co_names)}  # fmt: skip
    return found


def test_a_function_by_value_takes_the_submodules_its_code_reaches_as_cloudpickle_would():
    import concurrent.futures
    import email.mime.text  # imported, but the function never names mime
    import xml.etree.ElementTree

    scope = {"concurrent": concurrent, "xml": xml, "email": email, "np": np, "math": math}
    exec("def f():\n    return (concurrent.futures.Future, xml.etree.ElementTree.Element,\n"  # noqa: S102 - a cell
         "            np.linalg.norm, email.utils, math.pi)", scope)  # fmt: skip
    code, packages = scope["f"].__code__, [concurrent, xml, email, np, math]
    found = {m.__name__ for m in shipping._imported_submodules(code, packages)}
    assert found == _scan_for_submodules(code, packages)
    assert {"concurrent.futures", "xml.etree", "xml.etree.ElementTree", "numpy.linalg"} <= found
    assert "email.mime.text" not in found


def test_a_function_using_a_submodule_its_package_does_not_import_runs_in_a_fresh_interpreter():
    import xml.etree.ElementTree

    scope = {"xml": xml, "__name__": "__main__"}
    exec("def f():\n    return xml.etree.ElementTree.fromstring('<a>7</a>').text", scope)  # noqa: S102 - a cell
    payload = shipping.dumps(scope["f"])
    run = subprocess.run([sys.executable, "-c", "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read())())"],
                         input=payload, capture_output=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().strip() == "7"
