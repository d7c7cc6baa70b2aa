"""Memory profile of a computation: live floats after every command and what is
live at the peak (the same accounting as :meth:`NnetComputation.peak_memory_floats`,
Kaldi's GetMaxMemoryUse)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..computation import CommandType as CT
from ..computation import NnetComputation


@dataclass
class MemoryProfile:
    live_floats: np.ndarray  # after each command
    peak_floats: int
    peak_command: int  # first command at which the peak is reached
    live_at_peak: list[int]  # matrices live at the peak, largest first

    def describe(self, c: NnetComputation, limit: int = 10) -> str:
        lines = [f"peak {self.peak_floats} floats at command {self.peak_command}"]
        for m in self.live_at_peak[:limit]:
            info = c.matrices[m]
            what = f"{info.node}{' (deriv)' if info.is_deriv else ''}"
            lines.append(f"  m{m:<5} {info.rows:>6} x {info.cols:<6} "
                         f"{info.rows * info.cols:>10}  {what}")
        if len(self.live_at_peak) > limit:
            lines.append(f"  ... {len(self.live_at_peak) - limit} more")
        return "\n".join(lines)


def memory_profile(c: NnetComputation) -> MemoryProfile:
    """Live floats after each command, and the matrices live at the (first) peak."""
    live: dict[int, float] = {}
    cur = 0.0
    out = np.zeros(len(c.commands))
    peak, peak_at, peak_set = 0.0, -1, []
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is CT.ALLOC_MATRIX or (t is CT.ACCEPT_INPUT
                                    and c.submatrices[cmd.dst].matrix not in live):
            m = cmd.matrix if t is CT.ALLOC_MATRIX else c.submatrices[cmd.dst].matrix
            size = c.matrices[m].rows * c.matrices[m].cols
            live[m] = size
            cur += size
        elif t is CT.DEALLOC_MATRIX:
            cur -= live.pop(cmd.matrix, 0)
        elif t is CT.PROVIDE_OUTPUT and cmd.release:
            cur -= live.pop(c.submatrices[cmd.src].matrix, 0)
        elif t is CT.SWAP_MATRIX:
            if cmd.src_matrix in live:
                live[cmd.matrix] = live.pop(cmd.src_matrix)
        out[i] = cur
        if cur > peak:
            peak, peak_at = cur, i
            peak_set = sorted(live, key=lambda m: -live[m])
    return MemoryProfile(out, int(peak), peak_at, peak_set)
