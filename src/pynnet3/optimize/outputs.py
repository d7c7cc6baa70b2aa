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

from ..analysis.accesses import command_accesses, command_types, has_command_type
from ..computation import CommandType as CT
from ..computation import NnetComputation


def free_provided_outputs(c: NnetComputation, nnet, options=None) -> str:
    """Mark the final PROVIDE_OUTPUT of each whole output matrix as releasing it,
    when nothing later uses the matrix and nothing deallocates it."""
    if has_command_type(c, CT.GOTO_LABEL, CT.NO_OPERATION_LABEL):
        return ""  # a looped computation reuses its matrices on the next pass
    cmds, subs = c.commands, c.submatrices
    PROVIDE, DEALLOC, SWAP = CT.PROVIDE_OUTPUT, CT.DEALLOC_MATRIX, CT.SWAP_MATRIX
    outputs: set[int] = set()
    ended: set[int] = set()  # deallocated, swapped away or already handed over
    for i in [i for i, t in enumerate(command_types(c)) if t is PROVIDE or t is DEALLOC
              or t is SWAP]:
        cmd = cmds[i]
        if cmd.type is PROVIDE:
            m = subs[cmd.src].matrix
            outputs.add(m)
            if cmd.release:
                ended.add(m)
        elif cmd.type is DEALLOC:
            ended.add(cmd.matrix)
        else:
            ended.add(cmd.src_matrix)
    # the last command accessing each candidate: scan back from the end (outputs
    # are provided at the end of their segment, so the scan is short)
    todo = outputs - ended - {0}
    last: dict[int, int] = {}
    for i in range(len(cmds) - 1, -1, -1):
        if not todo:
            break
        for sub, _ in command_accesses(c, nnet, cmds[i]):
            m = subs[sub].matrix
            if m in todo:
                last[m] = i
                todo.discard(m)
    released = 0
    for m in sorted(last):
        cmd = cmds[last[m]]
        if cmd.type is not PROVIDE:
            continue
        sm, info = subs[cmd.src], c.matrices[m]
        if (sm.num_rows, sm.num_cols) != (info.rows, info.cols):
            continue
        cmd.release = True
        released += 1
    return f"{released} outputs handed over" if released else ""
