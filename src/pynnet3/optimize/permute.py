"""Row-permutation hoisting (beyond Kaldi): outputs computed in the request's order.

The compiler computes every node's rows in Kaldi's index order (t, then x, then
n), so an output requested sequence by sequence (Kaldi's n-major row order, as
batched decoding asks for it) ends with a gather: ``output = X[perm]`` over the
whole output (tdnn_lstm at N=128: two 19200x200 gathers, ~9 ms of a ~120 ms
forward). When the values behind ``X``, back to the gathers that fill them, are
computed row by row (affine layers, nonlinearities, log-softmax, ...), those
matrices can hold their rows in the output's order instead: the gathers that fill
them take permuted tables (same cost), every row-wise step is unchanged, and the
final gather becomes an assignment that variable merging removes.

Invariant: every row holds the value it held before, moved to its new position
(a row-wise command computes each row from the same row of its inputs, so up to
float rounding of the kernels nothing changes); the only commands added are the
cuts' gathers (with their allocation and freeing), made only where the gathers
they replace are wider; only forward-only computations are touched (a backward
pass would need the same permutation of every derivative, which it does not pay
for).

Costs it does not weigh (measured on random networks, forward-only, n-major
outputs): a cut's copy is alive at its reader alongside the input it copies, and
where that input stays alive for another reader and the reader sits at the
peak, the peak rises by the copy (a few cases in ten thousand, by a few percent);
where the output's gather cannot be merged away (its matrix is also added to,
as for ``Sum(x, x)``) it stays as a plain copy and the cut's three commands come
on top.
"""

from __future__ import annotations

import numpy as np

from ..components.base import Flags
from ..computation import Command, NnetComputation, command_submatrices
from ..computation import CommandType as CT
from .options import OptimizeOptions

# Commands that say nothing about a matrix's row order.
_SIZING = (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX)
_GATHERS = (CT.COPY_ROWS, CT.ADD_ROWS)  # dst[i] (+)= src[table[i]]
_MULTI_GATHERS = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI)  # dst[i] (+)= sub/row pairs
_SCATTERS = (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)  # pairs[i] (+)= src[i]
_PLAIN = (CT.MATRIX_COPY, CT.MATRIX_ADD)
# Only forward computations with nothing that moves matrices around.
_REFUSED = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE, CT.GOTO_LABEL, CT.SWAP_MATRIX,
            CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX, CT.ADD_ROW_RANGES)
# A simple component computes output row i from input row i alone unless it is
# random, reorders indexes or keeps a memo (BatchNorm in training mode).
_NOT_ROW_WISE = Flags.RANDOM | Flags.REORDERS_INDEXES | Flags.USES_MEMO


def _multi_table_subs(c: NnetComputation, cmd: Command) -> np.ndarray:
    tab = c.indexes_multi[cmd.table]
    return tab[tab[:, 0] > 0, 0]


def _all_rows(c: NnetComputation, s: int) -> bool:
    sm = c.submatrices[s]
    return sm.row_offset == 0 and sm.num_rows == c.matrices[sm.matrix].rows


def _row_wise(nnet, cmd: Command) -> bool:
    comp = nnet.components[nnet.node(cmd.node).component]
    props = comp.properties()
    return (bool(props & Flags.SIMPLE) and not props & _NOT_ROW_WISE
            and cmd.precomputed == 0 and cmd.alpha != 2.0)  # (2.0: stores stats)


def _permutation(c: NnetComputation, cmd: Command) -> np.ndarray | None:
    """The table of a whole-matrix COPY_ROWS that only reorders rows; else None."""
    if cmd.type is not CT.COPY_ROWS or cmd.alpha != 1.0:
        return None
    d, s = c.submatrices[cmd.dst], c.submatrices[cmd.src]
    if d.matrix == s.matrix or not (c.is_whole(cmd.dst) and c.is_whole(cmd.src)):
        return None
    table = c.indexes[cmd.table]
    n = c.matrices[s.matrix].rows
    if len(table) != n or table.min(initial=0) < 0:
        return None
    seen = np.zeros(n, dtype=bool)
    seen[table] = True
    if not seen.all() or np.array_equal(table, np.arange(n)):
        return None
    return np.asarray(table, dtype=np.int64)


