# ruff: noqa: E501  (network configs are long lines)
"""Small networks, requests and a computation checker shared by the compiler and
runtime tests.

Every network avoids kinks (tanh / sigmoid only) so finite differences are
reliable in float64.
"""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.computation import CommandType as CT
from pynnet3.computation import NnetComputation

# -- networks -------------------------------------------------------------------------

TDNN = """
input-node name=input dim=3
component name=affine1 type=AffineComponent input-dim=9 output-dim=5
component-node name=affine1 component=affine1 input=Append(Offset(input, -2), input, Offset(input, 1))
component name=tanh1 type=TanhComponent dim=5
component-node name=tanh1 component=tanh1 input=affine1
component name=affine2 type=AffineComponent input-dim=5 output-dim=4
component-node name=affine2 component=affine2 input=Sum(Offset(tanh1, -1), Scale(0.5, Offset(tanh1, 1)))
component name=sig2 type=SigmoidComponent dim=4
component-node name=sig2 component=sig2 input=affine2
output-node name=output input=Sum(sig2, Scale(-2.0, Offset(sig2, 1)))
"""
TDNN_LEFT, TDNN_RIGHT = 3, 3  # input context of the output: t-3 .. t+3

IVECTOR = """
input-node name=input dim=3
input-node name=ivector dim=2
component name=affine1 type=AffineComponent input-dim=8 output-dim=4
component-node name=affine1 component=affine1 input=Append(input, Offset(input, -1), ReplaceIndex(ivector, t, 0))
component name=tanh1 type=TanhComponent dim=4
component-node name=tanh1 component=tanh1 input=affine1
output-node name=output input=tanh1
"""

# An LSTM-like loop: r(t) = tanh(A [x(t); r(t-1)]) with IfDefined at the start,
# and a dim-range node that feeds a part of r back and another part out.
RNN = """
input-node name=input dim=3
component name=affine1 type=AffineComponent input-dim=6 output-dim=5
component-node name=affine1 component=affine1 input=Append(input, IfDefined(Offset(rec, -1)))
component name=tanh1 type=TanhComponent dim=5
component-node name=tanh1 component=tanh1 input=affine1
dim-range-node name=rec input-node=tanh1 dim-offset=0 dim=3
dim-range-node name=out input-node=tanh1 dim-offset=3 dim=2
component name=affine2 type=AffineComponent input-dim=4 output-dim=2
component-node name=affine2 component=affine2 input=Append(out, IfDefined(Offset(out, 2)))
output-node name=output input=affine2
"""

# A recurrence whose start is a Failover to a constant node.
# Kaldi's fast-lstmp layer as its xconfig writes it, {x} its input and {delay} its
# recurrence's time offset: the cell c and the projection r go through one
# BackpropTruncation over Append(c, r), read back as c_trunc and r_trunc.
FAST_LSTMP = """
input-node name=input dim=5
component name=W_all type=NaturalGradientAffineComponent input-dim=8 output-dim=16
component-node name=W_all component=W_all input=Append({x}, IfDefined(Offset(r_trunc, {delay})))
component name=nonlin type=LstmNonlinearityComponent cell-dim=4
component-node name=nonlin component=nonlin input=Append(W_all, IfDefined(Offset(c_trunc, {delay})))
dim-range-node name=c input-node=nonlin dim-offset=0 dim=4
dim-range-node name=m input-node=nonlin dim-offset=4 dim=4
component name=W_rp type=NaturalGradientAffineComponent input-dim=4 output-dim=5
component-node name=rp component=W_rp input=m
dim-range-node name=r input-node=rp dim-offset=0 dim=3
component name=trunc type=BackpropTruncationComponent dim=7
component-node name=cr_trunc component=trunc input=Append(c, r)
dim-range-node name=c_trunc input-node=cr_trunc dim-offset=0 dim=4
dim-range-node name=r_trunc input-node=cr_trunc dim-offset=4 dim=3
component name=out type=AffineComponent input-dim=5 output-dim=6
component-node name=out component=out input=rp
output-node name=output input=out
"""

FAILOVER = """
input-node name=input dim=3
component name=const type=ConstantComponent output-dim=3
component-node name=const component=const input=input
component name=affine1 type=AffineComponent input-dim=6 output-dim=3
component-node name=affine1 component=affine1 input=Append(input, Failover(Offset(c, -1), const))
component name=c type=SigmoidComponent dim=3
component-node name=c component=c input=affine1
output-node name=output input=c
"""

