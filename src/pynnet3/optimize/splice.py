"""Splice-free affine components (beyond Kaldi).

A TDNN layer's input is usually spliced: ``Affine(Append(Offset(x, -1), x,
Offset(x, 1)))`` is compiled as a matrix ``S`` that is allocated, (zeroed,) and
filled by one MATRIX_COPY per column block ``S[:, c0:c1] = X_k`` (``X_k`` a row
range of the source), then read once by the affine PROPAGATE and freed. ``S`` is
as wide as the whole splice, and on TDNNs two such matrices make the peak.

The PROPAGATE (and a backprop that reads ``S`` for the weight gradient) can
take the blocks where they are: this pass gives it a block table
(``NnetComputation.indexes_blocks``, see :class:`~pynnet3.computation.CommandType`)
and drops ``S``'s allocation, zeroing, copies and deallocation.

The component gathers the blocks into a transient matrix for the one command
(:func:`~pynnet3.components.affine.gather_blocks`), so results are bit-identical
to the spliced computation (a sum of per-block products changes float32 rounding
enough to flip near-zero ReLU inputs against Kaldi's reference). The temporary
counts in the peak memory (``NnetComputation.peak_memory_floats``), so what goes
is ``S`` living from its copies to its last reader: the pass rewrites an ``S``
with several blocks only when a backprop also reads it (training: ``S`` no longer
lives from the forward pass to the backprop); there a single-block ``S`` (a plain
copy) is read in place too. Forward-only computations are left to variable merging,
which removes single copies itself. Commands always drop; the peak drops on real networks
(tdnn_relu_bn train 1041920 -> 545920 floats), while on toy networks the sources
living on next to the temporary can cost a few floats more than ``S`` did.

When it applies (all checked with the Analyzer's access table): the PROPAGATE's
component has ``propagate_blocks`` (the affine family); the command stores no
stats and has no memo; ``S``'s matrix is no user input or output, is allocated
and deallocated by plain sizing commands, and its only accesses are zeroings,
the copies, this PROPAGATE and backprops that read exactly ``S`` as their input
value (nothing else of ``S``'s matrix) and have ``backprop_blocks`` (the
weight gradient is then accumulated block by block); the copies have
``alpha == 1``, come after the zeroings and before the PROPAGATE, and tile ``S``
exactly, each a whole column block of ``S``'s rows; each source lies outside
``S``'s matrix and its data is not overwritten or freed between its copy and the
last command that reads ``S``. In a training computation the sources then stay
alive until the backprop instead of ``S``: usually they are kept anyway, and they
are narrower than ``S``. (A spliced *derivative* is still materialized.)
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import is_

import numpy as np

from ..analysis.accesses import AccessType, command_types
from ..analysis.analyzer import Analyzer
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT
from .options import OptimizeOptions

_R = int(AccessType.READ)
_W = int(AccessType.WRITE)
_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def supports_blocks(comp, method: str = "propagate") -> bool:
    """Whether ``comp``'s ``method`` (propagate or backprop) can take its input
    value as column blocks (``<method>_blocks``, e.g. from
    :class:`~pynnet3.components.affine.BlockInputMixin`)."""
    return callable(getattr(comp, f"{method}_blocks", None))


def splice_free_affine(c: NnetComputation, nnet, options: OptimizeOptions | None = None
                       ) -> str:
    """Make affine-like propagates (and their backprops) read a spliced input's
    column blocks in place."""
    cmds = c.commands
    types = command_types(c)
    if CT.BACKPROP not in types and CT.BACKPROP_NO_MODEL_UPDATE not in types:
        # forward only: a multi-block splice is never worth it (see the module doc)
        # and a single copy is what variable merging removes anyway
        return ""
    if CT.MATRIX_COPY not in types:
        return ""
    if CT.SWAP_MATRIX in types or CT.GOTO_LABEL in types:
        return ""  # straight-line computations before allocate-from-other only
    comps, backprop_ok = {}, set()
    for n in nnet.nodes:
        if n.kind == "component-node":
            comp = nnet.components[n.component]
            if supports_blocks(comp):
                comps[n.name] = comp
                if supports_blocks(comp, "backprop"):
                    backprop_ok.add(n.name)
    propagates = compress(range(len(types)), map(is_, types, repeat(CT.PROPAGATE)))
    candidates = [i for i in propagates
                  if (cmd := cmds[i]).in_value and cmd.node in comps
                  and cmd.table == -1 and cmd.alpha != 2.0 and not cmd.memo]
    if not candidates:
        return ""
    a = _Accesses(c, nnet)
    done = backprops = 0
    for p in candidates:
        plan = _plan(c, a, p, backprop_ok)
        if plan is None:
            continue
        blocks, readers, drop = plan
        if len(blocks) > 1 and len(readers) == 1:
            # read only by its propagate: the gathered temporary is as big as S and
            # the sources live through the command, so S's short life costs no more
            continue
        if len(blocks) > 1:
            c.indexes_blocks.append(np.array(blocks, dtype=np.int64))
        for r in readers:
            cmd = cmds[r]
            if len(blocks) == 1:  # a plain copy: read its source directly
                cmd.in_value = blocks[0]
            else:
                cmd.in_value = 0
                cmd.table = len(c.indexes_blocks) - 1
        for j in drop:
            cmds[j] = Command(CT.NO_OPERATION)
        done += 1
        backprops += len(readers) - 1
    if not done:
        return ""
    return (f"{done} spliced input(s) read in place by their propagate"
            + (f" ({backprops} also by a backprop)" if backprops else ""))


class _Accesses(Analyzer):
    """The Analyzer's access table and per-matrix accesses, with the one query the
    plans need answered from submatrix rectangles (two submatrices of a matrix
    share a variable exactly when their non-empty rectangles intersect) instead of
    the per-variable structures, which cost more to build than all the plans."""

    def __init__(self, c: NnetComputation, nnet):
        super().__init__(c, nnet)
        t = self.table
        # table entries grouped by matrix, each group in command order
        self._order = np.argsort(t.matrix, kind="stable")
        ptr = np.zeros(len(c.matrices) + 1, dtype=np.int64)
        np.cumsum(np.bincount(t.matrix, minlength=len(c.matrices)), out=ptr[1:])
        self._ptr = ptr

    def data_invalidated_command(self, after: int, s: int) -> int:
        """First command after ``after`` that writes part of submatrix ``s`` or
        deallocates (or swaps away) its matrix; num_commands if none."""
        c, t = self.computation, self.table
        subs = c.submatrices
        sm = subs[s]
        m = sm.matrix
        best = self.num_commands
        if sm.num_rows and sm.num_cols:
            r0, r1 = sm.row_offset, sm.row_offset + sm.num_rows
            c0, c1 = sm.col_offset, sm.col_offset + sm.num_cols
            k = self._order[self._ptr[m]:self._ptr[m + 1]]
            for j, x, a in zip(t.cmd[k].tolist(), t.sub[k].tolist(), t.acc[k].tolist(),
                               strict=True):
                if j <= after or not a & _W:
                    continue
                e = subs[x]
                if e.num_rows and e.num_cols and e.row_offset < r1 \
                        and r0 < e.row_offset + e.num_rows and e.col_offset < c1 \
                        and c0 < e.col_offset + e.num_cols:
                    best = j
                    break
        de = int(t.dealloc[m])
        if de > after:
            best = min(best, de)
        return best


def _plan(c: NnetComputation, a: Analyzer, p: int, backprop_ok: set[str]
          ) -> tuple[list[int], list[int], list[int]] | None:
    """(block submatrices in column order, the commands reading ``S`` — PROPAGATE
    ``p`` and any backprops —, commands to drop) for PROPAGATE ``p``, or None when
    the rewrite does not apply (module doc).

    Plans of earlier candidates do not interfere: each drops only commands that
    touch its own ``S`` matrix, which no other candidate reads (its only readers
    are its own PROPAGATE and backprops), and sources are checked against writes,
    which the rewrite never adds."""
    cmds = c.commands
    subs = c.submatrices
    t = a.table
    sv = subs[cmds[p].in_value]
    m = sv.matrix
    if t.is_input[m] or t.is_output[m]:
        return None
    alloc, dealloc = int(t.alloc_only[m]), int(t.dealloc_only[m])
    if alloc < 0 or dealloc < 0 or t.alloc[m] != alloc or t.dealloc[m] != dealloc:
        return None
    if subs[cmds[p].out_value].matrix == m:
        return None
    ma = a.matrix_arrays
    lo, hi = int(ma.ptr[m]), int(ma.ptr[m + 1])
    acc_cmds = ma.command[lo:hi].tolist()
    zeroings: list[int] = []
    copies: list[int] = []
    readers = [p]
    for j in acc_cmds:
        if j == p:
            continue
        cmd = cmds[j]
        if cmd.type in _BACKPROPS and j > p and cmd.node in backprop_ok and cmd.table == -1 \
                and cmd.in_value and subs[cmd.in_value] == sv and not cmd.memo \
                and all(not x or subs[x].matrix != m
                        for x in (cmd.out_value, cmd.out_deriv, cmd.in_deriv)):
            readers.append(j)  # a backprop reading S as its input value only
        elif t.zeroing[j] and cmd.type is CT.SET_CONST:
            if copies or j > p:
                return None  # a zeroing after a copy (or after the use) would matter
            zeroings.append(j)
        elif cmd.type is CT.MATRIX_COPY and cmd.alpha == 1.0 and j < p \
                and subs[cmd.dst].matrix == m and subs[cmd.src].matrix != m:
            copies.append(j)
        else:
            return None  # another reader or writer of S's matrix
    if not copies or int(ma.access[lo + acc_cmds.index(p)]) != _R:
        return None
    last = readers[-1]
    # the copies must tile S: whole row range, column blocks without gaps or overlaps
    pieces = []
    for j in copies:
        d = subs[cmds[j].dst]
        if d.row_offset != sv.row_offset or d.num_rows != sv.num_rows:
            return None
        pieces.append((d.col_offset, d.num_cols, j))
    pieces.sort()
    col = sv.col_offset
    for c0, w, _ in pieces:
        if c0 != col:
            return None
        col += w
    if col != sv.col_offset + sv.num_cols:
        return None
    blocks = []
    for _, _, j in pieces:
        src = cmds[j].src
        if a.data_invalidated_command(j, src) <= last:
            return None  # the source changes (or goes) before the last read of S
        blocks.append(src)
    # Reading the sources later keeps them alive longer; never let that cost more
    # than S itself (a source may be a column range of a wide matrix).
    extended = {subs[b].matrix for b in blocks}
    cost = sum(c.matrices[x].rows * c.matrices[x].cols for x in extended
               if not t.is_input[x] and a.last_matrix_access(x) < last)
    if cost > c.matrices[m].rows * c.matrices[m].cols:
        return None
    return blocks, readers, zeroings + copies + [alloc, dealloc]
