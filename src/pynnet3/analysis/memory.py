"""Memory profile of a computation: live floats after every command and what is
live at the peak. This is THE accounting (Kaldi's GetMaxMemoryUse, in floats):
:meth:`NnetComputation.peak_memory_floats` is the maximum of :func:`live_floats`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..components.blas import column_block_temporary
from ..computation import CommandType as CT
from ..computation import NnetComputation, bytes_per_element


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


_BLOCK_READERS = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def _deriv_block_floats(c: NnetComputation, cmd) -> int:
    """The temporary a backprop adding its input derivative to column blocks makes
    (``components.affine.add_input_deriv``), from the shapes alone."""
    od = c.submatrices[cmd.out_deriv]
    widths = [c.submatrices[s].num_cols for s in c.indexes_blocks[cmd.deriv_table].tolist()]
    return column_block_temporary(od.num_rows, od.num_cols, widths)


def live_floats(c: NnetComputation, upto: int | None = None) -> tuple[np.ndarray, dict]:
    """Live floats after each command (the accounting of :func:`memory_profile`; a
    command gathering block inputs, or adding its input derivative to blocks, counts
    its temporary at its own position), and
    the matrices live (matrix -> floats) after command ``upto`` (after the last one
    when None)."""
    live: dict[int, float] = {}
    cur = 0.0
    n = len(c.commands)
    out = [0.0] * n
    snap: dict = {}
    stop = -1 if upto is None else upto  # an int compare per command, not int == None
    subs, mats = c.submatrices, c.matrices
    ALLOC, ACCEPT, DEALLOC = CT.ALLOC_MATRIX, CT.ACCEPT_INPUT, CT.DEALLOC_MATRIX
    PROVIDE, SWAP = CT.PROVIDE_OUTPUT, CT.SWAP_MATRIX
    COMPRESS, DECOMPRESS = CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX
    PROPAGATE, BACKPROP, NO_UPDATE = _BLOCK_READERS
    packed: dict[int, float] = {}  # compressed submatrix -> its size in floats
    for i, cmd in enumerate(c.commands):
        t = cmd.type
        if t is ALLOC or (t is ACCEPT and subs[cmd.dst].matrix not in live):
            m = cmd.matrix if t is ALLOC else subs[cmd.dst].matrix
            size = mats[m].rows * mats[m].cols
            live[m] = size
            cur += size
        elif t is DEALLOC:
            cur -= live.pop(cmd.matrix, 0)
        elif t is PROVIDE and cmd.release:
            cur -= live.pop(subs[cmd.src].matrix, 0)
        elif t is SWAP:
            if cmd.src_matrix in live:
                live[cmd.matrix] = live.pop(cmd.src_matrix)
        elif t is COMPRESS or t is DECOMPRESS:
            sm = subs[cmd.dst]
            n_el = sm.num_rows * sm.num_cols
            if t is COMPRESS:  # the matrix shrinks to its compressed bytes
                packed[cmd.dst] = n_el * bytes_per_element(cmd.compress_kind) / 4
                cur += packed[cmd.dst] - n_el
            else:
                cur += n_el - packed.pop(cmd.dst, n_el)  # unmatched: no change
        out[i] = cur
        if (t is PROPAGATE or t is BACKPROP or t is NO_UPDATE) and cmd.in_value == 0 \
                and cmd.table >= 0:
            out[i] += c.gathered_floats(cmd)  # the temporary it gathers into
        if (t is BACKPROP or t is NO_UPDATE) and cmd.deriv_table >= 0:
            out[i] += _deriv_block_floats(c, cmd)  # the temporary it makes, if any
        if i == stop:
            snap = dict(live)
    if upto is None:
        snap = live
    return np.array(out, dtype=np.float64), snap


def memory_profile(c: NnetComputation) -> MemoryProfile:
    """Live floats after each command, and the matrices live at the (first) peak."""
    out, _ = live_floats(c)
    if not len(out) or out.max() <= 0:
        return MemoryProfile(out, 0, -1, [])
    peak_at = int(np.argmax(out))  # the first command at the peak
    _, live = live_floats(c, peak_at)
    return MemoryProfile(out, int(out[peak_at]), peak_at,
                         sorted(live, key=lambda m: -live[m]))
