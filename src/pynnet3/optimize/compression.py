"""Memory compression between the forward and the backward pass
(Kaldi's OptimizeMemoryCompression / MemoryCompressionOptimizer).

A matrix that the forward pass produces and the backward pass needs again sits in
memory in between. Where the backward pass needs only part of its information it
is compressed after its last forward access and decompressed just before its
first backward access:

* level >= 1 (exact): a matrix whose only backward access is its last access and
  is a read by a ``RectifiedLinearComponent`` backprop (as that component's
  output value, nothing else) keeps only its sign: uint8, range 0. ReLU backprop
  reads ``y > 0``, so results are bit-identical.
* level >= 2 (lossy): any other matrix accessed in both passes (not an output)
  is stored as int16 with range 10 (error <= 10 / 32767 / 2 inside [-10, 10],
  clamped outside; see :mod:`pynnet3.runtime.compression`). Level 3 is level 2,
  as in Kaldi.

Command encoding:

* ``COMPRESS_MATRIX``: ``dst`` = the whole-matrix submatrix, ``compress_kind`` = the
  compression kind in Kaldi's ``CuCompressedMatrixType`` numbering
  (1 int8, 2 uint8, 3 int16, 4 uint16; constants in
  :mod:`pynnet3.runtime.compression`), ``alpha`` = the range (0 = sign only).
  Values are always clamped to the representable range (Kaldi's ``truncate``,
  which its optimizer always sets).
* ``DECOMPRESS_MATRIX``: ``dst`` = the same submatrix; ``compress_kind``/``alpha``
  repeat the kind and range so each command is self-describing (memory
  accounting needs the kind; the runtime reads it from the stored object).

Memory accounting (Kaldi's GetMaxMemoryUse): compression frees
``rows * cols * (4 - bytes_per_element(kind))`` bytes until decompression.
"""

from __future__ import annotations

import numpy as np

from ..analysis import AccessType, Analyzer
from ..analysis.accesses import command_types
from ..analysis.variables import matrix_sizes
from ..computation import INT16, UINT8, Command, NnetComputation
from ..computation import CommandType as CT
from .pipeline import KeptReferences

_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def optimize_memory_compression(c: NnetComputation, nnet, options=None) -> str:
    """Insert COMPRESS/DECOMPRESS pairs around the forward/backward gap of each
    matrix that ``options.memory_compression_level`` allows compressing."""
    level = 1 if options is None else options.memory_compression_level
    present = command_types(c)
    if level <= 0 or not c.commands or CT.GOTO_LABEL in present:
        return ""
    MARKER = CT.NO_OPERATION_MARKER
    markers = [i for i, x in enumerate(c.commands) if x.type is MARKER]
    if len(markers) != 1:
        return ""  # no backward pass (or an unexpected layout)
    middle = markers[0]
    a = Analyzer(c, nnet)
    plans = []  # (after forward command, before backward command, matrix, kind, range)
    ma = a.matrix_arrays
    ptr, acc_cmd, acc_type = ma.ptr, ma.command, ma.access
    # per matrix: k = number of accesses before the middle; a candidate is accessed
    # on both sides (0 < k < number of accesses) and is not an output
    before = np.concatenate([[0], np.cumsum(acc_cmd < middle)])
    k = before[ptr[1:]] - before[ptr[:-1]]
    num = np.diff(ptr)
    cand = (k > 0) & (k < num) & ~a.table.is_output
    cand[0] = False
    full_write = None
    for m in np.flatnonzero(cand).tolist():
        j = int(ptr[m] + k[m])
        fwd, bwd = int(acc_cmd[j - 1]), int(acc_cmd[j])
        last = k[m] == num[m] - 1
        plan = _plan_matrix(c, nnet, m, fwd, bwd, int(acc_type[j]), bool(last), level)
        if plan is None:
            continue
        if full_write is None:
            full_write = _first_full_writes(c, a)
        if full_write[m] <= fwd or _defined_by(a, m, fwd):
            plans.append(plan)
    if not plans:
        return ""
    before: dict[int, list[Command]] = {}
    for fwd, bwd, m, kind, rng in plans:
        s = c.whole(m)
        before.setdefault(fwd + 1, []).append(
            Command(CT.COMPRESS_MATRIX, dst=s, alpha=rng, compress_kind=kind))
        before.setdefault(bwd, []).append(
            Command(CT.DECOMPRESS_MATRIX, dst=s, alpha=rng, compress_kind=kind))
    out: list[Command] = []
    for i, cmd in enumerate(c.commands):
        out.extend(before.get(i, ()))
        out.append(cmd)
    c.commands = out
    exact = sum(p[3] == UINT8 for p in plans)
    done = (f"compressed {len(plans)} matrices between the passes "
            f"({exact} sign-only, {len(plans) - exact} int16)")
    # The new commands name whole-matrix submatrices: where commands named each one
    # already, they name the same objects as before. (The access table counts a
    # COMPRESS/DECOMPRESS without a dst as naming the whole matrix; renumbering
    # does not, so there is no claim where there are any.)
    if CT.COMPRESS_MATRIX in present or CT.DECOMPRESS_MATRIX in present:
        return done
    named = np.isin([c.whole(p[2]) for p in plans], a.table.sub).all()
    return KeptReferences(done) if named else done


