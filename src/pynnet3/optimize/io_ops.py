"""Consolidation of I/O commands (Kaldi's ConsolidateIoOperations).

Within each segment (forward, backward, and looped segments, split at
``NO_OPERATION_MARKER``), accept-input commands move to the start and
provide-output commands to the end, each group keeping its order. Other passes
may have moved them; the runtime's contract with the user needs them there.
"""

from __future__ import annotations

from bisect import bisect_left

from ..computation import CommandType as CT
from ..computation import NnetComputation


def consolidate_io_operations(c: NnetComputation, nnet=None, options=None) -> str:
    """Accept-input first and provide-output last within each segment."""
    accepts, provides, markers = [], [], []
    ACCEPT, PROVIDE, MARKER = CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT, CT.NO_OPERATION_MARKER
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is ACCEPT:
            accepts.append(i)
        elif t is PROVIDE:
            provides.append(i)
        elif t is MARKER:
            markers.append(i)
    if not accepts and not provides:
        return ""
    cmds = c.commands
    out: list = []
    moved = 0
    begin = 0  # of the segment
    for end in markers + [len(cmds)]:
        # the segment's I/O commands (positions ascending)
        left = accepts[bisect_left(accepts, begin):bisect_left(accepts, end)]
        right = provides[bisect_left(provides, begin):bisect_left(provides, end)]
        # I/O commands that were not already in their block at the segment's ends
        seg_moved = sum(p >= begin + len(left) for p in left) + \
            sum(p < end - len(right) for p in right)
        if seg_moved:
            io = set(left) | set(right)
            out += [cmds[p] for p in left]
            out += [cmds[p] for p in range(begin, end) if p not in io]
            out += [cmds[p] for p in right]
            moved += seg_moved
        else:
            out += cmds[begin:end]
        if end < len(cmds):
            out.append(cmds[end])  # the marker
        begin = end + 1
    if moved:
        c.commands = out
    return f"moved {moved} commands" if moved else ""
