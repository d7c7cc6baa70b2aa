"""Consolidate the model update of components backpropagated many times (Kaldi's
ConsolidateModelUpdate).

A recurrent network runs one ``BACKPROP`` per time step for the same component,
each accumulating a small gradient. This pass keeps the derivative part of each of
them (as ``BACKPROP_NO_MODEL_UPDATE``, or nothing if it has no input derivative)
and moves the gradient accumulation into ONE ``BACKPROP`` with no input
derivative on row-wise concatenations of the inputs / outputs / output
derivatives, each piece copied in just before the command it came from (so it
holds the values that command saw).

Only components that are simple, updatable and memo-free qualify, as in Kaldi:
for them row i of the gradient depends on row i of the arguments alone, so one
call on stacked rows adds the same gradient as the separate calls (up to summation
order), and their input derivative does not depend on whether the model is
updated.
"""

from __future__ import annotations

import numpy as np

from ..components.base import Flags
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT
from .options import OptimizeOptions


def _eligible(comp) -> bool:
    props = comp.properties()
    return bool(props & Flags.SIMPLE and props & Flags.UPDATABLE
                and not props & Flags.USES_MEMO)


def _stack(c: NnetComputation, subs: list[int], before: list[int],
           inserts: dict[int, list[Command]]) -> tuple[int, int]:
    """A new matrix holding ``subs`` stacked by rows, filled by a ``MATRIX_COPY`` of
    each piece queued just before command ``before[i]``. Returns (matrix, whole sub)."""
    infos = [c.submatrices[s] for s in subs]
    rows = sum(sm.num_rows for sm in infos)
    cols = infos[0].num_cols
    first = c.matrices[infos[0].matrix]
    pieces = [c.matrices[sm.matrix].indexes for sm in infos]
    indexes = None
    if all(p is not None for p in pieces):
        indexes = np.concatenate([p[sm.row_offset:sm.row_offset + sm.num_rows]
                                  for p, sm in zip(pieces, infos, strict=True)])
    m = c.new_matrix(rows, cols, first.node, first.is_deriv, indexes)
    offset = 0
    for s, sm, k in zip(subs, infos, before, strict=True):
        piece = c.new_submatrix(m, offset, sm.num_rows, 0, cols)
        inserts.setdefault(k, []).append(Command(CT.MATRIX_COPY, dst=piece, src=s))
        offset += sm.num_rows
    return m, c.whole(m)


def consolidate_model_update(c: NnetComputation, nnet, options: OptimizeOptions) -> str:
    """For each eligible component with several ``BACKPROP`` commands, split them into
    derivative-only backprops plus one model-update backprop (see module doc). The
    stacked matrices are allocated and zeroed at the start of the backward pass; the
    update runs right after the last, and the matrices are freed after it."""
    if not c.need_model_derivative:
        return ""
    node_map = nnet.node_map
    eligible: dict[str, bool] = {}
    groups: dict[str, list[int]] = {}
    BACKPROP = CT.BACKPROP
    for k, cmd in enumerate(c.commands):
        if cmd.type is not BACKPROP:
            continue
        name = node_map[cmd.node].component
        ok = eligible.get(name)
        if ok is None:
            ok = eligible[name] = _eligible(nnet.components[name])
        if ok:
            groups.setdefault(name, []).append(k)

    before: dict[int, list[Command]] = {}  # commands to put just before command k
    head: list[Command] = []  # allocations, at the start of the backward pass
    after: dict[int, list[Command]] = {}  # ... and just after it
    done = []
    for name, ks in groups.items():
        if len(ks) < 2:
            continue
        props = nnet.components[name].properties()
        need_in = bool(props & Flags.BACKPROP_NEEDS_INPUT)
        need_out = bool(props & Flags.BACKPROP_NEEDS_OUTPUT)
        cmds = [c.commands[k] for k in ks]
        if any(cmd.precomputed or cmd.memo or bool(cmd.in_value) != need_in
               or bool(cmd.out_value) != need_out or not cmd.out_deriv for cmd in cmds):
            continue  # not the shape Kaldi's consolidation assumes: leave it alone
        stacked = {}
        for field, wanted in (("in_value", need_in), ("out_value", need_out),
                              ("out_deriv", True)):
            if wanted:
                stacked[field] = _stack(c, [getattr(cmd, field) for cmd in cmds], ks, before)
        # As Kaldi: allocated and zeroed as a whole up front (sizing moves them to
        # their first use later). A whole zeroing lets variable merging fold each
        # piece's own zeroed matrix into the stack without leaving partial zeroings.
        for m, whole in stacked.values():
            head.extend([Command(CT.ALLOC_MATRIX, matrix=m),
                         Command(CT.SET_CONST, dst=whole, alpha=0.0)])
        update = Command(CT.BACKPROP, node=cmds[-1].node,
                         **{f: s for f, (_, s) in stacked.items()})
        after.setdefault(ks[-1], []).extend(
            [update] + [Command(CT.DEALLOC_MATRIX, matrix=m) for m, _ in stacked.values()])
        for cmd in cmds:
            # Without an input derivative and without the update, nothing is left to do.
            cmd.type = (CT.BACKPROP_NO_MODEL_UPDATE if cmd.in_deriv or cmd.deriv_table >= 0
                        else CT.NO_OPERATION)
        done.append(f"{name} ({len(ks)})")
    if not done:
        return ""
    MARKER = CT.NO_OPERATION_MARKER
    marker = next(k for k, cmd in enumerate(c.commands) if cmd.type is MARKER)
    after.setdefault(marker, [])[:0] = head
    cmds = c.commands
    out: list[Command] = []
    done_to = 0  # commands before this one are in out
    for k in sorted(before.keys() | after.keys()):
        out += cmds[done_to:k]
        out += before.get(k, ())
        out.append(cmds[k])
        out += after.get(k, ())
        done_to = k + 1
    out += cmds[done_to:]
    c.commands = out
    return f"consolidated model update of {len(done)} components: {', '.join(done)}"
