"""Which forward values the recompute pass (:mod:`pynnet3.optimize.recompute`)
may free and recompute, and what each needs: the commands that write it, the
matrices they read, where it is last read forward and first read backward, and
which sources must be kept alive longer. Exactness rests on the conditions
checked here (the pass's module doc lists them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import AccessType, Analyzer
from ..components.base import Flags
from ..computation import CommandType as CT
from ..computation import NnetComputation

#: Component types whose propagate costs about one pass over its input (and is
#: deterministic given input, parameters and precomputed indexes): worth redoing
#: to save a matrix. Users may add their own type names.
CHEAP_COMPONENTS: set[str] = {
    "BatchNormComponent", "NoOpComponent", "FixedScaleComponent", "FixedBiasComponent",
    "ScaleAndOffsetComponent", "PerElementScaleComponent",
    "NaturalGradientPerElementScaleComponent", "PerElementOffsetComponent",
    "NormalizeComponent", "ClipGradientComponent", "BackpropTruncationComponent",
}

@dataclass(frozen=True)
class Candidate:
    """The forward commands ``defs`` (one propagate, or the row copies that fill
    it) write matrix ``matrix`` from parts of the matrices ``sources``;
    ``last_forward`` is the matrix's last access before the marker, ``backward``
    the commands after it that access it (first = the recompute point), ``end``
    the command freeing it (DEALLOC_MATRIX, or the SWAP_MATRIX handing its memory
    on). ``extend``: (source, command freeing it) for each source freed before the
    recompute point, whose life the recompute extends to just after it."""

    defs: tuple[int, ...]
    matrix: int
    sources: tuple[int, ...]
    last_forward: int
    backward: tuple[int, ...]
    end: int
    extend: tuple[tuple[int, int], ...] = ()

    @property
    def prop(self) -> int:
        """The first defining command."""
        return self.defs[0]

    def describe(self, c: NnetComputation) -> str:
        cmd = c.commands[self.defs[0]]
        return cmd.node if cmd.type is CT.PROPAGATE else f"{c.matrices[self.matrix].node} (copy)"


def compatible(chosen: list[Candidate], cand: Candidate) -> bool:
    """``cand`` may be recomputed along with ``chosen``: none of them reads the value
    another one frees (a recompute reads its input where the forward pass left it)."""
    return all(x.matrix not in cand.sources and cand.matrix not in x.sources for x in chosen)


def find_candidates(c: NnetComputation, nnet, middle: int) -> list[Candidate]:
    """The forward values that may be recomputed (module doc): outputs of cheap
    propagates, and matrices filled by row copies (:func:`_gather_candidate`)."""
    a = Analyzer(c, nnet)
    R, W = AccessType.READ, AccessType.WRITE
    mats = a.matrix_accesses
    subs = c.submatrices
    out = []
    last_write = None
    for i in range(middle):
        cmd = c.commands[i]
        if cmd.type is not CT.PROPAGATE or not cmd.in_value or cmd.table >= 0:
            continue
        comp = nnet.components[nnet.node_map[cmd.node].component]
        if getattr(comp, "type_name", "") not in CHEAP_COMPONENTS:
            continue
        props = comp.properties()
        if not props & Flags.SIMPLE or props & (Flags.RANDOM | Flags.PROPAGATE_ADDS):
            continue
        m = subs[cmd.out_value].matrix
        if cmd.out_value != c.whole(m) or subs[cmd.in_value].matrix == m:
            continue
        ma = mats[m]
        if ma.is_input or ma.is_output or not ma.accesses or ma.accesses[0][0] != i:
            continue
        # P is the only write; the rest are reads (the value stays what P made)
        if ma.accesses[0][1] is not W or any(acc is not R for _, acc in ma.accesses[1:]):
            continue
        life = _lifetime(c, ma, middle)
        if life is None:
            continue
        # the input must reach the recompute point unchanged and allocated (or be
        # freed before it, unchanged, and kept until then)
        extend = ()
        if a.data_invalidated_command(i, cmd.in_value) <= life[1][0]:
            if last_write is None:
                last_write = _last_writes(a)
            extend = _keep_source(c, a, cmd.in_value, i, life[1][0], last_write)
            if extend is None:
                continue
        out.append(Candidate((i,), m, (subs[cmd.in_value].matrix,), *life, extend=extend))
    done = {x.matrix for x in out}
    if last_write is None:
        last_write = _last_writes(a)
    for m in range(1, len(c.matrices)):
        if m not in done:
            cand = _gather_candidate(c, a, m, middle, last_write)
            if cand is not None:
                out.append(cand)
    return out


def _lifetime(c: NnetComputation, ma, middle: int):
    """(last forward access, backward accesses, end) of a matrix accessed on both
    sides of the marker and freed by a DEALLOC_MATRIX or a SWAP_MATRIX handing its
    memory on; None otherwise."""
    fwd = [j for j, _ in ma.accesses if j < middle]
    bwd = tuple(j for j, _ in ma.accesses if j > middle)
    end = ma.deallocate_command
    if not fwd or not bwd or end < 0:
        return None
    e = c.commands[end]
    if e.type is not CT.DEALLOC_MATRIX and e.type is not CT.SWAP_MATRIX:
        return None
    return fwd[-1], bwd, end


#: row copies and additions that fill a matrix from others (no arithmetic beyond
#: a scale and a sum; replayed in the same order they give the same bits)
_GATHERS = (CT.SET_CONST, CT.MATRIX_COPY, CT.COPY_ROWS, CT.COPY_ROWS_MULTI, CT.MATRIX_ADD,
            CT.ADD_ROWS, CT.ADD_ROWS_MULTI, CT.ADD_ROW_RANGES)
_MULTI_READS = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI)


def _last_writes(a: Analyzer) -> np.ndarray:
    """Per variable, the last command writing it (-1 if none)."""
    va = a.variable_accesses
    nv = len(va.ptr) - 1
    var = np.repeat(np.arange(nv), np.diff(va.ptr))
    w = (va.access & AccessType.WRITE) != 0
    out = np.full(nv, -1, dtype=np.int64)
    np.maximum.at(out, var[w], va.command[w])
    return out


def _gather_candidate(c: NnetComputation, a: Analyzer, m: int, middle: int,
                      last_write: np.ndarray):
    """Matrix ``m`` (not an input or output) when the forward pass fills it only by
    row copies and additions (:data:`_GATHERS`, writing nothing else), all before
    it is first read, and reads it afterwards only: e.g. the
    spliced input of a first TDNN layer, kept for the affine's model gradient
    while the smaller input it was copied from is freed. Each source must not be
    written after the copy reading it; one freed before the recompute point is
    kept until just after it (``extend``)."""
    ma = a.matrix_accesses[m]
    if ma.is_input or ma.is_output or not ma.accesses:
        return None
    cmds = c.commands
    W, R = AccessType.WRITE, AccessType.READ
    defs = []
    k = 0
    for j, acc in ma.accesses:
        if acc is R:
            break
        if cmds[j].type not in _GATHERS or not acc & W or j > middle:
            return None
        defs.append(j)
        k += 1
    if not defs or any(acc is not R for _, acc in ma.accesses[k:]):
        return None
    life = _lifetime(c, ma, middle)
    if life is None:
        return None
    r = life[1][0]
    subs = c.submatrices
    sources: dict[int, None] = {}
    extend = []
    for d in defs:
        cmd = cmds[d]
        if subs[cmd.dst].matrix != m:
            return None
        if cmd.type in _MULTI_READS:
            tab = c.indexes_multi[cmd.table][:, 0]
            reads = np.unique(tab[tab > 0]).tolist()
        else:
            reads = [cmd.src] if cmd.src else []
        for s in reads:
            sm = subs[s].matrix
            if sm == m:
                return None
            keep = _keep_source(c, a, s, d, r, last_write)
            if keep is None:
                return None
            if sm not in sources:
                sources[sm] = None
                extend += keep
    return Candidate(tuple(defs), m, tuple(sources), *life, extend=tuple(extend))


def _keep_source(c: NnetComputation, a: Analyzer, s: int, d: int, r: int,
                 last_write: np.ndarray):
    """How submatrix ``s``, read by command ``d``, can be read again unchanged at
    the recompute point ``r``: ``()`` when no command writes it after ``d`` and
    its matrix is alive at ``r``; ``((matrix, end),)`` when it is freed before
    ``r`` by ``end`` (a DEALLOC_MATRIX, or a SWAP_MATRIX handing its memory to a
    matrix it allocates), whose life can be extended; None otherwise."""
    vs = a.variables.submatrix_variables(s)
    if len(vs) and last_write[vs].max() > d:
        return None  # (a source written after the copy may differ later)
    sm = c.submatrices[s].matrix
    end = a.matrix_accesses[sm].deallocate_command
    if end < 0 or end > r:
        return ()  # alive at the recompute point
    e = c.commands[end]
    if e.type is CT.DEALLOC_MATRIX or (
            e.type is CT.SWAP_MATRIX and e.src_matrix == sm
            and a.matrix_accesses[e.matrix].allocate_command == end):
        return ((sm, end),)  # (a swap's receiver gets its own allocation instead)
    return None
