"""Turning the scheduled graph into an NnetComputation (forward and backward commands).

Per step: a value matrix (rows = the step's cindexes); a component step also gets
an input matrix filled from its descriptor, then a Propagate. A dim-range step is
a column range of its source's matrix when its rows are a contiguous row range of
one source step, else a copy. The backward pass runs the steps in reverse:
output derivatives are accepted, each descriptor's derivative is added back into
its sources, each component runs Backprop.

Row operations are chosen from the row mapping of each term: whole-matrix or
row-range copies where the mapping is contiguous, ``CopyRows``/``AddRows`` for one
source matrix, the ``Multi`` forms for several. Backward scatters never write a
row twice in one command: injective maps use one ``AddRows`` over the source
rows, contiguous fan-in uses ``AddRowRanges``, anything else is split into rounds.
"""

from __future__ import annotations

import numpy as np

from ..components.base import Flags
from ..computation import Command, CommandType, NnetComputation
from ..descriptor import part_dim, resolve_part
from ..errors import ComputeError
from ..index import pack, sort_order_txn, unpack
from .graph import ComputationGraph, GraphBuilder, Step
from .keymap import unique_keys

CT = CommandType


class _NodeLocations:
    """Where each cindex of a node lives: step number and row.

    Steps are added one at a time (a recurrent node gets one step per phase, so
    thousands of them) and looked up in between, so the sorted key arrays are kept
    as a few levels merged like a binary counter: adding and looking up stay
    ``O(log(steps))`` array operations instead of re-sorting everything per step."""

    def __init__(self):
        self.levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, step: int, indexes: np.ndarray) -> None:
        keys = pack(indexes)
        order = np.argsort(keys, kind="stable")
        level = (keys[order], np.full(len(keys), step, dtype=np.int64),
                 order.astype(np.int64))
        while self.levels and len(self.levels[-1][0]) <= 2 * len(level[0]):
            prev = self.levels.pop()
            k = np.concatenate([prev[0], level[0]])
            o = np.argsort(k, kind="stable")
            level = (k[o], np.concatenate([prev[1], level[1]])[o],
                     np.concatenate([prev[2], level[2]])[o])
        self.levels.append(level)

    def lookup(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = pack(idx)
        step_of = np.full(len(keys), -1, dtype=np.int64)
        row_of = np.full(len(keys), -1, dtype=np.int64)
        for lk, ls, lr in self.levels:
            if not len(lk):
                continue
            pos = np.minimum(np.searchsorted(lk, keys), len(lk) - 1)
            hit = (lk[pos] == keys) & (step_of < 0)
            step_of[hit] = ls[pos[hit]]
            row_of[hit] = lr[pos[hit]]
        if (step_of < 0).any():
            raise ComputeError(f"internal: cindex not scheduled: "
                               f"{idx[step_of < 0][:3].tolist()}")
        return step_of, row_of


class CommandCompiler:
    def __init__(self, nnet, request, builder: GraphBuilder, graph: ComputationGraph):
        self.nnet = nnet
        self.request = request
        self.builder = builder
        self.steps = graph.steps
        self.comp = graph.computability
        self.c = NnetComputation(need_model_derivative=request.need_model_derivative,
                                 request=request)
        self.value_sub: list[int] = [0] * len(self.steps)
        self.deriv_sub: list[int] = [0] * len(self.steps)
        self.input_matrix: list[int] = [0] * len(self.steps)
        self.input_deriv_matrix: list[int] = [0] * len(self.steps)
        self.input_indexes: list[np.ndarray | None] = [None] * len(self.steps)
        self.precomputed: list[int] = [0] * len(self.steps)
        self.memo: list[int] = [0] * len(self.steps)
        self.alias: list[bool] = [False] * len(self.steps)
        self.locations: dict[str, _NodeLocations] = {}
        self.allocated: set[int] = set()
        self._memos = 0

    # -- derivative bookkeeping ---------------------------------------------------
    def _deriv_flags(self) -> None:
        nodes = self.nnet.nodes
        node_map = self.nnet.node_map
        want_model = self.request.need_model_derivative
        src = {n.name: False for n in nodes}
        for spec in self.request.inputs:
            if spec.has_deriv:
                src[spec.name] = True
        changed = True
        while changed:
            changed = False
            for n in nodes:
                v = src[n.name]
                if n.kind == "component-node" and want_model and \
                        self.nnet.components[n.component].is_updatable():
                    v = True
                v = v or any(src[s] for s in n.inputs())
                if v != src[n.name]:
                    src[n.name] = v
                    changed = True
        out = {n.name: False for n in nodes}
        for spec in self.request.outputs:
            if spec.has_deriv:
                out[spec.name] = True
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if out[n.name]:
                    for s in n.inputs():
                        if not out[s]:
                            out[s] = changed = True
        self.need_deriv = {k: src[k] and out[k] for k in src}
        self.input_side_deriv = {
            n.name: any(self.need_deriv[s] for s in n.inputs()) for n in nodes}
        self.node_map = node_map

    def _backprop_needed(self, step: Step) -> bool:
        if step.kind != "component" or not self.need_deriv[step.node]:
            return False
        comp = self.nnet.components[self.node_map[step.node].component]
        model = self.request.need_model_derivative and comp.is_updatable()
        return model or self.input_side_deriv[step.node]

    # -- helpers ------------------------------------------------------------------
    def _alloc(self, m: int, zero: bool = True) -> None:
        self.c.add(Command(CT.ALLOC_MATRIX, matrix=m))
        self.allocated.add(m)
        if zero:
            self.c.add(Command(CT.SET_CONST, dst=self.c.whole(m), alpha=0.0))

    def _sub(self, s: int, row0: int, nrows: int, col0: int, ncols: int) -> int:
        """Submatrix of submatrix ``s`` (returns ``s`` itself when it is the same)."""
        base = self.c.submatrices[s]
        if row0 == 0 and nrows == base.num_rows and col0 == 0 and ncols == base.num_cols:
            return s
        return self.c.new_submatrix(base.matrix, base.row_offset + row0, nrows,
                                    base.col_offset + col0, ncols)

    def _cols(self, s: int, col0: int, ncols: int) -> int:
        return self._sub(s, 0, self.c.submatrices[s].num_rows, col0, ncols)

    # -- main -------------------------------------------------------------------------
    def compile(self) -> NnetComputation:
        self._deriv_flags()
        c = self.c
        c.add(Command(CT.NO_OPERATION_PERMANENT))
        for i, step in enumerate(self.steps):
            self._forward_step(i, step)
        if any(self.need_deriv.values()):
            c.add(Command(CT.NO_OPERATION_MARKER))
            self._allocate_derivs()
            for i in range(len(self.steps) - 1, -1, -1):
                self._backward_step(i, self.steps[i])
        else:
            c.add(Command(CT.NO_OPERATION_MARKER))
        keep = set()
        for i, step in enumerate(self.steps):
            if step.kind == "output":
                keep.add(c.submatrices[self.value_sub[i]].matrix)
            if step.kind == "input" and self.deriv_sub[i]:
                keep.add(c.submatrices[self.deriv_sub[i]].matrix)
        for m in range(1, len(c.matrices)):
            if m not in keep:
                c.add(Command(CT.DEALLOC_MATRIX, matrix=m))
        return c

    def _locate(self, node: str) -> _NodeLocations:
        return self.locations.setdefault(node, _NodeLocations())

    def _forward_step(self, i: int, step: Step) -> None:
        c = self.c
        node = self.node_map[step.node]
        k = len(step.indexes)
        if step.kind == "input":
            m = c.new_matrix(k, node.dim, step.node, False, step.indexes)
            self.value_sub[i] = c.whole(m)
            self.allocated.add(m)
            c.add(Command(CT.ACCEPT_INPUT, dst=c.whole(m), node=step.node))
        elif step.kind == "dim-range":
            self._forward_dim_range(i, step, node)
        elif step.kind == "output":
            dim = self.nnet.node_dim(step.node)
            m = c.new_matrix(k, dim, step.node, False, step.indexes)
            self.value_sub[i] = c.whole(m)
            self._alloc(m)
            self._descriptor_forward(node.descriptor, step.indexes, c.whole(m))
            c.add(Command(CT.PROVIDE_OUTPUT, src=c.whole(m), node=step.node))
        else:
            self._forward_component(i, step, node)
        self._locate(step.node).add(i, step.indexes)

    def _forward_dim_range(self, i: int, step: Step, node) -> None:
        c = self.c
        src_steps, src_rows = self._locate(node.source).lookup(step.indexes)
        k = len(step.indexes)
        if (src_steps == src_steps[0]).all() and np.array_equal(
                src_rows, src_rows[0] + np.arange(k)):
            self.alias[i] = True
            self.value_sub[i] = self._sub(self.value_sub[src_steps[0]], int(src_rows[0]), k,
                                          node.dim_offset, node.dim)
            return
        m = c.new_matrix(k, node.dim, step.node, False, step.indexes)
        self.value_sub[i] = c.whole(m)
        self._alloc(m)
        self._gather(c.whole(m), node.source, step.indexes, 1.0, True,
                     col_range=(node.dim_offset, node.dim))

    def _forward_component(self, i: int, step: Step, node) -> None:
        c = self.c
        comp = self.nnet.components[node.component]
        props = comp.properties()
        if comp.is_simple():
            in_idx = step.indexes
        else:
            deps = comp.input_indexes(step.indexes)
            avail = self.comp.input_available(node, deps.indexes)
            u = unpack(unique_keys(pack(deps.indexes[avail])))
            in_idx = u[sort_order_txn(u)]
            if props & Flags.REORDERS_INDEXES and hasattr(comp, "reorder_indexes"):
                in_idx, step.indexes = self._reordered(comp, in_idx, step.indexes)
        self.input_indexes[i] = in_idx
        if len(in_idx):
            mi = c.new_matrix(len(in_idx), comp.input_dim, step.node + "_input", False, in_idx)
            self.input_matrix[i] = mi
            self._alloc(mi)
            self._descriptor_forward(node.descriptor, in_idx, c.whole(mi))
        # else: a component with no input rows (ConstantComponent): like Kaldi, no
        # input matrix at all (Propagate gets an empty input).
        mo = c.new_matrix(len(step.indexes), comp.output_dim, step.node, False, step.indexes)
        self.value_sub[i] = c.whole(mo)
        self._alloc(mo)
        need_bp = self._backprop_needed(step)
        pre = comp.precompute_indexes(in_idx, step.indexes, need_bp)
        if pre is not None:
            c.precomputed.append(pre)
            self.precomputed[i] = len(c.precomputed) - 1
        if props & Flags.USES_MEMO and need_bp:
            self._memos += 1
            self.memo[i] = self._memos
        c.add(Command(CT.PROPAGATE, node=step.node, precomputed=self.precomputed[i],
                      in_value=c.whole(self.input_matrix[i]) if self.input_matrix[i] else 0,
                      out_value=c.whole(mo), memo=self.memo[i],
                      alpha=1.0 if not self.request.store_component_stats else 2.0))

    @staticmethod
    def _reordered(comp, in_idx: np.ndarray, out_idx: np.ndarray):
        """The row orders the component prefers (Kaldi's ReorderIndexes), which
        spare it and its neighbours reordering copies. Only pure permutations are
        taken; padding rows (Kaldi adds some for a few components) are not."""
        new_in, new_out = comp.reorder_indexes(in_idx, out_idx)
        new_in = np.asarray(new_in, dtype=np.int64).reshape(-1, 3)
        new_out = np.asarray(new_out, dtype=np.int64).reshape(-1, 3)
        same = (len(new_in) == len(in_idx) and len(new_out) == len(out_idx)
                and np.array_equal(np.sort(pack(new_in)), np.sort(pack(in_idx)))
                and np.array_equal(np.sort(pack(new_out)), np.sort(pack(out_idx))))
        return (new_in, new_out) if same else (in_idx, out_idx)

    # -- descriptor evaluation -------------------------------------------------------
    def _descriptor_forward(self, desc, idx: np.ndarray, dst: int) -> None:
        col = 0
        for part in desc.parts:
            dim = part_dim(part, self.nnet.node_dim)
            ok, terms = resolve_part(part, idx, self.comp.computable)
            dsub = self._cols(dst, col, dim)
            first = True
            for t in terms:
                if t.node is None:
                    if not first or len(t.rows) != len(idx):
                        raise ComputeError("Const() inside Sum/Failover/IfDefined after other "
                                           "terms is not supported")
                    self.c.add(Command(CT.SET_CONST, dst=dsub, alpha=t.value))
                    first = False
                    continue
                self._gather(dsub, t.node, t.indexes, t.scale, first, rows=t.rows)
                first = False
            col += dim

    def _gather(self, dsub: int, node: str, src_idx: np.ndarray, alpha: float, copy: bool,
                rows: np.ndarray | None = None, col_range=None) -> None:
        """dst rows ``rows`` (default all) (+)= alpha * node's value at ``src_idx``."""
        c = self.c
        k = c.submatrices[dsub].num_rows
        if rows is None:
            rows = np.arange(len(src_idx))
        steps, srows = self._locate(node).lookup(src_idx)
        groups = np.unique(steps)
        if len(groups) == 1:
            ssub = self.value_sub[groups[0]]
            if col_range is not None:
                ssub = self._cols(ssub, *col_range)
            self._rows_op(dsub, ssub, rows, srows, k, alpha, copy)
            return
        table = np.full((k, 2), -1, dtype=np.int64)
        subs = {}
        for g in groups:
            s = self.value_sub[g]
            if col_range is not None:
                s = self._cols(s, *col_range)
            subs[g] = s
        table[rows, 0] = np.array([subs[g] for g in steps.tolist()], dtype=np.int64)
        table[rows, 1] = srows
        c.indexes_multi.append(table)
        c.add(Command(CT.COPY_ROWS_MULTI if copy else CT.ADD_ROWS_MULTI, dst=dsub,
                      table=len(c.indexes_multi) - 1, alpha=alpha))

    def _rows_op(self, dsub, ssub, rows, srows, k, alpha, copy) -> None:
        """One source submatrix: a (row-range) matrix copy/add if contiguous, else rows."""
        c = self.c
        n = len(rows)
        if n and np.array_equal(rows, rows[0] + np.arange(n)) and np.array_equal(
                srows, srows[0] + np.arange(n)):
            d = self._sub(dsub, int(rows[0]), n, 0, c.submatrices[dsub].num_cols)
            s = self._sub(ssub, int(srows[0]), n, 0, c.submatrices[ssub].num_cols)
            c.add(Command(CT.MATRIX_COPY if copy else CT.MATRIX_ADD, dst=d, src=s, alpha=alpha))
            return
        table = np.full(k, -1, dtype=np.int64)
        table[rows] = srows
        c.indexes.append(table)
        c.add(Command(CT.COPY_ROWS if copy else CT.ADD_ROWS, dst=dsub, src=ssub,
                      table=len(c.indexes) - 1, alpha=alpha))

    # -- backward -------------------------------------------------------------------------
    def _allocate_derivs(self) -> None:
        c = self.c
        for i, step in enumerate(self.steps):
            if not self.need_deriv.get(step.node):
                continue
            if self.alias[i]:
                continue
            info = c.matrices[c.submatrices[self.value_sub[i]].matrix]
            m = c.new_matrix(info.rows, info.cols, step.node, True, step.indexes)
            self.deriv_sub[i] = c.whole(m)
            if step.kind == "output":
                # Filled (and created) by the user's derivative, as in Kaldi: the
                # accept-input command is the allocation.
                self.allocated.add(m)
            else:
                self._alloc(m)
        for i, step in enumerate(self.steps):
            if self.alias[i] and self.need_deriv.get(step.node):
                node = self.node_map[step.node]
                v = c.submatrices[self.value_sub[i]]
                src_steps, src_rows = self._locate(node.source).lookup(step.indexes[:1])
                base = self.deriv_sub[src_steps[0]]
                self.deriv_sub[i] = self._sub(base, int(src_rows[0]), v.num_rows,
                                              node.dim_offset, node.dim)

    def _backward_step(self, i: int, step: Step) -> None:
        c = self.c
        node = self.node_map[step.node]
        if step.kind == "output":
            spec = self.request.output(step.node)
            if spec is None or not spec.has_deriv or not self.deriv_sub[i]:
                return
            c.add(Command(CT.ACCEPT_INPUT, dst=self.deriv_sub[i], node=step.node, is_deriv=True))
            self._descriptor_backward(node.descriptor, step.indexes, self.deriv_sub[i])
        elif step.kind == "input":
            if self.deriv_sub[i]:
                c.add(Command(CT.PROVIDE_OUTPUT, src=self.deriv_sub[i], node=step.node,
                              is_deriv=True))
        elif step.kind == "dim-range":
            if self.alias[i] or not self.deriv_sub[i]:
                return
            self._scatter(self.deriv_sub[i], node.source, step.indexes, 1.0,
                          np.arange(len(step.indexes)), col_range=(node.dim_offset, node.dim))
        elif self._backprop_needed(step):
            comp = self.nnet.components[node.component]
            props = comp.properties()
            in_deriv = 0
            if self.input_side_deriv[step.node] and self.input_matrix[i]:
                mi = self.input_matrix[i]
                info = c.matrices[mi]
                md = c.new_matrix(info.rows, info.cols, step.node + "_input", True,
                                  self.input_indexes[i])
                self._alloc(md)
                in_deriv = c.whole(md)
                self.input_deriv_matrix[i] = md
            # Kaldi uses kBackprop (with a to-update component) for every component
            # once model derivatives are wanted, updatable or not.
            model = self.request.need_model_derivative
            c.add(Command(CT.BACKPROP if model else CT.BACKPROP_NO_MODEL_UPDATE,
                          node=step.node, precomputed=self.precomputed[i],
                          in_value=(c.whole(self.input_matrix[i])
                                    if props & Flags.BACKPROP_NEEDS_INPUT
                                    and self.input_matrix[i] else 0),
                          out_value=(self.value_sub[i]
                                     if props & Flags.BACKPROP_NEEDS_OUTPUT else 0),
                          out_deriv=self.deriv_sub[i], in_deriv=in_deriv, memo=self.memo[i]))
            if in_deriv:
                self._descriptor_backward(node.descriptor, self.input_indexes[i], in_deriv)

    def _descriptor_backward(self, desc, idx: np.ndarray, src_deriv: int) -> None:
        col = 0
        for part in desc.parts:
            dim = part_dim(part, self.nnet.node_dim)
            _, terms = resolve_part(part, idx, self.comp.computable)
            psub = self._cols(src_deriv, col, dim)
            for t in terms:
                if t.node is None or not self.need_deriv.get(t.node):
                    continue
                self._scatter(psub, t.node, t.indexes, t.scale, t.rows)
            col += dim

    def _scatter(self, psub: int, node: str, src_idx: np.ndarray, alpha: float,
                 rows: np.ndarray, col_range=None) -> None:
        """node's deriv at ``src_idx`` += alpha * psub[rows]."""
        steps, srows = self._locate(node).lookup(src_idx)
        for g in np.unique(steps):
            sel = steps == g
            dsub = self.deriv_sub[g]
            if col_range is not None:
                dsub = self._cols(dsub, *col_range)
            self._scatter_one(dsub, psub, rows[sel], srows[sel], alpha)

    def _scatter_one(self, dsub: int, psub: int, prows: np.ndarray, drows: np.ndarray,
                     alpha: float) -> None:
        c = self.c
        n = len(prows)
        if n == 0:
            return
        nd = c.submatrices[dsub].num_rows
        if np.array_equal(prows, prows[0] + np.arange(n)) and np.array_equal(
                drows, drows[0] + np.arange(n)):
            d = self._sub(dsub, int(drows[0]), n, 0, c.submatrices[dsub].num_cols)
            s = self._sub(psub, int(prows[0]), n, 0, c.submatrices[psub].num_cols)
            c.add(Command(CT.MATRIX_ADD, dst=d, src=s, alpha=alpha))
            return
        order = np.lexsort((prows, drows))
        prows, drows = prows[order], drows[order]
        first = np.ones(n, dtype=bool)
        first[1:] = drows[1:] != drows[:-1]
        if first.all():
            table = np.full(nd, -1, dtype=np.int64)
            table[drows] = prows
            c.indexes.append(table)
            c.add(Command(CT.ADD_ROWS, dst=dsub, src=psub, table=len(c.indexes) - 1,
                          alpha=alpha))
            return
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], n)
        lo, hi = prows[starts], prows[ends - 1] + 1
        if np.array_equal(hi - lo, ends - starts):  # each fan-in is a contiguous range
            ranges = np.zeros((nd, 2), dtype=np.int64)
            ranges[drows[starts], 0] = lo
            ranges[drows[starts], 1] = hi
            c.indexes_ranges.append(ranges)
            c.add(Command(CT.ADD_ROW_RANGES, dst=dsub, src=psub,
                          table=len(c.indexes_ranges) - 1, alpha=alpha))
            return
        rank = np.arange(n) - np.repeat(starts, ends - starts)
        for r in range(int(rank.max()) + 1):
            sel = rank == r
            table = np.full(nd, -1, dtype=np.int64)
            table[drows[sel]] = prows[sel]
            c.indexes.append(table)
            c.add(Command(CT.ADD_ROWS, dst=dsub, src=psub, table=len(c.indexes) - 1,
                          alpha=alpha))


def compile_commands(nnet, request, builder: GraphBuilder,
                     graph: ComputationGraph) -> NnetComputation:
    return CommandCompiler(nnet, request, builder, graph).compile()
