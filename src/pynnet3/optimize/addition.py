"""Addition to assignment (Kaldi's ConvertAdditionToAssignment).

An adding command (``MATRIX_ADD``, ``ADD_ROWS``, ``ADD_ROWS_MULTI``,
``ADD_TO_ROWS_MULTI``) whose destination held nothing but the zeros of its
initialization (the command is the first access to every written region that is
not a zeroing) computes ``0 + x``: it becomes the copying version. Copies are
cheaper, and they let variable merging remove the assignment and the zeroing
pass drop the zeroing.
"""

from __future__ import annotations

import numpy as np

from ..analysis.accesses import AccessType, command_accesses
from ..computation import CommandType as CT
from ..computation import NnetComputation
from .merging import AccessIndex
from .options import OptimizeOptions

_TO_COPY = {CT.MATRIX_ADD: CT.MATRIX_COPY, CT.ADD_ROWS: CT.COPY_ROWS,
            CT.ADD_ROWS_MULTI: CT.COPY_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI: CT.COPY_TO_ROWS_MULTI}


def convert_addition_to_assignment(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """Turn additions into a region that only zeroing touched before into copies."""
    if not any(cmd.type in _TO_COPY for cmd in c.commands):
        return ""
    index = AccessIndex(c, nnet)
    converted = 0
    for i, cmd in enumerate(c.commands):
        new = _TO_COPY.get(cmd.type)
        if new is None:
            continue
        if cmd.type is CT.ADD_TO_ROWS_MULTI and not _scatter_targets_unique(c, cmd):
            continue  # a copy would keep one of several sums into one row
        written = [s for s, a in command_accesses(c, nnet, cmd) if a & AccessType.WRITE]
        if written and all(index.first_nontrivial_sub(s) == i for s in written):
            cmd.type = new
            converted += 1
    return f"converted {converted} additions to copies" if converted else ""


def _scatter_targets_unique(c: NnetComputation, cmd) -> bool:
    tab = c.indexes_multi[cmd.table]
    tab = tab[tab[:, 0] >= 0]
    return len(np.unique(tab, axis=0)) == len(tab)
