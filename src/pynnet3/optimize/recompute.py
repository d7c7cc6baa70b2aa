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
(:mod:`.recompute_candidates`): the spliced input of a first TDNN layer, kept for
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

Modules: this one (the pass, the choice, the rewrite), :mod:`.recompute_candidates`
(what qualifies), :mod:`.recompute_model` (the memory arithmetic).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np

from ..analysis.accesses import command_types
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT
from .recompute_candidates import (
    CHEAP_COMPONENTS,
    Candidate,
    compatible,
    find_candidates,
)
from .recompute_model import MemoryModel, live_floats_compressed

__all__ = ["CHEAP_COMPONENTS", "Candidate", "MemoryModel", "choose", "compatible",
           "find_candidates", "live_floats_compressed", "recompute_cheap_values",
           "with_recomputed"]

_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)
_BLOCKS = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_FIELDS = ("dst", "src", "in_value", "out_value", "out_deriv", "in_deriv")


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
    elif cmd.type in _BLOCKS:
        for field in ("table", "deriv_table"):
            k = getattr(cmd, field)
            if k < 0:
                continue
            blocks = t.indexes_blocks[k]
            mapped = np.array([sub(int(s)) for s in blocks.tolist()], dtype=blocks.dtype)
            if (mapped != blocks).any():
                t.indexes_blocks.append(mapped)
                setattr(new, field, len(t.indexes_blocks) - 1)
    return new
