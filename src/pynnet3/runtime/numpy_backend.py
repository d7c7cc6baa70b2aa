"""The default backend: NumPy arrays, float32 (float64 on request)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..index import unique_keys
from .backend import register_backend
from .matrix_pool import POOL


def _all_rows(table, src) -> bool:
    """Whether every entry of a row table is a row of ``src`` (none is -1)."""
    return len(table) > 0 and int(table.min()) >= 0 and int(table.max()) < src.shape[0]


class NumpyBackend:
    name = "numpy"

    def zeros(self, rows, cols, dtype):
        arr = POOL.take(rows, cols, dtype)  # a freed matrix's warm pages (matrix_pool)
        if arr is None:
            return np.zeros((rows, cols), dtype=dtype)
        arr.fill(0)
        return arr

    def alloc(self, rows, cols, dtype):
        """A new matrix whose contents are undefined (ALLOC_MATRIX: the compiler
        zeroes with SET_CONST where a matrix is read before it is fully written,
        and the checker proves the rest), so a pooled buffer is not cleared."""
        arr = POOL.take(rows, cols, dtype)
        return np.empty((rows, cols), dtype=dtype) if arr is None else arr

    def release_matrix(self, matrices: dict, key) -> None:
        """Drop ``matrices[key]`` (DEALLOC_MATRIX); its buffer goes to the pool
        when nothing else holds it, and when this backend's alloc() takes from it."""
        if type(self).alloc is NumpyBackend.alloc:
            POOL.release(matrices, key)
        else:
            matrices.pop(key, None)

    def from_numpy(self, array, dtype):
        if type(array).__module__.startswith("torch"):
            # (a tensor that requires grad, or lives on a GPU, has no NumPy view:
            # np.array would raise torch's RuntimeError/TypeError)
            array = array.detach().cpu().numpy()
        return np.array(array, dtype=dtype, copy=True)

    def to_numpy(self, array):
        return np.asarray(array)

    def copy_out(self, array):
        """A result handed to the user: a NumPy copy."""
        return np.array(array, copy=True)

    def view(self, mat, row0, nrows, col0, ncols):
        return mat[row0:row0 + nrows, col0:col0 + ncols]

    def is_finite(self, array) -> bool:
        return bool(np.isfinite(array).all())

    def set_const(self, dst, value):
        dst[...] = value

    def copy(self, dst, src, alpha):
        if alpha == 1.0:
            dst[...] = src
        else:
            np.multiply(src, alpha, out=dst, casting="unsafe")

    def add(self, dst, src, alpha):
        if alpha == 1.0:
            dst += src
        else:
            dst += alpha * src

    def copy_rows(self, dst, src, table, alpha):
        if _all_rows(table, src):
            grid = _grid_views(dst, src, table)
            if grid is not None:  # (a strided copy: no index lookups, no temporary)
                if alpha == 1.0:
                    np.copyto(grid[0], grid[1])
                else:
                    np.multiply(grid[1], alpha, out=grid[0])
                return
            if dst.flags.c_contiguous and not np.may_share_memory(dst, src):
                # (3x faster than a gather then a copy; mode="clip" skips the buffer
                # that bounds checking needs: _all_rows checked them)
                np.take(src, table, axis=0, out=dst, mode="clip")
                if alpha != 1.0:
                    dst *= alpha
                return
            # a column block or an overlap: gather (np.take: ~2.5x faster than
            # fancy indexing), then one pass that also scales
            vals = np.take(src, table, axis=0, mode="clip")
            if alpha == 1.0:
                dst[...] = vals
            else:
                np.multiply(vals, alpha, out=dst)
            return
        ok = table >= 0
        vals = src[table[ok]]
        dst[ok] = vals if alpha == 1.0 else alpha * vals
        dst[~ok] = 0

    def add_rows(self, dst, src, table, alpha):
        if _all_rows(table, src):  # no boolean masks: a gather and one add
            grid = _grid_views(dst, src, table)
            if grid is not None:
                grid[0][...] += grid[1] if alpha == 1.0 else alpha * grid[1]
                return
            vals = np.take(src, table, axis=0, mode="clip")
            if alpha != 1.0:
                vals *= alpha
            dst += vals
            return
        ok = table >= 0
        vals = src[table[ok]]
        dst[ok] += vals if alpha == 1.0 else alpha * vals

    def _gather_multi(self, dst, sources, table):
        out = np.zeros_like(dst)
        for s in unique_keys(table[:, 0]).tolist():
            if s < 0:
                continue
            sel = table[:, 0] == s
            out[sel] = sources[s][table[sel, 1]]
        return out

    def _rows_multi(self, dst, sources, table, alpha, add: bool) -> bool:
        """COPY/ADD_ROWS_MULTI source by source straight into ``dst`` (slices where a
        source's rows are a run: a recurrent layer's per-step outputs), from a plan
        made once per table. False (nothing done) when ``dst`` overlaps a source."""
        if any(np.may_share_memory(dst, src) for src in sources.values()):
            return False
        groups, missing = _multi_plan(table)
        for s, d, r in groups:
            src = sources[s]
            vals = src[r] if type(r) is slice else np.take(src, r, axis=0, mode="clip")
            if add:
                if alpha != 1.0:
                    vals = alpha * vals
                dst[d] += vals
            elif alpha == 1.0:
                dst[d] = vals
            elif type(d) is slice:
                np.multiply(vals, alpha, out=dst[d])
            else:
                dst[d] = alpha * vals
        if missing is not None and not add:
            dst[missing] = 0
        return True

    def copy_rows_multi(self, dst, sources, table, alpha):
        if self._rows_multi(dst, sources, table, alpha, add=False):
            return
        vals = self._gather_multi(dst, sources, table)
        dst[...] = vals if alpha == 1.0 else alpha * vals

    def add_rows_multi(self, dst, sources, table, alpha):
        if self._rows_multi(dst, sources, table, alpha, add=True):
            return
        vals = self._gather_multi(dst, sources, table)
        dst += vals if alpha == 1.0 else alpha * vals

    def add_row_ranges(self, dst, src, ranges, alpha):
        # Prefix sums in float64 keep long ranges (pooling over thousands of frames)
        # at float32 accuracy.
        cs = np.zeros((src.shape[0] + 1, src.shape[1]), dtype=np.float64)
        np.cumsum(src, axis=0, dtype=np.float64, out=cs[1:])
        sums = cs[ranges[:, 1]] - cs[ranges[:, 0]]
        dst += (alpha * sums).astype(dst.dtype)


