"""Limit derivatives to a time window (Kaldi's LimitDerivativeTimes).

With ``min_deriv_time`` / ``max_deriv_time`` (or ``max_deriv_time_relative``, added
to the largest output ``t`` of the request) set, derivatives at rows whose ``t`` is
outside ``[min, max]`` are treated as zero, the truncated backprop-through-time of
recurrent training. A row's ``t`` comes from ``MatrixInfo.indexes``.

What the rewrite keeps (as Kaldi's DerivativeTimeLimiter):

* Commands that write derivative matrices only write in-range rows: row ops drop
  table entries whose source or destination derivative row is out of range,
  matrix copies/adds and backprops of simple components shrink to the in-range
  row span, and commands left with nothing to do are removed.
* Out-of-range rows of a derivative matrix are therefore never written after the
  zeroing at allocation, so wherever they are still read they read zero.
* Derivative matrices (other than inputs/outputs of the computation) that end up
  entirely out of range are removed; partly out-of-range ones shrink to their
  in-range row span when nothing but zeroing touches the rest.

Like Kaldi, this must run first, on a computation as the compiler makes it: it
relies on every derivative matrix being zeroed at allocation and on no command
overwriting a nonzero derivative with a copy. As in Kaldi, a propagate whose
output is entirely out of range no longer stores component statistics.
"""

from __future__ import annotations

import numpy as np

from ..components.base import Flags
from ..computation import Command, NnetComputation, SubMatrix, command_submatrices
from ..computation import CommandType as CT
from ..errors import ComputeError
from ..index import unique_keys
from .options import OptimizeOptions

