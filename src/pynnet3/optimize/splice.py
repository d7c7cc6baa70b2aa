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
(:func:`~pynnet3.components.affine.gather_blocks`), so the forward values are
bit-identical to the spliced computation's (a sum of per-block products changes
float32 rounding enough to flip near-zero ReLU inputs against Kaldi's reference).
The backprop's weight gradient is summed block by block (one GEMM per block into
the gradient's columns): equal to float rounding, which no sign depends on. The temporary
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
are narrower than ``S``.

The derivative side (training): the backprop writes its input derivative into a
matrix ``D`` as wide as the splice, which MATRIX_COPY / MATRIX_ADD commands then
add, column block by column block, to the derivatives of the spliced sources
(shifted row windows of one matrix, for a TDNN layer). Such a backprop is given
the destinations as a block table (``Command.deriv_table``) instead: it adds block
``j`` of its input derivative straight into destination ``j`` (large blocks: one
GEMM with beta = 1 each, ``components.affine.add_input_deriv``), and ``D``'s
allocation, zeroing, transfers and deallocation drop. The results are ``D``'s
entries added in the same order into the same places (:func:`_deriv_plan` lists
when that holds), each entry bit for bit ``D``'s for small blocks and to float
rounding for large ones (``blas.column_block_path``: exactly on the development
host's float32 kernels); a derivative's rounding flips no sign. Components opt in
with ``deriv_blocks`` (the affine family whose backprop is the standard one).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import is_

import numpy as np

from ..analysis.accesses import AccessType, command_types
from ..analysis.analyzer import Analyzer
from ..components.base import Flags
from ..computation import Command, NnetComputation, rects_overlap
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
    if CT.MATRIX_COPY not in types and CT.MATRIX_ADD not in types:
        return ""
    if CT.SWAP_MATRIX in types or CT.GOTO_LABEL in types:
        return ""  # straight-line computations before allocate-from-other only
    comps, backprop_ok, deriv_ok = {}, set(), set()
    for n in nnet.nodes:
        if n.kind == "component-node":
            comp = nnet.components[n.component]
            if supports_blocks(comp):
                comps[n.name] = comp
                if supports_blocks(comp, "backprop"):
                    backprop_ok.add(n.name)
            if getattr(comp, "deriv_blocks", False):
                deriv_ok.add(n.name)
    propagates = compress(range(len(types)), map(is_, types, repeat(CT.PROPAGATE)))
    candidates = [i for i in propagates
                  if (cmd := cmds[i]).in_value and cmd.node in comps
                  and cmd.table == -1 and cmd.alpha != 2.0 and not cmd.memo]
    deriv_candidates = [i for i, t in enumerate(types) if t in _BACKPROPS
                        and (cmd := cmds[i]).in_deriv and cmd.deriv_table == -1
                        and cmd.node in deriv_ok]
    if not candidates and not deriv_candidates:
        return ""
    a = _Accesses(c, nnet)
    # (the derivative plans first, on the same analysis: they touch derivative
    # matrices only, the value plans value matrices only)
    deriv_plans = [plan for b in deriv_candidates
                   if (plan := _deriv_plan(c, a, b)) is not None]
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
    touched: set[int] = set()
    derivs = 0
    for b, blocks, drop, mats in deriv_plans:
        if touched & mats:
            continue  # two plans on one matrix: the first one's analysis only holds
        touched |= mats
        c.indexes_blocks.append(np.array(blocks, dtype=np.int64))
        cmds[b].in_deriv = 0
        cmds[b].deriv_table = len(c.indexes_blocks) - 1
        for j in drop:
            cmds[j] = Command(CT.NO_OPERATION)
        derivs += 1
    out = []
    if done:
        out.append(f"{done} spliced input(s) read in place by their propagate"
                   + (f" ({backprops} also by a backprop)" if backprops else ""))
    if derivs:
        out.append(f"{derivs} spliced input derivative(s) added in place by their backprop")
    return "; ".join(out)


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


def _deriv_plan(c: NnetComputation, a: Analyzer, b: int
                ) -> tuple[int, list[int], list[int], set[int]] | None:
    """For backprop ``b`` whose input derivative goes to a matrix ``D`` that is then
    copied or added, column block by column block, elsewhere: ``(b, the blocks'
    destinations in column order, commands to drop, matrices involved)``, or None
    (the derivative-side rewrite of the module doc).

    Applies when ``D`` (a derivative matrix, the whole of it ``b``'s in_deriv, no
    user input or output) is allocated and freed by plain sizing commands, zeroed
    before ``b`` (or ``b`` overwrites it), and otherwise only read after ``b`` by
    MATRIX_COPY / MATRIX_ADD commands with ``alpha == 1``, each of a whole column
    block of ``D`` into a derivative matrix ``P`` other than ``D`` and ``b``'s
    out_deriv, together reading every column of ``D`` once, in column order, in two
    or more blocks (a single copy is variable merging's to remove).
    Adding block ``j`` into its destination at ``b`` is then the same as the
    transfers (the same products, added in the same order), provided that each
    ``P`` is allocated before ``b``, no command between ``b`` and the last transfer
    touches ``P`` except the transfers, and a transfer that *copies* finds its
    destination zero: ``P``'s last write before ``b`` zeroed all of ``P``, and no
    earlier transfer writes where it does (what convert_addition made of the first
    of several additions into a zeroed matrix)."""
    cmds, subs, t = c.commands, c.submatrices, a.table
    cmd = cmds[b]
    sd = subs[cmd.in_deriv]
    m = sd.matrix
    mat = c.matrices[m]
    if t.is_input[m] or t.is_output[m] or not mat.is_deriv:
        return None
    if not _covers(sd, mat):
        return None
    alloc, dealloc = int(t.alloc_only[m]), int(t.dealloc_only[m])
    if alloc < 0 or dealloc < 0 or t.alloc[m] != alloc or t.dealloc[m] != dealloc:
        return None
    od = subs[cmd.out_deriv].matrix if cmd.out_deriv else 0
    if od == m:
        return None
    ma = a.matrix_arrays
    lo, hi = int(ma.ptr[m]), int(ma.ptr[m + 1])
    zeroings: list[int] = []
    pieces: list[tuple[int, int, int]] = []
    for j in ma.command[lo:hi].tolist():
        if j == b:
            continue
        x = cmds[j]
        if j < b and t.zeroing[j] and x.type is CT.SET_CONST and subs[x.dst] == sd:
            zeroings.append(j)
        elif j > b and x.type in (CT.MATRIX_COPY, CT.MATRIX_ADD) and x.alpha == 1.0 \
                and subs[x.src].matrix == m and subs[x.dst].matrix != m:
            src = subs[x.src]
            if src.row_offset or src.num_rows != mat.rows:
                return None
            pieces.append((src.col_offset, src.num_cols, j))
        else:
            return None  # another reader or writer of D
    if len(pieces) < 2:
        return None  # (one copy of D: variable merging lets the backprop write there)
    if not zeroings and _component_adds(a, cmd):
        return None  # D's undefined contents would be added to
    pieces.sort()
    col = 0
    for c0, w, _ in pieces:
        if c0 != col:
            return None  # a column read twice, or not at all
        col += w
    if col != mat.cols:
        return None
    transfers = [j for _, _, j in pieces]
    if transfers != sorted(transfers):
        return None  # (blocks are added in column order: the floats of another order)
    last = transfers[-1]
    group = set(transfers)
    mats = {m}
    for j in transfers:
        d = subs[cmds[j].dst]
        p = d.matrix
        if p in mats:
            continue
        mats.add(p)
        if p == od or not c.matrices[p].is_deriv or t.alloc[p] < 0 or t.alloc[p] > b:
            return None
        plo, phi = int(ma.ptr[p]), int(ma.ptr[p + 1])
        accs = list(zip(ma.command[plo:phi].tolist(), ma.access[plo:phi].tolist(),
                        strict=True))
        if any(b <= k <= last and k not in group for k, _ in accs):
            return None  # P is touched between b and the transfers (or by b itself)
        copies = [k for k in transfers if cmds[k].type is CT.MATRIX_COPY
                  and subs[cmds[k].dst].matrix == p]
        if copies:
            writes = [k for k, acc in accs if k < b and acc & _W]
            if not writes or not (t.zeroing[writes[-1]] and cmds[writes[-1]].type
                                  is CT.SET_CONST and _covers(subs[cmds[writes[-1]].dst],
                                                              c.matrices[p])):
                return None  # the copy's destination is not known to be zero
            for k in copies:
                dk = subs[cmds[k].dst]
                for i in transfers:
                    if i >= k:
                        break
                    di = subs[cmds[i].dst]
                    if di.matrix == p and rects_overlap(di, dk):
                        return None  # the copy overwrites an earlier transfer's sum
    blocks = [cmds[j].dst for _, _, j in pieces]
    return b, blocks, zeroings + transfers + [alloc, dealloc], mats


def _component_adds(a: Analyzer, cmd: Command) -> bool:
    return bool(a.nnet.components[a.nnet.node_map[cmd.node].component].properties()
                & Flags.BACKPROP_ADDS)


def _covers(sm, mat) -> bool:
    return not sm.row_offset and not sm.col_offset and sm.num_rows == mat.rows \
        and sm.num_cols == mat.cols
