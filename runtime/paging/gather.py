"""A task's rows of an arena array, without bringing in their pages.

A task that reads a few scattered rows of a large array (a parameter server's weights,
an embedding table) makes each row's whole page resident: 4 KiB or more for an 8-byte
weight. On the driver's host that costs a mapping per page, and an invalidation per
page the driver rewrites; on another host it costs a page on the link per row, 500
times the bytes the task reads. :func:`gather` copies the rows' bytes alone: from the
driver's memory on its host, from the driver over the page protocol elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from clamor.runtime.paging.pager import (
    contiguous_rows,
    prefetch,
    rows_layout,
    worker_pager,
)


def gather(array: np.ndarray, index: Any) -> np.ndarray:
    """``array[index]`` as a new array, for rows of an arena array a task reads::

        w = clamor.empty(10**8)                # the driver's weights
        def task(rows):
            ids = np.unique(idx[rows])
            wl = clamor.gather(w, ids)         # w[ids]: 8 bytes an id on the link, not a page
            ...

    ``index`` selects along the first axis: integers (negative ones from the end, any
    shape, as numpy's ``array[index]``), a slice or a boolean mask. The values are those
    of the task's epoch, as any read of the arena; the rows' pages count in the task's
    read set, and none of them is mapped or cached. On the driver's host a row is copied
    from the driver's memory where that shows the task's version; the other rows (all of
    them on another host, or with ``transport="tcp"``) are asked of the driver, in one
    request. Anywhere else it is :func:`~clamor.prefetch` and then ``array[index]``: on the
    driver, with exact read sets (which record each page), for an array outside the arena,
    or for rows that are not one run of bytes each.
    """
    pager = worker_pager()
    start = pager.offset_of(array) if pager is not None and isinstance(array, np.ndarray) else None
    rows = contiguous_rows(array, index, "gather") if start is not None else None
    if rows is not None and len(rows):
        shape, row_bytes = rows_layout(array, index, rows)
        out = np.empty(shape, array.dtype)
        if row_bytes and pager.gather(start + rows * array.strides[0], row_bytes, out):
            return out
    prefetch(array, index)
    return np.array(array[index])
