"""Recompute cheap forward values in the backward pass instead of keeping them
(the "memory" pass of the meta-optimizer, seed 003's recompute; issue 15).

In a training computation most of the peak memory is the forward values the
backward pass reads again. Some of them are cheap elementwise functions of a
value that stays alive anyway: a BatchNorm output is ``(x - mean) * scale`` of
its input, which the ReLU before it keeps for its own backprop. Such a value
can be freed after its last forward read and computed again, by the very same
propagate command on the very same input, just before its first backward read.

For a propagate ``P`` (forward pass) writing all of matrix ``M`` this pass:

* frees ``M`` right after its last forward access;
* gives the backward pass a fresh matrix ``M'`` (same size and indexes): every
  backward command that named a part of ``M`` names the same part of ``M'``
  (index tables naming ``M`` are copied, not edited), and ``M``'s deallocation
  (or the swap that handed its memory on) becomes ``M'``'s;
* allocates ``M'`` and re-runs ``P`` into it just before its first backward
  access, with no memo (the forward memo stays the one the backprop consumes)
  and no stored statistics (``alpha`` 1, so statistics are not counted twice).

``P`` qualifies when its component is in :data:`CHEAP_COMPONENTS` (elementwise
or per-column cost, simple), is neither ``RANDOM`` (the same mask again is not
guaranteed) nor ``PROPAGATE_ADDS`` (the output's old contents would matter),
reads its input as one submatrix of another matrix, and: ``M`` is neither an
input nor an output, ``P`` is its only write (every other access reads it), and
no command between ``P`` and the recompute point writes any part of ``P``'s
input or frees/swaps its matrix (the analyzer's ``data_invalidated_command``),
or, where its matrix is freed before that point, no command writes it after
``P`` and the recompute keeps it alive until it has run (``extend``, below).
The re-run then sees bit-identical input and writes a bit-identical ``M'``.
Of two candidates where one reads the value the other frees, at most one is
chosen (:func:`compatible`).

A matrix filled only by row copies and additions (SET_CONST, MATRIX_COPY/ADD,
COPY/ADD_ROWS(_MULTI), ADD_ROW_RANGES) before it is first read, and only read
afterwards, is recomputed the same way by re-running those commands in order
(:func:`_gather_candidate`): the spliced input of a first TDNN layer, kept for
the affine's model gradient, is several times the size of the input it was
copied from. A source must not be written after the copy that reads it; one
freed before the recompute point is kept until just after it instead (its
DEALLOC moves there; where allocate-from-other had handed its memory on by a
SWAP, the receiver gets an ALLOC of its own).

The pass only changes the computation when that lowers its peak memory
(:func:`pynnet3.analysis.memory.live_floats`, counted after memory compression
when that pass follows, since a value read again by a recompute can no longer
be compressed to its sign). It chooses on a :class:`MemoryModel` (the live
floats of the computation as it is, with each candidate's saving and each lost
compression as intervals: a few numpy operations per set tried), greedily
(:func:`choose`), then builds the chosen set once and measures it; where the
measurement does not confirm a lower peak (or the model does not apply, at
compression level 2) it chooses by building and measuring each set. It runs
after the allocation passes, on the final command order, so the peak it
measures is the computation's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np

from ..analysis import AccessType, Analyzer
from ..analysis.accesses import command_types
from ..analysis.memory import live_floats
from ..components.base import Flags
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT

#: Component types whose propagate costs about one pass over its input (and is
#: deterministic given input, parameters and precomputed indexes): worth redoing
#: to save a matrix. Users may add their own type names.
CHEAP_COMPONENTS: set[str] = {
    "BatchNormComponent", "NoOpComponent", "FixedScaleComponent", "FixedBiasComponent",
    "ScaleAndOffsetComponent", "PerElementScaleComponent",
    "NaturalGradientPerElementScaleComponent", "PerElementOffsetComponent",
    "NormalizeComponent", "ClipGradientComponent", "BackpropTruncationComponent",
}

_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_BLOCKS = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_FIELDS = ("dst", "src", "in_value", "out_value", "out_deriv", "in_deriv")


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


def recompute_cheap_values(c: NnetComputation, nnet, options=None) -> str:
    """Free cheap forward values between the passes and recompute them in the
    backward pass, where that lowers the peak memory (module doc)."""
    present = command_types(c)
    if CT.GOTO_LABEL in present or CT.PROPAGATE not in present:
        return ""
    markers = [i for i, t in enumerate(present) if t is CT.NO_OPERATION_MARKER]
    if len(markers) != 1:
        return ""  # no backward pass (or several segments)
    cands = find_candidates(c, nnet, markers[0])
    if not cands:
        return ""
    level = 0 if options is None else options.memory_compression_level
    after = options if level > 0 and CT.COMPRESS_MATRIX not in present else None

    def exact(chosen: list[Candidate]) -> tuple[float, float]:
        live = live_floats_compressed(with_recomputed(c, nnet, chosen), nnet, after)
        return (float(live.max()), float(live.sum())) if len(live) else (0.0, 0.0)

    chosen = None
    if level <= 1:  # choose on the model, then measure once
        model = MemoryModel(c, nnet, cands, after)
        base = model.measured
        chosen = choose(cands, model)
        if not chosen:
            return ""
        best = exact(chosen)
        if best[0] >= base[0]:
            chosen = None  # (the model was wrong: choose by measuring)
    else:
        base = exact([])
    if chosen is None:
        chosen = choose(cands, exact)
        best = exact(chosen) if chosen else base
    if best[0] >= base[0]:
        return ""
    names = sorted({x.describe(c) for x in chosen})
    built = with_recomputed(c, nnet, chosen)
    for name in ("matrices", "submatrices", "indexes_multi", "indexes_blocks", "commands",
                 "_whole"):
        setattr(c, name, getattr(built, name))
    return (f"recompute {len(chosen)} forward values in the backward pass "
            f"({', '.join(names)}); peak {int(base[0])} -> {int(best[0])} floats")


def choose(cands: list[Candidate], score) -> list[Candidate]:
    """A set of compatible candidates that lowers ``score(set)`` = (peak, floats
    summed over commands) the most, greedily: latest backward use first (those
    values are freed longest), each kept when it lowers the score; then each
    dropped again when the peak stays as low without it (each costs time). Empty
    when none lowers the peak."""
    base = best = score([])
    chosen: list[Candidate] = []
    for cand in sorted(cands, key=lambda x: -x.backward[0]):
        if not compatible(chosen, cand):
            continue
        s = score(chosen + [cand])
        if s < best:
            chosen, best = chosen + [cand], s
    if best[0] >= base[0]:
        return []
    for cand in list(chosen):
        fewer = [x for x in chosen if x is not cand]
        s = score(fewer)
        if s[0] <= best[0]:
            chosen, best = fewer, s
    return chosen


def compatible(chosen: list[Candidate], cand: Candidate) -> bool:
    """``cand`` may be recomputed along with ``chosen``: none of them reads the value
    another one frees (a recompute reads its input where the forward pass left it)."""
    return all(x.matrix not in cand.sources and cand.matrix not in x.sources for x in chosen)


class MemoryModel:
    """The score of a candidate set without building it: live floats after each
    command of ``c`` (memory compression at level 1 applied as intervals), minus
    each chosen value over the commands where it is no longer alive, plus the
    compression lost by an input that a recompute now reads in the backward pass
    (level 1 compresses a ReLU output only when its ReLU backprop is its only
    backward reader), plus each source whose life a recompute extends. Positions
    are ``c``'s commands; a command inserted before
    command ``k`` is counted as after ``k - 1`` with its value at its largest."""

    def __init__(self, c: NnetComputation, nnet, cands: list[Candidate], options):
        live, _ = live_floats(c)
        self.n = n = len(live)
        self.compressed: dict[int, tuple[int, int, float]] = {}  # matrix -> lo, hi, saving
        measured = live
        if options is not None:
            from .compression import optimize_memory_compression

            t = copy.copy(c)
            optimize_memory_compression(t, nnet, options)
            self.compressed = _compression_intervals(c, t)
            measured, _ = live_floats(t)
        #: (peak, sum) of ``c`` as measured (after compression): what a set must beat
        self.measured = (float(measured.max()), float(measured.sum())) if n else (0.0, 0.0)
        diff = np.zeros(n + 1)
        for lo, hi, saving in self.compressed.values():
            diff[lo] -= saving
            diff[hi] += saving
        self.base = live + np.cumsum(diff)[:n]
        mats = {x.matrix for x in cands} | {m for x in cands for m, _ in x.extend}
        self.size = {m: c.matrices[m].rows * c.matrices[m].cols for m in mats}

    def __call__(self, chosen: list[Candidate]) -> tuple[float, float]:
        diff = np.zeros(self.n + 1)
        for x in chosen:
            lo, hi = x.last_forward + 1, x.backward[0] - 1
            if lo < hi:
                diff[lo] -= self.size[x.matrix]
                diff[hi] += self.size[x.matrix]
        until: dict[int, tuple[int, int]] = {}  # extended source -> (freed at, until)
        for x in chosen:
            for m, e in x.extend:
                until[m] = (e, max(until.get(m, (e, 0))[1], x.backward[0]))
        for m, (e, r) in until.items():
            diff[e] += self.size[m]
            diff[r] -= self.size[m]
        for m in {s for x in chosen for s in x.sources} & self.compressed.keys():
            lo, hi, saving = self.compressed[m]
            diff[lo] += saving
            diff[hi] -= saving
        prof = self.base + np.cumsum(diff)[:self.n]
        return (float(prof.max()), float(prof.sum())) if self.n else (0.0, 0.0)


def _compression_intervals(c: NnetComputation, t: NnetComputation
                           ) -> dict[int, tuple[int, int, float]]:
    """Per matrix that ``t`` (``c`` after the compression pass, which only inserts
    commands) compresses: the positions of ``c`` after which it is compressed,
    ``[lo, hi)`` (the command before its decompression counted full, where the
    decompression brings it back), and the floats compression saves."""
    from ..runtime.compression import bytes_per_element

    out = {}
    opened: dict[int, tuple[int, float]] = {}
    k = 0  # commands of c passed
    originals = c.commands
    for cmd in t.commands:
        if k < len(originals) and cmd is originals[k]:
            k += 1
            continue
        sm = t.submatrices[cmd.dst]
        if cmd.type is CT.COMPRESS_MATRIX:
            n_el = sm.num_rows * sm.num_cols
            opened[sm.matrix] = (k, n_el * (1 - bytes_per_element(cmd.compress_kind) / 4))
        elif cmd.type is CT.DECOMPRESS_MATRIX and sm.matrix in opened:
            lo, saving = opened.pop(sm.matrix)
            out[sm.matrix] = (lo, max(lo, k - 1), saving)
    return out


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


def with_recomputed(c: NnetComputation, nnet, chosen: list[Candidate]) -> NnetComputation:
    """A shallow copy of ``c`` with ``chosen`` applied (``c`` is not modified:
    lists that change are new lists; changed commands are new objects). The
    candidates must be :func:`compatible`."""
    for k, x in enumerate(chosen):
        if not compatible(chosen[:k], x):
            raise ValueError(f"recompute: candidate at command {x.prop} reads or frees a "
                             f"value another chosen one frees or reads")
    t = copy.copy(c)
    t.matrices, t.submatrices = list(c.matrices), list(c.submatrices)
    t.indexes_multi, t.indexes_blocks = list(c.indexes_multi), list(c.indexes_blocks)
    t._whole = dict(c._whole)
    cmds: list[Command | None] = list(c.commands)
    before: dict[int, list[Command]] = {}
    after: dict[int, list[Command]] = {}
    until: dict[int, tuple[int, int]] = {}  # extended source -> (freed at, until)
    for cand in chosen:
        m = cand.matrix
        info = c.matrices[m]
        m2 = t.new_matrix(info.rows, info.cols, info.node, info.is_deriv, info.indexes)
        remap: dict[int, int] = {}

        def sub(s: int, m=m, m2=m2, remap=remap) -> int:
            if not s or t.submatrices[s].matrix != m:
                return s
            if s not in remap:
                sm = t.submatrices[s]
                remap[s] = t.whole(m2) if s == c.whole(m) else t.new_submatrix(
                    m2, sm.row_offset, sm.num_rows, sm.col_offset, sm.num_cols)
            return remap[s]

        for j in cand.backward:
            cmds[j] = _remapped(t, cmds[j], sub)
        e = cmds[cand.end]
        cmds[cand.end] = replace(e, matrix=m2) if e.type is CT.DEALLOC_MATRIX \
            else replace(e, src_matrix=m2)
        group = [Command(CT.ALLOC_MATRIX, matrix=m2)]
        for d in cand.defs:
            rec = _remapped(t, c.commands[d], sub)
            if rec.type is CT.PROPAGATE:
                rec.memo, rec.alpha = 0, 1.0  # (no memo, no stored stats)
            group.append(rec)
        after.setdefault(cand.last_forward, []).append(Command(CT.DEALLOC_MATRIX, matrix=m))
        before.setdefault(cand.backward[0], []).extend(group)
        for s, end in cand.extend:
            until[s] = (end, max(until.get(s, (end, 0))[1], cand.backward[0]))
    for s, (end, r) in until.items():
        e = c.commands[end]
        # the source stays; the matrix that took its memory over gets its own
        cmds[end] = None if e.type is CT.DEALLOC_MATRIX else \
            Command(CT.ALLOC_MATRIX, matrix=e.matrix)
        before[r].append(Command(CT.DEALLOC_MATRIX, matrix=s))
    out: list[Command] = []
    for i, cmd in enumerate(cmds):
        out.extend(before.get(i, ()))
        if cmd is not None:
            out.append(cmd)
        out.extend(after.get(i, ()))
    t.commands = out
    return t


def _remapped(t: NnetComputation, cmd: Command, sub) -> Command:
    """A copy of ``cmd`` naming submatrices through ``sub`` (index tables that name
    a remapped submatrix are copied into ``t``)."""
    new = replace(cmd, **{f: sub(getattr(cmd, f)) for f in _FIELDS if getattr(cmd, f)})
    if cmd.type in _MULTI:
        tab = t.indexes_multi[cmd.table]
        ids = tab[:, 0]
        mapped = np.array([sub(int(s)) if s > 0 else int(s) for s in ids.tolist()],
                          dtype=tab.dtype)
        if (mapped != ids).any():
            tab = tab.copy()
            tab[:, 0] = mapped
            t.indexes_multi.append(tab)
            new.table = len(t.indexes_multi) - 1
    elif cmd.type in _BLOCKS and cmd.table >= 0:
        blocks = t.indexes_blocks[cmd.table]
        mapped = np.array([sub(int(s)) for s in blocks.tolist()], dtype=blocks.dtype)
        if (mapped != blocks).any():
            t.indexes_blocks.append(mapped)
            new.table = len(t.indexes_blocks) - 1
    return new


def live_floats_compressed(c: NnetComputation, nnet, options) -> np.ndarray:
    """Live floats after each command; with ``options``, of the computation as the
    memory-compression pass (which runs after this one) would leave it."""
    if options is not None:
        from .compression import optimize_memory_compression

        c = copy.copy(c)
        optimize_memory_compression(c, nnet, options)  # (only rebinds c.commands)
    live, _ = live_floats(c)
    return live
