"""Turning a multi-segment computation into a loop (Kaldi's OptimizeLoopedComputation).

The computation of a looped request (:func:`pynnet3.compiler.looped.compile_looped`)
has one segment per chunk. Each segment's splice point is its
``NO_OPERATION_PERMANENT`` (after its inputs are accepted, before any work). At a
splice point the *active* matrices are those written before it and read after it:
the state carried from the past. Each matrix is described by its node, whether it
is a derivative and its indexes with the time shifted so the first row has t=0
(its *shape id*), plus that first t (its *offset*). The first two splice points
``s1 < s2`` whose active lists agree in shape ids, with every offset either equal
or larger by ``(s2 - s1)`` chunk shifts, are spliced: everything after ``s2`` is
dropped, ``s2`` becomes ``GOTO_LABEL`` to a ``NO_OPERATION_LABEL`` inserted at
``s1``, and before the goto the shifted matrices of ``s2`` are swapped into their
counterparts of ``s1``, so the loop body starts again in the same state.

Invariant kept: running the looped computation chunk by chunk gives the outputs
the unlooped multi-segment computation would give for as many segments as chunks.
"""

from __future__ import annotations

import numpy as np

from ..analysis.accesses import has_command_type
from ..analysis.analyzer import Analyzer
from ..computation import Command, CommandType, NnetComputation
from ..errors import ComputeError

CT = CommandType


def _segment_ends(c: NnetComputation) -> list[int]:
    return [i for i, cmd in enumerate(c.commands) if cmd.type is CT.NO_OPERATION_MARKER]


def find_time_shift(c: NnetComputation) -> int:
    """The time shift between consecutive segments: the t offset between the first
    output of segment 1 and that of segment 2 (segment 0 has extra left context)."""
    ends = _segment_ends(c)
    if len(ends) < 3:
        raise ComputeError("a looped computation needs at least 3 segments")

    def first_output(lo: int, hi: int) -> Command:
        for cmd in c.commands[lo:hi]:
            if cmd.type is CT.PROVIDE_OUTPUT:
                return cmd
        raise ComputeError(f"no output in commands {lo}..{hi - 1} (segment of a looped "
                           "computation)")

    a, b = first_output(ends[0], ends[1]), first_output(ends[1], ends[2])
    ma, mb = c.submatrices[a.src].matrix, c.submatrices[b.src].matrix
    ia, ib = c.matrices[ma].indexes, c.matrices[mb].indexes
    if a.node != b.node or ia is None or ib is None or len(ia) != len(ib) or not len(ia):
        raise ComputeError("outputs of segments 1 and 2 do not correspond")
    shift = int(ib[0, 1] - ia[0, 1])
    if not np.array_equal(ib[:, 1], ia[:, 1] + shift):
        raise ComputeError("outputs of segments 1 and 2 differ by more than a time shift")
    return shift


def _matrix_pairs(c: NnetComputation) -> tuple[np.ndarray, np.ndarray]:
    """(shape id, offset) of every matrix (index 0 unused). Matrices without
    indexes get shape ids of their own, so they never match another matrix."""
    ids = {}
    shape_id = np.zeros(len(c.matrices), dtype=np.int64)
    offset = np.zeros(len(c.matrices), dtype=np.int64)
    for m in range(1, len(c.matrices)):
        info = c.matrices[m]
        if info.indexes is None or len(info.indexes) == 0:
            shape_id[m] = -m
            continue
        idx = np.asarray(info.indexes, dtype=np.int64)
        t0 = int(idx[0, 1])
        norm = idx.copy()
        norm[:, 1] -= t0
        key = (info.node, info.is_deriv, info.cols, norm.tobytes())
        shape_id[m] = ids.setdefault(key, len(ids) + 1)
        offset[m] = t0
    return shape_id, offset


def _active_matrices(c: NnetComputation, nnet, splice_points: list[int]) -> list[list[int]]:
    """Matrices first written (other than zeroing) before and read after each
    splice point."""
    analyzer = Analyzer(c, nnet)
    first = analyzer.first_nontrivial_matrix_accesses()
    last = analyzer.matrix_arrays.last(-1)
    points = np.asarray(splice_points, dtype=np.int64)
    # inside[k, m]: splice point k lies strictly between m's first non-trivial
    # access and its last access
    inside = (points[:, None] > first[None, 1:]) & (points[:, None] < last[None, 1:])
    return [(np.flatnonzero(row) + 1).tolist() for row in inside]


def _lists_match(a: np.ndarray, b: np.ndarray, shift: int) -> bool:
    """``a``, ``b``: (k, 2) sorted (shape id, offset) lists; equal shape ids and
    each offset equal or larger by ``shift``."""
    if a.shape != b.shape:
        return False
    if not np.array_equal(a[:, 0], b[:, 0]):
        return False
    d = b[:, 1] - a[:, 1]
    return bool(np.all((d == 0) | (d == shift)))