# Round(): the ivector only exists every 3 frames.
ROUND = """
input-node name=input dim=2
input-node name=ivector dim=2
component name=affine1 type=AffineComponent input-dim=4 output-dim=3
component-node name=affine1 component=affine1 input=Append(input, Round(ivector, 3))
component name=tanh1 type=TanhComponent dim=3
component-node name=tanh1 component=tanh1 input=affine1
output-node name=output input=tanh1
"""

# x-vector style statistics extraction + pooling.
STATS = """
input-node name=input dim=3
component name=affine1 type=AffineComponent input-dim=3 output-dim=2
component-node name=affine1 component=affine1 input=input
component name=tanh1 type=TanhComponent dim=2
component-node name=tanh1 component=tanh1 input=affine1
component name=extract type=StatisticsExtractionComponent input-dim=2 input-period=1 output-period=2 include-variance=true
component-node name=extract component=extract input=tanh1
component name=pool type=StatisticsPoolingComponent input-dim=5 input-period=2 left-context=4 right-context=4 num-log-count-features=0 output-stddevs=true
component-node name=pool component=pool input=extract
component name=affine2 type=AffineComponent input-dim=4 output-dim=2
component-node name=affine2 component=affine2 input=Round(pool, 2)
output-node name=output input=affine2
"""


# -- requests -------------------------------------------------------------------------

def frames(t0: int, t1: int, n: int = 1, x: int = 0) -> np.ndarray:
    """Indexes (n, t, x) for t in [t0, t1) and every n < ``n``, in (n, t) order."""
    return np.array([[s, t, x] for s in range(n) for t in range(t0, t1)], dtype=np.int64)


def request(inputs: dict, outputs: dict, input_deriv: bool = False,
            output_deriv: bool = False, model: bool = False) -> pynnet3.ComputationRequest:
    return pynnet3.ComputationRequest(
        [pynnet3.IoSpecification(k, v, input_deriv) for k, v in inputs.items()],
        [pynnet3.IoSpecification(k, v, output_deriv) for k, v in outputs.items()],
        need_model_derivative=model)


def random_inputs(nnet, req, rng, dtype=np.float64) -> dict:
    return {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name))).astype(dtype)
            for s in req.inputs}


def random_output_derivs(nnet, req, rng, dtype=np.float64) -> dict:
    return {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name))).astype(dtype)
            for s in req.outputs if s.has_deriv}


def to_float64(nnet) -> None:
    """Make every float32 parameter array of ``nnet`` float64 (in place)."""
    for comp in nnet.components.values():
        for key, val in list(vars(comp).items()):
            if isinstance(val, np.ndarray) and val.dtype == np.float32:
                setattr(comp, key, val.astype(np.float64))


# -- checker ----------------------------------------------------------------------------

_ROW_OPS = (CT.COPY_ROWS, CT.ADD_ROWS)
_MULTI_OPS = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
              CT.ADD_TO_ROWS_MULTI)


def submatrices_used(cmd) -> list[int]:
    return [s for s in (cmd.dst, cmd.src, cmd.in_value, cmd.out_value, cmd.out_deriv,
                        cmd.in_deriv) if s]


