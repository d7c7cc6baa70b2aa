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

Speed: before the first command every step's final row order is fixed (component
inputs, reorderings) and every cindex's (step, row) indexed, and the descriptor
terms of all steps of one node (a recurrent node has one step per phase,
hundreds of them) are resolved, located and classified (one source step?
consecutive rows?) with a few array operations in one go. What is left per step
is creating its commands. The order in which matrices, submatrices, tables and
commands are created is exactly that of the plain step-by-step walk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..components.base import Flags
from ..computation import Command, CommandType, NnetComputation
from ..descriptor import resolve_part
from ..errors import ComputeError
from ..index import pack, sort_order_txn, unpack
from .graph import ComputationGraph, GraphBuilder, Step

CT = CommandType


class _NodeLocations:
    """Where each scheduled cindex of one node lives: step number and row.

    Built once from the final row order of every step (component inputs and
    reorderings are worked out before any command is emitted), so a lookup is
    one ``searchsorted`` however many steps (phases) the node has."""

    __slots__ = ("keys", "step", "row")

    def __init__(self, keys: np.ndarray, step: np.ndarray, row: np.ndarray):
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.step = step[order]
        self.row = row[order]

    def lookup(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = pack(idx)
        lk = self.keys
        if not len(lk):
            found = np.zeros(len(keys), dtype=bool)
            pos = np.zeros(len(keys), dtype=np.int64)
        else:
            pos = np.minimum(np.searchsorted(lk, keys), len(lk) - 1)
            found = lk[pos] == keys
        if not found.all():
            raise ComputeError(f"internal: cindex not scheduled: "
                               f"{idx[~found][:3].tolist()}")
        return self.step[pos], self.row[pos]


_NO_LOCATIONS = _NodeLocations(np.zeros(0, np.int64), np.zeros(0, np.int64),
                               np.zeros(0, np.int64))


@dataclass(slots=True)
class _Source:
    """One term of one descriptor part for one step (or the source of a dim-range
    step): rows ``rows`` (strictly increasing) of the destination (+)= ``scale``
    times ``node`` at the cindexes that live in step ``steps[j]``, row
    ``srows[j]`` (a constant ``value`` when ``node`` is None). ``single``: all in
    one step (``s0``); ``contig``: moreover ``rows`` and ``srows`` are both runs
    of consecutive rows, starting at ``r0`` and ``sr0``."""

    node: str | None
    scale: float
    rows: np.ndarray
    steps: np.ndarray | None
    srows: np.ndarray | None
    value: float = 0.0
    single: bool = False
    contig: bool = False
    s0: int = 0
    r0: int = 0
    sr0: int = 0


def _cut(node: str | None, scale: float, value: float, rows: np.ndarray,
         steps: np.ndarray | None, srows: np.ndarray | None, bounds: np.ndarray,
         cut: list[int]) -> list[_Source | None]:
    """Cut one term (rows of several concatenated steps; ``bounds``: where each
    step's rows start, ``cut``: where each step's part of the term starts) into
    one :class:`_Source` per step (None where it has no rows), classifying every
    piece with a few array operations for all steps together."""
    g = len(cut) - 1
    m = len(rows)
    if m == 0:
        return [None] * g
    if g == 1:  # one step (most nodes): the same tests on scalars
        if steps is None:
            return [_Source(node, scale, rows - bounds[0] if bounds[0] else rows, None, None,
                            value, False, False, 0, int(rows[0]) - int(bounds[0]), 0)]
        s0 = int(steps[0])
        single = int(steps[-1]) == s0 and (m < 3 or bool((steps == s0).all()))
        contig = single and _contiguous(rows, True) and _contiguous(srows)
        return [_Source(node, scale, rows - bounds[0] if bounds[0] else rows, steps, srows,
                        value, single, contig, s0, int(rows[0]) - int(bounds[0]),
                        int(srows[0]))]
    ca = np.asarray(cut, dtype=np.int64)
    lo, hi = ca[:-1], ca[1:]
    first = np.minimum(lo, m - 1)
    last = np.maximum(hi - 1, 0)
    r_lo = rows[first]
    rows_ok = rows[last] - r_lo == hi - lo - 1
    local0 = (r_lo - bounds[:g]).tolist()
    if steps is None:
        single = contig = [False] * g
        s0 = sr0 = [0] * g
    else:
        brk = np.zeros(m, dtype=np.int64)  # number of step changes before j
        np.cumsum(steps[1:] != steps[:-1], out=brk[1:])
        one = brk[last] == brk[first]
        np.cumsum(srows[1:] != srows[:-1] + 1, out=brk[1:])  # breaks in the source rows
        contig = (one & rows_ok & (brk[last] == brk[first])).tolist()
        single = one.tolist()
        s0 = steps[first].tolist()
        sr0 = srows[first].tolist()
    out: list[_Source | None] = []
    for q in range(g):
        a, b = cut[q], cut[q + 1]
        if a == b:
            out.append(None)
            continue
        whole = a == 0 and b == m
        out.append(_Source(
            node, scale, rows if whole and bounds[q] == 0 else rows[a:b] - bounds[q],
            steps if whole or steps is None else steps[a:b],
            srows if whole or srows is None else srows[a:b], value,
            single[q], contig[q], s0[q], local0[q], sr0[q]))
    return out


@dataclass(slots=True)
class _CompInfo:
    """A component's dims and the property flags the commands depend on."""

    comp: object
    input_dim: int
    output_dim: int
    simple: bool
    updatable: bool
    uses_memo: bool
    reorders: bool
    needs_input: bool
    needs_output: bool


def _contiguous(a: np.ndarray, increasing: bool = False) -> bool:
    """Whether ``a`` is ``a[0], a[0] + 1, ...`` (``a`` non-empty). With
    ``increasing`` (``a`` is known to be strictly increasing) the span says it."""
    n = len(a)
    if int(a[-1]) - int(a[0]) != n - 1:
        return False
    return increasing or n < 3 or bool((a[1:] - a[:-1] == 1).all())


class CommandCompiler:
    """Emits the commands of a scheduled graph (module doc)."""

    # Work out descriptor terms, component inputs and source locations for all
    # steps of a node at once; False: step by step (the reference, for tests).
    batch_steps: bool = True

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
        self.locations: dict[str, _NodeLocations] | None = None
        self.allocated: set[int] = set()
        self._memos = 0
        # Per step: its descriptor's terms with their source locations, one list per
        # part (made for all steps of a node at once; the backward pass reuses them).
        self._sources: list[list[list[_Source]] | None] = [None] * len(self.steps)
        self._part_dims: dict[str, list[int]] = {}
        self._dim_range_src: dict[int, _Source] = {}
        self._props: dict[str, _CompInfo] = {}

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
        model = (self.request.need_model_derivative
                 and self._properties(step.node).updatable)
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
        return self.locations.get(node, _NO_LOCATIONS)

    # -- preparation: row orders and where every cindex lives --------------------------
    def _computability_of(self, i: int):
        """The computability that step ``i``'s descriptor resolves with (a
        multi-segment compiler has one per segment and overrides this)."""
        return self.comp

    def _prepare(self) -> None:
        """Fix every step's final row order (component inputs, reorderings) and
        index where each cindex lives. Nothing here emits commands or objects, so
        doing it up front leaves the computation exactly as step-by-step would."""
        per_node: dict[str, list[int]] = {}
        for i, step in enumerate(self.steps):
            per_node.setdefault(step.node, []).append(i)
        self.steps_of = per_node
        for i, step in enumerate(self.steps):
            if step.kind == "component" and self.input_indexes[i] is None:
                self._component_inputs(i)
        self.locations = {}
        for name, ids in per_node.items():
            if len(ids) == 1:
                i = ids[0]
                k = len(self.steps[i].indexes)
                self.locations[name] = _NodeLocations(
                    pack(self.steps[i].indexes), np.full(k, i, dtype=np.int64),
                    np.arange(k, dtype=np.int64))
                continue
            sizes = [len(self.steps[i].indexes) for i in ids]
            keys = pack(np.concatenate([self.steps[i].indexes for i in ids]))
            step_of = np.repeat(np.asarray(ids, dtype=np.int64), sizes)
            starts = np.cumsum(sizes) - sizes
            row_of = np.arange(len(keys), dtype=np.int64) - np.repeat(starts, sizes)
            self.locations[name] = _NodeLocations(keys, step_of, row_of)

    def _component_inputs(self, i: int) -> None:
        """Row order of the input matrix of step ``i`` and of the other steps of its
        node that resolve with the same computability (reordering their
        ``indexes`` too when the component prefers other orders): the available
        inputs of each step, unique, in (t, x, n) order."""
        step = self.steps[i]
        node = self.node_map[step.node]
        info = self._properties(step.node)
        if info.simple:
            self.input_indexes[i] = step.indexes
            return
        comp = info.comp
        computability = self._computability_of(i)
        group = [j for j in self.steps_of[step.node]
                 if self.input_indexes[j] is None and self.steps[j].kind == "component"
                 and self._computability_of(j) is computability] if self.batch_steps else [i]
        reorders = info.reorders and hasattr(comp, "reorder_indexes")
        memo = computability.input_memo.get(step.node) \
            if len(group) == 1 and self.batch_steps else None
        if memo is not None and np.array_equal(np.sort(pack(step.indexes)), memo[0]):
            # the graph builder worked out the inputs of exactly these outputs
            u = unpack(memo[1])
            in_idx = u[sort_order_txn(u)]
            if reorders:
                in_idx, step.indexes = self._reordered(comp, in_idx, step.indexes)
            self.input_indexes[i] = in_idx
            return
        sizes = [len(self.steps[j].indexes) for j in group]
        out = np.concatenate([self.steps[j].indexes for j in group]) if len(group) > 1 \
            else step.indexes
        deps = computability.input_deps(node, out)
        avail = computability.input_available(node, deps.indexes)
        dep_idx = deps.indexes[avail]
        dep_step = np.repeat(np.arange(len(group), dtype=np.int64), sizes)[deps.owner[avail]]
        # by step, then (t, x, n); then drop repeats of a cindex within a step
        order = np.lexsort((dep_idx[:, 0], dep_idx[:, 2], dep_idx[:, 1], dep_step))
        dep_idx, dep_step = dep_idx[order], dep_step[order]
        keep = np.ones(len(order), dtype=bool)
        if len(order) > 1:
            keep[1:] = (dep_step[1:] != dep_step[:-1]) | (pack(dep_idx[1:]) != pack(dep_idx[:-1]))
        dep_idx, dep_step = dep_idx[keep], dep_step[keep]
        cut = np.searchsorted(dep_step, np.arange(len(group) + 1)).tolist()
        for q, j in enumerate(group):
            in_idx = dep_idx[cut[q]:cut[q + 1]]
            if len(group) > 1:
                in_idx = in_idx.copy()
            if reorders:
                in_idx, self.steps[j].indexes = self._reordered(comp, in_idx,
                                                                self.steps[j].indexes)
            self.input_indexes[j] = in_idx

    def _step_sources(self, i: int) -> list[list[_Source]]:
        """The terms of step ``i``'s descriptor, per part, with source locations.
        Worked out for every step of the node that resolves with the same
        computability at once: resolution is row by row, so resolving the
        concatenated rows and cutting the terms at the step boundaries gives each
        step exactly the terms (in the same order) it would get alone."""
        if self._sources[i] is not None:
            return self._sources[i]
        step = self.steps[i]
        node = self.node_map[step.node]
        computability = self._computability_of(i)
        group = [j for j in self.steps_of[step.node]
                 if self._sources[j] is None and self.steps[j].kind == step.kind
                 and self._computability_of(j) is computability] if self.batch_steps else [i]
        rows_of = [self._descriptor_rows(j) for j in group]
        sizes = [len(r) for r in rows_of]
        idx = rows_of[0] if len(group) == 1 else np.concatenate(rows_of)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        per_step: list[list[list[_Source]]] = [[] for _ in group]
        for part in node.descriptor.parts:
            _, terms = resolve_part(part, idx, computability.computable)
            for lst in per_step:
                lst.append([])
            for t in terms:
                if t.node is None:
                    steps = srows = None
                else:
                    steps, srows = self._locate(t.node).lookup(t.indexes)
                cut = [0, len(t.rows)] if len(group) == 1 else \
                    np.searchsorted(t.rows, bounds).tolist()
                pieces = _cut(t.node, t.scale, t.value, t.rows, steps, srows, bounds, cut)
                for q, piece in enumerate(pieces):
                    if piece is not None:
                        per_step[q][-1].append(piece)
        for j, lst in zip(group, per_step, strict=True):
            self._sources[j] = lst
        return self._sources[i]

    def _source_rows(self, i: int) -> _Source:
        """Where the source cindexes of dim-range step ``i`` live (row ``j`` of the
        step reads ``steps[j]``, ``srows[j]``); looked up for all steps of the
        node at once."""
        found = self._dim_range_src.get(i)
        if found is not None:
            return found
        name = self.steps[i].node
        group = [j for j in self.steps_of[name] if j not in self._dim_range_src] \
            if self.batch_steps else [i]
        sizes = [len(self.steps[j].indexes) for j in group]
        idx = self.steps[i].indexes if len(group) == 1 else \
            np.concatenate([self.steps[j].indexes for j in group])
        steps, srows = self._locate(self.node_map[name].source).lookup(idx)
        cut = np.cumsum([0, *sizes]).tolist()
        bounds = np.asarray(cut, dtype=np.int64)
        rows = np.arange(len(idx), dtype=np.int64)
        for j, piece in zip(group, _cut(name, 1.0, 0.0, rows, steps, srows, bounds, cut),
                            strict=True):
            self._dim_range_src[j] = piece
        return self._dim_range_src[i]

    def _properties(self, name: str) -> _CompInfo:
        """What the commands need of the component of node ``name`` (the
        property flags cost an enum operation per test, so they are read once)."""
        info = self._props.get(name)
        if info is None:
            comp = self.nnet.components[self.node_map[name].component]
            p = comp.properties()
            info = self._props[name] = _CompInfo(
                comp, comp.input_dim, comp.output_dim, bool(p & Flags.SIMPLE),
                bool(p & Flags.UPDATABLE), bool(p & Flags.USES_MEMO),
                bool(p & Flags.REORDERS_INDEXES), bool(p & Flags.BACKPROP_NEEDS_INPUT),
                bool(p & Flags.BACKPROP_NEEDS_OUTPUT))
        return info

    def _descriptor_rows(self, i: int) -> np.ndarray:
        """The cindexes step ``i``'s descriptor is evaluated at (its input rows)."""
        return self.input_indexes[i] if self.steps[i].kind == "component" \
            else self.steps[i].indexes

    def _forward_step(self, i: int, step: Step) -> None:
        if self.locations is None:
            self._prepare()
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
            self._descriptor_forward(i, c.whole(m))
            c.add(Command(CT.PROVIDE_OUTPUT, src=c.whole(m), node=step.node))
        else:
            self._forward_component(i, step, node)

    def _forward_dim_range(self, i: int, step: Step, node) -> None:
        c = self.c
        src = self._source_rows(i)
        k = len(step.indexes)
        if src.contig:
            self.alias[i] = True
            self.value_sub[i] = self._sub(self.value_sub[src.s0], src.sr0, k,
                                          node.dim_offset, node.dim)
            return
        m = c.new_matrix(k, node.dim, step.node, False, step.indexes)
        self.value_sub[i] = c.whole(m)
        self._alloc(m)
        self._gather(c.whole(m), src, 1.0, True, col_range=(node.dim_offset, node.dim))

    def _forward_component(self, i: int, step: Step, node) -> None:
        c = self.c
        info = self._properties(step.node)
        in_idx = self.input_indexes[i]
        if len(in_idx):
            mi = c.new_matrix(len(in_idx), info.input_dim, step.node + "_input", False, in_idx)
            self.input_matrix[i] = mi
            self._alloc(mi)
            self._descriptor_forward(i, c.whole(mi))
        # else: a component with no input rows (ConstantComponent): like Kaldi, no
        # input matrix at all (Propagate gets an empty input).
        mo = c.new_matrix(len(step.indexes), info.output_dim, step.node, False, step.indexes)
        self.value_sub[i] = c.whole(mo)
        self._alloc(mo)
        need_bp = self._backprop_needed(step)
        pre = info.comp.precompute_indexes(in_idx, step.indexes, need_bp)
        if pre is not None:
            c.precomputed.append(pre)
            self.precomputed[i] = len(c.precomputed) - 1
        if info.uses_memo and need_bp:
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
    def _dims(self, name: str, desc) -> list[int]:
        dims = self._part_dims.get(name)
        if dims is None:
            dims = self._part_dims[name] = desc.part_dims(self.nnet.node_dim)
        return dims

    def _descriptor_forward(self, i: int, dst: int) -> None:
        name = self.steps[i].node
        desc = self.node_map[name].descriptor
        nrows = self.c.submatrices[dst].num_rows
        col = 0
        for dim, sources in zip(self._dims(name, desc), self._step_sources(i), strict=True):
            dsub = self._cols(dst, col, dim)
            first = True
            for t in sources:
                if t.node is None:
                    if not first or len(t.rows) != nrows:
                        raise ComputeError("Const() inside Sum/Failover/IfDefined after other "
                                           "terms is not supported")
                    self.c.add(Command(CT.SET_CONST, dst=dsub, alpha=t.value))
                    first = False
                    continue
                self._gather(dsub, t, t.scale, first)
                first = False
            col += dim

    def _gather(self, dsub: int, src: _Source, alpha: float, copy: bool,
                col_range=None) -> None:
        """dst rows ``src.rows`` (+)= alpha * the source values (see _Source): a
        (row-range) matrix copy/add if contiguous, else rows of one source
        submatrix, else the multi-source form."""
        c = self.c
        k = c.submatrices[dsub].num_rows
        rows, steps, srows = src.rows, src.steps, src.srows
        if src.single:
            ssub = self.value_sub[src.s0]
            if col_range is not None:
                ssub = self._cols(ssub, *col_range)
            if src.contig:
                n = len(rows)
                d = self._sub(dsub, src.r0, n, 0, c.submatrices[dsub].num_cols)
                s = self._sub(ssub, src.sr0, n, 0, c.submatrices[ssub].num_cols)
                c.add(Command(CT.MATRIX_COPY if copy else CT.MATRIX_ADD, dst=d, src=s,
                              alpha=alpha))
                return
            table = np.full(k, -1, dtype=np.int64)
            table[rows] = srows
            c.indexes.append(table)
            c.add(Command(CT.COPY_ROWS if copy else CT.ADD_ROWS, dst=dsub, src=ssub,
                          table=len(c.indexes) - 1, alpha=alpha))
            return
        groups = np.unique(steps).tolist()
        table = np.full((k, 2), -1, dtype=np.int64)
        subs = np.zeros(max(groups) + 1, dtype=np.int64)
        for g in groups:
            s = self.value_sub[g]
            if col_range is not None:
                s = self._cols(s, *col_range)
            subs[g] = s
        table[rows, 0] = subs[steps]
        table[rows, 1] = srows
        c.indexes_multi.append(table)
        c.add(Command(CT.COPY_ROWS_MULTI if copy else CT.ADD_ROWS_MULTI, dst=dsub,
                      table=len(c.indexes_multi) - 1, alpha=alpha))

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
                src = self._source_rows(i)
                base = self.deriv_sub[src.s0]
                self.deriv_sub[i] = self._sub(base, src.sr0, v.num_rows,
                                              node.dim_offset, node.dim)

    def _backward_step(self, i: int, step: Step) -> None:
        c = self.c
        node = self.node_map[step.node]
        if step.kind == "output":
            spec = self.request.output(step.node)
            if spec is None or not spec.has_deriv or not self.deriv_sub[i]:
                return
            c.add(Command(CT.ACCEPT_INPUT, dst=self.deriv_sub[i], node=step.node, is_deriv=True))
            self._descriptor_backward(i, self.deriv_sub[i])
        elif step.kind == "input":
            if self.deriv_sub[i]:
                c.add(Command(CT.PROVIDE_OUTPUT, src=self.deriv_sub[i], node=step.node,
                              is_deriv=True))
        elif step.kind == "dim-range":
            if self.alias[i] or not self.deriv_sub[i]:
                return
            self._scatter(self.deriv_sub[i], self._source_rows(i), 1.0,
                          col_range=(node.dim_offset, node.dim))
        elif self._backprop_needed(step):
            info = self._properties(step.node)
            in_deriv = 0
            if self.input_side_deriv[step.node] and self.input_matrix[i]:
                mat = c.matrices[self.input_matrix[i]]
                md = c.new_matrix(mat.rows, mat.cols, step.node + "_input", True,
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
                                    if info.needs_input and self.input_matrix[i] else 0),
                          out_value=self.value_sub[i] if info.needs_output else 0,
                          out_deriv=self.deriv_sub[i], in_deriv=in_deriv, memo=self.memo[i]))
            if in_deriv:
                self._descriptor_backward(i, in_deriv)

    def _descriptor_backward(self, i: int, src_deriv: int) -> None:
        name = self.steps[i].node
        desc = self.node_map[name].descriptor
        col = 0
        for dim, sources in zip(self._dims(name, desc), self._step_sources(i), strict=True):
            psub = self._cols(src_deriv, col, dim)
            for t in sources:
                if t.node is None or not self.need_deriv.get(t.node):
                    continue
                self._scatter(psub, t, t.scale)
            col += dim

    def _scatter(self, psub: int, src: _Source, alpha: float, col_range=None) -> None:
        """The derivative at step ``src.steps[j]``, row ``src.srows[j]`` += alpha *
        psub[src.rows[j]]."""
        if src.single:
            parts = [(src.s0, src.rows, src.srows, src.contig)]
        else:
            parts = []
            for g in np.unique(src.steps).tolist():
                sel = src.steps == g
                prows, drows = src.rows[sel], src.srows[sel]
                parts.append((g, prows, drows,
                              _contiguous(prows, True) and _contiguous(drows)))
        for g, prows, drows, contig in parts:
            dsub = self.deriv_sub[g]
            if col_range is not None:
                dsub = self._cols(dsub, *col_range)
            self._scatter_one(dsub, psub, prows, drows, alpha, contig)

    def _scatter_one(self, dsub: int, psub: int, prows: np.ndarray, drows: np.ndarray,
                     alpha: float, contig: bool) -> None:
        c = self.c
        n = len(prows)
        if n == 0:
            return
        nd = c.submatrices[dsub].num_rows
        if contig:
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