class _Group:
    """The matrices that take the permutation, grown from the matrix an output is
    gathered from: through row-wise commands, to every matrix they tie to its row
    order. Where a row-wise propagate's input cannot follow (it is computed by
    something that is not row-wise, or read in its own order elsewhere), that
    input is *cut*: the propagate reads a permuted copy of it instead, made just
    before (``cuts``: those propagates' command indexes). ``ok`` is False when the
    group cannot be formed (then nothing is changed)."""

    def __init__(self, c: NnetComputation, nnet, uses: dict[int, list[int]], root: int,
                 final: int, perm: np.ndarray):
        self.c, self.nnet, self.uses, self.final = c, nnet, uses, final
        self.rows = c.matrices[root].rows
        self.inverse = np.empty_like(perm)
        self.inverse[perm] = np.arange(len(perm))
        self.matrices: set[int] = set()
        self.cuts: list[int] = []
        self.ok = self._grow(root)

    def _mat(self, s: int) -> int:
        return self.c.submatrices[s].matrix

    def _grow(self, root: int) -> bool:
        """Add ``root`` and all it ties in; on failure leave the group as it was."""
        saved = (set(self.matrices), list(self.cuts))
        pending = [root]
        while pending:
            m = pending.pop()
            if m in self.matrices:
                continue
            if self.c.matrices[m].rows != self.rows:
                self.matrices, self.cuts = saved
                return False
            self.matrices.add(m)
            for k in self.uses.get(m, ()):
                if self._input_side(k, m):
                    continue
                joined = self._follows(k, m)
                if joined is None:
                    self.matrices, self.cuts = saved
                    return False
                pending.extend(x for x in joined if x not in self.matrices)
        return True

    def _input_side(self, k: int, m: int) -> bool:
        """Command ``k`` is a row-wise propagate writing ``m`` from another matrix:
        its input joins the group if it can, else it is cut. True when handled."""
        c, cmd = self.c, self.c.commands[k]
        if cmd.type is not CT.PROPAGATE or not cmd.in_value or k in self.cuts:
            return False
        y = self._mat(cmd.in_value)
        if self._mat(cmd.out_value) != m or y == m or not _row_wise(self.nnet, cmd) \
                or not _all_rows(c, cmd.out_value):
            return False
        if y in self.matrices and _all_rows(c, cmd.in_value):
            return True
        own = c.submatrices[cmd.in_value]
        if own.num_rows != self.rows:
            return _all_rows(c, cmd.in_value) and self._grow(y)
        before = (set(self.matrices), list(self.cuts))
        if _all_rows(c, cmd.in_value) and self._grow(y):
            # joining may have cut wider inputs further back than this one
            added = self.matrices - before[0]
            if self._net_columns(added, self.cuts[len(before[1]):]) <= own.num_cols:
                return True
            self.matrices, self.cuts = before
        self.cuts.append(k)
        return True

    def _net_columns(self, matrices: set[int], cuts: list[int]) -> int:
        """Columns the ``cuts`` gather, less those of the gathers out of
        ``matrices`` that the permutation makes plain copies."""
        return (sum(self.c.submatrices[self.c.commands[k].in_value].num_cols for k in cuts)
                - sum(self.c.submatrices[self.c.commands[k].dst].num_cols
                      for k in self.freed(matrices)))

    def freed(self, matrices: set[int]) -> list[int]:
        """The whole-matrix gathers out of ``matrices`` (to a matrix outside the
        group) that the permutation makes plain copies: their command indexes."""
        c, out = self.c, []
        identity = np.arange(len(self.inverse))
        for m in matrices:
            for k in self.uses.get(m, ()):
                cmd = c.commands[k]
                if k in out or _permutation(c, cmd) is None or self._mat(cmd.src) != m \
                        or self._mat(cmd.dst) in self.matrices:
                    continue
                if np.array_equal(self.inverse[c.indexes[cmd.table]], identity):
                    out.append(k)
        return out

    def _follows(self, k: int, m: int) -> list[int] | None:
        """The other matrices command ``k`` ties to ``m``'s row order (to join the
        group), or None when ``k`` cannot run on ``m`` permuted."""
        c, cmd = self.c, self.c.commands[k]
        t = cmd.type
        if t in _SIZING or k == self.final:
            return []
        if t is CT.SET_CONST:
            return [] if _all_rows(c, cmd.dst) else None
        if t in _GATHERS:  # as destination: permute the table; as source: map it
            if any(self._mat(s) == m and not _all_rows(c, s) for s in (cmd.dst, cmd.src)):
                return None
            return []
        if t in _MULTI_GATHERS or t in _SCATTERS:
            own = cmd.dst if t in _MULTI_GATHERS else cmd.src
            if self._mat(own) == m and not _all_rows(c, own):
                return None
            subs = np.unique(_multi_table_subs(c, cmd))
            if any(self._mat(int(s)) == m and not _all_rows(c, int(s)) for s in subs):
                return None
            return []
        if t in _PLAIN:
            if not (_all_rows(c, cmd.dst) and _all_rows(c, cmd.src)):
                return None
            return [self._mat(cmd.dst), self._mat(cmd.src)]
        if t is CT.PROPAGATE:
            subs = command_submatrices(c, cmd)
            if k in self.cuts:
                if self._mat(cmd.in_value) == m:
                    return None  # a cut input must keep its order (its copy permutes it)
                subs = [cmd.out_value]
            if not _row_wise(self.nnet, cmd) or not all(_all_rows(c, s) for s in subs):
                return None
            return [self._mat(s) for s in subs]
        return None  # input, output, or anything else that fixes the order

    def saving(self) -> tuple[list[int], int]:
        """The gathers made plain copies (command indexes), and the columns of
        gathering saved net of the cuts."""
        freed = self.freed(self.matrices)
        return freed, -self._net_columns(self.matrices, self.cuts)


