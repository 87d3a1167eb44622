"""The driver's scattered writes to an arena array, without a write trap per page.

Between stages the driver's first write to each arena page is trapped (one write-protect
fault per OS page), so that the next stage knows which pages to invalidate. A parameter
server's update writes a few values into each of thousands of pages of a large array:
``w[ids] -= step * g[ids]`` with 20,000 scattered ids took 10.8 ms on 16 cores and 20 ms
on the 2-core VM, against 0.6 ms in plain memory, all of it in those faults.
:func:`write` knows the pages from the index: it marks them written as the traps would
(old bytes kept where a stage or lineage needs them) and copies the rows in through an
untracked mapping of the arena, in one native call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from clamor.runtime.paging import arena
from clamor.runtime.paging.native import _native
from clamor.runtime.paging.pager import contiguous_rows, rows_layout

ffi, lib = _native.ffi, _native.lib


def write(array: np.ndarray, index: Any, values: Any) -> None:
    """``array[index] = values``, for an arena array on the driver, without a page fault
    per page written: for sparse updates of a large array between stages::

        w = clamor.empty(10**8)
        ...
        ids = np.unique(batch_ids)
        clamor.write(w, ids, w[ids] - step * g[ids])    # not w[ids] -= step * g[ids]

    ``index`` selects along the first axis (integers, negative ones from the end, a slice
    or a boolean mask); ``values`` broadcast and cast as numpy's assignment does; a row
    given twice ends with its last value. The next stage's tasks read the new values, and
    a stage replaying an older epoch reads the old ones, as after any write. Anywhere the
    native path does not apply it is ``array[index] = values``: an array outside the arena,
    a write while a stage runs (its readers must be stopped page by page), rows that are
    not contiguous, an index of several axes, or on a worker (where arena arrays are
    read-only and numpy says so).
    """
    writable = isinstance(array, np.ndarray) and array.flags.writeable and arena.in_arena(array)
    rows = contiguous_rows(array, index, "write") if writable else None
    if rows is None:
        array[index] = values
        return
    shape, row_bytes = rows_layout(array, index, rows)
    out = np.empty(shape, array.dtype)
    out[...] = values  # numpy's broadcasting and casting, as array[index] = values
    if not len(rows):
        return
    offsets = arena.arena_offset(array) + rows * array.strides[0]
    rc = lib.clamor_driver_write_rows(ffi.from_buffer("int64_t[]", offsets), len(rows),
                                      ffi.from_buffer("uint8_t[]", out), row_bytes)  # fmt: skip
    if rc == 1:  # no pager runs, or a stage runs: the ordinary way
        array[index] = values
    elif rc:
        raise IndexError("a row to write lies outside the arena")
