"""Statistics extraction and pooling (Kaldi's x-vector "stats layer").

``StatisticsExtractionComponent`` turns frames into per-period count / sum /
sum-of-squares statistics; ``StatisticsPoolingComponent`` sums those statistics
over a (possibly huge, e.g. 10000-frame) window of periods and turns them into
means and standard deviations.

Both are non-simple: an output row sums a *window* of input rows that share its
``(n, x)``. An output is computable when ANY input in its window exists
(``InputDeps.any_suffices``), and the window is cut to the input rows that exist.

The input and output rows may come in any order. Precomputation sorts the usable
input rows by ``(n, x, t)``; every window is then a contiguous range ``[lo, hi)``
of that sorted order, so the forward pass is a difference of cumulative sums and
the backward pass a cumulative sum of a difference array. Nothing loops in Python
per row or per frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ComputeError
from ..index import describe, pack
from .base import (
    Component,
    Flags,
    InputDeps,
    check_table_rows,
    overwrite_by_zeroing,
    register,
    require,
)
from .fields import Field
from .precomputed import expect_fields, int_array, int_field, plain_indexes, same_rows
from .xp import namespace

_DIRECT_MAX_WINDOWS = 512  # more windows than this: one prefix-sum pass beats a loop
_SHORT_WINDOW = 16  # windows at most this long are summed by gathering their j-th rows
_T_SHIFT = 1 << 31  # t is offset by this inside a window key so that keys sort by t


@plain_indexes("StatisticsExtractionComponent", "StatisticsPoolingComponent")
@dataclass
class RangeIndexes:
    """Output row ``o`` sums the sorted input rows ``perm[lo[o]:hi[o]]``.

    ``perm`` lists the input rows that take part (sorted by ``(n, x, t)``);
    input rows not in ``perm`` belong to no window (their derivative is 0).
    """

    perm: np.ndarray  # (m,) int64 rows of the input matrix, sorted by (n, x, t)
    lo: np.ndarray  # (rows_out,) int64
    hi: np.ndarray  # (rows_out,) int64
    num_input_rows: int

    @property
    def counts(self) -> np.ndarray:
        return self.hi - self.lo

    @property
    def counts_table(self) -> np.ndarray:
        """:attr:`counts`, made once (a host table with one device copy, xp.param)."""
        return self._derived("_counts", lambda: self.hi - self.lo)

    # -- plain data (pynnet3.components.precomputed) -----------------------------------
    def to_data(self) -> dict:
        return {"perm": self.perm, "lo": self.lo, "hi": self.hi,
                "num_input_rows": self.num_input_rows}

    @classmethod
    def from_data(cls, data: dict) -> RangeIndexes:
        expect_fields(data, {"perm", "lo", "hi", "num_input_rows"}, "RangeIndexes")
        num_in = int_field(data, "num_input_rows")
        perm = int_array(data, "perm", (None,), 0, num_in)
        lo = int_array(data, "lo", (None,), 0, len(perm) + 1)
        hi = int_array(data, "hi", lo.shape, 0, len(perm) + 1)
        if (lo > hi).any():
            raise ValueError("RangeIndexes: a range ends before it begins")
        if len(np.unique(perm)) != len(perm):  # (spread writes each input row once)
            raise ValueError("RangeIndexes: an input row is listed twice")
        return cls(perm, lo, hi, num_in)

    def check_use(self, component, num_in: int | None, num_out: int) -> None:
        same_rows("RangeIndexes input", self.num_input_rows, num_in)
        same_rows("RangeIndexes output", len(self.lo), num_out)

    def window_sums(self, values):
        """Row ``o`` = sum of ``values[perm[lo[o]:hi[o]]]``, in float64 (an array of
        ``values``' backend and device: NumPy array or torch tensor).

        Cumulative sums are taken in float64 so that the difference of two large
        prefix sums keeps float32 accuracy even over windows of 10000 frames. When
        the windows together cover about the rows once (decode-time pooling: one
        window per sequence), each window is summed on its own instead: prefix
        sums of every row in float64 would cost several times that; many short
        windows (extraction with a small output period) add their rows gathered
        position by position."""
        xp = namespace(values)
        if self._spread_plan().owner_is_identity:  # output row i is input row i
            return _float64_copy(xp, values)
        strategy = self._sum_strategy()
        if strategy == "short":
            return self._short_sums(values)
        if strategy == "direct" and not xp.launch_bound(values):
            # (on a GPU one prefix sum beats a kernel per window)
            return self._direct_sums(values)
        csum = xp.zeros((len(self.perm) + 1, values.shape[1]), like=values, dtype=xp.float64)
        xp.cumsum(xp.take(values, xp.index(self.perm, like=values)), axis=0, dtype=xp.float64,
                  out=csum[1:])
        return (xp.take(csum, xp.index(self.hi, like=values))
                - xp.take(csum, xp.index(self.lo, like=values)))

    def _derived(self, name: str, make):
        """A value that depends on the indexes only, made once (host tables handed to
        ``xp.index`` must be the same arrays on every call: one device copy each)."""
        value = self.__dict__.get(name)
        if value is None:  # (racing threads compute equal values)
            value = self.__dict__[name] = make()
        return value

    def _sum_strategy(self) -> str:
        """How :meth:`window_sums` sums: "short", "direct" or "prefix" (see there)."""
        def make():
            lo, hi = self.lo, self.hi
            if len(lo) and int((hi - lo).sum()) <= 2 * len(self.perm):
                if int((hi - lo).max()) <= _SHORT_WINDOW:
                    return "short"
                if len(lo) <= _DIRECT_MAX_WINDOWS:
                    return "direct"
            return "prefix"
        return self._derived("_strategy", make)

    def _short_sums(self, values):
        """Many short windows (extraction with a small output period): the j-th rows
        of all windows gathered and added at once, j = 0 .. the longest window."""
        xp = namespace(values)

        def make():  # per j: (the windows at least j + 1 long or None for all, their rows)
            lens = self.hi - self.lo
            steps = []
            for j in range(int(lens.max())):
                sel = np.flatnonzero(lens > j)
                steps.append((None if len(sel) == len(lens) else sel,
                              self.perm[self.lo[sel] + j]))
            return steps

        out = xp.zeros((len(self.lo), values.shape[1]), like=values, dtype=xp.float64)
        for sel, rows in self._derived("_short_steps", make):
            gathered = xp.take(values, xp.index(rows, like=values))
            if sel is None:
                out += gathered
            else:
                out[xp.index(sel, like=values)] += gathered
        return out

    def _direct_sums(self, values):
        """Each window summed on its own (few long windows: x-vector pooling)."""
        xp = namespace(values)
        if not self._perm_is_identity():  # the rows in window order, gathered once
            values = xp.take(values, xp.index(self.perm, like=values))

        def make():  # (the non-empty windows' outputs, (lo, hi) of each)
            live = np.flatnonzero(self.hi > self.lo)
            return live, [(int(self.lo[o]), int(self.hi[o])) for o in live.tolist()]

        live, bounds = self._derived("_direct_windows", make)
        if xp.is_numpy:
            # (a float64 copy, then numpy's row-wise sum: several times faster than a
            # float64-accumulating reduce over a float32 block)
            sums = [xp.sum(xp.astype(values[a:b], xp.float64), axis=0) for a, b in bounds]
        else:  # (torch accumulates in float64 faster without the copy: 1.5x on a CPU)
            sums = [xp.sum(values[a:b], axis=0, dtype=xp.float64) for a, b in bounds]
        if len(live) == len(self.lo):  # (one stack, not a row assignment per window)
            return xp.stack(sums) if sums else \
                xp.zeros((0, values.shape[1]), like=values, dtype=xp.float64)
        out = xp.zeros((len(self.lo), values.shape[1]), like=values, dtype=xp.float64)
        if sums:
            out[xp.index(live, like=values)] = xp.stack(sums)
        return out

    def window_sums_and_squares(self, values) -> tuple:
        """``(window_sums(values), window_sums(square(values)))``, the same floats
        (squares in ``values``' dtype, sums in float64). For a few long windows of
        a NumPy array in order (x-vector decoding), window by window through
        buffers of one window's size: no temporary of the whole input's squares
        (a fresh matrix of tens of MB costs more in page faults than its
        arithmetic)."""
        xp = namespace(values)
        if (not xp.is_numpy or self._spread_plan().owner_is_identity
                or self._sum_strategy() != "direct" or not self._perm_is_identity()):
            return self.window_sums(values), self.window_sums(xp.square(values))
        live = np.flatnonzero(self.hi > self.lo)
        cols = values.shape[1]
        sums = np.zeros((len(self.lo), cols), np.float64)
        squares = np.zeros((len(self.lo), cols), np.float64)
        if not len(live):
            return sums, squares
        longest = int((self.hi - self.lo)[live].max())
        wide = np.empty((longest, cols), np.float64)
        square = np.empty((longest, cols), values.dtype)
        for o in live.tolist():
            a, b = int(self.lo[o]), int(self.hi[o])
            n = b - a
            np.copyto(wide[:n], values[a:b])  # (the float64 copy _direct_sums sums)
            np.sum(wide[:n], axis=0, out=sums[o])
            np.square(values[a:b], out=square[:n])
            np.copyto(wide[:n], square[:n])
            np.sum(wide[:n], axis=0, out=squares[o])
        return sums, squares

    def _perm_is_identity(self) -> bool:
        flag = self.__dict__.get("_identity")
        if flag is None:
            perm = self.perm
            flag = len(perm) == self.num_input_rows and bool(
                np.array_equal(perm, np.arange(len(perm))))
            self.__dict__["_identity"] = flag
        return flag

    @property
    def is_identity(self) -> bool:
        """Whether output row i's window is exactly input row i (x-vector extraction
        with output-period 1): then window sums and spread are copies."""
        plan = self._spread_plan()
        return plan.owner_is_identity and plan.rows is None

    def spread(self, deriv, dtype=None):
        """The transpose of :meth:`window_sums`: input row ``i`` gets the sum of
        ``deriv[o]`` over the outputs whose window holds ``i`` (a new array,
        ``[num_input_rows, cols]``; rows in no window get an exact 0), summed in
        float64 and then cast to ``dtype`` (disjoint windows: a cast of ``deriv``'s
        rows, then a gather, which is the same).

        Disjoint windows (x-vector extraction and pooling): each row is in at most
        one window and gets that output's row, gathered (no arithmetic). Overlapping
        windows: a float64 cumulative sum of a difference array whose entries sum
        the rows of the outputs that start (+) or end (-) a window there.

        ``dtype``: float64 when None; else an array's dtype (or a NumPy dtype with
        NumPy arrays)."""
        xp = namespace(deriv)
        if dtype is None:
            dtype = xp.float64
        plan = self._spread_plan()
        if plan.owner is not None:
            if plan.rows is None and plan.owner_is_identity:  # input row i = output row i
                return xp.copy(deriv) if deriv.dtype == dtype else xp.astype(deriv, dtype)
            if deriv.dtype != dtype:  # the (fewer) output rows, before the gather
                deriv = xp.astype(deriv, dtype)
            owner = xp.index(plan.owner, like=deriv)
            if plan.rows is None:  # every input row in exactly one window, in order
                return xp.take(deriv, owner)
            out = xp.zeros((self.num_input_rows, deriv.shape[1]), like=deriv)
            out[xp.index(plan.rows, like=deriv)] = xp.take(deriv, owner)
            return out
        n = len(deriv)
        signed = xp.empty((2 * n, deriv.shape[1]), like=deriv, dtype=xp.float64)
        signed[:n] = deriv
        xp.negative(signed[:n], out=signed[n:])
        diff = xp.zeros((len(self.perm) + 1, deriv.shape[1]), like=deriv, dtype=xp.float64)
        if len(plan.events):
            diff[xp.index(plan.targets, like=deriv)] = xp.add_reduceat(
                xp.take(signed, xp.index(plan.events, like=deriv)), plan.group_starts, axis=0)
        per_sorted = xp.cumsum(diff[:-1], axis=0)
        if len(plan.uncovered_rows):
            per_sorted[xp.index(plan.uncovered_rows, like=deriv)] = 0.0
        out = xp.zeros((self.num_input_rows, deriv.shape[1]), like=deriv, dtype=xp.float64)
        out[xp.index(self.perm, like=deriv)] = per_sorted
        return out if out.dtype == dtype else xp.astype(out, dtype)

    def spread_add(self, target, deriv) -> None:
        """``target += spread(deriv, target.dtype)``. When every input row is in exactly
        one window, windows in row order (x-vector pooling), and the windows are few,
        each window's rows get their output's row added by broadcasting: no
        [num_input_rows, cols] temporary (on torch CPU that gather cost 4x NumPy's)."""
        plan = self._spread_plan()
        segments = self._derived("_segments", lambda: _segments(self, plan))
        xp = namespace(deriv)
        if segments is None or xp.launch_bound(deriv):  # (a GPU: one gather, one add)
            target += self.spread(deriv, target.dtype)
            return
        if deriv.dtype != target.dtype:  # (the same floats as spread's cast, then gather)
            deriv = xp.astype(deriv, target.dtype)
        for o, a, b in segments:
            target[a:b] += deriv[o]

    def _spread_plan(self) -> _SpreadPlan:
        plan = self.__dict__.get("_spread")
        if plan is None:
            plan = self.__dict__["_spread"] = _SpreadPlan.make(self)
        return plan


@dataclass
class _SpreadPlan:
    """What :meth:`RangeIndexes.spread` needs that depends on the indexes only.

    Disjoint windows: ``owner[j]`` is the output whose window holds input row
    ``rows[j]`` (``rows`` None: every input row in order; ``owner_is_identity``:
    input row i is output row i's window). Otherwise: ``events`` are rows of
    ``[deriv; -deriv]`` (a window's start, its end), sorted stably by their place
    in the difference array; runs of equal place begin at ``group_starts`` and sum
    into ``targets``; ``uncovered`` marks the sorted positions in no window (their
    numbers: ``uncovered_rows``)."""

    owner: np.ndarray | None = None
    rows: np.ndarray | None = None
    owner_is_identity: bool = False
    events: np.ndarray | None = None
    group_starts: np.ndarray | None = None
    targets: np.ndarray | None = None
    uncovered: np.ndarray | None = None
    uncovered_rows: np.ndarray | None = None

    @classmethod
    def make(cls, r: RangeIndexes) -> _SpreadPlan:
        lo, hi = r.lo, r.hi
        live = np.flatnonzero(hi > lo)  # empty windows add nothing
        order = live[np.argsort(lo[live], kind="stable")]
        if bool(np.all(hi[order[:-1]] <= lo[order[1:]])):  # disjoint
            lens = hi[order] - lo[order]
            owner = np.repeat(order, lens)
            pos = np.arange(len(owner), dtype=np.int64)
            pos += np.repeat(lo[order] - (np.add.accumulate(lens) - lens), lens)
            rows = r.perm[pos]
            if len(rows) == r.num_input_rows and bool(np.array_equal(
                    rows, np.arange(len(rows)))):
                return cls(owner=owner, owner_is_identity=len(owner) == len(lo) and bool(
                    np.array_equal(owner, np.arange(len(owner)))))
            return cls(owner=owner, rows=rows)
        m = len(r.perm)
        cover = np.bincount(lo[live], minlength=m + 1) - np.bincount(hi[live], minlength=m + 1)
        place = np.concatenate([lo[live], hi[live]])
        events = np.argsort(place, kind="stable")  # starts before ends at one place
        place = place[events]
        group_starts = np.flatnonzero(np.r_[True, place[1:] != place[:-1]])
        events = np.concatenate([live, live + len(lo)])[events]
        uncovered = np.cumsum(cover[:-1]) == 0
        return cls(events=events, group_starts=group_starts, targets=place[group_starts],
                   uncovered=uncovered, uncovered_rows=np.flatnonzero(uncovered))


def _segments(r: RangeIndexes, plan: _SpreadPlan) -> list | None:
    """``[(output, first input row, end)]`` when every input row is in exactly one
    window, windows in row order, and there are at most ``_DIRECT_MAX_WINDOWS`` of them
    (not one row each); else None."""
    if plan.owner is None or plan.rows is not None or plan.owner_is_identity \
            or not 0 < len(r.lo) <= _DIRECT_MAX_WINDOWS:
        return None
    owner = plan.owner
    if not len(owner):  # (no input rows: nothing to add)
        return []
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    ends = np.r_[starts[1:], len(owner)]
    return [(int(owner[a]), int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def _float64_copy(xp, x):
    """``x`` as a new float64 array (NumPy's ``astype(np.float64)``, which copies)."""
    return xp.copy(x) if x.dtype == xp.float64 else xp.astype(x, xp.float64)


def stretch_range_indexes(mini: RangeIndexes, stretch_rows) -> RangeIndexes | None:
    """:func:`window_ranges` for N sequences from the two-sequence object, when
    the input and output rows are sequence-major (``(1, 2, S)``: what sorting by
    ``(n, x, t)`` gives) and each sequence's windows hold rows of that sequence
    only: ``perm`` is then the n = 0 part repeated with each sequence's row
    offset, and ``lo`` / ``hi`` the n = 0 ranges moved by one part per sequence
    (every sequence has the same (t, x), so the same sorted order and windows).
    None when ``mini`` has another form (the caller computes it instead).
    ``stretch_rows``: the expansion's :class:`~pynnet3.cache.expand.RowMapStretch`
    for N, read for its layouts and N only."""
    (o_in, s_in), (o_out, s_out) = stretch_rows.in_layout, stretch_rows.out_layout
    perm, lo, hi = mini.perm, mini.lo, mini.hi
    m = len(perm) // 2
    if o_in != 1 or o_out != 1 or mini.num_input_rows != 2 * s_in \
            or len(perm) != 2 * m or len(lo) != 2 * s_out:
        return None
    head = perm[:m]
    lo0, hi0 = lo[:s_out], hi[:s_out]
    if not (np.array_equal(perm[m:], head + s_in) and (head < s_in).all()
            and np.array_equal(lo[s_out:], lo0 + m) and np.array_equal(hi[s_out:], hi0 + m)
            and (lo0 >= 0).all() and (hi0 <= m).all()):
        return None
    num_n = stretch_rows.num_n
    seq = np.arange(num_n, dtype=np.int64)[:, None]
    return RangeIndexes((head + seq * s_in).ravel(), (lo0 + seq * m).ravel(),
                        (hi0 + seq * m).ravel(), num_n * s_in)


def _stretch_precomputed(self, mini_indexes, input_indexes, output_indexes,
                         need_backprop: bool, stretch_rows) -> RangeIndexes | None:
    """The statistics components' shortcut-expansion hook: :func:`stretch_range_indexes`
    (None: then ``precompute_indexes`` runs)."""
    if not isinstance(mini_indexes, RangeIndexes):
        return None
    return stretch_range_indexes(mini_indexes, stretch_rows)


def _nx_groups(input_indexes: np.ndarray, output_indexes: np.ndarray):
    """Ids of the ``(n, x)`` pairs, shared by inputs and outputs, in ``(n, x)``
    order (only their order matters): positions in the pairs' bounding box where
    that is small, else dense ids from sorting."""
    n_in, x_in = input_indexes[:, 0], input_indexes[:, 2]
    n_out, x_out = output_indexes[:, 0], output_indexes[:, 2]
    if len(n_in) and len(n_out):
        n_lo = min(int(n_in.min()), int(n_out.min()))
        x_lo = min(int(x_in.min()), int(x_out.min()))
        x_ext = max(int(x_in.max()), int(x_out.max())) - x_lo + 1
        n_ext = max(int(n_in.max()), int(n_out.max())) - n_lo + 1
        if n_ext * x_ext < 1 << 30:
            if x_ext == 1:
                return n_in - n_lo, n_out - n_lo
            return ((n_in - n_lo) * x_ext + (x_in - x_lo),
                    (n_out - n_lo) * x_ext + (x_out - x_lo))
    both = np.concatenate([input_indexes, output_indexes])
    nx = both.copy()
    nx[:, 1] = 0
    _, inverse = np.unique(pack(nx), return_inverse=True)
    inverse = inverse.astype(np.int64).ravel()
    return inverse[:len(input_indexes)], inverse[len(input_indexes):]


def window_ranges(input_indexes, output_indexes, t_first, t_last, period: int,
                  what: str) -> RangeIndexes:
    """Ranges of input rows with the output's ``(n, x)`` and
    ``t_first[o] <= t <= t_last[o]``, ``t % period == 0`` (rows off that grid take
    part in no window, as in Kaldi, which only looks up on-grid times).

    Raises ComputeError if some output's window holds no input row."""
    inp = np.asarray(input_indexes, dtype=np.int64).reshape(-1, 3)
    out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
    g_in, g_out = _nx_groups(inp, out)
    if period == 1:  # every row is on the grid
        on_grid = None
        keys = g_in << 32
        keys += inp[:, 1]
    else:
        on_grid = np.flatnonzero(inp[:, 1] % period == 0)
        keys = g_in[on_grid] << 32
        keys += inp[on_grid, 1]
    keys += _T_SHIFT
    if len(keys) > 1 and bool(np.all(keys[1:] > keys[:-1])):
        # Already in (n, x, t) order (the usual case) and so without duplicates.
        order = np.arange(len(keys), dtype=np.int64)
        sorted_keys = keys
    else:
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        if len(sorted_keys) > 1 and np.any(sorted_keys[1:] == sorted_keys[:-1]):
            raise ComputeError(f"{what}: duplicate input indexes")
    base = g_out << 32
    base += _T_SHIFT
    lo = np.searchsorted(sorted_keys, base + np.asarray(t_first), "left")
    hi = np.searchsorted(sorted_keys, base + np.asarray(t_last), "right")
    empty = hi <= lo
    if np.any(empty):
        raise ComputeError(f"{what}: no input rows for output indexes "
                           f"{describe(out[empty])}")
    perm = order if on_grid is None else on_grid[order]
    return RangeIndexes(perm, lo.astype(np.int64), hi.astype(np.int64), len(inp))


def _window_deps(output_indexes: np.ndarray, t_first: np.ndarray, size: int, step: int,
                 valid: np.ndarray | None = None, t_lo: float = -math.inf,
                 t_hi: float = math.inf) -> InputDeps:
    """``size`` dependencies per output at ``t_first + k*step``, all optional,
    any one sufficing; outputs with ``valid`` False get none. Only times within
    ``[t_lo, t_hi]`` are listed (the caller knows nothing outside can exist), in
    the same order as without the bounds: by output row, then by time."""
    out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
    rows = np.arange(len(out), dtype=np.int64)
    if valid is not None:
        rows = rows[valid]
    if t_lo > t_hi:  # no time can exist: no dependencies
        rows = rows[:0]
        t_lo, t_hi = -math.inf, math.inf
    first = np.asarray(t_first, dtype=np.int64)[rows]
    k_lo = np.zeros(len(rows), dtype=np.int64)
    k_hi = np.full(len(rows), size - 1, dtype=np.int64)
    if t_lo > -math.inf:  # first k with first + k*step >= t_lo
        k_lo = np.maximum(k_lo, -np.floor_divide(first - int(t_lo), step))
    if t_hi < math.inf:  # last k with first + k*step <= t_hi
        k_hi = np.minimum(k_hi, np.floor_divide(int(t_hi) - first, step))
    count = np.maximum(k_hi - k_lo + 1, 0)
    check_table_rows(int(count.sum()), "dependencies of a statistics window")
    owner = np.repeat(rows, count)
    deps = out[owner]
    # k of each dependency: k_lo of its output plus its place within the output's run
    start = np.cumsum(count) - count
    k = np.arange(len(owner), dtype=np.int64) - np.repeat(start - k_lo, count)
    deps[:, 1] = np.repeat(first, count) + k * step
    return InputDeps(owner, deps, np.zeros(len(owner), dtype=bool), any_suffices=True)


def sort_nxt(input_indexes, output_indexes) -> tuple[np.ndarray, np.ndarray]:
    """Kaldi's ReorderIndexes for the statistics components: both index lists
    sorted by (n, x, t). Optional for our compiler (the math takes any order);
    it reproduces Kaldi's row order."""
    def nxt(idx):
        idx = np.asarray(idx, dtype=np.int64).reshape(-1, 3)
        return idx[np.lexsort((idx[:, 1], idx[:, 2], idx[:, 0]))]

    return nxt(input_indexes), nxt(output_indexes)


class _CheckedStatistics(Component):
    """What the two statistics components share: the input dim (``_input_dim``) and
    Kaldi's Check(), :meth:`_problem` (None when the configuration is valid), run
    on a config line (:meth:`_checked`) and once a file's body is read."""

    def _problem(self) -> str | None:
        raise NotImplementedError

    @property
    def input_dim(self) -> int:
        return self._input_dim

    @classmethod
    def _checked(cls, comp: _CheckedStatistics, cfg) -> _CheckedStatistics:
        """``comp`` made from ``cfg``, once every option was used and it passes Check()."""
        cfg.check_all_used()
        problem = comp._problem()
        require(problem is None, cfg, f"{cls.type_name}: {problem}")
        return comp

    @classmethod
    def empty_for_read(cls) -> _CheckedStatistics:
        return cls(0)

    def read_end(self, r) -> None:
        super().read_end(r)
        problem = self._problem()  # Kaldi's Check(), once the whole body is read
        if problem is not None:
            raise r.error(f"invalid {self.type_name}: {problem}")


@register
class StatisticsExtractionComponent(_CheckedStatistics):
    """Per-period statistics of the input: ``[count, sum x, (sum x^2)]``.

    The output at time t covers the period window
    ``[floor(t/P)*P, floor(t/P)*P + P)`` (P = output-period), stepping by the
    input-period; the count is the number of input rows found in it.
    Invariants: input_dim > 0, periods > 0, output_period % input_period == 0.
    """

    type_name = "StatisticsExtractionComponent"

    def __init__(self, input_dim: int, input_period: int = 1, output_period: int = 1,
                 include_variance: bool = True):
        self._input_dim = int(input_dim)
        self.input_period = int(input_period)
        self.output_period = int(output_period)
        self.include_variance = bool(include_variance)

    def _problem(self) -> str | None:
        """Kaldi's Check()."""
        if self._input_dim <= 0:
            return f"input-dim must be > 0, got {self._input_dim}"
        if self.input_period <= 0 or self.output_period <= 0:
            return "input-period and output-period must be > 0"
        if self.output_period % self.input_period:
            return (f"output-period={self.output_period} must be a multiple of "
                    f"input-period={self.input_period}")
        return None

    # -- structure ------------------------------------------------------------------
    @property
    def output_dim(self) -> int:
        return 1 + self._input_dim * (2 if self.include_variance else 1)

    def properties(self) -> Flags:
        # Kaldi declares PROPAGATE_ADDS although Propagate zeroes the output first.
        flags = Flags.PROPAGATE_ADDS | Flags.REORDERS_INDEXES
        if self.include_variance:
            flags |= Flags.BACKPROP_NEEDS_INPUT
        return flags

    def info(self) -> str:
        return (super().info() + f", input-period={self.input_period}, "
                f"output-period={self.output_period}, "
                f"include-variance={str(self.include_variance).lower()}")

    # -- construction and files ----------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None):
        input_dim = cfg.get_int("input-dim", required=True)
        input_period = cfg.get_int("input-period", 1)
        output_period = cfg.get_int("output-period", 1)
        include_variance = cfg.get_bool("include-variance", True)
        return cls._checked(cls(input_dim, input_period, output_period, include_variance), cfg)

    kaldi_fields = (
        Field("<InputDim>", "_input_dim", "int"),
        Field("<InputPeriod>", "input_period", "int"),
        Field("<OutputPeriod>", "output_period", "int"),
        Field("<IncludeVarinance>", "include_variance", "bool"),  # sic, Kaldi's spelling
    )

    # -- indexes ---------------------------------------------------------------------
    def _window_start(self, t: np.ndarray) -> np.ndarray:
        return np.floor_divide(t, self.output_period) * self.output_period

    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        """Per output: the ``output_period / input_period`` times of its period
        window, all optional; computable when any exists."""
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        return _window_deps(out, self._window_start(out[:, 1]),
                            self.output_period // self.input_period, self.input_period)

    def output_time_bounds(self, input_bounds: tuple[float, float]) -> tuple[float, float]:
        """Bounds on the t of computable outputs when the computable inputs have
        ``input_bounds[0] <= t <= input_bounds[1]``: an output's period window
        ``[w, w + P)`` (``w <= t < w + P``) must hold one of them."""
        lo, hi = input_bounds
        if lo > hi:
            return input_bounds
        return (lo - self.output_period + 1, hi + self.output_period - 1)

    def reorder_indexes(self, input_indexes, output_indexes):
        return sort_nxt(input_indexes, output_indexes)

    def precompute_indexes(self, input_indexes, output_indexes, need_backprop: bool):
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        first = self._window_start(out[:, 1])
        return window_ranges(input_indexes, out, first, first + self.output_period - 1,
                             self.input_period, self.type_name)

    stretch_precomputed = _stretch_precomputed

    # -- math ------------------------------------------------------------------------
    def propagate_overwrite(self, indexes: RangeIndexes, in_value, out_value):
        """:meth:`propagate`, which writes every entry of its output: the zeroing
        Kaldi's PROPAGATE_ADDS asks for first is not needed (the runtime skips it)."""
        if type(self).propagate is not StatisticsExtractionComponent.propagate:
            return overwrite_by_zeroing(self, indexes, in_value, out_value)
        return self.propagate(indexes, in_value, out_value)

    def propagate(self, indexes: RangeIndexes, in_value, out_value):
        d = self._input_dim
        xp = namespace(in_value)
        # (a host table kept with the indexes: one device copy of it)
        out_value[:, 0] = xp.param(indexes.counts_table, like=out_value)
        if indexes.is_identity and in_value.dtype == out_value.dtype:  # one row per window
            out_value[:, 1:1 + d] = in_value
            if self.include_variance:
                xp.square(in_value, out=out_value[:, 1 + d:])
            return None
        # (assigning the float64 sums rounds them to the output's dtype)
        out_value[:, 1:1 + d] = indexes.window_sums(in_value)
        if self.include_variance:
            out_value[:, 1 + d:] = indexes.window_sums(xp.square(in_value))
        return None

    def backprop(self, indexes: RangeIndexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        d = self._input_dim
        # The count column has no derivative; the sums pass the derivative back
        # unchanged and the sums of squares as 2 x.
        xp = namespace(out_deriv)
        if indexes.is_identity:  # one row per window: dsum + 2 dsq x, in float64
            if not self.include_variance:
                in_deriv[...] = out_deriv[:, 1:1 + d]
                return
            acc = _float64_copy(xp, out_deriv[:, 1 + d:])
            acc *= in_value  # (exact: a product of two floats fits a double)
            acc *= 2.0
            acc += out_deriv[:, 1:1 + d]
            in_deriv[...] = acc
            return
        deriv = indexes.spread(out_deriv[:, 1:1 + d])
        if self.include_variance:
            sq = indexes.spread(out_deriv[:, 1 + d:])  # deriv += 2 sq x, in place
            sq *= 2.0
            sq *= in_value
            deriv += sq
        in_deriv[...] = deriv


@register
class StatisticsPoolingComponent(_CheckedStatistics):
    """Pools extraction stats over ``[t - left_context, t + right_context]`` and
    outputs ``[log-count x num_log_count_features, mean, (stddev)]``.

    Input columns: count, sums, (sums of squares: when output-stddevs). The
    output exists only at multiples of input-period. The stddev is
    ``sqrt(max(E[x^2] - mean^2, variance_floor))``; the backprop ignores the floor
    (as Kaldi does).
    """

    type_name = "StatisticsPoolingComponent"

    def __init__(self, input_dim: int, input_period: int = 1, left_context: int = 0,
                 right_context: int = 0, num_log_count_features: int = 0,
                 output_stddevs: bool = False, variance_floor: float = 1.0e-10):
        self._input_dim = int(input_dim)
        self.input_period = int(input_period)
        self.left_context = int(left_context)
        self.right_context = int(right_context)
        self.num_log_count_features = int(num_log_count_features)
        self.output_stddevs = bool(output_stddevs)
        self.variance_floor = float(variance_floor)

    def _problem(self) -> str | None:
        """Kaldi's Check()."""
        if self._input_dim <= 0:
            return f"input-dim must be > 0, got {self._input_dim}"
        if self.input_period <= 0:
            return "input-period must be > 0"
        if self.left_context < 0 or self.right_context < 0:
            return "left-context and right-context must be given and >= 0"
        if self.left_context + self.right_context <= 0:
            return "left-context + right-context must be > 0"
        if self.left_context % self.input_period or self.right_context % self.input_period:
            return "left-context and right-context must be multiples of input-period"
        if self.num_log_count_features < 0:
            return "num-log-count-features must be >= 0"
        if not 0.0 < self.variance_floor < 1.0:
            return "variance-floor must be in (0, 1)"
        if self.output_stddevs and (self._input_dim - 1) % 2:
            return "with output-stddevs=true, input-dim must be odd (1 + 2 * feature-dim)"
        return None

    # -- structure ------------------------------------------------------------------
    @property
    def output_dim(self) -> int:
        return self._input_dim + self.num_log_count_features - 1

    @property
    def feature_dim(self) -> int:
        """Dim of the mean (and stddev) blocks when output-stddevs."""
        return (self._input_dim - 1) // 2

    def properties(self) -> Flags:
        flags = Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS
        if self.output_stddevs or self.num_log_count_features > 0:
            flags |= Flags.BACKPROP_NEEDS_OUTPUT
        if self.num_log_count_features == 0:
            flags |= Flags.BACKPROP_NEEDS_INPUT
        return flags

    def info(self) -> str:
        return (super().info() + f", input-period={self.input_period}, "
                f"left-context={self.left_context}, right-context={self.right_context}, "
                f"num-log-count-features={self.num_log_count_features}, "
                f"output-stddevs={str(self.output_stddevs).lower()}, "
                f"variance-floor={self.variance_floor:g}")

    # -- construction and files ----------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator | None = None):
        comp = cls(
            input_dim=cfg.get_int("input-dim", required=True),
            input_period=cfg.get_int("input-period", 1),
            # Kaldi's defaults are -1, which Check() rejects: both are required.
            left_context=cfg.get_int("left-context", -1),
            right_context=cfg.get_int("right-context", -1),
            num_log_count_features=cfg.get_int("num-log-count-features", 0),
            output_stddevs=cfg.get_bool("output-stddevs", False),
            variance_floor=cfg.get_float("variance-floor", 1.0e-10),
        )
        return cls._checked(comp, cfg)

    kaldi_fields = (
        Field("<InputDim>", "_input_dim", "int"),
        Field("<InputPeriod>", "input_period", "int"),
        Field("<LeftContext>", "left_context", "int"),
        Field("<RightContext>", "right_context", "int"),
        Field("<NumLogCountFeatures>", "num_log_count_features", "int"),
        Field("<OutputStddevs>", "output_stddevs", "bool"),
        Field("<VarianceFloor>", "variance_floor", "float"),
    )

    # -- indexes ---------------------------------------------------------------------
    def input_indexes(self, output_indexes: np.ndarray) -> InputDeps:
        """Per output at t (a multiple of input-period): the times
        ``t - left_context .. t + right_context`` step input-period, all optional,
        any one sufficing. Outputs at other t get no dependencies (never
        computable, as in Kaldi's IsComputable)."""
        return self.input_indexes_within(output_indexes, -math.inf, math.inf)

    def input_indexes_within(self, output_indexes: np.ndarray, t_lo: float,
                             t_hi: float) -> InputDeps:
        """:meth:`input_indexes` without the dependencies outside ``[t_lo, t_hi]``
        (which the caller knows cannot be computed): the window can be 10001
        frames long while the input has a few hundred."""
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        size = (self.left_context + self.right_context) // self.input_period + 1
        valid = out[:, 1] % self.input_period == 0
        return _window_deps(out, out[:, 1] - self.left_context, size, self.input_period,
                            valid, t_lo, t_hi)

    def output_time_bounds(self, input_bounds: tuple[float, float]) -> tuple[float, float]:
        """Bounds on the t of computable outputs when the computable inputs have
        ``input_bounds[0] <= t <= input_bounds[1]`` (the window
        ``[t - left_context, t + right_context]`` must hold one of them)."""
        lo, hi = input_bounds
        if lo > hi:
            return input_bounds
        return (lo - self.right_context, hi + self.left_context)

    def reorder_indexes(self, input_indexes, output_indexes):
        return sort_nxt(input_indexes, output_indexes)

    def precompute_indexes(self, input_indexes, output_indexes, need_backprop: bool):
        out = np.asarray(output_indexes, dtype=np.int64).reshape(-1, 3)
        if np.any(out[:, 1] % self.input_period):
            raise ComputeError(f"{self.type_name}: output t must be a multiple of "
                               f"input-period={self.input_period}")
        return window_ranges(input_indexes, out, out[:, 1] - self.left_context,
                             out[:, 1] + self.right_context, self.input_period,
                             self.type_name)

    stretch_precomputed = _stretch_precomputed

    # -- math ------------------------------------------------------------------------
    def propagate(self, indexes: RangeIndexes, in_value, out_value):
        # Sums are exact-ish (float64); the rest runs in the data's dtype like
        # Kaldi, so that E[x^2] - mean^2 cancels the way Kaldi's float32 does
        # when the variance is small next to mean^2.
        self._pool(indexes.window_sums(in_value), out_value)
        return None

    def propagate_extracted(self, indexes: RangeIndexes, extraction, ext_indexes,
                            x, out_value) -> bool:
        """:meth:`propagate` of what ``extraction`` (a StatisticsExtractionComponent
        whose rows are its input's, one row per window: x-vector decoding) makes of
        ``x``, without making it: the window sums of its columns (count, ``x``,
        ``x^2``) taken column block by column block, the same floats (a column's sums
        do not depend on the others). NumPy forward only; False (nothing done) where
        that does not hold."""
        d = extraction._input_dim
        if (type(x) is not np.ndarray or type(out_value) is not np.ndarray
                or x.dtype != out_value.dtype or not ext_indexes.is_identity
                or type(self).propagate is not StatisticsPoolingComponent.propagate
                or x.shape[1] != d or x.shape[0] != indexes.num_input_rows
                or self.input_dim != 1 + d * (2 if extraction.include_variance else 1)):
            return False
        sums = np.empty((len(indexes.lo), self.input_dim), np.float64)
        counts = ext_indexes.counts_table.astype(x.dtype)[:, None]  # (as it writes them)
        sums[:, :1] = indexes.window_sums(counts)
        if extraction.include_variance:
            sums[:, 1:1 + d], sums[:, 1 + d:] = indexes.window_sums_and_squares(x)
        else:
            sums[:, 1:1 + d] = indexes.window_sums(x)
        self._pool(sums, out_value)
        return True

    def _pool(self, window_sums, out_value) -> None:
        """The output from the float64 window sums of the input's columns."""
        nlc = self.num_log_count_features
        xp = namespace(out_value)
        sums = xp.astype(window_sums, out_value.dtype)
        counts = sums[:, 0]
        stats = sums[:, 1:] / counts[:, None]
        if self.output_stddevs:
            f = self.feature_dim
            mean = stats[:, :f]
            # (the floor rounded to the data's precision, as dtype.type(floor) did)
            floor = float(xp.scalar_type(out_value)(self.variance_floor))
            var = xp.maximum(stats[:, f:] - mean * mean, floor)
            stats[:, f:] = xp.sqrt(var)
        out_value[:, nlc:] = stats
        if nlc:
            out_value[:, :nlc] = xp.log(counts)[:, None]

    def backprop(self, indexes: RangeIndexes, in_value, out_value, out_deriv, memo, grad,
                 in_deriv) -> None:
        if in_deriv is None:
            return
        nlc = self.num_log_count_features
        xp = namespace(out_deriv)
        deriv = _float64_copy(xp, out_deriv[:, nlc:])
        if self.output_stddevs:
            # d stddev / d E[x^2] = 0.5 / stddev; and E[x^2] - mean^2 adds
            # -2 mean dF/dvar to the mean's derivative. The variance floor is
            # ignored here, exactly as in Kaldi.
            f = self.feature_dim
            mean = xp.astype(out_value[:, nlc:nlc + f], xp.float64)
            stddev = xp.astype(out_value[:, nlc + f:], xp.float64)
            deriv[:, f:] *= 0.5 / stddev
            deriv[:, :f] -= 2.0 * mean * deriv[:, f:]
        if nlc:
            counts = xp.exp(xp.astype(out_value[:, 0], xp.float64))
        else:
            counts = indexes.window_sums(in_value[:, :1])[:, 0]
        deriv /= counts[:, None]
        # The count column is not differentiable (it comes from the extraction's
        # constant counts); Kaldi leaves its derivative untouched.
        indexes.spread_add(in_deriv[:, 1:], deriv)


__all__ = ["StatisticsExtractionComponent", "StatisticsPoolingComponent", "RangeIndexes",
           "window_ranges", "sort_nxt"]
