"""Removal of input derivatives nothing reads (beyond Kaldi).

A backprop computes its input derivative whenever its node's input needs one;
for some steps nothing reads it — e.g. the first step of a recurrence whose input
rows come only from nodes without derivatives. Kaldi (and our compiler, to stay
command-for-command comparable with it) still allocates, zeroes and fills that
matrix. Here a derivative matrix whose only accesses are its zeroing and the
backprop writing it is dropped: the backprop stops computing it, and a
``BACKPROP_NO_MODEL_UPDATE`` left with nothing to do goes entirely. A backprop
with a model update keeps its update (updatable components accept no input
derivative); one of a non-updatable component is left alone, since its backprop
may keep statistics (self-repair).
"""

from __future__ import annotations

import numpy as np

from ..analysis import Analyzer
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT


def remove_dead_input_derivatives(c: NnetComputation, nnet, options=None) -> str:
    """Drop input-derivative matrices that only their backprop writes."""
    cmds = c.commands
    backprops = []  # with an input derivative
    BACKPROP, NO_UPDATE, GOTO = CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE, CT.GOTO_LABEL
    for i, cmd in enumerate(cmds):
        t = cmd.type
        if t is BACKPROP or t is NO_UPDATE:
            if cmd.in_deriv:
                backprops.append(i)
        elif t is GOTO:
            return ""
    if not backprops:
        return ""
    a = Analyzer(c, nnet)
    t, ma = a.table, a.matrix_arrays
    # per matrix: how many commands other than zeroings access it
    busy = ~t.zeroing[ma.command]
    m_of = np.repeat(np.arange(len(c.matrices)), np.diff(ma.ptr))
    others = np.bincount(m_of[busy], minlength=len(c.matrices))
    # a candidate's matrix: no user input or output, allocated and freed, and
    # nothing but zeroings besides the backprop writing it
    ok = ((others == 1) & ~t.is_input & ~t.is_output & (t.alloc >= 0)
          & (t.dealloc >= 0)).tolist()
    subs = c.submatrices
    node_map = nnet.node_map
    dropped = removed = 0
    for i in backprops:
        cmd = cmds[i]
        m = subs[cmd.in_deriv].matrix
        if not ok[m]:
            continue
        if any(s and subs[s].matrix == m for s in (cmd.in_value, cmd.out_value, cmd.out_deriv)):
            continue
        if cmd.type is CT.BACKPROP:
            if not nnet.components[node_map[cmd.node].component].is_updatable():
                continue
            cmd.in_deriv = 0
        else:
            cmds[i] = Command(CT.NO_OPERATION)
            removed += 1
        zeroings = [j for j in ma.command[ma.ptr[m]:ma.ptr[m + 1]].tolist() if j != i]
        for j in zeroings + [int(t.alloc[m]), int(t.dealloc[m])]:
            cmds[j] = Command(CT.NO_OPERATION)
        dropped += 1
    if not dropped:
        return ""
    return (f"dropped {dropped} unread input derivatives"
            + (f" ({removed} backprops with nothing left to do)" if removed else ""))
