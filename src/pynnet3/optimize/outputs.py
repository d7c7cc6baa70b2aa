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

from ..analysis import Analyzer
from ..computation import CommandType as CT
from ..computation import NnetComputation


def free_provided_outputs(c: NnetComputation, nnet, options=None) -> str:
    """Mark the final PROVIDE_OUTPUT of each whole output matrix as releasing it,
    when nothing later uses the matrix and nothing deallocates it."""
    if any(cmd.type in (CT.GOTO_LABEL, CT.NO_OPERATION_LABEL) for cmd in c.commands):
        return ""  # a looped computation reuses its matrices on the next pass
    a = Analyzer(c, nnet)
    released = 0
    for m in range(1, len(c.matrices)):
        ma = a.matrix_accesses[m]
        if not ma.is_output or ma.deallocate_command != -1 or not ma.accesses:
            continue
        last = ma.accesses[-1][0]
        cmd = c.commands[last]
        if cmd.type is not CT.PROVIDE_OUTPUT:
            continue
        sm, info = c.submatrices[cmd.src], c.matrices[m]
        if (sm.num_rows, sm.num_cols) != (info.rows, info.cols):
            continue
        cmd.release = True
        released += 1
    return f"{released} outputs handed over" if released else ""