def _grid(table: np.ndarray):
    """``(start, p, q, a, b)`` when ``table[i * q + j] == start + i * a + j * b`` for
    all i < p, j < q (with p > 1 or q > 1), else None. Offset() of an input given
    sequence by sequence and read time by time is such a grid (b = frames per
    sequence, a = the time step); so is an iVector repeated per frame (a = 0)."""
    return None if len(table) < 4 else _plan(_GRID_PLANS, table, _make_grid)


def _make_grid(table: np.ndarray):
    n = len(table)
    d = np.diff(table.astype(np.int64))
    b = int(d[0])
    breaks = np.flatnonzero(d != b)
    q = n if not len(breaks) else int(breaks[0]) + 1
    plan = None
    if n % q == 0:
        p = n // q
        start = int(table[0])
        a = int(table[q]) - start if p > 1 else 0
        grid = start + a * np.arange(p, dtype=np.int64)[:, None] \
            + b * np.arange(q, dtype=np.int64)[None, :]
        if np.array_equal(grid.reshape(-1), table):
            plan = (start, p, q, a, b)
    return plan


def _grid_views(dst: np.ndarray, src: np.ndarray, table: np.ndarray):
    """``(dst as [p, q, cols], the table's rows of src as a strided [p, q, cols]
    view)`` when the (in-range) table is a :func:`_grid` and the two do not overlap;
    else None."""
    plan = _grid(table)
    if plan is None or dst.ndim != 2 or np.may_share_memory(dst, src):
        return None
    start, p, q, a, b = plan
    r0, c0 = src.strides
    d0, d1 = dst.strides
    cols = dst.shape[1]
    sv = as_strided(src[start:], shape=(p, q, cols), strides=(a * r0, b * r0, c0),
                     writeable=False)
    dv = as_strided(dst, shape=(p, q, cols), strides=(q * d0, d0, d1))
    return dv, sv


# table id -> (table, plan): the tables live in cached computations and are never
# modified after compilation (the table itself is kept, so an id is not reused)
_MULTI_PLANS: dict[int, tuple] = {}
_GRID_PLANS: dict[int, tuple] = {}
_MAX_PLANS = 1024


def _plan(cache: dict, table: np.ndarray, make):
    """``make(table)``, kept in ``cache`` while ``table`` is the object there."""
    hit = cache.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    plan = make(table)
    if len(cache) >= _MAX_PLANS:
        cache.clear()
    cache[id(table)] = (table, plan)
    return plan


def _run_or_rows(rows: np.ndarray):
    """``rows`` as a slice when they are consecutive and ascending, else as they are."""
    n = len(rows)
    if n and int(rows[-1]) - int(rows[0]) == n - 1 and (n < 3 or bool(np.all(np.diff(rows) == 1))):
        return slice(int(rows[0]), int(rows[0]) + n)
    return rows


def _multi_plan(table: np.ndarray):
    """``([(source, dst rows, source rows)], rows with no source)`` of a (submatrix,
    row) table; rows as slices where they run."""
    return _plan(_MULTI_PLANS, table, _make_multi)


def _make_multi(table: np.ndarray):
    order = np.argsort(table[:, 0], kind="stable")
    keys = table[order, 0]
    cuts = (np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()
    groups, missing = [], None
    for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True):
        rows = order[a:b]
        if keys[a] < 0:
            missing = rows
            continue
        groups.append((int(keys[a]), _run_or_rows(rows), _run_or_rows(table[rows, 1])))
    return groups, missing


register_backend("numpy", NumpyBackend)
