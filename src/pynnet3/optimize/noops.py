"""Removal of no-op commands that nothing needs (beyond Kaldi).

Kaldi keeps a ``kNoOperationPermanent`` in every computation (looped
computations splice there) and a ``kNoOperationMarker`` even when no backward
pass follows it. Outside looped computations neither is read by anyone: the
runtime steps over them, the checker only needs the marker to precede
backprops. Each costs a dispatch per run, so they go.
"""

from __future__ import annotations

from ..analysis.accesses import has_command_type
from ..computation import CommandType as CT
from ..computation import NnetComputation


def remove_needless_noops(c: NnetComputation, nnet=None, options=None) -> str:
    """Drop permanent no-ops and a marker with nothing after it (not in looped
    computations, whose labels and segments rely on them)."""
    cmds = c.commands
    if has_command_type(c, CT.GOTO_LABEL, CT.NO_OPERATION_LABEL):
        return ""
    removed = 0
    for cmd in cmds:
        if cmd.type is CT.NO_OPERATION_PERMANENT:
            cmd.type = CT.NO_OPERATION
            removed += 1
    markers = [i for i, cmd in enumerate(cmds) if cmd.type is CT.NO_OPERATION_MARKER]
    if len(markers) == 1:
        i = markers[0]
        rest = [cmd for cmd in cmds[i + 1:] if cmd.type is not CT.NO_OPERATION]
        # nothing follows, or only the deallocations of the forward pass
        if all(cmd.type is CT.DEALLOC_MATRIX for cmd in rest):
            cmds[i].type = CT.NO_OPERATION
            removed += 1
    return f"removed {removed} no-ops" if removed else ""
