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

    def flush():
        nonlocal moved
        left = [x for x in seg if x.type is CT.ACCEPT_INPUT]
        right = [x for x in seg if x.type is CT.PROVIDE_OUTPUT]
        mid = [x for x in seg if x.type not in (CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT)]
        new = left + mid + right
        # I/O commands that were not already in their block at the segment's ends
        moved += sum(x.type is CT.ACCEPT_INPUT for x in seg[len(left):])
        moved += sum(x.type is CT.PROVIDE_OUTPUT for x in seg[:len(seg) - len(right)])
        out.extend(new)
        seg.clear()

    for cmd in c.commands:
        if cmd.type is CT.NO_OPERATION_MARKER:
            flush()
            out.append(cmd)
        else:
            seg.append(cmd)
    flush()
    c.commands = out
    return f"moved {moved} commands" if moved else ""
