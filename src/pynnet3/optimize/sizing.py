"""Sizing commands: shorter matrix lifetimes and reuse of freed memory.

* :func:`move_sizing_commands` (Kaldi's MoveSizingCommands) moves each
  ``ALLOC_MATRIX`` (with the zeroing that follows it, if any) to just before the
  first access of its matrix and each ``DEALLOC_MATRIX`` to just after the last
  access. The compiler allocates early and frees late; this is where most of the
  optimizer's memory saving comes from.
* :func:`remove_unnecessary_allocation` (Kaldi's RemoveUnnecessaryAllocation)
  pairs the deallocation of a matrix ``A`` with a later allocation of a matrix
  ``B`` of the same size and replaces the pair by one ``SWAP_MATRIX`` (``B``
  takes over ``A``'s memory; the deallocation becomes a no-op). An allocation
  leaves data undefined, so handing ``B`` ``A``'s stale data is the same thing;
  a zeroing that follows ``B``'s allocation stays where it is.

Both reason about straight-line command order, so they leave looped
computations (with a ``GOTO_LABEL``) alone.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..analysis import Analyzer
from ..analysis.accesses import has_command_type
from ..analysis.memory import live_floats
from ..computation import Command, NnetComputation, SubMatrix
from ..computation import CommandType as CT


def _looped(c: NnetComputation) -> bool:
    return has_command_type(c, CT.GOTO_LABEL)


def _alloc_zero_pairs(c: NnetComputation) -> list[bool]:
    """``pair[i]``: command ``i`` allocates a matrix and ``i + 1`` zeroes all of it."""
    cmds = c.commands
    pair = [False] * len(cmds)
    last = len(cmds) - 1
    for i, x in enumerate(cmds):
        if x.type is not CT.ALLOC_MATRIX or i == last:
            continue
        y = cmds[i + 1]
        if y.type is CT.SET_CONST and y.alpha == 0.0:
            info = c.matrices[x.matrix]
            pair[i] = c.submatrices[y.dst] == SubMatrix(x.matrix, 0, info.rows, 0, info.cols)
    return pair


def move_sizing_commands(c: NnetComputation, nnet, options=None) -> str:
    """Allocate each matrix just before its first use and free it just after its
    last; input/output and all other commands keep their relative order."""
    if _looped(c):
        return ""
    a = Analyzer(c, nnet)
    cmds = c.commands
    n = len(cmds)
    pair = _alloc_zero_pairs(c)
    ma = a.matrix_arrays
    ptr, acc = ma.ptr, ma.command
    # Sort keys: 3 * position, so that "just before command k" is 3k - 1 and
    # "just after command k" is 3k + 1; ties keep the original order.
    key = np.arange(0, 3 * n, 3, dtype=np.int64)
    num = np.diff(ptr)
    first = ma.first(-1)
    last = ma.last(-1)
    second = np.full(len(num), -1, dtype=np.int64)
    two = num >= 2
    second[two] = acc[ptr[:-1][two] + 1]
    alloc, dealloc = a.table.alloc.tolist(), a.table.dealloc.tolist()
    first, second, last, num = first.tolist(), second.tolist(), last.tolist(), num.tolist()
    for m in range(1, len(c.matrices)):
        al = alloc[m]
        if al != -1 and cmds[al].type is CT.ALLOC_MATRIX:
            # the zeroing that travels with the allocation is not a use
            use = second[m] if (pair[al] and num[m] and first[m] == al + 1) else first[m]
            if use != -1:
                key[al] = 3 * use - 1
        de = dealloc[m]
        if de != -1 and num[m] and cmds[de].type is CT.DEALLOC_MATRIX:
            key[de] = 3 * last[m] + 1
    order = np.argsort(key, kind="stable").tolist()
    out: list[Command] = []
    for i in order:
        if i > 0 and pair[i - 1]:
            continue  # a zeroing travels with its allocation
        out.append(cmds[i])
        if pair[i]:
            out.append(cmds[i + 1])
    moved = sum(x is not y for x, y in zip(out, cmds, strict=True))
    c.commands = out
    return f"reordered {moved} commands" if moved else ""


def remove_unnecessary_allocation(c: NnetComputation, nnet, options=None) -> str:
    """Replace (deallocation of A, later allocation of B of A's size) pairs by
    ``SWAP_MATRIX`` B <- A. Pairing, per size: from the latest deallocation to the
    earliest, take the earliest still-unpaired allocation after it.

    With ``options.allocate_from_other_peak_aware`` (beyond Kaldi, default on) a
    pair is refused when holding the freed matrix until the allocation would raise
    the computation's peak memory: Kaldi's pairing can raise it (tdnnf_chain
    decode: 74736 -> 103200 floats)."""
    if _looped(c):
        return ""
    # Matrices filled by ACCEPT_INPUT count their memory at the accept; keep their
    # (unusual) allocations as they are so the accounting stays right.
    ACCEPT, ALLOC, DEALLOC = CT.ACCEPT_INPUT, CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX
    inputs = {c.submatrices[cmd.dst].matrix for cmd in c.commands if cmd.type is ACCEPT}
    lists: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    mats = c.matrices
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is DEALLOC or (t is ALLOC and cmd.matrix not in inputs):
            info = mats[cmd.matrix]
            d, al = lists.setdefault((info.rows, info.cols), ([], []))
            (d if t is DEALLOC else al).append(i)
    peak_aware = getattr(options, "allocate_from_other_peak_aware", False)
    if peak_aware:
        live = live_floats(c)[0]
        peak = live.max() if len(live) else 0.0
    swaps = rejected = 0
    for (rows, cols), (deallocs, allocs) in lists.items():
        for d in reversed(deallocs):
            j = bisect.bisect_right(allocs, d)
            if j == len(allocs):
                continue
            if peak_aware:
                # the freed matrix stays held from its deallocation until the
                # allocation that takes it over; refuse when that raises the peak
                size = rows * cols
                if live[d:allocs[j]].max() + size > peak:
                    rejected += 1
                    continue
                live[d:allocs[j]] += size
            al = allocs.pop(j)
            freed = c.commands[d].matrix
            c.commands[al] = Command(CT.SWAP_MATRIX, matrix=c.commands[al].matrix,
                                     src_matrix=freed)
            c.commands[d] = Command(CT.NO_OPERATION)
            swaps += 1
    note = f" ({rejected} refused: they would raise the peak)" if rejected else ""
    return f"{swaps} allocations take over freed matrices{note}" if swaps else ""
