"""Variable merging (Kaldi's VariableMergingOptimization).

Two matrices that hold "the same data at different times" become one: the
source and destination of an assignment ``dst = src``, the input and output of a
component that can propagate in place, the output and input derivative of a
component that can backprop in place. The *discarded* matrix is re-expressed as
a region of the *kept* one: every submatrix of the discarded matrix is rewritten
(in place, same id) as the corresponding submatrix of the kept matrix, so no
command or index table needs editing. A left merge keeps the source side (the
destination must be a whole matrix); a right merge keeps the destination side
(the source must be a whole matrix).

Whether a merge is allowed (Kaldi's MayBeMerged) depends on who reads and writes
the two regions before and after the command. Instead of rebuilding the
Analyzer after each merge, the pass keeps its own exact per-matrix access lists
(rectangles, in command order) and updates them as it merges, so every decision
sees the current computation. Two rectangles of one matrix overlap exactly when
they share an analysis variable, so the queries agree with the Analyzer's.

Invariants kept after each merge: the kept matrix is allocated before the first
access to either matrix and deallocated after the last (by moving its
allocation / deallocation command into the discarded matrix's slot when that is
earlier / later); zeroing commands that would clobber merged data are dropped or
moved; a removed assignment becomes NO_OPERATION (the driver renumbers).
"""

from __future__ import annotations

from operator import attrgetter, itemgetter

import numpy as np

from ..analysis.accesses import (
    AccessType,
    PropertyCache,
    build_access_table,
    has_command_type,
)
from ..components.base import Flags
from ..computation import Command, NnetComputation, SubMatrix
from ..computation import CommandType as CT
from .options import OptimizeOptions

_MAX_SWEEPS = 20
_TYPE = attrgetter("type")
_FIRST = itemgetter(0)
_W = int(AccessType.WRITE)
_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
_INPUT_CONTIGUOUS = int(Flags.INPUT_CONTIGUOUS)
_OUTPUT_CONTIGUOUS = int(Flags.OUTPUT_CONTIGUOUS)
_PROPAGATE_IN_PLACE = int(Flags.PROPAGATE_IN_PLACE)
_BACKPROP_IN_PLACE = int(Flags.BACKPROP_IN_PLACE)
# entry of a matrix's access list: (command, row0, row1, col0, col1, access, is_zeroing)
_CMD, _R0, _R1, _C0, _C1, _ACC, _ZERO = range(7)


class _Mat:
    """What the pass tracks about one matrix (alloc/dealloc are command indexes or -1;
    ``accept`` is the first ACCEPT_INPUT of an input matrix)."""

    __slots__ = ("acc", "alloc", "dealloc", "accept", "is_input", "is_output", "subs",
                 "contiguous")

    def __init__(self):
        self.acc: list[tuple] = []
        self.alloc = self.dealloc = self.accept = -1
        self.is_input = self.is_output = self.contiguous = False
        self.subs: list[int] = []


def _overlaps(e: tuple, r: tuple) -> bool:
    return e[_R0] < r[1] and r[0] < e[_R1] and e[_C0] < r[3] and r[2] < e[_C1]