def _plan_matrix(c: NnetComputation, nnet, m: int, fwd: int, bwd: int, bwd_access: int,
                 bwd_is_last: bool, level: int):
    """The plan for matrix ``m`` (not an output) whose last forward access is ``fwd``
    and first backward access ``bwd``; None when it is not compressed."""
    cmd = c.commands[bwd]
    if (level >= 1 and bwd_is_last and bwd_access == AccessType.READ
            and cmd.type in _BACKPROPS and _relu_reads_only_output(c, nnet, cmd, m)):
        return fwd, bwd, m, UINT8, 0.0
    if level >= 2:
        return fwd, bwd, m, INT16, 10.0
    return None


def _first_full_writes(c: NnetComputation, a: Analyzer) -> np.ndarray:
    """Per matrix, the first command that writes all of it (a plain write of a
    whole-matrix submatrix; len(commands) if none): the common way a matrix is
    defined, found for all matrices in one vectorized pass."""
    t = a.table
    sa = t.sub_array
    rows, cols = matrix_sizes(c).T
    whole = (sa[:, 1] == 0) & (sa[:, 3] == 0) & (sa[:, 2] == rows[sa[:, 0]]) \
        & (sa[:, 4] == cols[sa[:, 0]])
    hit = (t.acc == AccessType.WRITE) & whole[t.sub]
    out = np.full(len(c.matrices), len(c.commands), dtype=np.int64)
    np.minimum.at(out, t.sub_matrix[t.sub[hit]], t.cmd[hit])
    return out


def _defined_by(a: Analyzer, m: int, fwd: int) -> bool:
    """Every part (variable) of matrix ``m`` has been written by command ``fwd``:
    compression reads the whole matrix, so a part that only the backward pass
    fills (a merged or reused matrix) would be read undefined. (The slower test,
    for matrices that no single command writes whole.)"""
    va = a.variable_accesses
    for v in a.variables.matrix_variables(m).tolist():
        cmds, accs = va.of(v)
        if not ((cmds <= fwd) & ((accs & AccessType.WRITE) != 0)).any():
            return False
    return True


def _relu_reads_only_output(c: NnetComputation, nnet, cmd: Command, m: int) -> bool:
    """``cmd`` (a backprop; Kaldi's compiler makes every backprop kBackprop, ours
    drops the model update when none is wanted, so both types count) is a ReLU's,
    and it touches matrix ``m`` only as its output value."""
    comp = nnet.components[nnet.node_map[cmd.node].component]
    if getattr(comp, "type_name", "") != "RectifiedLinearComponent":
        return False
    if not cmd.out_value or c.submatrices[cmd.out_value].matrix != m:
        return False
    return all(not s or c.submatrices[s].matrix != m
               for s in (cmd.in_value, cmd.out_deriv, cmd.in_deriv))
