"""Repeated gathers made assignments (beyond Kaldi).

Two component nodes that read the same descriptor (the output layers of a chain
model, both heads of an LSTM's projection) each get their input gathered: the
same rows of the same source, by the same table, into two matrices. The second
gather is the first's result again; as an assignment ``m2 = m1`` it is a plain
copy, and variable merging (which runs next) usually removes it altogether, the
two readers then sharing one matrix.

Invariant: a gather becomes an assignment only when the earlier one wrote a whole
matrix that nothing writes (or frees) before the later one, and nothing writes
the source rows in between: ``m1`` then holds exactly what the later gather
would write.

Memory: the assignment keeps ``m1`` alive from its last reader up to the later
gather, and may free the source earlier (when the later gather was its last
reader). A share is only made where that does not raise the peak, estimated
with each matrix alive from its first to its last use (as move_sizing_commands
makes it): two heads of one layer, gathered one after the other, share (the
recurrence they read is freed earlier); an output gathered at the end from the
rows an early layer read (an x-vector's statistics input, its source still read
in between) does not, when keeping ``m1`` across the layers in between would
raise the peak.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..computation import Command, NnetComputation, command_submatrices
from ..computation import CommandType as CT
from .options import OptimizeOptions
from .row_ops import _written_subs

_GATHERS = (CT.COPY_ROWS, CT.COPY_ROWS_MULTI)


def _sources(c: NnetComputation, cmd: Command) -> set[int]:
    """The matrices a gather reads."""
    if cmd.type is CT.COPY_ROWS:
        return {c.submatrices[cmd.src].matrix}
    tab = c.indexes_multi[cmd.table]
    return {c.submatrices[int(s)].matrix for s in np.unique(tab[tab[:, 0] > 0, 0])}


def _key(c: NnetComputation, cmd: Command) -> tuple:
    table = c.indexes[cmd.table] if cmd.type is CT.COPY_ROWS else c.indexes_multi[cmd.table]
    sm = c.submatrices[cmd.dst]
    src = c.submatrices[cmd.src] if cmd.type is CT.COPY_ROWS else None
    return (cmd.type, cmd.alpha, src, sm.num_rows, sm.num_cols,
            np.ascontiguousarray(table).tobytes())


def _write_positions(c: NnetComputation) -> dict[int, list[int]] | None:
    """Per matrix, the indexes of the commands that write (or free) it, in order;
    None when some command's writes cannot be told."""
    out: dict[int, list[int]] = {}
    for k, cmd in enumerate(c.commands):
        if cmd.type in (CT.DEALLOC_MATRIX, CT.SWAP_MATRIX):
            mats = {cmd.matrix, cmd.src_matrix} - {0}
        else:
            subs = _written_subs(c, cmd)
            if subs is None:
                return None
            mats = {c.submatrices[s].matrix for s in subs}
        for m in mats:
            out.setdefault(m, []).append(k)
    return out


class _Lifetimes:
    """Matrices alive from their first to their last use (sizing commands aside, as
    move_sizing_commands makes them), the floats alive at each command and their
    peak: the estimate by which a share is judged (module docstring)."""

    def __init__(self, c: NnetComputation):
        self.c = c
        self.uses: dict[int, list[int]] = {}
        for k, cmd in enumerate(c.commands):
            if cmd.type not in (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX):
                for m in {c.submatrices[s].matrix for s in command_submatrices(c, cmd)}:
                    self.uses.setdefault(m, []).append(k)
        delta = np.zeros(len(c.commands) + 1, dtype=np.int64)
        for m, pos in self.uses.items():
            delta[pos[0]] += self._size(m)
            delta[pos[-1] + 1] -= self._size(m)
        self.live = np.cumsum(delta[:-1])
        self.peak = int(self.live.max(initial=0))

    def _size(self, m: int) -> int:
        return self.c.matrices[m].rows * self.c.matrices[m].cols

    def share(self, m1: int, j: int, sources: set[int]) -> bool:
        """Let command ``j`` read ``m1`` instead of ``sources``, if that keeps the
        peak: ``m1`` lives on from its last use up to ``j``, while a source that
        ``j`` read last is freed after its use before (by the first gather, at
        the latest). Returns whether it did."""
        delta = np.zeros(len(self.live) + 1, dtype=np.int64)
        pos = self.uses[m1]
        if pos[-1] < j:
            delta[pos[-1] + 1] += self._size(m1)
            delta[j] -= self._size(m1)
        for m in sources:
            pos = self.uses[m]
            if pos[-1] == j and len(pos) > 1:
                delta[pos[-2] + 1] -= self._size(m)
                delta[j + 1] += self._size(m)
        live = self.live + np.cumsum(delta[:-1])
        if int(live.max(initial=0)) > self.peak:
            return False
        self.live = live
        bisect.insort(self.uses[m1], j)
        for m in sources:
            self.uses[m].remove(j)
        return True


def _untouched(writes: dict[int, list[int]], m: int, after: int, before: int) -> bool:
    pos = writes.get(m, [])
    i = bisect.bisect_right(pos, after)
    return i == len(pos) or pos[i] >= before


def share_identical_gathers(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Make each repeated whole-matrix gather an assignment from the first (see the
    module docstring)."""
    if any(cmd.type is CT.GOTO_LABEL for cmd in c.commands):
        return ""
    writes = _write_positions(c)
    if writes is None:
        return ""
    alive = None  # (made for the first repeat: most computations have none)
    first: dict[tuple, int] = {}
    done = 0
    for j, cmd in enumerate(c.commands):
        if cmd.type not in _GATHERS or not c.is_whole(cmd.dst):
            continue
        key = _key(c, cmd)
        i = first.get(key)
        if i is None:
            first[key] = j
            continue
        m1 = c.submatrices[c.commands[i].dst].matrix
        sources = _sources(c, cmd)
        alive = alive or _Lifetimes(c)
        if m1 == c.submatrices[cmd.dst].matrix or not all(
                _untouched(writes, m, i, j) for m in (m1, *sources)) \
                or not alive.share(m1, j, sources):
            first[key] = j  # (a later repeat may still reuse this one)
            continue
        cmd.type, cmd.src, cmd.table, cmd.alpha = CT.MATRIX_COPY, c.whole(m1), -1, 1.0
        done += 1
    return f"{done} repeated gather(s) made assignments" if done else ""