class AccessIndex:
    """Per-matrix access lists of a computation (rectangles in command order) and
    the ComputationAnalysis queries on them; cheaper to build than the Analyzer
    and cheap to update, so passes that edit as they go can stay exact.

    Built from the :class:`~pynnet3.analysis.accesses.AccessTable` with numpy;
    ``alloc`` / ``dealloc`` come from ALLOC_MATRIX / DEALLOC_MATRIX commands only
    (the passes using this run before swaps exist)."""

    def __init__(self, c: NnetComputation, nnet):
        self.c = c
        self.n = len(c.commands)
        self.props = PropertyCache(nnet)
        t = build_access_table(c, nnet, self.props)
        self.table = t
        nm = len(c.matrices)
        sa = t.sub_array
        mats = self.mats = [_Mat() for _ in range(nm)]
        # access entries grouped by matrix, in table (command) order
        ent_m = t.sub_matrix[t.sub]
        order = np.argsort(ent_m, kind="stable")
        sub = t.sub[order]
        cmd = t.cmd[order]
        r0 = sa[sub, 1]
        c0 = sa[sub, 3]
        entries = list(zip(cmd.tolist(), r0.tolist(), (r0 + sa[sub, 2]).tolist(),
                           c0.tolist(), (c0 + sa[sub, 4]).tolist(),
                           t.acc[order].astype(np.int64).tolist(),
                           t.zeroing[cmd].tolist(), strict=True))
        eptr = np.zeros(nm + 1, dtype=np.int64)
        np.cumsum(np.bincount(ent_m, minlength=nm), out=eptr[1:])
        # submatrices grouped by matrix, ascending
        sub_m = sa[1:, 0]
        sorder = (np.argsort(sub_m, kind="stable") + 1).tolist()
        sptr = np.zeros(nm + 1, dtype=np.int64)
        np.cumsum(np.bincount(sub_m, minlength=nm), out=sptr[1:])
        eptr, sptr = eptr.tolist(), sptr.tolist()
        alloc, dealloc = t.alloc_only.tolist(), t.dealloc_only.tolist()
        accept, is_out = t.accept.tolist(), t.is_output.tolist()
        for m, x in enumerate(mats):
            if eptr[m + 1] > eptr[m]:
                x.acc = entries[eptr[m]:eptr[m + 1]]
            if sptr[m + 1] > sptr[m]:
                x.subs = sorder[sptr[m]:sptr[m + 1]]
            x.alloc, x.dealloc, x.accept = alloc[m], dealloc[m], accept[m]
            x.is_input, x.is_output = accept[m] != -1, is_out[m]
        # Kaldi gives the matrices of contiguous-input/-output components stride ==
        # num_cols; a merge must not make them a column range of a wider matrix
        # (MayBeMerged, c6/c7).
        subs = c.submatrices
        for i in t.component_commands:
            cmd = c.commands[i]
            p = self.props(cmd.node)
            if p & _INPUT_CONTIGUOUS:
                for s in (cmd.in_value, cmd.in_deriv):
                    if s:
                        mats[subs[s].matrix].contiguous = True
            if p & _OUTPUT_CONTIGUOUS:
                for s in (cmd.out_value, cmd.out_deriv):
                    if s:
                        mats[subs[s].matrix].contiguous = True

    def _props(self, node: str) -> int:
        return self.props(node)

    # -- geometry --------------------------------------------------------------------
    def rect(self, s: int) -> tuple[int, int, int, int]:
        sm = self.c.submatrices[s]
        return (sm.row_offset, sm.row_offset + sm.num_rows,
                sm.col_offset, sm.col_offset + sm.num_cols)

    def whole(self, s: int) -> bool:
        sm = self.c.submatrices[s]
        info = self.c.matrices[sm.matrix]
        return sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows \
            and sm.num_cols == info.cols

    # -- queries (Kaldi's ComputationAnalysis, on the current state) -----------------
    def first_nontrivial_sub(self, s: int) -> int:
        """First command touching submatrix ``s`` other than a zeroing (n if none)."""
        return self.first_nontrivial(self.mats[self.c.submatrices[s].matrix], self.rect(s))

    def first_nontrivial(self, m: _Mat, r: tuple) -> int:
        for e in m.acc:
            if not e[_ZERO] and _overlaps(e, r):
                return e[_CMD]
        return self.n

    def last_access(self, m: _Mat, r: tuple) -> int:
        for e in reversed(m.acc):
            if _overlaps(e, r):
                return e[_CMD]
        return -1

    def last_write(self, m: _Mat, r: tuple) -> int:
        if m.is_output:  # Kaldi: an output is "written" by the user at the end
            return self.n
        for e in reversed(m.acc):
            if e[_ACC] & _W and _overlaps(e, r):
                return e[_CMD]
        return -1

    def data_invalidated(self, m: _Mat, r: tuple, after: int) -> int:
        best = m.dealloc if m.dealloc != -1 else self.n
        for e in m.acc:
            if e[_CMD] > after and e[_ACC] & _W and _overlaps(e, r):
                return min(best, e[_CMD])
        return best


