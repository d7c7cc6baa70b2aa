"""Consolidation of I/O commands (Kaldi's ConsolidateIoOperations).

Within each segment (forward, backward, and looped segments, split at
``NO_OPERATION_MARKER``), accept-input commands move to the start and
provide-output commands to the end, each group keeping its order. Other passes
may have moved them; the runtime's contract with the user needs them there.
"""

from __future__ import annotations

from ..computation import CommandType as CT
from ..computation import NnetComputation


def consolidate_io_operations(c: NnetComputation, nnet=None, options=None) -> str:
    """Accept-input first and provide-output last within each segment."""
    out = []
    seg: list = []
    moved = 0

    ACCEPT, PROVIDE, MARKER = CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT, CT.NO_OPERATION_MARKER

    def flush():
        nonlocal moved
        left = [x for x in seg if x.type is ACCEPT]
        right = [x for x in seg if x.type is PROVIDE]
        if not left and not right:
            out.extend(seg)
            seg.clear()
            return
        mid = [x for x in seg if x.type is not ACCEPT and x.type is not PROVIDE]
        # I/O commands that were not already in their block at the segment's ends
        moved += sum(x.type is ACCEPT for x in seg[len(left):])
        moved += sum(x.type is PROVIDE for x in seg[:len(seg) - len(right)])
        out.extend(left)
        out.extend(mid)
        out.extend(right)
        seg.clear()

    for cmd in c.commands:
        if cmd.type is MARKER:
            flush()
            out.append(cmd)
        else:
            seg.append(cmd)
    flush()
    c.commands = out
    return f"moved {moved} commands" if moved else ""
