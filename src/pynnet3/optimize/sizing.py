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
from operator import is_not

import numpy as np

from ..analysis import Analyzer
from ..analysis.accesses import AccessTable
from ..analysis.memory import live_floats
from ..analysis.variables import matrix_sizes
from ..computation import CommandType as CT
from ..computation import NnetComputation


def _alloc_zero_pairs(c: NnetComputation, table: AccessTable, allocs: list[int]
                      ) -> np.ndarray:
    """``pair[i]``: command ``i`` allocates a matrix and ``i + 1`` zeroes all of it
    (``allocs``: the ALLOC_MATRIX commands)."""
    n = len(c.commands)
    pair = np.zeros(n, dtype=bool)
    al = np.array(allocs, dtype=np.int64)
    al = al[al < n - 1]
    al = al[table.zeroing[al + 1]]  # followed by a SET_CONST 0 ...
    if not len(al):
        return pair
    cmds = c.commands
    m = np.fromiter((cmds[i].matrix for i in al.tolist()), dtype=np.int64, count=len(al))
    # ... of the whole matrix (a zeroing has one table entry)
    sa = table.sub_array[table.sub[np.searchsorted(table.cmd, al + 1)]]
    rows, cols = matrix_sizes(c).T
    pair[al[(sa[:, 0] == m) & (sa[:, 1] == 0) & (sa[:, 2] == rows[m]) & (sa[:, 3] == 0)
            & (sa[:, 4] == cols[m])]] = True
    return pair


def move_sizing_commands(c: NnetComputation, nnet, options=None) -> str:
    """Allocate each matrix just before its first use and free it just after its
    last; input/output and all other commands keep their relative order."""
    cmds = c.commands
    allocs = []
    ALLOC, GOTO = CT.ALLOC_MATRIX, CT.GOTO_LABEL
    for i, cmd in enumerate(cmds):
        if cmd.type is ALLOC:
            allocs.append(i)
        elif cmd.type is GOTO:
            return ""  # not straight-line
    a = Analyzer(c, nnet)
    t = a.table
    n = len(cmds)
    pair = _alloc_zero_pairs(c, t, allocs)
    ma = a.matrix_arrays
    ptr, acc = ma.ptr, ma.command
    num = np.diff(ptr)
    first = ma.first(-1)
    last = ma.last(-1)
    second = np.full(len(num), -1, dtype=np.int64)
    two = num >= 2
    second[two] = acc[ptr[:-1][two] + 1]
    # Sort keys: 3 * position, so that "just before command k" is 3k - 1 and
    # "just after command k" is 3k + 1; ties keep the original order.
    key = np.arange(0, 3 * n, 3, dtype=np.int64)
    # matrices whose last allocation / deallocation is a plain ALLOC / DEALLOC
    ms = np.arange(len(num))
    al, de = t.alloc, t.dealloc
    has_al = (al != -1) & (al == t.alloc_only) & (ms > 0)
    # the zeroing that travels with the allocation is not a use
    use = np.where(pair[al] & (num > 0) & (first == al + 1), second, first)
    sel = has_al & (use != -1)
    key[al[sel]] = 3 * use[sel] - 1
    sel = (de != -1) & (de == t.dealloc_only) & (num > 0) & (ms > 0)
    key[de[sel]] = 3 * last[sel] + 1
    # a zeroing travels with its allocation: it sorts right after it
    zi = np.flatnonzero(pair)
    key[zi + 1] = key[zi]
    out = list(map(cmds.__getitem__, np.argsort(key, kind="stable").tolist()))
    moved = sum(map(is_not, out, cmds))
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
    cmds, mats = c.commands, c.matrices
    ACCEPT, ALLOC, DEALLOC, GOTO = CT.ACCEPT_INPUT, CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX, \
        CT.GOTO_LABEL
    sizing = []  # allocations and deallocations
    inputs = set()
    for i, cmd in enumerate(cmds):
        t = cmd.type
        if t is ALLOC or t is DEALLOC:
            sizing.append(i)
        elif t is ACCEPT:
            inputs.add(c.submatrices[cmd.dst].matrix)
        elif t is GOTO:
            return ""  # not straight-line
    # per size (in order of first appearance): its deallocations and allocations.
    # Matrices filled by ACCEPT_INPUT count their memory at the accept; keep their
    # (unusual) allocations as they are so the accounting stays right.
    lists: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for i in sizing:
        cmd = cmds[i]
        if cmd.type is ALLOC and cmd.matrix in inputs:
            continue
        info = mats[cmd.matrix]
        d, al = lists.setdefault((info.rows, info.cols), ([], []))
        (d if cmd.type is DEALLOC else al).append(i)
    peak_aware = getattr(options, "allocate_from_other_peak_aware", False)
    pairs, refused = _pair(lists)
    if peak_aware and pairs:
        live = live_floats(c)[0]
        peak = live.max() if len(live) else 0.0
        # Holding the freed matrix from its deallocation to the allocation that
        # takes it over may raise the peak. When no pair would, even with all of
        # them made, the pairs stand (live memory only grows as pairs are made,
        # so each check below would pass); otherwise check them one by one.
        held = np.zeros(len(live) + 1)
        d = np.array([p[0] for p in pairs], dtype=np.int64)
        al = np.array([p[1] for p in pairs], dtype=np.int64)
        size = np.array([p[2] for p in pairs], dtype=np.float64)
        np.add.at(held, d, size)
        np.add.at(held, al, -size)
        if (live + np.cumsum(held[:-1])).max() > peak:
            pairs, refused = _pair(lists, live, peak)
    for d, al, _ in pairs:
        # in place (each command object has one slot): the allocation becomes the
        # swap, the deallocation a no-op
        cmds[al].type, cmds[al].src_matrix = CT.SWAP_MATRIX, cmds[d].matrix
        cmds[d].type = CT.NO_OPERATION
    note = f" ({refused} refused: they would raise the peak)" if refused else ""
    return f"{len(pairs)} allocations take over freed matrices{note}" if pairs else ""


def _pair(lists: dict[tuple[int, int], tuple[list[int], list[int]]],
          live: np.ndarray | None = None, peak: float = 0.0
          ) -> tuple[list[tuple[int, int, int]], int]:
    """(deallocation, allocation, size) pairs and how many were refused: with
    ``live`` (live floats after each command, updated as pairs are made) the pairs
    that would raise ``peak`` are."""
    pairs = []
    refused = 0
    for (rows, cols), (deallocs, allocs) in lists.items():
        allocs = list(allocs)
        size = rows * cols
        for d in reversed(deallocs):
            j = bisect.bisect_right(allocs, d)
            if j == len(allocs):
                continue
            if live is not None:
                if live[d:allocs[j]].max() + size > peak:
                    refused += 1
                    continue
                live[d:allocs[j]] += size
            pairs.append((d, allocs.pop(j), size))
    return pairs, refused