def check_computation(c: NnetComputation, nnet=None) -> list[str]:
    """The checker-like invariants of a compiled computation; returns problems."""
    problems: list[str] = []
    mats = c.matrices
    for s, sm in enumerate(c.submatrices[1:], start=1):
        if not 0 < sm.matrix < len(mats):
            problems.append(f"submatrix {s}: bad matrix {sm.matrix}")
            continue
        m = mats[sm.matrix]
        if sm.num_rows <= 0 or sm.num_cols <= 0 or sm.row_offset < 0 or sm.col_offset < 0 \
                or sm.row_offset + sm.num_rows > m.rows or sm.col_offset + sm.num_cols > m.cols:
            problems.append(f"submatrix {s} {sm} out of range of matrix {sm.matrix} "
                            f"({m.rows}x{m.cols})")
    live: set[int] = set()
    ever: set[int] = set()
    freed: set[int] = set()
    markers = [k for k, cmd in enumerate(c.commands) if cmd.type is CT.NO_OPERATION_MARKER]
    if len(markers) != 1:
        problems.append(f"expected exactly one NO_OPERATION_MARKER, got {len(markers)}")
    marker = markers[0] if markers else len(c.commands)

    def use(k, s, what):
        if not 0 < s < len(c.submatrices):
            problems.append(f"c{k}: {what} submatrix {s} out of range")
            return None
        m = c.submatrices[s].matrix
        if m not in live:
            problems.append(f"c{k}: {what} m{m} used while not allocated")
        return c.submatrices[s]

    for k, cmd in enumerate(c.commands):
        t = cmd.type
        if t is CT.ALLOC_MATRIX:
            if cmd.matrix in ever:
                problems.append(f"c{k}: m{cmd.matrix} allocated twice")
            live.add(cmd.matrix)
            ever.add(cmd.matrix)
            continue
        if t is CT.DEALLOC_MATRIX:
            if cmd.matrix in freed:
                problems.append(f"c{k}: m{cmd.matrix} deallocated twice")
            if cmd.matrix not in live:
                problems.append(f"c{k}: m{cmd.matrix} deallocated while not allocated")
            live.discard(cmd.matrix)
            freed.add(cmd.matrix)
            continue
        if t is CT.ACCEPT_INPUT:
            m = c.submatrices[cmd.dst].matrix
            live.add(m)
            ever.add(m)
            continue
        for s in submatrices_used(cmd):
            use(k, s, t.value)
        if t is CT.PROPAGATE and k > marker:
            problems.append(f"c{k}: Propagate after the marker")
        if t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE) and k < marker:
            problems.append(f"c{k}: Backprop before the marker")
        if t in (CT.MATRIX_COPY, CT.MATRIX_ADD):
            a, b = c.submatrices[cmd.dst], c.submatrices[cmd.src]
            if (a.num_rows, a.num_cols) != (b.num_rows, b.num_cols):
                problems.append(f"c{k}: {t.value} of different shapes")
        if t in _ROW_OPS:
            tab = c.indexes[cmd.table]
            d, s = c.submatrices[cmd.dst], c.submatrices[cmd.src]
            if len(tab) != d.num_rows or tab.max(initial=-1) >= s.num_rows or tab.min() < -1:
                problems.append(f"c{k}: {t.value} table out of range")
            if d.num_cols != s.num_cols:
                problems.append(f"c{k}: {t.value} column mismatch")
            if k > marker and t is CT.ADD_ROWS:
                # Backward AddRows must not read a source row into two places when it
                # stands for a scatter; destination rows are unique by construction.
                pass
        if t in _MULTI_OPS:
            tab = c.indexes_multi[cmd.table]
            d = c.submatrices[cmd.dst]
            if tab.shape != (d.num_rows, 2):
                problems.append(f"c{k}: {t.value} table shape {tab.shape}")
            for sub, row in tab.tolist():
                if sub == -1 and row == -1:
                    continue
                if not 0 < sub < len(c.submatrices) or not 0 <= row < \
                        c.submatrices[sub].num_rows:
                    problems.append(f"c{k}: {t.value} bad location ({sub}, {row})")
                    break
                use(k, sub, t.value)
                if c.submatrices[sub].num_cols != d.num_cols:
                    problems.append(f"c{k}: {t.value} column mismatch")
                    break
            if t in (CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI):
                locs = [tuple(p) for p in tab.tolist() if p[0] != -1]
                if len(set(locs)) != len(locs):
                    problems.append(f"c{k}: {t.value} writes a location twice")
        if t is CT.ADD_ROW_RANGES:
            tab = c.indexes_ranges[cmd.table]
            d, s = c.submatrices[cmd.dst], c.submatrices[cmd.src]
            if tab.shape != (d.num_rows, 2) or (tab[:, 0] > tab[:, 1]).any() or \
                    tab.min(initial=0) < 0 or tab.max(initial=0) > s.num_rows:
                problems.append(f"c{k}: AddRowRanges ranges out of range")
            elif k > marker:
                # A backward scatter: every source row goes to one destination row.
                nonempty = tab[tab[:, 1] > tab[:, 0]]
                nonempty = nonempty[np.argsort(nonempty[:, 0])]
                if (nonempty[1:, 0] < nonempty[:-1, 1]).any():
                    problems.append(f"c{k}: backward AddRowRanges ranges overlap")
        if t is CT.PROVIDE_OUTPUT:
            m = c.submatrices[cmd.src].matrix
            if c.submatrices[cmd.src].num_rows != mats[m].rows:
                problems.append(f"c{k}: provide-output of a partial matrix")
    # Everything except outputs and input derivatives is deallocated.
    provided = {c.submatrices[cmd.src].matrix for cmd in c.commands
                if cmd.type is CT.PROVIDE_OUTPUT}
    if live != provided:
        problems.append(f"not deallocated: {sorted(live - provided)}; "
                        f"provided but freed: {sorted(provided - live)}")
    return problems


def assert_valid(c: NnetComputation, nnet=None) -> None:
    """This module's compiler-specific invariants, then the library's checker."""
    problems = check_computation(c, nnet)
    assert not problems, "\n".join(problems[:20])
    if nnet is not None:
        pynnet3.check(c, nnet)
