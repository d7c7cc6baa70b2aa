"""What the runtime may skip in a training run, found from how a value is used
later in the computation (NumPy backend; decided per computer, from the
computation and its nodes' components):

* :func:`sign_free_propagates`: affine layers whose output no use gates on the sign
  of an entry, which then run without the float64 near-zero refinement
  (components/affine.py);
* :func:`relu_mask_plans`: ReLU backprops that take their sign-only compressed
  output's codes as the ``y > 0`` mask, with no decompression.
"""

from __future__ import annotations

import numpy as np

from ..components.affine import AffineComponent
from ..components.base import Flags
from ..components.nonlinear import RectifiedLinearComponent as Relu
from ..computation import SUBMATRIX_FIELDS, Command, NnetComputation
from ..computation import CommandType as CT

#: commands that do nothing at run time (I/O lookups step over them)
NOOPS = (CT.NO_OPERATION, CT.NO_OPERATION_PERMANENT, CT.NO_OPERATION_MARKER,
         CT.NO_OPERATION_LABEL)
#: the multi-row commands (their tables name submatrices)
MULTI_ROW_OPS = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
                 CT.ADD_TO_ROWS_MULTI)


def whole(c: NnetComputation, s: int) -> bool:
    """Whether submatrix ``s`` is all of its matrix."""
    return c.is_whole(s)


#: component types whose propagate and backprop are smooth in their input value
#: (no derivative gated on the sign of an entry, as ReLU's is)
_SIGN_FREE = frozenset(("LogSoftmaxComponent", "SoftmaxComponent", "SigmoidComponent",
                        "TanhComponent"))