def _matrix_uses(c: NnetComputation) -> dict[int, list[int]]:
    uses: dict[int, list[int]] = {}
    for k, cmd in enumerate(c.commands):
        mats = {c.submatrices[s].matrix for s in command_submatrices(c, cmd)}
        if cmd.type in _SIZING:
            mats.add(cmd.matrix)
        for m in mats:
            uses.setdefault(m, []).append(k)
    return uses


def _apply(c: NnetComputation, group: set[int], perm: np.ndarray, commands: set[int]
           ) -> None:
    """Permute the rows of every matrix in ``group`` by ``perm`` (new row j = old
    row perm[j]): tables writing them are reordered, tables reading them remapped."""
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(len(perm))

    def reads(tab: np.ndarray) -> np.ndarray:
        out = tab.copy()
        ok = out >= 0
        out[ok] = inverse[out[ok]]
        return out

    def in_group(s: int) -> bool:
        return c.submatrices[s].matrix in group

    for k in sorted(commands):
        cmd = c.commands[k]
        t = cmd.type
        if t in _GATHERS:
            tab = np.asarray(c.indexes[cmd.table], dtype=np.int64)
            if in_group(cmd.src):
                tab = reads(tab)
            if in_group(cmd.dst):
                tab = tab[perm]
            c.indexes.append(tab)
            cmd.table = len(c.indexes) - 1
        elif t in _MULTI_GATHERS or t in _SCATTERS:
            tab = np.array(c.indexes_multi[cmd.table], dtype=np.int64)
            for s in np.unique(tab[tab[:, 0] > 0, 0]):
                if in_group(int(s)):
                    rows = tab[:, 0] == s
                    tab[rows, 1] = inverse[tab[rows, 1]]
            if in_group(cmd.dst if t in _MULTI_GATHERS else cmd.src):
                tab = tab[perm]
            c.indexes_multi.append(tab)
            cmd.table = len(c.indexes_multi) - 1
    for m in group:
        info = c.matrices[m]
        if info.indexes is not None:
            info.indexes = info.indexes[perm]


def hoist_output_permutations(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Compute the values behind each reordered output in the output's row order
    (see the module docstring): the output's gather becomes a MATRIX_COPY, where
    that saves more columns of gathering than the cuts add."""
    if any(cmd.type in _REFUSED for cmd in c.commands):
        return ""
    uses = _matrix_uses(c)
    taken: set[int] = set()
    inserts: dict[int, list[Command]] = {}  # command index -> commands to put before it
    done, cut = 0, 0
    for k, cmd in enumerate(c.commands):
        perm = _permutation(c, cmd)
        src = c.submatrices[cmd.src].matrix if perm is not None else 0
        if perm is None or src in taken:
            continue
        group = _Group(c, nnet, uses, src, k, perm)
        if not group.ok or taken & group.matrices:
            continue
        freed, cols = group.saving()
        if not freed or cols <= 0:
            continue
        taken |= group.matrices
        touched = {j for m in group.matrices for j in uses.get(m, ())} - set(group.cuts)
        _apply(c, group.matrices, perm, touched)
        for j in freed:
            c.commands[j].type, c.commands[j].table = CT.MATRIX_COPY, -1
        for j in group.cuts:
            inserts[j] = _cut(c, c.commands[j], perm)
        done += len(freed)
        cut += len(group.cuts)
    if inserts:
        _insert(c, inserts)
    if not done:
        return ""
    return (f"{done} reordered output(s) computed in the request's row order"
            + (f" ({cut} input(s) gathered instead)" if cut else ""))


def _cut(c: NnetComputation, cmd: Command, perm: np.ndarray) -> list[Command]:
    """A permuted copy of propagate ``cmd``'s input, which it then reads; returns the
    commands that make it (allocation and gather, to run just before ``cmd``)."""
    sm = c.submatrices[cmd.in_value]
    info = c.matrices[sm.matrix]
    idx = None if info.indexes is None else info.indexes[sm.row_offset:][:sm.num_rows][perm]
    m = c.new_matrix(sm.num_rows, sm.num_cols, info.node, info.is_deriv, idx)
    c.indexes.append(perm.copy())
    gather = Command(CT.COPY_ROWS, dst=c.whole(m), src=cmd.in_value,
                     table=len(c.indexes) - 1)
    cmd.in_value = c.whole(m)
    return [Command(CT.ALLOC_MATRIX, matrix=m), gather]


def _insert(c: NnetComputation, inserts: dict[int, list[Command]]) -> None:
    """Put the cut copies in place; each is freed right after its one reader."""
    out: list[Command] = []
    for k, cmd in enumerate(c.commands):
        made = inserts.get(k)
        if made:
            out.extend(made)
        out.append(cmd)
        if made:
            out.append(Command(CT.DEALLOC_MATRIX, matrix=made[0].matrix))
    c.commands = out