def _swap_order(list1: list[int], list2: list[int]) -> list[tuple[int, int]]:
    """Order of the swaps ``list1[i] <- list2[i]`` so that a matrix of ``list1`` that
    also appears in ``list2`` gives its data away before it receives new data."""
    pos_in_2 = {m: i for i, m in enumerate(list2)}
    done = [False] * len(list1)
    out: list[tuple[int, int]] = []
    for _ in range(len(list1) + 1):
        if len(out) == len(list1):
            return out
        for i, (m1, m2) in enumerate(zip(list1, list2, strict=True)):
            if done[i]:
                continue
            j = pos_in_2.get(m1)
            if j is None or done[j]:
                out.append((m1, m2))
                done[i] = True
    if len(out) != len(list1):
        raise ComputeError("internal: cyclic matrix swaps in looped computation")
    return out


def optimize_looped_computation(c: NnetComputation, nnet, options=None) -> str:
    """Splice the first repeating pair of segments into an infinite loop (see the
    module docstring); returns "" (and changes nothing) when there is none."""
    splice = [i for i, cmd in enumerate(c.commands)
              if cmd.type is CT.NO_OPERATION_PERMANENT]
    if len(splice) < 2 or len(_segment_ends(c)) < 3:
        return ""
    if has_command_type(c, CT.GOTO_LABEL):
        return ""  # already looped
    shift_per_segment = find_time_shift(c)
    active = _active_matrices(c, nnet, splice)
    shape_id, offset = _matrix_pairs(c)
    lists = []
    for mats in active:
        m = np.asarray(mats, dtype=np.int64)
        order = np.lexsort((m, offset[m], shape_id[m]))
        m = m[order]
        lists.append((m, np.stack([shape_id[m], offset[m]], axis=1)))
    found = None
    for s1 in range(len(splice)):
        for s2 in range(s1 + 1, len(splice)):
            if _lists_match(lists[s1][1], lists[s2][1], (s2 - s1) * shift_per_segment):
                found = (s1, s2)
                break
        if found:
            break
    if found is None:
        return ""
    s1, s2 = found
    (m1, p1), (m2, p2) = lists[s1], lists[s2]
    moved = p2[:, 1] != p1[:, 1]
    list1, list2 = m1[moved].tolist(), m2[moved].tolist()
    _check_identified(c, list1, list2, (s2 - s1) * shift_per_segment)
    # Form the loop: drop everything after the second splice point, make it the goto,
    # insert the label at the first one, and swap the state back before jumping.
    c.commands = c.commands[:splice[s2]]
    c.commands.insert(splice[s1], Command(CT.NO_OPERATION_LABEL))
    for a, b in _swap_order(list1, list2):
        c.commands.append(Command(CT.SWAP_MATRIX, matrix=a, src_matrix=b))
    c.commands.append(Command(CT.GOTO_LABEL, label=splice[s1]))
    fix_goto_label(c)
    return (f"loop from segment {s1} to segment {s2} ({len(list1)} matrices swapped, "
            f"time shift {(s2 - s1) * shift_per_segment})")


def _check_identified(c: NnetComputation, list1: list[int], list2: list[int],
                      shift: int) -> None:
    if shift <= 0:
        raise ComputeError(f"internal: looped time shift {shift} is not positive")
    for a, b in zip(list1, list2, strict=True):
        ia, ib = c.matrices[a], c.matrices[b]
        same = (ia.rows == ib.rows and ia.cols == ib.cols and ia.node == ib.node
                and ia.is_deriv == ib.is_deriv and ia.indexes is not None
                and ib.indexes is not None)
        if same:
            x, y = np.asarray(ia.indexes), np.asarray(ib.indexes)
            same = (np.array_equal(x[:, [0, 2]], y[:, [0, 2]])
                    and np.array_equal(x[:, 1] + shift, y[:, 1]))
        if not same:
            raise ComputeError(f"internal: looped computation pairs m{a} with m{b}, which "
                               f"are not the same state shifted by {shift}")


def fix_goto_label(c: NnetComputation, nnet=None, options=None) -> str:
    """Point the final ``GOTO_LABEL`` at the ``NO_OPERATION_LABEL`` again (other
    passes move commands). Returns "" when nothing needed fixing."""
    label = next((i for i, cmd in enumerate(c.commands)
                  if cmd.type is CT.NO_OPERATION_LABEL), None)
    for cmd in reversed(c.commands):
        if cmd.type is CT.GOTO_LABEL:
            if label is None:
                raise ComputeError("GOTO_LABEL without a NO_OPERATION_LABEL")
            if cmd.label != label:
                cmd.label = label
                return f"goto points at c{label}"
            return ""
        if cmd.type is not CT.PROVIDE_OUTPUT:
            return ""
    return ""
