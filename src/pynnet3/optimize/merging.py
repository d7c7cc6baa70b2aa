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

Like Kaldi, the pass sweeps over the candidate commands until a sweep merges
nothing. A candidate's verdict depends only on the state of the matrices its
command names, and only a merge changes that state (of the two matrices it
joins), so a later sweep re-examines only candidates one of whose matrices a
merge has touched since they were last examined: the others would get the same
"no" again.

Invariants kept after each merge: the kept matrix is allocated before the first
access to either matrix and deallocated after the last (by moving its
allocation / deallocation command into the discarded matrix's slot when that is
earlier / later); zeroing commands that would clobber merged data are dropped or
moved; a removed assignment becomes NO_OPERATION (the driver renumbers).
"""

from __future__ import annotations

from itertools import pairwise
from operator import attrgetter, itemgetter

import numpy as np

from ..analysis.accesses import AccessType, build_access_table, property_cache
from ..analysis.variables import matrix_sizes
from ..components.base import Flags
from ..computation import Command, NnetComputation, make_submatrix
from ..computation import CommandType as CT
from .options import OptimizeOptions

_MAX_SWEEPS = 20
# command types as module constants: an Enum class attribute lookup costs more
_MATRIX_COPY, _PROPAGATE_T, _NO_OPERATION = CT.MATRIX_COPY, CT.PROPAGATE, CT.NO_OPERATION
_UNMODELLED = (CT.SWAP_MATRIX, CT.GOTO_LABEL, CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX)
_FIRST = itemgetter(0)
_NODE = attrgetter("node")
_W = int(AccessType.WRITE)
_INPUT_CONTIGUOUS = int(Flags.INPUT_CONTIGUOUS)
_OUTPUT_CONTIGUOUS = int(Flags.OUTPUT_CONTIGUOUS)
_PROPAGATE_IN_PLACE = int(Flags.PROPAGATE_IN_PLACE)
_BACKPROP_IN_PLACE = int(Flags.BACKPROP_IN_PLACE)
# entry of a matrix's access list: (command, submatrix, access, is_zeroing); the
# rectangle is rects[submatrix], which a merge moves with the submatrix
_CMD, _SUB, _ACC, _ZERO = range(4)
_EVERYWHERE = (0, 1 << 62, 0, 1 << 62)
# candidate kinds
_ASSIGN, _PROPAGATE, _BACKPROP = range(3)


class AccessIndex:
    """Per-matrix access lists of a computation (rectangles in command order) and
    the ComputationAnalysis queries on them; cheaper to build than the Analyzer
    and cheap to update, so passes that edit as they go can stay exact.

    Everything is kept in plain lists indexed by matrix (``acc``, ``alloc``,
    ``dealloc``, ``accept`` — the first ACCEPT_INPUT of an input matrix —,
    ``is_input``, ``is_output``, ``contiguous``, ``subs``: its submatrices) or by
    submatrix (``sub_mat``, ``rects``: (row0, row1, col0, col1), ``whole``), built
    from the :class:`~pynnet3.analysis.accesses.AccessTable` with numpy;
    ``alloc`` / ``dealloc`` come from ALLOC_MATRIX / DEALLOC_MATRIX commands only
    (the passes using this run before swaps exist)."""

    def __init__(self, c: NnetComputation, nnet):
        self.c = c
        self.n = len(c.commands)
        self.props = property_cache(c, nnet)  # the optimizer session's, when open
        t = build_access_table(c, nnet, self.props)
        self.table = t
        nm = len(c.matrices)
        sa = t.sub_array
        # per submatrix
        sub_m = sa[:, 0]
        r0, c0 = sa[:, 1], sa[:, 3]
        r1, c1 = r0 + sa[:, 2], c0 + sa[:, 4]
        rows, cols = matrix_sizes(c).T
        self.sub_mat: list[int] = sub_m.tolist()
        self.rects: list[tuple] = list(zip(r0.tolist(), r1.tolist(), c0.tolist(), c1.tolist(),
                                           strict=True))
        self.whole: list[bool] = ((r0 == 0) & (c0 == 0) & (r1 == rows[sub_m])
                                  & (c1 == cols[sub_m])).tolist()
        # access entries grouped by matrix, in table (command) order
        ent_m = t.sub_matrix[t.sub]
        order = np.argsort(ent_m, kind="stable")
        cmd = t.cmd[order]
        entries = list(zip(cmd.tolist(), t.sub[order].tolist(), t.acc[order].tolist(),
                           t.zeroing[cmd].tolist(), strict=True))
        eptr = np.zeros(nm + 1, dtype=np.int64)
        np.cumsum(np.bincount(ent_m, minlength=nm), out=eptr[1:])
        self.acc: list[list[tuple]] = [entries[a:b] for a, b in pairwise(eptr.tolist())]
        # submatrices grouped by matrix, ascending
        sorder = (np.argsort(sub_m[1:], kind="stable") + 1).tolist()
        sptr = np.zeros(nm + 1, dtype=np.int64)
        np.cumsum(np.bincount(sub_m[1:], minlength=nm), out=sptr[1:])
        self.subs: list[list[int]] = [sorder[a:b] for a, b in pairwise(sptr.tolist())]
        self.alloc: list[int] = t.alloc_only.tolist()
        self.dealloc: list[int] = t.dealloc_only.tolist()
        self.accept: list[int] = t.accept.tolist()
        self.is_input: list[bool] = (t.accept != -1).tolist()
        self.is_output: list[bool] = t.is_output.tolist()
        # Kaldi gives the matrices of contiguous-input/-output components stride ==
        # num_cols; a merge must not make them a column range of a wider matrix
        # (MayBeMerged, c6/c7).
        self.contiguous = [False] * nm
        cmds, subs = c.commands, c.submatrices
        comp = [cmds[i] for i in t.component_commands]
        contiguous_nodes = {node: p for node in set(map(_NODE, comp))
                            if (p := self.props(node)) & (_INPUT_CONTIGUOUS | _OUTPUT_CONTIGUOUS)}
        for cmd in comp:
            p = contiguous_nodes.get(cmd.node)
            if p is None:
                continue
            if p & _INPUT_CONTIGUOUS:
                for s in (cmd.in_value, cmd.in_deriv):
                    if s:
                        self.contiguous[subs[s].matrix] = True
            if p & _OUTPUT_CONTIGUOUS:
                for s in (cmd.out_value, cmd.out_deriv):
                    if s:
                        self.contiguous[subs[s].matrix] = True

    # -- queries (Kaldi's ComputationAnalysis, on the current state) -----------------
    # ``m`` is a matrix, ``r`` a rectangle (row0, row1, col0, col1) in it.
    def first_nontrivial(self, m: int, r: tuple) -> int:
        """First command touching ``r`` other than a zeroing (n if none)."""
        r0, r1, c0, c1 = r
        rects = self.rects
        for i, s, _, zero in self.acc[m]:
            if not zero:
                q0, q1, p0, p1 = rects[s]
                if q0 < r1 and r0 < q1 and p0 < c1 and c0 < p1:
                    return i
        return self.n

    def last_access(self, m: int, r: tuple) -> int:
        r0, r1, c0, c1 = r
        rects = self.rects
        for i, s, _, _ in reversed(self.acc[m]):
            q0, q1, p0, p1 = rects[s]
            if q0 < r1 and r0 < q1 and p0 < c1 and c0 < p1:
                return i
        return -1

    def last_write(self, m: int, r: tuple) -> int:
        if self.is_output[m]:  # Kaldi: an output is "written" by the user at the end
            return self.n
        r0, r1, c0, c1 = r
        rects = self.rects
        for i, s, a, _ in reversed(self.acc[m]):
            if a & _W:
                q0, q1, p0, p1 = rects[s]
                if q0 < r1 and r0 < q1 and p0 < c1 and c0 < p1:
                    return i
        return -1

    def data_invalidated(self, m: int, r: tuple, after: int) -> int:
        best = self.dealloc[m] if self.dealloc[m] != -1 else self.n
        r0, r1, c0, c1 = r
        rects = self.rects
        for i, s, a, _ in self.acc[m]:
            if i > after and a & _W:
                q0, q1, p0, p1 = rects[s]
                if q0 < r1 and r0 < q1 and p0 < c1 and c0 < p1:
                    return min(best, i)
        return best


class _Merger(AccessIndex):
    def __init__(self, c: NnetComputation, nnet, options: OptimizeOptions, copies: list[int]):
        super().__init__(c, nnet)
        self.o = options
        self.merges = self.removed = 0
        # stamp[m]: the number of merges done when matrix m last changed
        self.stamp = [0] * len(c.matrices)
        self.todo = self._candidates(copies)
        self.moved_subs: set[int] = set()  # submatrices now in another matrix

    def finish(self) -> None:
        """Write the moved submatrices to the computation."""
        subs, rects, sub_mat = self.c.submatrices, self.rects, self.sub_mat
        for s in self.moved_subs:
            r0, r1, c0, c1 = rects[s]
            subs[s] = make_submatrix(sub_mat[s], r0, r1 - r0, c0, c1 - c0)

    # -- the sweep -------------------------------------------------------------------
    def _candidates(self, copies: list[int]) -> list[list]:
        """[command, s1, s2, kind, examined, matrices] for each command that may
        let s1 (read) and s2 (written) share storage, in command order; ``examined``
        is the merge count when it was last examined (-1: never), ``matrices`` the
        matrices its verdict then depended on. ``copies``: the MATRIX_COPY commands.

        Only these commands are candidates, and a merge never turns a command into
        one (it writes sizing commands, zeroings and no-ops) nor changes one but
        its own, which it takes off the list; so the list is made once."""
        c, o = self.c, self.o
        cmds = c.commands
        out = []
        if o.remove_assignments:
            out = [[i, cmd.src, cmd.dst, _ASSIGN, -1, ()] for i in copies
                   if (cmd := cmds[i]).src > 0 and cmd.dst > 0]
        for i in self.table.component_commands:
            cmd = cmds[i]
            if cmd.type is _PROPAGATE_T:
                # A component that may run in place overwrites its output when it
                # aliases the input, even if it otherwise adds (Kaldi's contract,
                # e.g. Normalize).
                if not (o.propagate_in_place and cmd.in_value
                        and self.props(cmd.node) & _PROPAGATE_IN_PLACE):
                    continue
                s1, s2, kind = cmd.in_value, cmd.out_value, _PROPAGATE
            else:
                if not (o.backprop_in_place and cmd.out_deriv and cmd.in_deriv
                        and self.props(cmd.node) & _BACKPROP_IN_PLACE):
                    continue
                s1, s2, kind = cmd.out_deriv, cmd.in_deriv, _BACKPROP
            if s1 > 0 and s2 > 0:
                out.append([i, s1, s2, kind, -1, ()])
        out.sort(key=_FIRST)
        return out

    def _reads_aliased_value(self, cmd: Command) -> bool:
        """A backprop reading a value that overlaps its output or input derivative
        (then the derivatives must not alias: the value would be clobbered)."""
        sub_mat, rects = self.sub_mat, self.rects
        for s in (cmd.in_value, cmd.out_value):
            if not s:
                continue
            m = sub_mat[s]
            r0, r1, c0, c1 = rects[s]
            for o in (cmd.out_deriv, cmd.in_deriv):
                if sub_mat[o] == m:
                    e = rects[o]
                    if r0 < e[1] and e[0] < r1 and c0 < e[3] and e[2] < c1:
                        return True
        return False

    def sweep(self) -> int:
        done = 0
        cmds = self.c.commands
        stamp, sub_mat, whole = self.stamp, self.sub_mat, self.whole
        left = []
        for cand in self.todo:
            i, s1, s2, kind, examined, mats = cand
            if examined >= 0:
                for m in mats:
                    if stamp[m] > examined:
                        break
                else:
                    left.append(cand)  # nothing it depends on changed: still no
                    continue
            cand[4] = self.merges
            if kind == _BACKPROP:
                cmd = cmds[i]
                cand[5] = tuple(sub_mat[s] for s in (cmd.in_value, cmd.out_value, s1, s2)
                                if s)
                if self._reads_aliased_value(cmd):
                    left.append(cand)
                    continue
            else:
                cand[5] = (m1, m2) = (sub_mat[s1], sub_mat[s2])
                if m1 == m2 or not (whole[s1] or whole[s2]):
                    left.append(cand)  # may_merge's first tests, inline for speed
                    continue
            how = self.may_merge(i, s1, s2)
            if how == "left":
                self.do_merge(i, s1, s2, keep_is_src=True)
            elif how == "right":
                self.do_merge(i, s2, s1, keep_is_src=False)
            else:
                left.append(cand)
                continue
            done += 1
        self.todo = left
        return done

    def may_merge(self, i: int, s1: int, s2: int) -> str:
        """"left" (keep s1), "right" (keep s2) or "" (Kaldi's MayBeMerged, plus the
        conditions under which the allocation fix-up below is exact)."""
        m1, m2 = self.sub_mat[s1], self.sub_mat[s2]
        if m1 == m2:
            return ""
        w1, w2 = self.whole[s1], self.whole[s2]
        if not (w1 or w2):
            return ""  # neither side may be discarded (the common case)
        is_input, is_output = self.is_input, self.is_output
        if (is_input[m1] and is_input[m2]) or (is_output[m1] and is_output[m2]):
            return ""
        if (is_input[m1] or is_output[m1] or is_input[m2] or is_output[m2]) \
                and not (w1 and w2):
            return ""
        o = self.o
        left = o.allow_left_merge and w2 and not (self.contiguous[m2] and not w1)
        right = o.allow_right_merge and w1 and not (self.contiguous[m1] and not w2)
        if not (left or right):
            return ""
        r1, r2 = self.rects[s1], self.rects[s2]
        if self.first_nontrivial(m2, r2) != i:
            return ""
        cmd = self.c.commands[i]
        if cmd.type is _MATRIX_COPY and cmd.alpha == 1.0:
            ok = self.last_write(m1, r1) < i and \
                self.last_access(m1, r1) < self.data_invalidated(m2, r2, i)
        else:
            ok = self.last_access(m1, r1) == i
        if not ok:
            return ""
        if left and self._left_ok(m1, m2):
            return "left"
        if right and self._right_ok(i, m1, m2, r2):
            return "right"
        return ""

    def _left_ok(self, k: int, d: int) -> bool:
        # d is the whole destination; before the command it only saw zeroings.
        return not self.is_input[d] and (self.is_input[k] or self.alloc[k] != -1) \
            and self.alloc[d] != -1

    def _right_ok(self, i: int, d: int, k: int, r2: tuple) -> bool:
        # d (whole source) becomes region r2 of k; before command i, k only zeroed r2.
        if self.is_input[k]:
            return False
        if self.is_input[d]:
            return self.alloc[k] != -1
        if self.alloc[d] == -1 or self.alloc[k] == -1:
            return False
        d_first = self.first_nontrivial(d, _EVERYWHERE)
        zk = self._initial_zeroing(k)
        r0, r1, c0, c1 = r2
        rects = self.rects
        for e in self.acc[k]:
            j = e[_CMD]
            if j >= i:
                break
            if e[_ZERO] and j > d_first and e is not zk:
                q0, q1, p0, p1 = rects[e[_SUB]]
                if q0 < r1 and r0 < q1 and p0 < c1 and c0 < p1:
                    return False  # would zero d's data after d wrote it
        if zk is not None and zk[_CMD] > d_first:
            zd = self._initial_zeroing(d)
            if zd is None or zd[_CMD] > d_first:
                return False  # nowhere to move k's zeroing to
        return True

    def _initial_zeroing(self, m: int):
        """m's first access when it zeroes the whole matrix, else None."""
        acc = self.acc[m]
        if not acc:
            return None
        e = acc[0]
        if not e[_ZERO]:
            return None
        info = self.c.matrices[m]
        if self.rects[e[_SUB]] == (0, info.rows, 0, info.cols):
            return e
        return None

    # -- the merge -------------------------------------------------------------------
    def do_merge(self, i: int, s_keep: int, s_disc: int, keep_is_src: bool) -> None:
        c = self.c
        cmds = c.commands
        mk, md = self.sub_mat[s_keep], self.sub_mat[s_disc]
        alloc, dealloc, acc = self.alloc, self.dealloc, self.acc
        k_acc, d_acc = acc[mk], acc[md]
        moved: dict[int, int] = {}  # zeroing command index -> its new slot

        # dead: commands that become NO_OPERATION
        if keep_is_src:
            # d's accesses before i are zeroings of data that i overwrites.
            dead = {e[_CMD] for e in d_acc if e[_CMD] < i}
            dead.add(alloc[md])
        elif self.is_input[md]:
            # k (whole) only saw zeroings before i; it now starts as d's input
            dead = {e[_CMD] for e in k_acc if e[_CMD] < i}
            dead.add(alloc[mk])
            if alloc[md] != -1:  # an input allocated before it is accepted
                cmds[alloc[md]].matrix = mk
            alloc[mk], self.is_input[mk], self.accept[mk] = alloc[md], True, self.accept[md]
        else:
            dead = set()
            d_first = self.first_nontrivial(md, _EVERYWHERE)
            zk, zd = self._initial_zeroing(mk), self._initial_zeroing(md)
            if zk is not None and zk[_CMD] > d_first:
                # k's zeroing would clobber d's data: it takes the slot of d's zeroing
                # (whose command goes to k's slot, to become the no-op there)
                moved[zk[_CMD]] = zd[_CMD]
                cmds[zd[_CMD]], cmds[zk[_CMD]] = cmds[zk[_CMD]], cmds[zd[_CMD]]
                dead.add(zk[_CMD])
                zk_pos = zd[_CMD]
            else:
                zk_pos = zk[_CMD] if zk is not None else None
            if zk_pos is not None and zk_pos < d_first:
                # the whole of k (so region r2) is zero before d is used
                dead.update(e[_CMD] for e in d_acc
                            if e[_ZERO] and e[_CMD] < d_first and e[_CMD] != zk_pos)
            if alloc[md] < alloc[mk]:
                cmds[alloc[md]].matrix = mk  # d's allocation now allocates k
                dead.add(alloc[mk])
                alloc[mk] = alloc[md]
            else:
                dead.add(alloc[md])

        # one deallocation, after the last use of either
        dk, dd = dealloc[mk], dealloc[md]
        if dd != -1 and dk != -1:
            if dd > dk:
                cmds[dd].matrix = mk  # d's deallocation now frees k
                dead.add(dk)
                dealloc[mk] = dd
            else:
                dead.add(dd)
        elif dd != -1:
            dead.add(dd)
        elif dk != -1:
            dead.add(dk)
            dealloc[mk] = -1
        self.is_output[mk] = self.is_output[mk] or self.is_output[md]
        self.contiguous[mk] = self.contiguous[mk] or self.contiguous[md]

        cmd = cmds[i]
        if cmd.type is _MATRIX_COPY:
            if cmd.alpha == 1.0:
                dead.add(i)
                self.removed += 1
            else:
                cmd.src = cmd.dst  # now an in-place scaling of one region

        # d's submatrices become regions of k (written to the computation by finish())
        sub_mat, rects, whole = self.sub_mat, self.rects, self.whole
        dr, _, dc, _ = rects[s_keep]
        info = c.matrices[mk]
        rows, cols = info.rows, info.cols
        for s in self.subs[md]:
            r0, r1, c0, c1 = rects[s]
            if dr or dc:
                r0, r1, c0, c1 = r0 + dr, r1 + dr, c0 + dc, c1 + dc
                rects[s] = (r0, r1, c0, c1)
            sub_mat[s] = mk
            whole[s] = r0 == 0 and c0 == 0 and r1 == rows and c1 == cols
        self.moved_subs.update(self.subs[md])
        self.subs[mk] += self.subs[md]
        dead.discard(-1)
        # k's moved zeroing takes its new slot; d's entry for that slot is replaced
        if moved:
            k_acc = [(moved[e[0]],) + e[1:] if e[0] in moved else e for e in k_acc]
            gone = dead | set(moved.values())
        else:
            gone = dead
        # (d's entries name d's submatrices, whose rectangles were moved above)
        merged = [e for e in k_acc if e[_CMD] not in dead]
        merged += [e for e in d_acc if e[_CMD] not in gone]
        merged.sort(key=_FIRST)
        acc[mk] = merged
        for j in dead:
            cmds[j].type = _NO_OPERATION  # in place: each command object has one slot
        # d is gone: nothing refers to it any more
        acc[md], self.subs[md] = [], []
        alloc[md] = dealloc[md] = self.accept[md] = -1
        self.is_input[md] = self.is_output[md] = self.contiguous[md] = False
        self.merges += 1
        self.stamp[mk] = self.stamp[md] = self.merges


def variable_merging(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Merge matrices connected by assignments / in-place propagate / in-place
    backprop until nothing more can be merged (Kaldi's VariableMergingOptimization).
    Leaves NO_OPERATION commands and unreferenced matrices for the renumberer."""
    if not (options.allow_left_merge or options.allow_right_merge):
        return ""
    copies = []
    MC, UNMODELLED = _MATRIX_COPY, _UNMODELLED
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is MC:
            copies.append(i)
        elif t in UNMODELLED:
            return ""  # runs before these exist; their lifetimes are not modelled here
    m = _Merger(c, nnet, options, copies)
    for _ in range(_MAX_SWEEPS):
        if m.sweep() == 0:
            break
    m.finish()
    if not m.merges:
        return ""
    return f"merged {m.merges} matrix pairs ({m.removed} assignments removed)"