_COPIES = (CT.MATRIX_COPY, CT.COPY_ROWS, CT.MATRIX_ADD, CT.ADD_ROWS)
_NODE_CMDS = (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def sign_free_propagates(c: NnetComputation, comps: dict) -> list[int]:
    """Indices of the PROPAGATE commands of affine-family nodes (those that refine
    near-zero outputs: components/affine.py) whose output value no use gates on
    the sign of an entry (:func:`_sign_free_value`). ``comps``: component of each
    component node."""
    subs = c.submatrices
    out = []
    tables: dict[int, frozenset] = {}
    for i, cmd in enumerate(c.commands):
        if (cmd.type is not CT.PROPAGATE or not cmd.out_value or not cmd.in_value
                or not isinstance(comps.get(cmd.node), AffineComponent)):
            continue
        target = subs[cmd.out_value].matrix
        if subs[cmd.in_value].matrix != target and _sign_free_value(c, i, target, cmd.node,
                                                                    comps, tables):
            out.append(i)
    return out


def relu_mask_plans(c: NnetComputation, comps: dict) -> dict[int, int]:
    """``{decompression: backprop}``: each DECOMPRESS_MATRIX of a sign-only
    compression (range 0: Kaldi's for a ReLU output that only the ReLU's backprop
    reads) whose matrix is then touched only by one BACKPROP of a node whose
    component is a RectifiedLinearComponent with its own backprop (which takes its
    output value as a bool mask: it only reads ``y > 0``), reading it as that
    output value, and then freed. That backprop may take the positive codes as
    the mask (runtime/compression.positive_mask): no float matrix is written and
    read again; the same mask, the same floats."""
    subs, cmds = c.submatrices, c.commands
    tables: dict[int, frozenset] = {}
    out: dict[int, int] = {}
    for i, cmd in enumerate(cmds):
        if cmd.type is not CT.DECOMPRESS_MATRIX or cmd.alpha != 0.0 or not cmd.dst:
            continue
        m = subs[cmd.dst].matrix
        reader = None
        for j in range(i + 1, len(cmds)):
            x = cmds[j]
            if x.type in NOOPS:
                continue
            if x.type is CT.DEALLOC_MATRIX and x.matrix == m:
                if reader is not None:
                    out[i] = reader
                break
            if x.matrix == m or x.src_matrix == m:
                break  # (resized, swapped, compressed again ...)
            if x.type in MULTI_ROW_OPS or (x.type in _NODE_CMDS
                                    and (x.table >= 0 or x.deriv_table >= 0)):
                named = tables.get(j)
                if named is None:
                    named = tables[j] = _table_matrices(c, x)
                if m in named:
                    break
            on = {f for f in SUBMATRIX_FIELDS if (s := getattr(x, f)) and subs[s].matrix == m}
            if not on:
                continue
            comp = comps.get(x.node)
            if (reader is not None or x.type not in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
                    or on != {"out_value"} or not isinstance(comp, Relu)
                    or type(comp).backprop is not Relu.backprop):
                break
            reader = j
    return out


def _table_matrices(c: NnetComputation, cmd: Command) -> frozenset:
    """The matrices the submatrix tables of ``cmd`` name (multi-row ops; a
    PROPAGATE or BACKPROP reading its input or adding its input derivative as
    blocks)."""
    t, subs = cmd.type, c.submatrices
    found: set[int] = set()
    if t in MULTI_ROW_OPS:
        found.update(np.unique(c.indexes_multi[cmd.table][:, 0]).tolist())
    elif t in _NODE_CMDS:
        if cmd.table >= 0 and not cmd.in_value:
            found.update(c.indexes_blocks[cmd.table].tolist())
        if cmd.deriv_table >= 0:
            found.update(c.indexes_blocks[cmd.deriv_table].tolist())
    return frozenset(subs[s].matrix for s in found if s > 0)


def _sign_free_value(c: NnetComputation, start: int, target: int, producer: str,
                     comps: dict, tables: dict) -> bool:
    """Whether, after command ``start``, until it is freed or overwritten as a
    whole (a swap renames it), the value in matrix ``target`` is only read by
    other nodes' PROPAGATE (as input) or BACKPROP (as input or output value) of
    a :data:`_SIGN_FREE` type, copied or added into another matrix whose value
    passes the same test (any scale), or provided as an output. A PROPAGATE that
    writes the whole matrix ends the value unless its component adds to its
    output. Anything else (a partial write, a resize or compression, a table of
    submatrices naming the matrix, another command type) answers False.
    ``tables``: :func:`_table_matrices` by command index, filled as needed."""
    subs, cmds = c.submatrices, c.commands
    for j in range(start + 1, len(cmds)):
        cmd = cmds[j]
        t = cmd.type
        if t in NOOPS:
            continue
        if t is CT.DEALLOC_MATRIX and cmd.matrix == target:
            return True
        if t is CT.SWAP_MATRIX and target in (cmd.matrix, cmd.src_matrix):
            target = cmd.src_matrix if cmd.matrix == target else cmd.matrix
            continue  # (the value now goes by the other matrix's number)
        if cmd.matrix == target or cmd.src_matrix == target:
            return False  # (resized, compressed, ...)
        if t in MULTI_ROW_OPS or (t in _NODE_CMDS and (cmd.table >= 0 or cmd.deriv_table >= 0)):
            named = tables.get(j)
            if named is None:
                named = tables[j] = _table_matrices(c, cmd)
            if target in named:
                return False
        on = {f for f in SUBMATRIX_FIELDS if (s := getattr(cmd, f)) and subs[s].matrix == target}
        if not on:
            continue
        if t in (CT.MATRIX_COPY, CT.COPY_ROWS, CT.SET_CONST) and on == {"dst"} \
                and whole(c, cmd.dst):
            return True  # (overwritten as a whole: the value is gone)
        if t in _COPIES and on == {"src"}:
            if not _sign_free_value(c, j, subs[cmd.dst].matrix, producer, comps, tables):
                return False
            continue
        if t is CT.PROVIDE_OUTPUT and on == {"src"}:
            if cmd.release:
                return True  # (handed over: gone)
            continue
        if t in _NODE_CMDS and cmd.node != producer and on <= {"in_value", "out_value"}:
            comp = comps.get(cmd.node)
            if comp is None:
                return False
            if t is not CT.PROPAGATE or "in_value" in on:
                if comp.type_name not in _SIGN_FREE:
                    return False
                continue
            if whole(c, cmd.out_value):  # (a whole write: the value ends, or is added to)
                return not comp.properties() & Flags.PROPAGATE_ADDS
        return False
    return True


# per command type, the submatrix fields that command only reads ("table": the
# submatrices its block table (PROPAGATE / BACKPROP) or gather table (multi-row
# copies into ``dst``) names)
_READ_FIELDS = {
    CT.MATRIX_COPY: ("src",), CT.MATRIX_ADD: ("src",), CT.COPY_ROWS: ("src",),
    CT.ADD_ROWS: ("src",), CT.ADD_ROW_RANGES: ("src",),
    CT.COPY_ROWS_MULTI: ("table",), CT.ADD_ROWS_MULTI: ("table",),
    CT.COPY_TO_ROWS_MULTI: ("src",), CT.ADD_TO_ROWS_MULTI: ("src",),
    CT.PROPAGATE: ("in_value", "table"),
    CT.BACKPROP: ("in_value", "out_value", "out_deriv", "table"),
    CT.BACKPROP_NO_MODEL_UPDATE: ("in_value", "out_value", "out_deriv", "table"),
}


def _touched(c: NnetComputation, cmd: Command) -> list[tuple[str, int]]:
    """``(field, submatrix)`` of every submatrix ``cmd`` names, its tables' entries
    under the field names "table" (input blocks, multi-row tables) and
    "deriv_table" (derivative blocks)."""
    out = [(f, s) for f in SUBMATRIX_FIELDS if (s := getattr(cmd, f))]
    t = cmd.type
    if t in (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
        if not cmd.in_value and cmd.table >= 0:
            out += [("table", int(s)) for s in c.indexes_blocks[cmd.table]]
        if t is not CT.PROPAGATE and not cmd.in_deriv and cmd.deriv_table >= 0:
            out += [("deriv_table", int(s)) for s in c.indexes_blocks[cmd.deriv_table]]
    elif t in MULTI_ROW_OPS:
        out += [("table", int(s)) for s in np.unique(c.indexes_multi[cmd.table][:, 0])
                if s > 0]
    return out


def read_only_inputs(c: NnetComputation) -> frozenset[int]:
    """Matrices that one ACCEPT_INPUT fills whole and that no command writes, swaps,
    compresses or hands out afterwards (only reads, and the deallocation): the
    NumPy runtime may then hold the user's own array, read-only, instead of a copy
    (as Kaldi's AcceptInput takes the matrix over; a read-only view makes a missed
    write raise rather than change the caller's data)."""
    subs = c.submatrices
    accepted: dict[int, int] = {}
    other: set[int] = set()
    for cmd in c.commands:
        t = cmd.type
        if t is CT.ACCEPT_INPUT:
            m = subs[cmd.dst].matrix
            accepted[m] = accepted.get(m, 0) + (1 if c.is_whole(cmd.dst) else 2)
            continue
        if t in (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX) or t in NOOPS:
            continue
        if t in (CT.SWAP_MATRIX, CT.COMPRESS_MATRIX, CT.DECOMPRESS_MATRIX):
            other.update((cmd.matrix, cmd.src_matrix))
        reads = _READ_FIELDS.get(t, ())
        for f, s in _touched(c, cmd):
            if f not in reads:
                other.add(subs[s].matrix)
    return frozenset(m for m, n in accepted.items() if n == 1 and m not in other)
