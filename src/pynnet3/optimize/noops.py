"""Removal of no-op commands that nothing needs (beyond Kaldi).

Kaldi keeps a ``kNoOperationPermanent`` in every computation (looped
computations splice there) and a ``kNoOperationMarker`` even when no backward
pass follows it. Outside looped computations neither is read by anyone: the
runtime steps over them, the checker only needs the marker to precede
backprops. Each costs a dispatch per run, so they go.
"""

from __future__ import annotations

from ..computation import CommandType as CT
from ..computation import NnetComputation


def remove_needless_noops(c: NnetComputation, nnet=None, options=None) -> str:
    """Drop permanent no-ops and a marker with nothing after it (not in looped
    computations, whose labels and segments rely on them)."""
    cmds = c.commands
    permanent, markers = [], []
    PERMANENT, MARKER = CT.NO_OPERATION_PERMANENT, CT.NO_OPERATION_MARKER
    LOOPED = (CT.GOTO_LABEL, CT.NO_OPERATION_LABEL)
    for i, cmd in enumerate(cmds):
        t = cmd.type
        if t is PERMANENT:
            permanent.append(i)
        elif t is MARKER:
            markers.append(i)
        elif t in LOOPED:
            return ""
    for i in permanent:
        cmds[i].type = CT.NO_OPERATION
    removed = len(permanent)
    if len(markers) == 1:
        i = markers[0]
        # nothing follows, or only the deallocations of the forward pass
        DEALLOC, NOOP = CT.DEALLOC_MATRIX, CT.NO_OPERATION
        if all(cmd.type is DEALLOC for cmd in cmds[i + 1:] if cmd.type is not NOOP):
            cmds[i].type = CT.NO_OPERATION
            removed += 1
    return f"removed {removed} no-ops" if removed else ""
