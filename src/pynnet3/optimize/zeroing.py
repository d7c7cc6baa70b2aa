"""Removal of zeroing that is overwritten before it is read (Kaldi's RemoveUnnecessaryZeroing).

The compiler zeroes every matrix right after allocating it. Where every piece
of the matrix is fully written (a plain write, not an add) before anything reads
it, that zeroing is dead: the allocation may leave the data undefined. The
analysis treats a fresh allocation as undefined, so after this pass the checker
proves that no variable is read before its first full write.
"""

from __future__ import annotations

from ..analysis import AccessType, Analyzer
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT


def remove_unnecessary_zeroing(c: NnetComputation, nnet, options=None) -> str:
    """Turn into NO_OPERATION each SET_CONST 0 that is a matrix's first access
    when, for every variable the zeroing covers, the next access (if any) is a
    plain WRITE. Kept for an output matrix with a variable nothing but the
    zeroing writes (the user sees those zeros)."""
    if any(cmd.type is CT.GOTO_LABEL for cmd in c.commands):
        return ""  # straight-line access order does not hold across a loop
    a = Analyzer(c, nnet)
    va = a.variable_accesses
    removed = 0
    for m in range(1, len(c.matrices)):
        ma = a.matrix_accesses[m]
        if not ma.accesses:
            continue
        z = ma.accesses[0][0]
        cmd = c.commands[z]
        if not (cmd.type is CT.SET_CONST and cmd.alpha == 0.0):
            continue
        if _zeroing_needed(a, va, m, z, ma.is_output):
            continue
        c.commands[z] = Command(CT.NO_OPERATION)
        removed += 1
    return f"removed {removed} zeroing commands" if removed else ""


def _zeroing_needed(a: Analyzer, va, m: int, z: int, is_output: bool) -> bool:
    for v in a.variables.matrix_variables(m):
        cmds, acc = va.of(int(v))
        # The zeroing is the matrix's first access, so a variable it covers has it
        # first; a variable it does not cover is unaffected by removing it.
        if len(cmds) == 0 or cmds[0] != z:
            continue
        if len(cmds) == 1:
            if is_output:
                return True  # the zeros themselves reach the user
            continue
        if acc[1] != int(AccessType.WRITE):
            return True  # read (or added to) while still holding the zeros
    return False