_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_TO_MULTI = (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_BIG = np.iinfo(np.int64).max


def _time_window(c: NnetComputation, options: OptimizeOptions) -> tuple[int, int] | None:
    """(min, max) derivative time from the options (unset ends: +-_BIG); None if unset."""
    lo, hi = options.min_deriv_time, options.max_deriv_time
    if options.max_deriv_time_relative is not None:
        req = c.request
        ts = [s.indexes[:, 1] for s in (req.outputs if req is not None else []) if len(s.indexes)]
        if not ts:
            raise ComputeError("max_deriv_time_relative needs a request with output indexes")
        hi = options.max_deriv_time_relative + int(max(t.max() for t in ts))
    if lo is None and hi is None:
        return None
    lo = -_BIG if lo is None else int(lo)
    hi = _BIG if hi is None else int(hi)
    if hi < lo:
        raise ComputeError(f"derivative time window is empty: min_deriv_time {lo} > "
                           f"max_deriv_time {hi}")
    return lo, hi


class _Limiter:
    """The state of one LimitDerivativeTimes run (see module doc)."""

    def __init__(self, c: NnetComputation, nnet, lo: int, hi: int):
        self.c = c
        self.nnet = nnet
        nm = len(c.matrices)
        # Per matrix: which rows are in the window (None: all), and the in-window
        # row span [begin, end); state 0 = all rows inside, 1 = partly, 2 = none.
        self.inside: list[np.ndarray | None] = [None] * nm
        self.state = np.zeros(nm, dtype=np.int8)
        self.begin = np.zeros(nm, dtype=np.int64)
        self.end = np.array([m.rows for m in c.matrices], dtype=np.int64)
        for m in range(1, nm):
            idx = c.matrices[m].indexes
            if idx is None or len(idx) != c.matrices[m].rows:
                continue  # nothing known about its times: never limited
            ok = (idx[:, 1] >= lo) & (idx[:, 1] <= hi)
            rows = np.flatnonzero(ok)
            if len(rows) == len(ok):
                continue
            self.inside[m] = ok
            if not len(rows):
                self.state[m] = 2
            else:
                self.state[m] = 1
                self.begin[m], self.end[m] = rows[0], rows[-1] + 1
        self.is_deriv = np.array([m.is_deriv for m in c.matrices], dtype=bool)
        n = len(c.submatrices)
        self.smap = np.arange(n, dtype=np.int64)  # any matrix, restricted to its span
        for s in range(1, n):
            sm = c.submatrices[s]
            st = self.state[sm.matrix]
            if st == 0:
                continue
            if st == 2:
                self.smap[s] = 0
                continue
            b = max(int(self.begin[sm.matrix]), sm.row_offset)
            e = min(int(self.end[sm.matrix]), sm.row_offset + sm.num_rows)
            self.smap[s] = 0 if e <= b else (
                s if (b, e) == (sm.row_offset, sm.row_offset + sm.num_rows) else
                c.new_submatrix(sm.matrix, b, e - b, sm.col_offset, sm.num_cols))
        deriv_of_sub = np.array([self.is_deriv[c.submatrices[s].matrix] for s in range(n)])
        # only derivative matrices are limited by data-movement commands
        self.smap_deriv = np.where(deriv_of_sub, self.smap, np.arange(n))
        self.removed_memos: set[int] = set()
        self.removed = self.modified = 0

    # -- helpers ------------------------------------------------------------------------
    def kept(self, s: int) -> np.ndarray:
        """Per row of submatrix ``s``: True unless it is a derivative row out of range."""
        sm = self.c.submatrices[s]
        ok = self.inside[sm.matrix]
        if ok is None or not self.is_deriv[sm.matrix]:
            return np.ones(sm.num_rows, dtype=bool)
        return ok[sm.row_offset:sm.row_offset + sm.num_rows]

    def prune(self, s: int, mapped: int) -> tuple[int, int]:
        """(rows cut at the start, rows cut at the end) going from ``s`` to ``mapped``."""
        a, b = self.c.submatrices[s], self.c.submatrices[mapped]
        left = b.row_offset - a.row_offset
        return left, a.num_rows - b.num_rows - left

    def sub_rows(self, s: int, left: int, nrows: int) -> int:
        sm = self.c.submatrices[s]
        return self.c.new_submatrix(sm.matrix, sm.row_offset + left, nrows, sm.col_offset,
                                    sm.num_cols)

    def drop(self, cmd: Command) -> None:
        cmd.type = CT.NO_OPERATION
        self.removed += 1

    # -- per command type --------------------------------------------------------------
    def modify(self, cmd: Command) -> None:
        t = cmd.type
        if t is CT.PROPAGATE:
            if cmd.alpha == 2.0 and cmd.out_value and self.smap[cmd.out_value] == 0:
                cmd.alpha = 1.0  # Kaldi: no stats for an output entirely out of range
        elif t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
            self.backprop(cmd)
        elif t in (CT.MATRIX_COPY, CT.MATRIX_ADD):
            self.matrix_op(cmd)
        elif t in (CT.COPY_ROWS, CT.ADD_ROWS):
            self.rows_op(cmd)
        elif t in _MULTI:
            self.multi_op(cmd)
        elif t is CT.ADD_ROW_RANGES:
            self.ranges_op(cmd)

    def backprop(self, cmd: Command) -> None:
        props = self.nnet.components[self.nnet.node_map[cmd.node].component].properties()
        if not props & Flags.SIMPLE:
            return  # would need new precomputed indexes; its reads see zeros anyway
        args = {f: getattr(cmd, f) for f in ("in_value", "out_value", "out_deriv", "in_deriv")}
        mapped = {f: int(self.smap[s]) for f, s in args.items()}
        if mapped["out_deriv"] == 0:
            if any(mapped[f] for f in args if args[f]):
                return  # spans disagree (not a compiler-made backprop): leave it
            if cmd.memo:
                self.removed_memos.add(cmd.memo)
            self.drop(cmd)
            return
        if mapped["out_deriv"] == args["out_deriv"] or props & Flags.USES_MEMO:
            return
        if any(args[f] and not mapped[f] for f in args) or len(
                {self.prune(args[f], mapped[f]) for f in args if args[f]}) != 1:
            return  # the arguments' in-range spans differ: keep the full command
        for f in args:
            setattr(cmd, f, mapped[f])
        self.modified += 1

    def matrix_op(self, cmd: Command) -> None:
        d, s = cmd.dst, cmd.src
        dm, sm = int(self.smap_deriv[d]), int(self.smap_deriv[s])
        if dm == d and sm == s:
            return
        if dm == 0 or sm == 0:
            self.drop(cmd)
            return
        l1, r1 = self.prune(d, dm)
        l2, r2 = self.prune(s, sm)
        left, right = max(l1, l2), max(r1, r2)
        n = self.c.submatrices[d].num_rows - left - right
        if n <= 0:
            self.drop(cmd)
            return
        cmd.dst, cmd.src = self.sub_rows(d, left, n), self.sub_rows(s, left, n)
        self.modified += 1

    def rows_op(self, cmd: Command) -> None:
        d, s = cmd.dst, cmd.src
        dm, sm = int(self.smap_deriv[d]), int(self.smap_deriv[s])
        if dm == 0 or sm == 0:
            self.drop(cmd)
            return
        tab = self.c.indexes[cmd.table]
        left_out, _ = self.prune(d, dm)
        left_in, _ = self.prune(s, sm)
        old = tab[left_out:left_out + self.c.submatrices[dm].num_rows]
        ok = old >= 0
        ok[ok] = self.kept(s)[old[ok]]
        ok &= self.kept(dm)
        if not ok.any():
            self.drop(cmd)
            return
        new = np.where(ok, old - left_in, -1)
        if dm == d and sm == s and np.array_equal(new, tab):
            return
        self.c.indexes.append(new.astype(np.int64))
        cmd.dst, cmd.src, cmd.table = dm, sm, len(self.c.indexes) - 1
        self.modified += 1

    def multi_op(self, cmd: Command) -> None:
        # the table is indexed by the rows of ``dst`` (``src`` for the scatters)
        field = "src" if cmd.type in _TO_MULTI else "dst"
        d = getattr(cmd, field)
        dm = int(self.smap_deriv[d])
        if dm == 0:
            self.drop(cmd)
            return
        tab = self.c.indexes_multi[cmd.table]
        left, _ = self.prune(d, dm)
        new = tab[left:left + self.c.submatrices[dm].num_rows].copy()
        dst_ok = self.kept(dm)
        for s in unique_keys(new[:, 0]).tolist():
            if s < 0:
                continue
            sel = new[:, 0] == s
            ok = self.kept(s)[new[sel, 1]] & dst_ok[sel]
            smapped = int(self.smap_deriv[s])
            rows = new[sel, 1] - (self.prune(s, smapped)[0] if smapped else 0)
            new[sel, 0] = np.where(ok, smapped, -1)
            new[sel, 1] = np.where(ok, rows, -1)
        if not (new[:, 0] >= 0).any():
            self.drop(cmd)
            return
        if dm == d and np.array_equal(new, tab):
            return
        self.c.indexes_multi.append(new)
        setattr(cmd, field, dm)
        cmd.table = len(self.c.indexes_multi) - 1
        self.modified += 1

    def ranges_op(self, cmd: Command) -> None:
        d, s = cmd.dst, cmd.src
        dm, sm = int(self.smap_deriv[d]), int(self.smap_deriv[s])
        if dm == d and sm == s:
            return
        if dm == 0 or sm == 0:
            self.drop(cmd)
            return
        tab = self.c.indexes_ranges[cmd.table]
        left_out, _ = self.prune(d, dm)
        left_in, _ = self.prune(s, sm)
        ranges = tab[left_out:left_out + self.c.submatrices[dm].num_rows]
        src_ok = self.kept(s)
        n = len(src_ok)
        # next_ok[j]: first kept source row >= j (n if none); last_ok[j]: 1 + last kept
        # row < j (0 if none): trimming a range's unkept ends is two lookups.
        pos = np.where(src_ok, np.arange(n), n)
        next_ok = np.append(np.minimum.accumulate(pos[::-1])[::-1], n)
        last_ok = np.concatenate([[0], np.maximum.accumulate(np.where(src_ok, np.arange(n) + 1,
                                                                      0))])
        b = next_ok[ranges[:, 0]]
        e = last_ok[ranges[:, 1]]
        ok = (ranges[:, 0] < ranges[:, 1]) & (b < e) & self.kept(dm)
        if not ok.any():
            self.drop(cmd)
            return
        new = np.zeros_like(ranges)  # (0, 0) is an empty range
        new[ok, 0] = b[ok] - left_in
        new[ok, 1] = e[ok] - left_in
        self.c.indexes_ranges.append(new)
        cmd.dst, cmd.src, cmd.table = dm, sm, len(self.c.indexes_ranges) - 1
        self.modified += 1

    # -- matrices ------------------------------------------------------------------------
    def prune_matrices(self) -> int:
        """Remove derivative matrices that are entirely out of range and unused but
        for zeroing; shrink partly out-of-range ones to their span when only zeroing
        touches rows outside it. Returns how many matrices were removed or shrunk."""
        c = self.c
        nm = len(c.matrices)
        io = np.zeros(nm, dtype=bool)
        uses: list[list[tuple[int, int]]] = [[] for _ in range(nm)]  # (command, sub)
        sizing: list[list[int]] = [[] for _ in range(nm)]
        for k, cmd in enumerate(c.commands):
            t = cmd.type
            if t is CT.NO_OPERATION:
                continue
            if t is CT.ACCEPT_INPUT:
                io[c.submatrices[cmd.dst].matrix] = True
            elif t is CT.PROVIDE_OUTPUT:
                io[c.submatrices[cmd.src].matrix] = True
            if t in (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX):
                sizing[cmd.matrix].append(k)
                continue
            for m in (cmd.matrix, cmd.src_matrix):
                if m:
                    uses[m].append((k, 0))  # swap / compression: whole-matrix use
            for s in command_submatrices(c, cmd):
                uses[c.submatrices[s].matrix].append((k, s))
        changed = 0
        limit: list[int] = []
        for m in range(1, nm):
            if self.state[m] == 0 or not self.is_deriv[m] or io[m]:
                continue
            zero_only = all(s and c.commands[k].type is CT.SET_CONST for k, s in uses[m])
            if self.state[m] == 2:
                if zero_only:
                    for k in sizing[m] + [k for k, _ in uses[m]]:
                        c.commands[k].type = CT.NO_OPERATION
                    changed += 1
                continue
            b, e = int(self.begin[m]), int(self.end[m])
            if all(self._within(s, b, e) or c.commands[k].type is CT.SET_CONST
                   for k, s in uses[m]):
                limit.append(m)
        if limit:
            self.limit_matrices(limit, uses)
            changed += len(limit)
        return changed

    def _within(self, s: int, b: int, e: int) -> bool:
        sm = self.c.submatrices[s]
        return s != 0 and b <= sm.row_offset and sm.row_offset + sm.num_rows <= e

    def limit_matrices(self, limit: list[int], uses) -> None:
        c = self.c
        span = {m: (int(self.begin[m]), int(self.end[m])) for m in limit}
        empty_subs = set()
        for s in range(1, len(c.submatrices)):
            sm = c.submatrices[s]
            if sm.matrix not in span:
                continue
            b, e = span[sm.matrix]
            r0, r1 = max(sm.row_offset, b), min(sm.row_offset + sm.num_rows, e)
            if r1 <= r0:  # only zeroing could use it (checked): those commands go
                empty_subs.add(s)
                r0, r1 = b, b + 1
            c.submatrices[s] = SubMatrix(sm.matrix, r0 - b, r1 - r0, sm.col_offset,
                                         sm.num_cols)
        for m in limit:
            b, e = span[m]
            info = c.matrices[m]
            info.rows = e - b
            if info.indexes is not None:
                info.indexes = info.indexes[b:e]
            for k, s in uses[m]:
                if s in empty_subs:
                    c.commands[k].type = CT.NO_OPERATION


def limit_derivative_times(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Treat derivatives at times outside the options' window as zero (module doc)."""
    window = _time_window(c, options)
    if window is None or not any(m.is_deriv for m in c.matrices):
        return ""  # no derivatives at all (then Kaldi would only drop some stats)
    num_submatrices = len(c.submatrices)
    lim = _Limiter(c, nnet, *window)
    if not (lim.state[1:] != 0).any():
        return ""
    for cmd in c.commands:
        lim.modify(cmd)
    if lim.removed_memos:
        for cmd in c.commands:
            if cmd.type is CT.PROPAGATE and cmd.memo in lim.removed_memos:
                cmd.memo = 0
    pruned = lim.prune_matrices()
    if not (lim.removed or lim.modified or pruned):
        # "" promises an unchanged computation (the pipeline reuses analyses):
        # drop the narrowed submatrices that went unused
        del c.submatrices[num_submatrices:]
        return ""
    lo, hi = window
    return (f"derivative times limited to [{lo if lo > -_BIG else '-inf'}, "
            f"{hi if hi < _BIG else 'inf'}]: {lim.removed} commands removed, "
            f"{lim.modified} narrowed, {pruned} matrices removed or shrunk")
