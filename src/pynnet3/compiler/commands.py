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
consecutive rows?) with a few array operations in one go, on packed index keys.
What is left per step is creating its commands. The order in which matrices,
submatrices, tables and commands are created is exactly that of the plain
step-by-step walk (accept-input and provide-output commands are held back and
put at their segment's ends, where Kaldi's ConsolidateIoOperations puts them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..components.base import Component, Flags
from ..computation import Command, CommandType, NnetComputation

# (on packed keys; the name is the one tests count resolutions through)
from ..descriptor import resolve_part_keys
from ..errors import ComputeError
from ..index import pack, txn_keys, unique_keys, unpack
from .graph import ComputationGraph, GraphBuilder, Step

CT = CommandType
# The types the per-step paths create (a module constant is read ~10x faster than
# an Enum member through its class).
_ALLOC, _SET_CONST, _COPY, _ADD, _PROPAGATE = (
    CT.ALLOC_MATRIX, CT.SET_CONST, CT.MATRIX_COPY, CT.MATRIX_ADD, CT.PROPAGATE)
_SIMPLE, _UPDATABLE, _USES_MEMO, _REORDERS, _NEEDS_INPUT, _NEEDS_OUTPUT = (
    int(f) for f in (Flags.SIMPLE, Flags.UPDATABLE, Flags.USES_MEMO, Flags.REORDERS_INDEXES,
                     Flags.BACKPROP_NEEDS_INPUT, Flags.BACKPROP_NEEDS_OUTPUT))


class _NodeLocations:
    """Where each scheduled cindex of one node lives: step number and row.

    Built once from the final row order of every step (component inputs and
    reorderings are worked out before any command is emitted), so a lookup is
    one ``searchsorted`` however many steps (phases) the node has."""

    __slots__ = ("keys", "step", "row", "only")

    def __init__(self, keys: np.ndarray, step: np.ndarray | int, row: np.ndarray | None):
        """``keys`` of the rows of the node's steps, and the step and row of each;
        ``step`` an int and ``row`` None: all rows of that one step, in order."""
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        if row is None:
            self.only, self.step, self.row = step, None, order
        else:
            self.only, self.step, self.row = None, step[order], row[order]

    def lookup(self, idx: np.ndarray) -> tuple[np.ndarray | int, np.ndarray]:
        return self.lookup_keys(pack(idx))

    def lookup_keys(self, keys: np.ndarray) -> tuple[np.ndarray | int, np.ndarray]:
        """(step, row) of each packed cindex key. The step is an int when the node
        has one step (every node outside a recurrence): the same for all rows,
        with no array to make and test."""
        lk = self.keys
        if not len(lk):
            found = np.zeros(len(keys), dtype=bool)
            pos = np.zeros(len(keys), dtype=np.int64)
        else:
            pos = lk.searchsorted(keys)
            np.minimum(pos, len(lk) - 1, out=pos)
            found = lk[pos] == keys
        if not found.all():
            raise ComputeError(f"internal: cindex not scheduled: "
                               f"{unpack(keys[~found][:3]).tolist()}")
        if self.only is not None:
            return self.only, self.row[pos]
        return self.step[pos], self.row[pos]


_NO_LOCATIONS = _NodeLocations(np.zeros(0, np.int64), 0, None)


class _Source:
    """One term of one descriptor part for one step (or the source of a dim-range
    step): rows ``rows`` (strictly increasing) of the destination (+)= ``scale``
    times ``node`` at the cindexes that live in step ``steps[j]``, row
    ``srows[j]`` (a constant ``value`` when ``node`` is None); ``n`` rows in all.
    ``single``: all in one step (``s0``); ``contig``: moreover ``rows`` and
    ``srows`` are both runs of consecutive rows, starting at ``r0`` and ``sr0``.

    A contiguous piece (nearly every piece of a recurrence's steps) is fully
    described by ``n``, ``s0``, ``r0`` and ``sr0``: its row arrays are only made
    when asked for, which the command compiler never does."""

    __slots__ = ("node", "scale", "value", "n", "single", "contig", "s0", "r0", "sr0",
                 "_rows", "_steps", "_srows")

    def __init__(self, node: str | None, scale: float, value: float, n: int, single: bool,
                 contig: bool, s0: int, r0: int, sr0: int, rows: np.ndarray | None,
                 steps: np.ndarray | None, srows: np.ndarray | None):
        self.node = node
        self.scale = scale
        self.value = value
        self.n = n
        self.single = single
        self.contig = contig
        self.s0 = s0
        self.r0 = r0
        self.sr0 = sr0
        self._rows = rows
        self._steps = steps
        self._srows = srows

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            return np.arange(self.r0, self.r0 + self.n, dtype=np.int64)
        return self._rows

    @property
    def steps(self) -> np.ndarray | None:
        if self._steps is None and self.single:
            return np.full(self.n, self.s0, dtype=np.int64)
        return self._steps

    @property
    def srows(self) -> np.ndarray | None:
        if self._srows is None and self.contig:
            return np.arange(self.sr0, self.sr0 + self.n, dtype=np.int64)
        return self._srows


def _cut(node: str | None, scale: float, value: float, rows: np.ndarray,
         steps: np.ndarray | int | None, srows: np.ndarray | None, bounds: np.ndarray,
         cut: list[int]) -> list[_Source | None]:
    """Cut one term (rows of several concatenated steps; ``bounds``: where each
    step's rows start, ``cut``: where each step's part of the term starts) into
    one :class:`_Source` per step (None where it has no rows), classifying every
    piece with a few array operations for all steps together. ``steps``: the
    source step of each row, or one int for all (see
    :meth:`_NodeLocations.lookup_keys`)."""
    g = len(cut) - 1
    m = len(rows)
    if m == 0:
        return [None] * g
    if g == 1:  # one step (most nodes): the same tests on scalars
        b0 = int(bounds[0])
        local = rows - b0 if b0 else rows
        if steps is None:
            return [_Source(node, scale, value, m, False, False, 0, int(rows[0]) - b0, 0,
                            local, None, None)]
        if isinstance(steps, int):
            s0, single, steps = steps, True, None
        else:
            s0 = int(steps[0])
            single = int(steps[-1]) == s0 and (m < 3 or bool((steps == s0).all()))
        contig = single and _contiguous(rows, True) and _contiguous(srows)
        return [_Source(node, scale, value, m, single, contig, s0, int(rows[0]) - b0,
                        int(srows[0]), local, steps, srows)]
    if isinstance(steps, int):
        steps = np.full(m, steps, dtype=np.int64)
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
    sizes = (hi - lo).tolist()
    if all(contig) and 0 not in sizes:  # (every step of a recurrence, typically)
        return [_Source(node, scale, value, n, True, True, s, r, sr, None, None, None)
                for n, s, r, sr in zip(sizes, s0, local0, sr0, strict=True)]
    blist = bounds.tolist()
    out: list[_Source | None] = []
    for q in range(g):
        a, b = cut[q], cut[q + 1]
        if a == b:
            out.append(None)
        elif contig[q]:  # described by its first rows (class doc)
            out.append(_Source(node, scale, value, b - a, True, True, s0[q], local0[q],
                               sr0[q], None, None, None))
        else:
            out.append(_Source(
                node, scale, value, b - a, single[q], False, s0[q], local0[q], sr0[q],
                rows[a:b] - blist[q], None if steps is None else steps[a:b],
                None if srows is None else srows[a:b]))
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
    precomputes: bool  # its class has a precompute_indexes of its own


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
        self.node_map = nnet.node_map
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
        self._bp_needed: dict[str, bool] = {}
        # accept-input and provide-output commands held back (:meth:`_add_io`)
        self._io: tuple[list[Command], list[Command]] | None = None
        self._memos = 0
        # Per step: its descriptor's terms, per part, each term as its pieces for
        # all steps of the group it was worked out with (shared by the group), and
        # its place in that group (its piece is ``pieces[place]``; None: no rows).
        self._sources: list[list[list[list[_Source | None]]] | None] = [None] * len(self.steps)
        self._place: list[int] = [0] * len(self.steps)
        self._part_dims: dict[str, list[int]] = {}
        self._dim_range_src: dict[int, _Source] = {}
        self._props: dict[str, _CompInfo] = {}

    # -- derivative bookkeeping ---------------------------------------------------
    def _deriv_flags(self) -> None:
        nodes = self.nnet.nodes
        node_map = self.nnet.node_map
        inputs = {n.name: n.inputs() for n in nodes}
        want_model = self.request.need_model_derivative
        src = {n.name: False for n in nodes}
        for spec in self.request.inputs:
            if spec.has_deriv:
                src[spec.name] = True
        if want_model:
            for n in nodes:
                if n.kind == "component-node" and self._flags(n) & _UPDATABLE:
                    src[n.name] = True
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if not src[n.name] and any(src[s] for s in inputs[n.name]):
                    src[n.name] = changed = True
        out = {n.name: False for n in nodes}
        for spec in self.request.outputs:
            if spec.has_deriv:
                out[spec.name] = True
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if out[n.name]:
                    for s in inputs[n.name]:
                        if not out[s]:
                            out[s] = changed = True
        self.need_deriv = {k: src[k] and out[k] for k in src}
        self.input_side_deriv = {
            n.name: any(self.need_deriv[s] for s in inputs[n.name]) for n in nodes}
        self.node_map = node_map

    def _backprop_needed(self, step: Step) -> bool:
        if step.kind != "component":
            return False
        found = self._bp_needed.get(step.node)
        if found is None:
            found = self._bp_needed[step.node] = self.need_deriv[step.node] and (
                (self.request.need_model_derivative
                 and self._properties(step.node).updatable)
                or self.input_side_deriv[step.node])
        return found

    # -- helpers ------------------------------------------------------------------
    def _alloc(self, m: int) -> int:
        """Allocate matrix ``m`` and zero it; returns its whole submatrix."""
        c = self.c
        whole = c.whole(m)
        append = c.commands.append
        append(Command(_ALLOC, matrix=m))
        append(Command(_SET_CONST, dst=whole, alpha=0.0))
        return whole

    def _sub(self, s: int, row0: int, nrows: int, col0: int, ncols: int) -> int:
        """Submatrix of submatrix ``s`` (returns ``s`` itself when it is the same)."""
        base = self.c.submatrices[s]
        if row0 == 0 and nrows == base.num_rows and col0 == 0 and ncols == base.num_cols:
            return s
        return self.c.new_submatrix(base.matrix, base.row_offset + row0, nrows,
                                    base.col_offset + col0, ncols)

    def _rows(self, s: int, row0: int, nrows: int) -> int:
        """``_sub`` of all columns."""
        base = self.c.submatrices[s]
        if row0 == 0 and nrows == base.num_rows:
            return s
        return self.c.new_submatrix(base.matrix, base.row_offset + row0, nrows,
                                    base.col_offset, base.num_cols)

    def _cols(self, s: int, col0: int, ncols: int) -> int:
        """``_sub`` of all rows."""
        base = self.c.submatrices[s]
        if col0 == 0 and ncols == base.num_cols:
            return s
        return self.c.new_submatrix(base.matrix, base.row_offset, base.num_rows,
                                    base.col_offset + col0, ncols)

    # -- main -------------------------------------------------------------------------
    def compile(self) -> NnetComputation:
        """The forward segment, then the backward one. As Kaldi's compiler (its
        ConsolidateIoOperations), each segment accepts its inputs first and
        provides its outputs last, in the order they were made."""
        self._deriv_flags()
        c = self.c
        self._io = ([], [])
        c.add(Command(CT.NO_OPERATION_PERMANENT))
        for i, step in enumerate(self.steps):
            self._forward_step(i, step)
        self._place_io(0)
        c.add(Command(CT.NO_OPERATION_MARKER))
        start = len(c.commands)
        if any(self.need_deriv.values()):
            self._allocate_derivs()
            for i in range(len(self.steps) - 1, -1, -1):
                self._backward_step(i, self.steps[i])
        keep = set()
        for i, step in enumerate(self.steps):
            if step.kind == "output":
                keep.add(c.submatrices[self.value_sub[i]].matrix)
            if step.kind == "input" and self.deriv_sub[i]:
                keep.add(c.submatrices[self.deriv_sub[i]].matrix)
        dealloc = CT.DEALLOC_MATRIX
        c.commands += [Command(dealloc, matrix=m) for m in range(1, len(c.matrices))
                       if m not in keep]
        self._place_io(start)
        return c

    def _add_io(self, cmd: Command) -> None:
        """An accept-input or provide-output command: held back (:meth:`compile`)
        or, when nothing collects them (the multi-segment compiler), added."""
        if self._io is None:
            self.c.commands.append(cmd)
        else:
            self._io[cmd.type is not CT.ACCEPT_INPUT].append(cmd)

    def _place_io(self, start: int) -> None:
        """Put the held-back I/O commands around the segment that begins at
        command ``start``."""
        accepts, provides = self._io
        self.c.commands[start:] = accepts + self.c.commands[start:] + provides
        accepts.clear()
        provides.clear()

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
        # The steps worked out together (batch_steps): those of one node and kind
        # that resolve with the same computability.
        groups: dict[tuple, list[int]] = {}
        self._group_of = [
            groups.setdefault((step.node, step.kind, id(self._computability_of(i))), [])
            for i, step in enumerate(self.steps)]
        for i, group in enumerate(self._group_of):
            group.append(i)
        for i, step in enumerate(self.steps):
            if step.kind == "component" and self.input_indexes[i] is None:
                if self.comp.simple[step.node]:
                    self.input_indexes[i] = step.indexes
                else:
                    self._component_inputs(i)
        self.locations = {}
        # node -> the keys of all its steps' rows, step after step (what its
        # descriptor is resolved at, when its steps are its descriptor's rows)
        self._node_keys: dict[str, np.ndarray] = {}
        for name, ids in per_node.items():
            if len(ids) == 1:
                keys = self._node_keys[name] = pack(self.steps[ids[0]].indexes)
                self.locations[name] = _NodeLocations(keys, ids[0], None)
                continue
            sizes = [len(self.steps[i].indexes) for i in ids]
            keys = self._node_keys[name] = pack(np.concatenate([self.steps[i].indexes
                                                                for i in ids]))
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
        # (no step of the group has its inputs yet: they are set group by group)
        group = self._group_of[i] if self.batch_steps else [i]
        reorders = info.reorders and hasattr(comp, "reorder_indexes")
        memo = computability.input_memo.get(step.node) \
            if len(group) == 1 and self.batch_steps else None
        if memo is not None and np.array_equal(np.sort(pack(step.indexes)), memo[0]):
            # the graph builder worked out the inputs of exactly these outputs
            in_idx = unpack(memo[1][np.argsort(txn_keys(memo[1]), kind="stable")])
            if reorders:
                in_idx, step.indexes = self._reordered(comp, in_idx, step.indexes)
            self.input_indexes[i] = in_idx
            return
        sizes = [len(self.steps[j].indexes) for j in group]
        out = np.concatenate([self.steps[j].indexes for j in group]) if len(group) > 1 \
            else step.indexes
        deps = computability.input_deps(node, out)
        avail = computability.input_available(node, deps.indexes)
        dep_keys = pack(deps.indexes[avail])
        dep_step = np.repeat(np.arange(len(group), dtype=np.int64), sizes)[deps.owner[avail]]
        # by step, then (t, x, n); then drop repeats of a cindex within a step
        order = np.lexsort((txn_keys(dep_keys), dep_step))
        dep_keys, dep_step = dep_keys[order], dep_step[order]
        keep = np.ones(len(order), dtype=bool)
        if len(order) > 1:
            keep[1:] = (dep_step[1:] != dep_step[:-1]) | (dep_keys[1:] != dep_keys[:-1])
        dep_idx, dep_step = unpack(dep_keys[keep]), dep_step[keep]
        cut = np.searchsorted(dep_step, np.arange(len(group) + 1)).tolist()
        # Inputs that are exactly each step's own rows (a component reading each
        # output's own index, BackpropTruncation say; one test for the group): the
        # step's ``indexes`` array itself, which precompute_indexes and the
        # descriptor (its packed keys) recognize without comparing or packing.
        own = cut == np.cumsum([0, *sizes]).tolist() and np.array_equal(dep_idx, out)
        for q, j in enumerate(group):
            if own:
                in_idx = self.steps[j].indexes
            else:
                in_idx = dep_idx[cut[q]:cut[q + 1]]
                if len(group) > 1:
                    in_idx = in_idx.copy()
            if reorders:
                in_idx, self.steps[j].indexes = self._reordered(comp, in_idx,
                                                                self.steps[j].indexes)
            self.input_indexes[j] = in_idx

    def _step_sources(self, i: int) -> list[list[list[_Source | None]]]:
        """The terms of step ``i``'s descriptor with source locations: per part,
        per term, the term's piece of each step of the group (step ``i``'s is at
        ``self._place[i]``; None where a step has no rows of the term). Worked out
        for every step of the node that resolves with the same computability at
        once: resolution is row by row, so resolving the concatenated rows and
        cutting the terms at the step boundaries gives each step exactly the terms
        (in the same order) it would get alone."""
        found = self._sources[i]
        if found is not None:
            return found
        step = self.steps[i]
        computability = self._computability_of(i)
        # (no step of the group is resolved yet: they are resolved group by group)
        group = self._group_of[i] if self.batch_steps else [i]
        # The rows the descriptor is evaluated at: a component's input rows, else
        # the step's own (the steps of a group are of one kind).
        rows_of = [self.input_indexes[j] for j in group] if step.kind == "component" \
            else [self.steps[j].indexes for j in group]
        bounds = np.zeros(len(group) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows_of], out=bounds[1:])
        if group == self.steps_of[step.node] and all(
                r is self.steps[j].indexes for r, j in zip(rows_of, group, strict=True)):
            keys = self._node_keys[step.node]  # (packed already, in this order)
        else:
            keys = pack(rows_of[0] if len(group) == 1 else np.concatenate(rows_of))
        per_part = []
        for part in self.node_map[step.node].descriptor.parts:
            _, terms = resolve_part_keys(part, keys, computability.computable_keys)
            per_term = []
            for t in terms:
                if t.node is None:
                    steps = srows = None
                else:
                    steps, srows = self._locate(t.node).lookup_keys(t.keys)
                cut = [0, len(t.rows)] if len(group) == 1 else \
                    np.searchsorted(t.rows, bounds).tolist()
                per_term.append(_cut(t.node, t.scale, t.value, t.rows, steps, srows, bounds,
                                     cut))
            per_part.append(per_term)
        for q, j in enumerate(group):
            self._sources[j] = per_part
            self._place[j] = q
        return per_part

    def _source_rows(self, i: int) -> _Source:
        """Where the source cindexes of dim-range step ``i`` live (row ``j`` of the
        step reads ``steps[j]``, ``srows[j]``); looked up for all steps of the
        node at once."""
        found = self._dim_range_src.get(i)
        if found is not None:
            return found
        name = self.steps[i].node
        group = self.steps_of[name] if self.batch_steps else [i]
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
            info = self._properties_of(self.node_map[name])
        return info

    def _flags(self, node) -> int:
        """The property flags of component node ``node``, as an int."""
        p = self.comp.flags.get(node.name)
        return int(self.nnet.components[node.component].properties()) if p is None else p

    def _properties_of(self, node) -> _CompInfo:
        """:meth:`_properties` of a component node."""
        info = self._props.get(node.name)
        if info is None:
            comp = self.nnet.components[node.component]
            p = self._flags(node)
            info = self._props[node.name] = _CompInfo(
                comp, comp.input_dim, comp.output_dim,
                bool(p & _SIMPLE), bool(p & _UPDATABLE), bool(p & _USES_MEMO),
                bool(p & _REORDERS), bool(p & _NEEDS_INPUT), bool(p & _NEEDS_OUTPUT),
                type(comp).precompute_indexes is not Component.precompute_indexes)
        return info

    def _forward_step(self, i: int, step: Step) -> None:
        if self.locations is None:
            self._prepare()
        kind = step.kind
        if kind == "component":
            self._forward_component(i, step)
            return
        c = self.c
        node = self.node_map[step.node]
        k = len(step.indexes)
        if kind == "dim-range":
            self._forward_dim_range(i, step, node)
        elif kind == "input":
            m = c.new_matrix(k, node.dim, step.node, False, step.indexes)
            self.value_sub[i] = c.whole(m)
            self._add_io(Command(CT.ACCEPT_INPUT, dst=c.whole(m), node=step.node))
        else:  # output
            dim = self._node_dim(step.node)
            m = c.new_matrix(k, dim, step.node, False, step.indexes)
            self.value_sub[i] = whole = self._alloc(m)
            self._descriptor_forward(i, whole)
            self._add_io(Command(CT.PROVIDE_OUTPUT, src=whole, node=step.node))

    def _forward_dim_range(self, i: int, step: Step, node) -> None:
        src = self._dim_range_src.get(i) or self._source_rows(i)
        k = len(step.indexes)
        if src.contig:
            self.alias[i] = True
            self.value_sub[i] = self._sub(self.value_sub[src.s0], src.sr0, k,
                                          node.dim_offset, node.dim)
            return
        m = self.c.new_matrix(k, node.dim, step.node, False, step.indexes)
        self.value_sub[i] = whole = self._alloc(m)
        self._gather(whole, src, 1.0, True, col_range=(node.dim_offset, node.dim))

    def _forward_component(self, i: int, step: Step) -> None:
        c = self.c
        name = step.node
        info = self._props.get(name) or self._properties(name)
        in_idx = self.input_indexes[i]
        in_value = 0
        if len(in_idx):
            mi = c.new_matrix(len(in_idx), info.input_dim, name + "_input", False, in_idx)
            self.input_matrix[i] = mi
            in_value = self._alloc(mi)
            self._descriptor_forward(i, in_value)
        # else: a component with no input rows (ConstantComponent): like Kaldi, no
        # input matrix at all (Propagate gets an empty input).
        out_idx = step.indexes
        mo = c.new_matrix(len(out_idx), info.output_dim, name, False, out_idx)
        self.value_sub[i] = out_value = self._alloc(mo)
        need_bp = self._bp_needed.get(name)
        if need_bp is None:
            need_bp = self._backprop_needed(step)
        precomputed = 0
        if info.precomputes:
            pre = info.comp.precompute_indexes(in_idx, out_idx, need_bp)
            if pre is not None:
                c.precomputed.append(pre)
                self.precomputed[i] = precomputed = len(c.precomputed) - 1
        memo = 0
        if info.uses_memo and need_bp:
            self._memos += 1
            self.memo[i] = memo = self._memos
        c.commands.append(Command(
            _PROPAGATE, node=name, precomputed=precomputed, in_value=in_value,
            out_value=out_value, memo=memo,
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
            dims = self._part_dims[name] = desc.part_dims(self._node_dim)
        return dims

    def _node_dim(self, name: str) -> int:
        """``nnet.node_dim`` (which looks nodes up by a linear search)."""
        n = self.node_map[name]
        if n.kind == "component-node":
            return self._properties(name).output_dim
        if n.kind == "output-node":
            return n.descriptor.dim(self._node_dim)
        return n.dim

    def _descriptor_forward(self, i: int, dst: int) -> None:
        name = self.steps[i].node
        dims = self._part_dims.get(name) or self._dims(name, self.node_map[name].descriptor)
        whole = len(dims) == 1  # (most nodes: the part is the whole input)
        append = self.c.commands.append
        rows, value_sub = self._rows, self.value_sub
        parts = self._sources[i] or self._step_sources(i)
        q = self._place[i]
        col = 0
        for dim, terms in zip(dims, parts, strict=True):
            dsub = dst if whole else self._cols(dst, col, dim)
            col += dim
            first = True
            everywhere = [p[q] for p in terms if p[q] is not None and p[q].node is None
                          and p[q].n == self.c.submatrices[dsub].num_rows]
            if everywhere:
                # Const() terms that cover every row (Kaldi's GRU writes Sum(Scale(-1,
                # z), Const(1, d))) are set first, as one constant: the others then add
                append(Command(_SET_CONST, dst=dsub, alpha=sum(t.value for t in everywhere)))
                first = False
            for pieces in terms:
                t = pieces[q]
                if t is None or (everywhere and t in everywhere):
                    continue
                if t.contig:  # (nearly every term: _gather's first case, inline)
                    n = t.n
                    append(Command(_COPY if first else _ADD, dst=rows(dsub, t.r0, n),
                                   src=rows(value_sub[t.s0], t.sr0, n), alpha=t.scale))
                elif t.node is None:
                    if not first or t.n != self.c.submatrices[dsub].num_rows:
                        raise ComputeError("Const() inside Sum/Failover/IfDefined after other "
                                           "terms is not supported")
                    append(Command(_SET_CONST, dst=dsub, alpha=t.value))
                else:
                    self._gather(dsub, t, t.scale, first)
                first = False

    def _gather(self, dsub: int, src: _Source, alpha: float, copy: bool,
                col_range=None) -> None:
        """dst rows ``src.rows`` (+)= alpha * the source values (see _Source): a
        (row-range) matrix copy/add if contiguous, else rows of one source
        submatrix, else the multi-source form."""
        c = self.c
        if src.single:
            ssub = self.value_sub[src.s0]
            if col_range is not None:
                ssub = self._cols(ssub, *col_range)
            if src.contig:
                n = src.n
                d = self._rows(dsub, src.r0, n)
                c.commands.append(Command(CT.MATRIX_COPY if copy else CT.MATRIX_ADD, dst=d,
                                          src=self._rows(ssub, src.sr0, n), alpha=alpha))
                return
            table = np.full(c.submatrices[dsub].num_rows, -1, dtype=np.int64)
            table[src.rows] = src.srows
            c.indexes.append(table)
            c.commands.append(Command(CT.COPY_ROWS if copy else CT.ADD_ROWS, dst=dsub,
                                      src=ssub, table=len(c.indexes) - 1, alpha=alpha))
            return
        k = c.submatrices[dsub].num_rows
        rows, steps, srows = src.rows, src.steps, src.srows
        groups = unique_keys(steps).tolist()
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
        c.commands.append(Command(CT.COPY_ROWS_MULTI if copy else CT.ADD_ROWS_MULTI, dst=dsub,
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
            # An output's derivative is filled (and created) by the user's
            # derivative, as in Kaldi: the accept-input command is the allocation.
            self.deriv_sub[i] = c.whole(m) if step.kind == "output" else self._alloc(m)
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
            self._add_io(Command(CT.ACCEPT_INPUT, dst=self.deriv_sub[i], node=step.node,
                                 is_deriv=True))
            self._descriptor_backward(i, self.deriv_sub[i])
        elif step.kind == "input":
            if self.deriv_sub[i]:
                self._add_io(Command(CT.PROVIDE_OUTPUT, src=self.deriv_sub[i], node=step.node,
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
                in_deriv = self._alloc(md)
                self.input_deriv_matrix[i] = md
            # Kaldi uses kBackprop (with a to-update component) for every component
            # once model derivatives are wanted, updatable or not.
            model = self.request.need_model_derivative
            c.commands.append(Command(
                CT.BACKPROP if model else CT.BACKPROP_NO_MODEL_UPDATE,
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
        need_deriv = self.need_deriv
        parts = self._step_sources(i)
        q = self._place[i]
        col = 0
        for dim, terms in zip(self._dims(name, desc), parts, strict=True):
            psub = self._cols(src_deriv, col, dim)
            for pieces in terms:
                t = pieces[q]
                if t is not None and t.node is not None and need_deriv.get(t.node):
                    self._scatter(psub, t, t.scale)
            col += dim

    def _scatter(self, psub: int, src: _Source, alpha: float, col_range=None) -> None:
        """The derivative at step ``src.steps[j]``, row ``src.srows[j]`` += alpha *
        psub[src.rows[j]]."""
        if src.contig:
            dsub = self.deriv_sub[src.s0]
            if col_range is not None:
                dsub = self._cols(dsub, *col_range)
            self.c.commands.append(Command(CT.MATRIX_ADD, dst=self._rows(dsub, src.sr0, src.n),
                                           src=self._rows(psub, src.r0, src.n), alpha=alpha))
            return
        if src.single:
            parts = [(src.s0, src.rows, src.srows)]
        else:
            parts = []
            for g in unique_keys(src.steps).tolist():
                sel = src.steps == g
                parts.append((g, src.rows[sel], src.srows[sel]))
        for g, prows, drows in parts:
            dsub = self.deriv_sub[g]
            if col_range is not None:
                dsub = self._cols(dsub, *col_range)
            self._scatter_one(dsub, psub, prows, drows, alpha,
                              not src.single and _contiguous(prows, True)
                              and _contiguous(drows))

    def _scatter_one(self, dsub: int, psub: int, prows: np.ndarray, drows: np.ndarray,
                     alpha: float, contig: bool) -> None:
        c = self.c
        n = len(prows)
        if n == 0:
            return
        nd = c.submatrices[dsub].num_rows
        if contig:
            c.commands.append(Command(CT.MATRIX_ADD, dst=self._rows(dsub, int(drows[0]), n),
                                      src=self._rows(psub, int(prows[0]), n), alpha=alpha))
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
