"""Handing output matrices over instead of keeping them (beyond Kaldi).

Kaldi keeps every output matrix (and input-derivative matrix) allocated to the
end, because its user fetches outputs after the run. Our runtime copies a
matrix out when it executes ``PROVIDE_OUTPUT`` (the stepping API lets the user
read it before the next command runs), so the last ``PROVIDE_OUTPUT`` of a
matrix that no later command touches can release it (``Command.release``, the
moral equivalent of Kaldi's GetOutputDestructive). In a training computation
that frees the forward outputs for the whole backward pass, at no command's
cost.
"""

from __future__ import annotations

from operator import attrgetter

from ..analysis.accesses import command_accesses
from ..computation import SUBMATRIX_FIELDS, NnetComputation
from ..computation import CommandType as CT

_FIELDS = attrgetter(*SUBMATRIX_FIELDS)
# commands that may access submatrices their fields do not name: in row tables,
# block tables (a component command with a table), or the whole matrix
_SUBMATRICES_ELSEWHERE = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
                          CT.ADD_TO_ROWS_MULTI, CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX)
_BLOCK_READERS = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def free_provided_outputs(c: NnetComputation, nnet, options=None) -> str:
    """Mark the final PROVIDE_OUTPUT of each whole output matrix as releasing it,
    when nothing later uses the matrix and nothing deallocates it."""
    cmds, subs = c.commands, c.submatrices
    PROVIDE, DEALLOC, SWAP = CT.PROVIDE_OUTPUT, CT.DEALLOC_MATRIX, CT.SWAP_MATRIX
    LOOPED = (CT.GOTO_LABEL, CT.NO_OPERATION_LABEL)
    outputs: set[int] = set()
    ended: set[int] = set()  # deallocated, swapped away or already handed over
    for cmd in cmds:
        t = cmd.type
        if t is PROVIDE:
            m = subs[cmd.src].matrix
            outputs.add(m)
            if cmd.release:
                ended.add(m)
        elif t is DEALLOC:
            ended.add(cmd.matrix)
        elif t is SWAP:
            ended.add(cmd.src_matrix)
        elif t in LOOPED:
            return ""  # a looped computation reuses its matrices on the next pass
    # the last command accessing each candidate: scan back from the end (outputs
    # are provided at the end of their segment, so the scan is short)
    todo = outputs - ended - {0}
    last: dict[int, int] = {}
    for i in range(len(cmds) - 1, -1, -1):
        if not todo:
            break
        cmd = cmds[i]
        t = cmd.type
        # Most commands access only submatrices their fields name: skip those that
        # name none of a candidate (the others are asked in full).
        if t not in _SUBMATRICES_ELSEWHERE and not (t in _BLOCK_READERS and (
                cmd.table >= 0 or cmd.deriv_table >= 0)):
            for sub in _FIELDS(cmd):
                if sub and subs[sub].matrix in todo:
                    break
            else:
                continue
        for sub, _ in command_accesses(c, nnet, cmd):
            m = subs[sub].matrix
            if m in todo:
                last[m] = i
                todo.discard(m)
    released = 0
    for m in sorted(last):
        cmd = cmds[last[m]]
        if cmd.type is not CT.PROVIDE_OUTPUT:
            continue
        sm, info = subs[cmd.src], c.matrices[m]
        if (sm.num_rows, sm.num_cols) != (info.rows, info.cols):
            continue
        cmd.release = True
        released += 1
    return f"{released} outputs handed over" if released else ""
