"""Shortcut compilation: expand a computation compiled for n in {0, 1} to n = 0..N-1.

The idea is Kaldi's (ExpandComputation): when every sequence of a request has
the same (t, x) pattern, the computation for N sequences is the one for two
sequences with every matrix, row range and index table stretched along n. The
mini computation (already optimized) is expanded here; nothing is re-derived
from the network except the precomputed indexes of components, which are rebuilt
for the expanded input/output indexes.

Layout. Every matrix of the mini computation must have a regular layout (see
:func:`pynnet3.cache.key.regular_layout`) with n in {0, 1}: rows reshape to
``(O, 2, S)``. The expanded matrix has rows ``(O, N, S)``: old row
``o*2S + w`` (n = 0) stands for new rows ``o*N*S + n'*S + w`` for every n'; old
n = 1 rows only confirm the pattern. A submatrix must start on an n = 0 row and
end on an n = 1 row; it stretches from its first row's new place to its last
row's new place at n = N - 1 (a snipped row range keeps its partial blocks).
Index tables must map n = 1 rows exactly like their n = 0 partners, one source
stride further; commands that pair rows one to one need submatrices of the same
local layout. Anything else raises :class:`ExpansionError`, and the caller
compiles the full request.

The precomputed indexes are rebuilt from a *snapshot* taken on the unoptimized
mini computation (component, input indexes, output indexes, need-backprop per
precomputed object), because optimization may merge a component's input matrix
into another one whose ``MatrixInfo.indexes`` describe a different node. A
component may instead stretch its mini object along n (the optional hook
``stretch_precomputed``, see :class:`RowMapStretch`), much cheaper than
recomputing it from the expanded index arrays at large N.

Everything that does not depend on N (layouts, the checks, where each table entry
goes) is worked out once per mini computation in an :class:`ExpansionPlan`, with
whole-array operations over all matrices, submatrices and tables at once; an
expansion to a given N is then a few numpy expressions per distinct index array
layout (:mod:`pynnet3.cache.stretch`; equal index arrays are expanded once and
shared), per table and per component, with no Python loop over rows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ..analysis.session import read_submatrices
from ..computation import CommandType, MatrixInfo, NnetComputation, SubMatrix, make_submatrix
from .stretch import ExpansionError, Stretcher, distinct_arrays, n_strides
from .stretch import require as _check

CT = CommandType
_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_TO_MULTI = (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_COPIES = (CT.MATRIX_COPY, CT.MATRIX_ADD)
_COMPONENT = (CT.PROPAGATE, *_BACKPROPS)
_TABLED = (CT.COPY_ROWS, CT.ADD_ROWS, CT.ADD_ROW_RANGES, *_MULTI)


@dataclass
class PrecomputedInfo:
    """How one precomputed-indexes object was made: by the component of ``node``
    for these input/output indexes (row orders of the component's matrices)."""

    node: str
    input_indexes: np.ndarray
    output_indexes: np.ndarray
    need_backprop: bool


def snapshot_precomputed(computation: NnetComputation) -> dict[int, PrecomputedInfo]:
    """``id(object) -> PrecomputedInfo`` for every precomputed object of an
    UNOPTIMIZED computation, read off its Propagate commands (whose submatrices are
    then whole matrices with the component's own indexes). Ids, because
    optimization may renumber the objects: see :func:`rekey_snapshot`."""
    c = computation
    with_bp = {cmd.precomputed for cmd in c.commands if cmd.type in _BACKPROPS}
    out: dict[int, PrecomputedInfo] = {}
    empty = np.zeros((0, 3), dtype=np.int64)
    for cmd in c.commands:
        if cmd.type is not CT.PROPAGATE or not cmd.precomputed:
            continue
        obj = c.precomputed[cmd.precomputed]
        if obj is None or id(obj) in out:
            continue
        out[id(obj)] = PrecomputedInfo(
            cmd.node,
            _sub_indexes(c, cmd.in_value) if cmd.in_value else empty,
            _sub_indexes(c, cmd.out_value),
            cmd.precomputed in with_bp)
    return out


def rekey_snapshot(snapshot: dict[int, PrecomputedInfo],
                   computation: NnetComputation) -> dict[int, PrecomputedInfo]:
    """The snapshot keyed by position in ``computation.precomputed`` (taken while
    the objects of the snapshot are still alive); objects a pass made are absent."""
    return {p: snapshot[id(obj)] for p, obj in enumerate(computation.precomputed)
            if obj is not None and id(obj) in snapshot}


def _sub_indexes(c: NnetComputation, s: int) -> np.ndarray:
    sm = c.submatrices[s]
    idx = c.matrices[sm.matrix].indexes
    if idx is None:
        raise ExpansionError(f"matrix {sm.matrix} has no indexes")
    return idx[sm.row_offset:sm.row_offset + sm.num_rows]


class RowMapStretch:
    """Stretches the row maps of one precomputed object along n: arrays
    ``rows[..., j]`` holding, for output row j of the mini computation, the input
    row it reads (or -1 for none). The input and output index arrays read
    ``(O, 2, S)`` (with their own O and S). When every n = 0 output row maps to an
    n = 0 input row or to -1, and its n = 1 partner (S_out rows on) to that input
    row's n = 1 partner (S_in rows on) or to -1 likewise, the map stays within a
    sequence, and for N sequences output row ``o * N * S_out + n * S_out + w`` maps
    to ``o' * N * S_in + n * S_in + w'`` (-1 stays -1) where its n = 0 row maps to
    ``o' * 2 * S_in + w'``: the same stretch as the index arrays'.

    A component's hook ``stretch_precomputed(mini_indexes, input_indexes,
    output_indexes, need_backprop, stretch_rows)`` gets ``stretch_rows(rows)``
    (this object bound to N: :meth:`bind`) and must return what
    ``precompute_indexes(input_indexes, output_indexes, need_backprop)`` would, or
    None to have it called; it may use the stretch only for maps whose rows depend
    on n only through "the same sequence" (like a time offset's). ``stretch_rows``
    returns None for a map without the form above; ``stretch_rows.run_starts(rows)``
    gives, without building the stretched map, the first row of each map when each
    stretches to one contiguous run of rows (else None); ``stretch_rows.in_layout``
    / ``out_layout`` / ``num_n`` tell the layouts and N, for objects that are not
    row maps (the statistics components' ranges)."""

    def __init__(self, in_rows: int, in_stride: int, out_rows: int, out_stride: int):
        self.in_rows, self.in_stride = in_rows, in_stride
        self.out_rows, self.out_stride = out_rows, out_stride
        # id(rows) -> (rows, its N-independent parts or None); the maps belong to the
        # mini computation's precomputed objects, which outlive the plan's use
        self._parts: dict[int, tuple] = {}

    def __call__(self, rows: np.ndarray, num_n: int) -> np.ndarray | None:
        """``rows`` (a map of the mini computation) for ``num_n`` sequences, or None."""
        got = self._parts.get(id(rows))
        if got is None:
            got = self._parts[id(rows)] = (rows, self._analyse(rows))
        parts = got[1]
        if parts is None:
            return None
        o, w, absent, shape = parts
        s_in = self.in_stride
        step = num_n * s_in
        # (K, O, 1, S) + (N, 1): rows (o, n, w) of the expanded output, per map row
        new = (o * step + w)[:, :, None, :] + np.arange(0, step, s_in, dtype=np.int64)[:, None]
        if absent is not None:
            np.copyto(new, -1, where=absent[:, :, None, :])
        return new.reshape(*shape, -1)

    def bind(self, num_n: int) -> BoundRowMapStretch:
        """This stretch for ``num_n`` sequences (what the components' hook gets)."""
        return BoundRowMapStretch(self, num_n)

    def run_starts(self, rows: np.ndarray, num_n: int) -> tuple[int, ...] | None:
        """For a map ``rows`` [K, out-rows] of the class doc's form in which every row
        k stretches to a contiguous run ``s_k, s_k + 1, ...`` over the expanded
        output rows: the K starts; else None. With equal strides S, output row
        (o, n, w) goes to (o', n, w'); the run holds when o' - o and w' - w are
        constant, and then starts at (o' - o) * N * S + (w' - w)."""
        if self.in_stride != self.out_stride or not isinstance(rows, np.ndarray) \
                or rows.ndim != 2:
            return None
        got = self._parts.get(id(rows))
        if got is None:
            got = self._parts[id(rows)] = (rows, self._analyse(rows))
        parts = got[1]
        if parts is None or parts[2] is not None:  # (not of the form, or absent rows)
            return None
        o, w = parts[0], parts[1]  # [K, O, S]
        d_o = o - np.arange(o.shape[1], dtype=np.int64)[:, None]
        d_w = w - np.arange(o.shape[2], dtype=np.int64)
        if not ((d_o == d_o[:, :1, :1]).all() and (d_w == d_w[:, :1, :1]).all()):
            return None
        s = self.in_stride
        starts = d_o[:, 0, 0] * (num_n * s) + d_w[:, 0, 0]
        end = starts + o.shape[1] * num_n * s
        if (starts < 0).any() or (end > self.in_rows // 2 * num_n).any():
            return None
        return tuple(starts.tolist())

    def _analyse(self, rows) -> tuple | None:
        """(o', w', absent or None, leading shape) of the n = 0 entries, or None
        when ``rows`` is not a map of the form of the class doc."""
        if not isinstance(rows, np.ndarray) or rows.dtype != np.int64 or rows.ndim == 0 \
                or rows.shape[-1] != self.out_rows:
            return None
        s_out, s_in = self.out_stride, self.in_stride
        blocks = rows.reshape(-1, self.out_rows // (2 * s_out), 2, s_out)
        zero, one = blocks[:, :, 0], blocks[:, :, 1]
        absent = zero < 0
        o, w = np.divmod(zero, 2 * s_in)
        if not (((zero >= 0) & (zero < self.in_rows) & (w < s_in)) | (zero == -1)).all() \
                or not np.array_equal(one, np.where(absent, -1, zero + s_in)):
            return None
        return o, w, (absent if absent.any() else None), rows.shape[:-1]


class BoundRowMapStretch:
    """A :class:`RowMapStretch` for one N: ``self(rows)`` and ``self.run_starts(rows)``."""

    __slots__ = ("stretch", "num_n")

    def __init__(self, stretch: RowMapStretch, num_n: int):
        self.stretch, self.num_n = stretch, num_n

    def __call__(self, rows: np.ndarray) -> np.ndarray | None:
        return self.stretch(rows, self.num_n)

    def run_starts(self, rows: np.ndarray) -> tuple[int, ...] | None:
        return self.stretch.run_starts(rows, self.num_n)

    @property
    def in_layout(self) -> tuple[int, int]:
        """(O, S) of the component's input rows: ``(O, 2, S)`` in the mini
        computation, ``(O, N, S)`` expanded."""
        st = self.stretch
        return st.in_rows // (2 * st.in_stride), st.in_stride

    @property
    def out_layout(self) -> tuple[int, int]:
        """(O, S) of the component's output rows, as :attr:`in_layout`."""
        st = self.stretch
        return st.out_rows // (2 * st.out_stride), st.out_stride


@dataclass
class _TablePlan:
    """Where the n = 0 entries of a table go, independent of N: destination row
    ``o * N * S + w (+ n' * S)`` of submatrix ``sub``, and the value likewise
    (for multi tables: per-entry stride and submatrix)."""

    kind: str  # "rows", "multi", "ranges"
    sub: int
    pos_o: np.ndarray
    pos_w: np.ndarray
    pos_s: int
    val_o: np.ndarray
    val_w: np.ndarray
    val_s: np.ndarray | int
    val_sub: np.ndarray | None = None
    size: np.ndarray | None = None
    # Whether entry e is row w of block o with (o, w) = divmod(e, S): the n = 0
    # entries cover the (O, 2, S) blocks row by row. When the expanded submatrix then
    # has O * N * S rows, every row gets a value, in (O, N, S) order: the table is
    # the values reordered, with no scatter.
    grid: bool = False


def _on_grid(pos_o: np.ndarray, pos_w: np.ndarray, rank: np.ndarray,
             stride: np.ndarray | int) -> np.ndarray:
    """Per table entry: whether it is row w of block o with (o, w) = divmod(its
    rank in the table, S) (see :attr:`_TablePlan.grid`)."""
    o, w = np.divmod(rank, stride)
    return (pos_o == o) & (pos_w == w)


class ExpansionPlan:
    """The N-independent part of expanding ``mini`` (module doc). Construction
    raises :class:`ExpansionError` when ``mini`` cannot be expanded."""

    def __init__(self, mini: NnetComputation, snapshot: dict[int, PrecomputedInfo], nnet):
        self.mini = mini
        self.nnet = nnet
        self.component_of = {n.name: nnet.components[n.component]
                             for n in nnet.nodes if n.kind == "component-node"}
        self._scan_commands()
        self._precomputed(snapshot)
        self._index_arrays()
        self._row_map_stretches()
        self._submatrices()
        self._check_row_pairs()
        self._table_plans()

    # -- index arrays: matrices' and components' -----------------------------------------
    def _index_arrays(self) -> None:
        """Layouts of the matrices' indexes and of the precomputed objects' input /
        output indexes, checked and expanded once per distinct array."""
        infos = self.mini.matrices[1:]
        _check(all(m.indexes is not None for m in infos), "a matrix has no indexes")
        arrays = [m.indexes for m in infos]
        for _, _, info in self.pre:
            arrays.append(info.output_indexes)
            if len(info.input_indexes):
                arrays.append(info.input_indexes)
        unique, which = distinct_arrays(arrays)
        stride, outer = n_strides(unique)
        self.array_stride, self.array_rows = stride, outer * 2 * stride
        self.stride = np.concatenate([[1], stride[which[:len(infos)]]]).astype(np.int64)
        self.matrix_array = which[:len(infos)]  # matrix m + 1 -> distinct array
        self.pre_array = which[len(infos):]  # per precomputed object: output (, input)
        self.stretcher = Stretcher(unique, stride)

    def _row_map_stretches(self) -> None:
        """``self.pre_stretch``: per precomputed object, a :class:`RowMapStretch` for
        its input and output layouts when its component has the hook
        ``stretch_precomputed``, else None."""
        self.pre_stretch: list[RowMapStretch | None] = []
        which = iter(self.pre_array)
        stride, rows = self.array_stride.tolist(), self.array_rows.tolist()
        for _, comp, info in self.pre:
            out = next(which)
            inp = next(which) if len(info.input_indexes) else None
            if inp is None or not hasattr(comp, "stretch_precomputed"):
                self.pre_stretch.append(None)
            else:
                self.pre_stretch.append(RowMapStretch(rows[inp], stride[inp],
                                                      rows[out], stride[out]))

    def _submatrices(self) -> None:
        """Each submatrix must start on an n = 0 row and end on an n = 1 row of its
        matrix (Kaldi's rule); it then runs from the new place of its first row
        (n = 0) to the new place of its last row taken at n = N - 1."""
        subs = self.mini.submatrices
        arr = read_submatrices(subs)[:, :3]  # (matrix, row offset, rows)
        arr[0] = (0, 0, 2)  # the empty submatrix: a harmless stand-in
        stride = self.stride[arr[:, 0]]
        first, last = arr[:, 1], arr[:, 1] + arr[:, 2] - 1
        o_a, phase = np.divmod(first, 2 * stride)
        o_l, rem_l = np.divmod(last, 2 * stride)
        _check(bool((phase < stride).all() and (rem_l >= stride).all()),
               "a submatrix does not start at n = 0 and end at n = 1")
        self.sub_matrix, self.sub_offset = arr[:, 0], arr[:, 1]
        self.sub_stride, self.sub_phase, self.sub_rows = stride, phase, arr[:, 2]
        self.sub_o_a, self.sub_span, self.sub_tail = o_a, o_l - o_a, rem_l - stride - phase

    def sub_new_rows(self, num_n: int, sub=slice(None)) -> np.ndarray:
        s = self.sub_stride[sub]
        return self.sub_span[sub] * num_n * s + (num_n - 1) * s + self.sub_tail[sub] + 1

    def sub_new_offsets(self, num_n: int) -> np.ndarray:
        return self.sub_o_a * num_n * self.sub_stride + self.sub_phase

    # -- local rows of submatrices -------------------------------------------------------------
    def _local(self, sub, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For local rows of submatrices ``sub``: their n (bool), their outer block
        (relative) and their place in it (relative to the phase): the new local row
        at sequence n' is ``o * N * S + w + n' * S``."""
        stride = self.sub_stride[sub]
        phase = self.sub_phase[sub]
        o, rem = np.divmod(phase + rows, 2 * stride)
        n = rem >= stride
        return n, o, np.where(n, rem - stride, rem) - phase

    def _zero_rows(self, sub, rows: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(o, w) of local rows that must be n = 0 rows and whose expansions must
        stay inside the expanded submatrix (an N-independent condition)."""
        n, o, w = self._local(sub, rows)
        _check(not n.any(), f"{what} reads an n = 1 row for an n = 0 row")
        last = o * 2 * self.sub_stride[sub] + w + self.sub_stride[sub]
        _check(bool((last < self.sub_rows[sub]).all()),
               f"{what}: a row falls outside its expanded submatrix")
        return o, w

    def _split(self, sub: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Local rows of ``sub`` with n = 0, with n = 1, and for the latter the local
        row of their n = 0 partner (negative when outside the submatrix)."""
        n, _, _ = self._local(sub, np.arange(int(self.sub_rows[sub]), dtype=np.int64))
        zero, one = np.flatnonzero(~n), np.flatnonzero(n)
        return zero, one, one - int(self.sub_stride[sub])

    # -- index tables ---------------------------------------------------------------------------
    def _table_plans(self) -> None:
        """``self.tables``: the plan of each requested table, in request order."""
        requests = self.requests
        self.tables: list[_TablePlan] = [None] * len(requests)
        rows = [k for k, r in enumerate(requests) if r[0] != "ranges"]
        if rows:
            for k, plan in zip(rows, self._row_plans([requests[k] for k in rows]), strict=True):
                self.tables[k] = plan
        for k, (kind, tab, dst, src) in enumerate(requests):
            if kind == "ranges":
                self.tables[k] = self._ranges_plan(tab, dst, src)

    def _row_plans(self, requests: list[tuple[str, np.ndarray, int, int]]) -> list[_TablePlan]:
        """Plans of the row tables (``("rows", table, dst, src)``) and multi-row
        tables (``("multi", table, own, 0)``), all checked at once: an n = 1 entry
        must read like its n = 0 partner, one source stride further (or nothing
        when that partner reads nothing or lies outside the submatrix), and n = 0
        entries, and the rows they read, must expand inside their submatrices. A
        row table is taken as a multi-row table with one source submatrix."""
        subs_of, rows_of = [], []
        for kind, tab, _, src in requests:
            if kind == "rows":
                subs_of.append(np.where(tab >= 0, src, -1))
                rows_of.append(tab)
            else:
                subs_of.append(tab[:, 0])
                rows_of.append(tab[:, 1])
        own = np.array([r[2] for r in requests], dtype=np.int64)
        lens = np.array([len(r) for r in rows_of], dtype=np.int64)
        _check(np.array_equal(lens, self.sub_rows[own]),
               "an index table's length is not its submatrix's")
        subs, rows = np.concatenate(subs_of), np.concatenate(rows_of)
        starts = np.cumsum(lens) - lens
        owner = np.repeat(own, lens)  # per entry: the submatrix the table runs over
        local = np.arange(len(rows), dtype=np.int64) - np.repeat(starts, lens)
        n, o, w = self._local(owner, local)
        one = np.flatnonzero(n)
        stride = self.sub_stride[owner[one]]
        inside = local[one] >= stride  # the n = 0 partner (stride rows back) exists
        partner = np.where(inside, one - stride, 0)
        psub, prow = subs[partner], rows[partner]
        ok = inside & (psub >= 0)
        _check(np.array_equal(subs[one], np.where(ok, psub, -1))
               and np.array_equal(rows[one],
                                  np.where(ok, prow + self.sub_stride[np.maximum(psub, 0)], -1)),
               "an index table is not regular in n")
        sel = np.flatnonzero(~n & (subs >= 0))
        po, pw, s_own = o[sel], w[sel], self.sub_stride[owner[sel]]
        _check(bool((po * 2 * s_own + pw + s_own < self.sub_rows[owner[sel]]).all()),
               "an index table: a row falls outside its expanded submatrix")
        vsub = subs[sel]
        vo, vw = self._zero_rows(vsub, rows[sel], "an index table")
        vs = self.sub_stride[vsub]
        bounds = np.searchsorted(sel, np.append(starts, len(rows)))
        counts = np.diff(bounds)
        rank = np.arange(len(sel), dtype=np.int64) - np.repeat(bounds[:-1], counts)
        off_grid = np.bincount(np.repeat(np.arange(len(requests)), counts)[
            ~_on_grid(po, pw, rank, s_own)], minlength=len(requests))
        grid = ((off_grid == 0) & (counts % self.sub_stride[own] == 0)).tolist()
        bounds = bounds.tolist()
        plans = []
        for j, (kind, _, own_j, src) in enumerate(requests):
            k = slice(bounds[j], bounds[j + 1])
            if kind == "rows":
                plans.append(_TablePlan("rows", own_j, po[k], pw[k], int(self.sub_stride[own_j]),
                                        vo[k], vw[k], int(self.sub_stride[src]), grid=grid[j]))
            else:
                plans.append(_TablePlan("multi", own_j, po[k], pw[k],
                                        int(self.sub_stride[own_j]), vo[k], vw[k], vs[k],
                                        vsub[k], grid=grid[j]))
        return plans

    def _ranges_plan(self, tab: np.ndarray, dst: int, src: int) -> _TablePlan:
        zero, one, partner = self._split(dst)
        inside = partner >= 0
        ss = int(self.sub_stride[src])
        b, e = tab[:, 0], tab[:, 1]
        size = e - b
        pb, psize = b[partner[inside]], size[partner[inside]]
        _check(np.array_equal(size[one][inside], psize)
               and np.array_equal(b[one][inside][psize > 0], pb[psize > 0] + ss)
               and not (size[one][~inside] > 0).any(), "a row-range table is not regular in n")
        sel = zero[size[zero] > 0]
        po, pw = self._zero_rows(dst, sel, "a row-range table")
        vo, vw = self._zero_rows(src, b[sel], "a row-range table")
        lo, lw = self._zero_rows(src, e[sel] - 1, "a row-range table")
        # The range must stay contiguous: its first and last rows in one n = 0 block.
        _check(np.array_equal(lo, vo) and np.array_equal(lw - vw, size[sel] - 1),
               "a row range spans n blocks")
        s = int(self.sub_stride[dst])
        grid = len(po) % s == 0 and bool(_on_grid(po, pw, np.arange(len(po)), s).all())
        return _TablePlan("ranges", dst, po, pw, s, vo, vw, ss, size=size[sel], grid=grid)

    @staticmethod
    def _table(plan: _TablePlan, new_rows: int, num_n: int) -> np.ndarray:
        n = np.arange(num_n, dtype=np.int64)[None, :]
        vs = np.reshape(plan.val_s, (-1, 1)) if plan.kind == "multi" else plan.val_s
        val = (plan.val_o[:, None] * (num_n * vs) + plan.val_w[:, None]) + n * vs
        if plan.grid and new_rows == len(val) * num_n:
            s = plan.pos_s
            val = val.reshape(-1, s, num_n).transpose(0, 2, 1)  # (O, N, S): row order
            if plan.kind == "rows":
                return val.reshape(-1)
            new = np.empty((new_rows, 2), dtype=np.int64)
            blocks = new.reshape(-1, num_n, s, 2)
            if plan.kind == "multi":
                blocks[..., 0] = plan.val_sub.reshape(-1, 1, s)
                blocks[..., 1] = val
            else:
                blocks[..., 0] = val
                blocks[..., 1] = val + plan.size.reshape(-1, 1, s)
            return new
        pos = (plan.pos_o * (num_n * plan.pos_s) + plan.pos_w)[:, None] + n * plan.pos_s
        if plan.kind == "rows":
            new = np.full(new_rows, -1, dtype=np.int64)
            new[pos] = val
        elif plan.kind == "multi":
            new = np.full((new_rows, 2), -1, dtype=np.int64)
            new[pos, 0] = plan.val_sub[:, None]
            new[pos, 1] = val
        else:
            new = np.zeros((new_rows, 2), dtype=np.int64)
            new[pos, 0] = val
            new[pos, 1] = val + plan.size[:, None]
        return new

    # -- precomputed indexes -----------------------------------------------------------------
    def _precomputed(self, snapshot: dict[int, PrecomputedInfo]) -> None:
        """``self.pre``: (position, component, snapshot) of every precomputed object,
        and ``self.component_reads``: (submatrix, k) pairs, each a submatrix the
        optimized computation's Propagate reads or writes and the k-th snapshot
        array (each object's output indexes, then its input indexes when it has
        any) it must agree with in n (checked in :meth:`_check_row_pairs`)."""
        props = self._propagates
        self.pre: list[tuple[int, object, PrecomputedInfo]] = []
        self.component_reads: list[tuple[int, int]] = []
        k = 0
        for p, obj in enumerate(self.mini.precomputed):
            if obj is None:
                continue
            info = snapshot.get(p)
            _check(info is not None and p in props,
                   f"precomputed indexes {p} were made by an optimization pass")
            cmd = props[p]
            self.pre.append((p, self.component_of[info.node], info))
            self.component_reads.append((cmd.out_value, k))
            k += 1
            if len(info.input_indexes):
                if cmd.in_value:
                    self.component_reads.append((cmd.in_value, k))
                k += 1
            else:
                _check(not cmd.in_value, "a component's input rows were reordered")

    # -- commands ---------------------------------------------------------------------------
    def _scan_commands(self) -> None:
        """One pass over the commands: the index tables to plan (``self.table_of``:
        (command, plan), ``self.requests``), the first Propagate of each precomputed
        object, and the pairs of submatrices whose rows go one to one (row i of a
        with row i of b), checked later by :meth:`_check_row_pairs`."""
        c = self.mini
        simple: dict[str, bool] = {}  # (only the nodes commands name: properties() is slow)
        memo: dict[tuple, int] = {}
        requests: list[tuple[str, np.ndarray, int, int]] = []  # (kind, table, dst/own, src)
        self.requests = requests
        self.table_of: list[tuple[int, int]] = []  # (command index, plan index)
        left: list[int] = []  # pairs (left[i], right[i]) of one-to-one submatrices,
        right: list[int] = []  # ... made by command owner[i]
        owner: list[int] = []
        self.row_pairs = (left, right, owner)
        self._propagates: dict[int, object] = {}  # precomputed index -> first Propagate
        propagate = CT.PROPAGATE
        for k, cmd in enumerate(c.commands):
            # (tuple membership: cheaper than a set or dict lookup for a few types)
            t = cmd.type
            if t in _COPIES:
                left.append(cmd.dst)
                right.append(cmd.src)
                owner.append(k)
            elif t in _COMPONENT:
                if t is propagate and cmd.precomputed:
                    self._propagates.setdefault(cmd.precomputed, cmd)
                value_in, deriv_in = cmd.in_value, cmd.in_deriv
                value_out, deriv_out = cmd.out_value, cmd.out_deriv
                some_out = value_out or deriv_out
                left += (value_in, value_out)
                right += (deriv_in, deriv_out)
                owner += (k, k)
                is_simple = simple.get(cmd.node)
                if is_simple is None:
                    comp = self.component_of.get(cmd.node)
                    is_simple = simple[cmd.node] = comp is not None and comp.is_simple()
                if is_simple:
                    left.append(value_in or deriv_in)
                    right.append(some_out)
                    owner.append(k)
                if cmd.table >= 0:
                    # input read as column blocks: row i of every block goes with row
                    # i of the output (derivative). Submatrix ids keep their meaning
                    # under expansion, so the block table itself is shared unchanged.
                    blocks = c.indexes_blocks[cmd.table].tolist()
                    left += blocks
                    right += [some_out] * len(blocks)
                    owner += [k] * len(blocks)
                if cmd.deriv_table >= 0:  # input derivative added to column blocks: the same
                    blocks = c.indexes_blocks[cmd.deriv_table].tolist()
                    left += blocks
                    right += [deriv_out] * len(blocks)
                    owner += [k] * len(blocks)
            elif t is CT.GOTO_LABEL:
                raise ExpansionError("looped computations are not expanded")
            elif t in _TABLED:
                if t in _MULTI:
                    # The table runs over the command's own submatrix: dst for the
                    # gathers, src for the scatters (kCopyToRowsMulti's one argument).
                    own = cmd.src if t in _TO_MULTI and cmd.src else cmd.dst
                    key = ("multi", cmd.table, own)
                else:
                    key = (t.value, cmd.table, cmd.dst, cmd.src)
                plan_id = memo.get(key)
                if plan_id is None:
                    plan_id = memo[key] = len(requests)
                    if t in _MULTI:
                        requests.append(("multi", c.indexes_multi[cmd.table], own, 0))
                    elif t is CT.ADD_ROW_RANGES:
                        requests.append(("ranges", c.indexes_ranges[cmd.table], cmd.dst,
                                         cmd.src))
                    else:
                        requests.append(("rows", c.indexes[cmd.table], cmd.dst, cmd.src))
                self.table_of.append((k, plan_id))
            # SWAP_MATRIX needs only equal sizes, which expansion keeps (rows * N / 2);
            # the swapped-in contents are undefined (allocate-from-other).

    def _check_row_pairs(self) -> None:
        """Submatrices whose rows go one to one must have one local n structure
        (stride, phase), so both stretch the same way; and the optimized
        computation must still read each component's rows with the n pattern of
        the snapshot's indexes (so both expand to the same row order). Each a few
        whole-array operations."""
        left, right, owner = self.row_pairs
        a = np.array(left, dtype=np.int64)
        b = np.array(right, dtype=np.int64)
        bad = (a != 0) & (b != 0) & ((self.sub_stride[a] != self.sub_stride[b])
                                     | (self.sub_phase[a] != self.sub_phase[b]))
        if bad.any():
            cmd = self.mini.commands[owner[int(np.argmax(bad))]]
            raise ExpansionError(f"{cmd.type.value} mixes n layouts")
        if not self.component_reads:
            return
        # The n of matrix row R is (R // S) % 2 and of snapshot row r (r // S') % 2
        # (n_strides checked both), so the n patterns compare without the indexes.
        sub, k = np.array(self.component_reads, dtype=np.int64).T
        arr = np.asarray(self.pre_array, dtype=np.int64)[k]
        rows = self.array_rows[arr]
        _check(np.array_equal(self.sub_rows[sub], rows),
               "a component's input or output rows were reordered")
        r = np.arange(rows.sum(), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
        ours = (np.repeat(self.sub_offset[sub], rows) + r) \
            // np.repeat(self.stride[self.sub_matrix[sub]], rows) % 2
        theirs = r // np.repeat(self.array_stride[arr], rows) % 2
        _check(np.array_equal(ours, theirs), "a component's input or output rows were reordered")

    # -- expansion -------------------------------------------------------------------------
    def expand(self, num_n: int, request=None, debug_info: bool = True) -> NnetComputation:
        """The computation for ``num_n`` sequences (module doc). Commands without
        index tables are shared with the mini computation (cached computations are
        read-only)."""
        if num_n < 2:
            raise ExpansionError("expansion needs at least 2 sequences")
        c, N = self.mini, num_n
        new = copy.copy(c)
        expanded = self.stretcher.expand(N)
        infos = c.matrices[1:]
        idx = ([expanded[u] for u in self.matrix_array] if debug_info
               else [None] * len(infos))
        new.matrices = [c.matrices[0]] + [
            MatrixInfo(m.rows // 2 * N, m.cols, m.node, m.is_deriv, ix)
            for m, ix in zip(infos, idx, strict=True)]
        offs, rows = self.sub_new_offsets(N).tolist(), self.sub_new_rows(N).tolist()
        new.submatrices = [c.submatrices[0]] + _with_rows(c.submatrices[1:], offs[1:], rows[1:])
        tables = [self._table(p, rows[p.sub], N) for p in self.tables]
        new.indexes, new.indexes_multi, new.indexes_ranges = [], [], []
        lists = {"rows": new.indexes, "multi": new.indexes_multi,
                 "ranges": new.indexes_ranges}
        slot = []
        for p, table in zip(self.tables, tables, strict=True):
            lst = lists[p.kind]
            lst.append(table)
            slot.append(len(lst) - 1)
        cmds = list(c.commands)
        for k, plan_id in self.table_of:
            cmd = copy.copy(cmds[k])
            cmd.table = slot[plan_id]
            cmds[k] = cmd
        new.commands = cmds
        new.precomputed = self._expand_precomputed(expanded, N)
        new._whole = dict(c._whole)
        if request is not None:
            new.request = request
        return new

    def _expand_precomputed(self, expanded: list[np.ndarray], num_n: int) -> list:
        """The precomputed objects for ``num_n`` sequences: stretched by their
        components' hooks where they have one and it applies, else recomputed."""
        mini = self.mini.precomputed
        out = [None] * len(mini)
        which = iter(self.pre_array)
        empty = np.zeros((0, 3), dtype=np.int64)
        for (p, comp, info), stretch in zip(self.pre, self.pre_stretch, strict=True):
            new_out = expanded[next(which)]
            new_in = expanded[next(which)] if len(info.input_indexes) else empty
            obj = None
            if stretch is not None:
                obj = comp.stretch_precomputed(mini[p], new_in, new_out, info.need_backprop,
                                               stretch.bind(num_n))
            if obj is None:
                obj = comp.precompute_indexes(new_in, new_out, info.need_backprop)
            out[p] = obj
        return out


def _with_rows(subs: list[SubMatrix], offsets: list[int], rows: list[int]
               ) -> list[SubMatrix]:
    """``subs`` with new row offsets and row counts."""
    return [make_submatrix(s[0], o, r, s[3], s[4])
            for s, o, r in zip(subs, offsets, rows, strict=True)]


def expand_computation(mini: NnetComputation, snapshot: dict[int, PrecomputedInfo],
                       num_n: int, nnet, request=None,
                       debug_info: bool = True) -> NnetComputation:
    """The computation for ``num_n`` sequences from ``mini`` (compiled for n in
    {0, 1}, usually optimized; ``snapshot`` from :func:`rekey_snapshot`): a
    one-off :class:`ExpansionPlan` and its expansion. Raises
    :class:`ExpansionError` when ``mini`` lacks the regular structure."""
    return ExpansionPlan(mini, snapshot, nnet).expand(num_n, request, debug_info)
