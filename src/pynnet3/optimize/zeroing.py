"""Removal of zeroing that is overwritten before it is read (Kaldi's RemoveUnnecessaryZeroing).

The compiler zeroes every matrix right after allocating it. Where every piece
of the matrix is fully written (a plain write, not an add) before anything reads
it, that zeroing is dead: the allocation may leave the data undefined. The
analysis treats a fresh allocation as undefined, so after this pass the checker
proves that no variable is read before its first full write.
"""

from __future__ import annotations

import numpy as np

from ..analysis import AccessType, Analyzer
from ..analysis.accesses import command_types
from ..computation import CommandType as CT
from ..computation import NnetComputation
from .pipeline import KeptReferences


def remove_unnecessary_zeroing(c: NnetComputation, nnet, options=None) -> str:
    """Turn into NO_OPERATION each SET_CONST 0 that is a matrix's first access
    when, for every variable the zeroing covers, the next access (if any) is a
    plain WRITE. Kept for an output matrix with a variable nothing but the
    zeroing writes (the user sees those zeros). The description is a
    :class:`~.pipeline.KeptReferences` when every removed zeroing's destination is
    still named by another command."""
    present = command_types(c)
    if CT.GOTO_LABEL in present:
        return ""  # straight-line access order does not hold across a loop
    a = Analyzer(c, nnet)
    ma = a.matrix_arrays
    nm = len(c.matrices)
    # z[m]: the matrix's first access when it is a zeroing, else -1
    z = ma.first(-1)
    z[0] = -1
    has = z >= 0
    has[has] = a.table.zeroing[z[has]]
    z[~has] = -1
    if not has.any():
        return ""
    # A variable that the zeroing covers has it as its first access (it is the
    # matrix's first access); one it does not cover is unaffected by removing it.
    va = a.variable_accesses
    variables = a.variables
    count = np.diff(va.ptr)
    nz = count > 0
    first_cmd = np.full(variables.num_variables, -2, dtype=np.int64)
    first_cmd[nz] = va.command[va.ptr[:-1][nz]]
    m_of = variables.matrix_of
    covered = nz & (first_cmd == z[m_of])
    second = np.zeros(variables.num_variables, dtype=np.int8)
    two = count >= 2
    second[two] = va.access[va.ptr[:-1][two] + 1]
    is_output = a.table.is_output
    needed_v = covered & (((count == 1) & is_output[m_of])  # the zeros reach the user
                          | (two & (second != int(AccessType.WRITE))))  # read while zero
    needed = np.zeros(nm, dtype=bool)
    needed[m_of[needed_v]] = True
    removed = z[has & ~needed].tolist()
    if not removed:
        return ""
    cmds, NOOP = c.commands, CT.NO_OPERATION
    for i in removed:
        cmds[i].type = NOOP  # in place: each command object has one slot
    done = f"removed {len(removed)} zeroing commands"
    # A zeroing names only its dst. When every removed one's dst is still named by
    # another command, the commands name the same objects as before. The access
    # table lists each command's submatrix fields and table entries, one entry for
    # a SET_CONST, except that it adds the whole matrix of a COMPRESS/DECOMPRESS
    # without a dst, which renumbering does not count as naming it.
    if CT.COMPRESS_MATRIX in present or CT.DECOMPRESS_MATRIX in present:
        return done
    dst = a.table.sub[np.searchsorted(a.table.cmd, removed)]
    ns = len(c.submatrices)
    named = np.bincount(a.table.sub, minlength=ns) - np.bincount(dst, minlength=ns)
    return KeptReferences(done) if (named[dst] > 0).all() else done
