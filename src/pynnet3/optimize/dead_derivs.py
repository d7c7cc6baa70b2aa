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

from ..analysis import Analyzer
from ..analysis.accesses import has_command_type
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT

_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def remove_dead_input_derivatives(c: NnetComputation, nnet, options=None) -> str:
    """Drop input-derivative matrices that only their backprop writes."""
    if not has_command_type(c, *_BACKPROPS) or has_command_type(c, CT.GOTO_LABEL):
        return ""
    a = Analyzer(c, nnet)
    subs, cmds = c.submatrices, c.commands
    dropped = removed = 0
    for i, cmd in enumerate(cmds):
        if cmd.type not in _BACKPROPS or not cmd.in_deriv:
            continue
        m = subs[cmd.in_deriv].matrix
        if any(s and subs[s].matrix == m for s in (cmd.in_value, cmd.out_value, cmd.out_deriv)):
            continue
        ma = a.matrix_accesses[m]
        if ma.is_input or ma.is_output or ma.allocate_command < 0 \
                or ma.deallocate_command < 0:
            continue
        zeroings = [j for j, _ in ma.accesses if j != i]
        if not all(cmds[j].type is CT.SET_CONST and cmds[j].alpha == 0.0 for j in zeroings):
            continue  # someone else reads or writes it
        if cmd.type is CT.BACKPROP:
            comp = nnet.components[nnet.node_map[cmd.node].component]
            if not comp.is_updatable():
                continue
            cmd.in_deriv = 0
        else:
            cmds[i] = Command(CT.NO_OPERATION)
            removed += 1
        for j in zeroings + [ma.allocate_command, ma.deallocate_command]:
            cmds[j] = Command(CT.NO_OPERATION)
        dropped += 1
    if not dropped:
        return ""
    return (f"dropped {dropped} unread input derivatives"
            + (f" ({removed} backprops with nothing left to do)" if removed else ""))