class _Merger(AccessIndex):
    def __init__(self, c: NnetComputation, nnet, options: OptimizeOptions):
        super().__init__(c, nnet)
        self.o = options
        self.merges = self.removed = 0

    # -- the sweep -------------------------------------------------------------------
    def candidate(self, i: int, cmd: Command) -> tuple[int, int]:
        """(s1, s2): the read and the written submatrix that may share storage."""
        t, o = cmd.type, self.o
        if t is CT.MATRIX_COPY and o.remove_assignments:
            return cmd.src, cmd.dst
        # A component that may run in place overwrites its output when it aliases
        # the input, even if it otherwise adds (Kaldi's contract, e.g. Normalize).
        if t is CT.PROPAGATE and o.propagate_in_place and cmd.in_value \
                and self._props(cmd.node) & _PROPAGATE_IN_PLACE:
            return cmd.in_value, cmd.out_value
        if t in _BACKPROPS and o.backprop_in_place and cmd.out_deriv and cmd.in_deriv:
            p = self._props(cmd.node)
            if p & _BACKPROP_IN_PLACE:
                r1, r2 = self.rect(cmd.out_deriv), self.rect(cmd.in_deriv)
                for s in (cmd.in_value, cmd.out_value):
                    # never alias a derivative with a value the backprop reads
                    if s and self._same_matrix_overlap(s, (cmd.out_deriv, r1),
                                                       (cmd.in_deriv, r2)):
                        return 0, 0
                return cmd.out_deriv, cmd.in_deriv
        return 0, 0

    def _same_matrix_overlap(self, s: int, *others) -> bool:
        sm = self.c.submatrices[s]
        r = self.rect(s)
        e = (0, r[0], r[1], r[2], r[3])
        return any(self.c.submatrices[o].matrix == sm.matrix and _overlaps(e, ro)
                   for o, ro in others)

    def sweep(self) -> int:
        done = 0
        MC, PR, BP, BN = CT.MATRIX_COPY, CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE
        cmds = self.c.commands
        # Only these types can be candidates, and a merge never turns a command
        # into one of them (it writes sizing commands, zeroings and no-ops), so
        # the list taken now covers the sweep; types are read again as it goes.
        todo = [i for i, t in enumerate(map(_TYPE, cmds))
                if t is MC or t is PR or t is BP or t is BN]
        for i in todo:
            cmd = cmds[i]
            s1, s2 = self.candidate(i, cmd)
            if s1 <= 0 or s2 <= 0:
                continue
            how = self.may_merge(i, s1, s2)
            if how == "left":
                self.do_merge(i, s1, s2, keep_is_src=True)
            elif how == "right":
                self.do_merge(i, s2, s1, keep_is_src=False)
            else:
                continue
            done += 1
        return done

    def may_merge(self, i: int, s1: int, s2: int) -> str:
        """"left" (keep s1), "right" (keep s2) or "" (Kaldi's MayBeMerged, plus the
        conditions under which the allocation fix-up below is exact)."""
        c, o = self.c, self.o
        m1, m2 = c.submatrices[s1].matrix, c.submatrices[s2].matrix
        if m1 == m2:
            return ""
        a1, a2 = self.mats[m1], self.mats[m2]
        if (a1.is_input and a2.is_input) or (a1.is_output and a2.is_output):
            return ""
        w1, w2 = self.whole(s1), self.whole(s2)
        if (a1.is_input or a1.is_output or a2.is_input or a2.is_output) and not (w1 and w2):
            return ""
        left = o.allow_left_merge and w2 and not (a2.contiguous and not w1)
        right = o.allow_right_merge and w1 and not (a1.contiguous and not w2)
        if not (left or right):
            return ""
        r1, r2 = self.rect(s1), self.rect(s2)
        if self.first_nontrivial(a2, r2) != i:
            return ""
        cmd = c.commands[i]
        if cmd.type is CT.MATRIX_COPY and cmd.alpha == 1.0:
            ok = self.last_write(a1, r1) < i and \
                self.last_access(a1, r1) < self.data_invalidated(a2, r2, i)
        else:
            ok = self.last_access(a1, r1) == i
        if not ok:
            return ""
        if left and self._left_ok(a1, a2):
            return "left"
        if right and self._right_ok(i, a1, a2, r2):
            return "right"
        return ""

    def _left_ok(self, k: _Mat, d: _Mat) -> bool:
        # d is the whole destination; before the command it only saw zeroings.
        return not d.is_input and (k.is_input or k.alloc != -1) and d.alloc != -1

    def _right_ok(self, i: int, d: _Mat, k: _Mat, r2: tuple) -> bool:
        # d (whole source) becomes region r2 of k; before command i, k only zeroed r2.
        if k.is_input:
            return False
        if d.is_input:
            return k.alloc != -1
        if d.alloc == -1 or k.alloc == -1:
            return False
        d_first = self.first_nontrivial(d, (0, 1 << 62, 0, 1 << 62))
        zk = self._initial_zeroing(k)
        for e in k.acc:
            if e[_CMD] >= i:
                break
            if e[_ZERO] and e[_CMD] > d_first and _overlaps(e, r2) and e is not zk:
                return False  # would zero d's data after d wrote it
        if zk is not None and zk[_CMD] > d_first:
            zd = self._initial_zeroing(d)
            if zd is None or zd[_CMD] > d_first:
                return False  # nowhere to move k's zeroing to
        return True

    def _initial_zeroing(self, m: _Mat):
        """m's first access when it zeroes the whole matrix, else None."""
        if not m.acc:
            return None
        e = m.acc[0]
        if not e[_ZERO]:
            return None
        sm = self.c.submatrices[self.c.commands[e[_CMD]].dst]
        info = self.c.matrices[sm.matrix]
        if (e[_R0], e[_R1], e[_C0], e[_C1]) == (0, info.rows, 0, info.cols):
            return e
        return None

    # -- the merge -------------------------------------------------------------------
    def do_merge(self, i: int, s_keep: int, s_disc: int, keep_is_src: bool) -> None:
        c = self.c
        cmds = c.commands
        mk, md = c.submatrices[s_keep].matrix, c.submatrices[s_disc].matrix
        k, d = self.mats[mk], self.mats[md]
        ks = c.submatrices[s_keep]
        dead: set[int] = set()  # commands that become NO_OPERATION
        moved: dict[int, int] = {}  # zeroing command index -> its new slot

        if keep_is_src:
            # d's accesses before i are zeroings of data that i overwrites.
            dead.update(e[_CMD] for e in d.acc if e[_CMD] < i)
            dead.add(d.alloc)
        elif d.is_input:
            # k (whole) only saw zeroings before i; it now starts as d's input
            dead.update(e[_CMD] for e in k.acc if e[_CMD] < i)
            dead.add(k.alloc)
            if d.alloc != -1:  # an input allocated before it is accepted
                cmds[d.alloc] = Command(CT.ALLOC_MATRIX, matrix=mk)
            k.alloc, k.is_input, k.accept = d.alloc, True, d.accept
        else:
            d_first = self.first_nontrivial(d, (0, 1 << 62, 0, 1 << 62))
            zk, zd = self._initial_zeroing(k), self._initial_zeroing(d)
            if zk is not None and zk[_CMD] > d_first:
                # k's zeroing would clobber d's data: it takes the slot of d's zeroing
                moved[zk[_CMD]] = zd[_CMD]
                cmds[zd[_CMD]] = cmds[zk[_CMD]]
                dead.add(zk[_CMD])
                zk_pos = zd[_CMD]
            else:
                zk_pos = zk[_CMD] if zk is not None else None
            if zk_pos is not None and zk_pos < d_first:
                # the whole of k (so region r2) is zero before d is used
                dead.update(e[_CMD] for e in d.acc
                            if e[_ZERO] and e[_CMD] < d_first and e[_CMD] != zk_pos)
            if d.alloc < k.alloc:
                cmds[d.alloc] = Command(CT.ALLOC_MATRIX, matrix=mk)
                dead.add(k.alloc)
                k.alloc = d.alloc
            else:
                dead.add(d.alloc)

        # one deallocation, after the last use of either
        if d.dealloc != -1 and k.dealloc != -1:
            if d.dealloc > k.dealloc:
                cmds[d.dealloc] = Command(CT.DEALLOC_MATRIX, matrix=mk)
                dead.add(k.dealloc)
                k.dealloc = d.dealloc
            else:
                dead.add(d.dealloc)
        elif d.dealloc != -1:
            dead.add(d.dealloc)
        elif k.dealloc != -1:
            dead.add(k.dealloc)
            k.dealloc = -1
        k.is_output = k.is_output or d.is_output
        k.contiguous = k.contiguous or d.contiguous

        cmd = cmds[i]
        if cmd.type is CT.MATRIX_COPY:
            if cmd.alpha == 1.0:
                dead.add(i)
                self.removed += 1
            else:
                cmd.src = cmd.dst  # now an in-place scaling of one region

        # d's submatrices become regions of k
        subs = c.submatrices
        for s in d.subs:
            t = subs[s]
            subs[s] = SubMatrix(mk, ks.row_offset + t.row_offset, t.num_rows,
                                ks.col_offset + t.col_offset, t.num_cols)
        k.subs += d.subs
        dr, dc = ks.row_offset, ks.col_offset
        dead.discard(-1)
        # k's moved zeroing takes its new slot; d's entry for that slot is replaced
        if moved:
            k_acc = [(moved[e[0]],) + e[1:] if e[0] in moved else e for e in k.acc]
            gone = dead | set(moved.values())
        else:
            k_acc, gone = k.acc, dead
        merged = [e for e in k_acc if e[_CMD] not in dead]
        merged += [(e[0], e[1] + dr, e[2] + dr, e[3] + dc, e[4] + dc, e[5], e[6])
                   for e in d.acc if e[_CMD] not in gone]
        merged.sort(key=_FIRST)
        k.acc = merged
        for j in dead:
            cmds[j] = Command(CT.NO_OPERATION)
        self.mats[md] = _Mat()
        self.merges += 1


def variable_merging(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Merge matrices connected by assignments / in-place propagate / in-place
    backprop until nothing more can be merged (Kaldi's VariableMergingOptimization).
    Leaves NO_OPERATION commands and unreferenced matrices for the renumberer."""
    if not (options.allow_left_merge or options.allow_right_merge):
        return ""
    if has_command_type(c, CT.SWAP_MATRIX, CT.GOTO_LABEL, CT.COMPRESS_MATRIX,
                        CT.DECOMPRESS_MATRIX):
        return ""  # runs before these exist; their lifetimes are not modelled here
    m = _Merger(c, nnet, options)
    for _ in range(_MAX_SWEEPS):
        if m.sweep() == 0:
            break
    if not m.merges:
        return ""
    return f"merged {m.merges} matrix pairs ({m.removed} assignments removed)"
