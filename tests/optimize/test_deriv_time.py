"""limit_derivative_times: derivatives at times outside [min_deriv_time, max_deriv_time]
are treated as zero.

The expected values come from an independent route: the *unoptimized* computation
with a ``SET_CONST 0`` inserted after every backward command on the out-of-window
rows of each derivative matrix it touches (and so right after the output
derivatives are accepted). That is the definition, applied naively row by row;
the pass instead removes and narrows commands and shrinks matrices. Both runs must
agree on outputs, input derivatives and gradients."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import Command, NnetComputation
from pynnet3.computation import CommandType as CT
from pynnet3.errors import ComputeError
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.deriv_time import limit_derivative_times
from tests.compiler import nets
from tests.optimize.single_pass import (
    apply_pass,
    assert_same_results,
    histogram,
    load_reference,
    run,
)

_FIELDS = ("dst", "src", "in_value", "out_value", "out_deriv", "in_deriv")


def masked_reference(c: NnetComputation, lo: int, hi: int) -> NnetComputation:
    """``c`` (unoptimized) with out-of-window derivative rows zeroed after every
    backward command that touches their matrix."""
    marker = next(k for k, cmd in enumerate(c.commands) if cmd.type is CT.NO_OPERATION_MARKER)
    out = []
    for k, cmd in enumerate(c.commands):
        out.append(cmd)
        if k <= marker:
            continue
        subs = [getattr(cmd, f) for f in _FIELDS if getattr(cmd, f)]
        if cmd.type in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI):
            col = c.indexes_multi[cmd.table][:, 0]
            subs += np.unique(col[col > 0]).tolist()
        for m in sorted({c.submatrices[s].matrix for s in subs}):
            info = c.matrices[m]
            if not info.is_deriv:
                continue
            t = info.indexes[:, 1]
            edges = np.diff(np.concatenate([[0], ((t < lo) | (t > hi)).astype(np.int8), [0]]))
            for a, b in zip(np.flatnonzero(edges == 1).tolist(),
                            np.flatnonzero(edges == -1).tolist(), strict=True):
                out.append(Command(CT.SET_CONST, dst=c.new_submatrix(m, a, b - a, 0, info.cols),
                                   alpha=0.0))
    c.commands = out
    return c


def check_against_mask(nnet, req, inputs, derivs, lo, hi, dtype=np.float32, **tol):
    """Apply the pass with window [lo, hi]; compare with the masked reference.
    Returns (unoptimized, limited computation, description, reference result)."""
    ref_c = masked_reference(pynnet3.compile(nnet, req, optimize=False), lo, hi)
    want = run(nnet, ref_c, inputs, derivs, dtype)
    c = pynnet3.compile(nnet, req, optimize=False)
    desc = apply_pass(limit_derivative_times, nnet, c,
                      OptimizeOptions(min_deriv_time=lo, max_deriv_time=hi))
    got = run(nnet, c, inputs, derivs, dtype)
    assert_same_results(got, want, **tol)
    # the window must matter: some gradient is nonzero, and differs from the full one
    full = run(nnet, pynnet3.compile(nnet, req, optimize=False), inputs, derivs, dtype)
    norms = [np.linalg.norm(g) for p in want.gradients.values() for g in p.values()]
    assert max(norms, default=1.0) > 0
    changed = [not np.allclose(full.gradients[k][p], want.gradients[k][p])
               for k in want.gradients for p in want.gradients[k]] + [
        not np.allclose(full.input_derivs[k], v) for k, v in want.input_derivs.items()]
    assert any(changed)
    return pynnet3.compile(nnet, req, optimize=False), c, desc, want


def _rnn():
    nnet = pynnet3.Nnet.from_config(nets.RNN, seed=7)
    nets.to_float64(nnet)
    req = nets.request({"input": nets.frames(0, 12, n=2)}, {"output": nets.frames(1, 10, n=2)},
                       input_deriv=True, output_deriv=True, model=True)
    rng = np.random.default_rng(11)
    return (nnet, req, nets.random_inputs(nnet, req, rng),
            nets.random_output_derivs(nnet, req, rng))


@pytest.mark.parametrize("lo,hi", [(4, 8), (6, 6), (-100, 3), (9, 100)])
def test_recurrent_net_float64(lo, hi):
    nnet, req, inputs, derivs = _rnn()
    before, after, desc, want = check_against_mask(nnet, req, inputs, derivs, lo, hi,
                                                    np.float64, value_rtol=1e-12,
                                                    grad_rtol=1e-12)
    assert desc.startswith("derivative times limited")
    assert len(after.commands) < len(before.commands)
    assert after.peak_memory_floats() < before.peak_memory_floats()
    # the input derivative is zero exactly at the out-of-window rows
    t = req.inputs[0].indexes[:, 1]
    d = want.input_derivs["input"]
    outside = (t < lo) | (t > hi)
    assert not d[outside].any() and d[~outside].any()


@pytest.mark.parametrize("name,lo,hi", [("generated/case_24", 9, 10),
                                        ("generated/case_28", 3, 10),
                                        ("generated/case_12", 8, 13)])
def test_generated_recurrent_cases(name, lo, hi):
    nnet, req, inputs, derivs = load_reference(name)
    before, after, desc, _ = check_against_mask(nnet, req, inputs, derivs, lo, hi)
    assert histogram(after)[CT.BACKPROP] < histogram(before)[CT.BACKPROP]


def test_lstm_truncated_backprop():
    """The realistic TDNN-LSTM with BPTT limited to [0, 10] (outputs are t = 0..19).
    LstmNonlinearity's self-repair adds gradient terms even where the output
    derivative is zero, so the masked reference (which still runs backprops on
    zero rows) only matches with self-repair off."""
    nnet, req, inputs, derivs = load_reference("realistic/tdnn_lstm/train")
    for comp in nnet.components.values():
        if comp.type_name == "LstmNonlinearityComponent":
            comp.self_repair_config[5:] = 0
    before, after, _, _ = check_against_mask(nnet, req, inputs, derivs, 0, 10)
    assert len(after.commands) < len(before.commands)
    assert after.peak_memory_floats() < before.peak_memory_floats()


def test_window_covering_everything_changes_nothing():
    nnet, req, inputs, derivs = _rnn()
    c = pynnet3.compile(nnet, req, optimize=False)
    text = str(c)
    assert limit_derivative_times(c, nnet, OptimizeOptions(min_deriv_time=-1000,
                                                           max_deriv_time=1000)) == ""
    assert str(c) == text
    assert limit_derivative_times(c, nnet, OptimizeOptions()) == ""


def test_relative_max_time_uses_the_last_output_time():
    nnet, req, _, _ = _rnn()
    last = int(req.outputs[0].indexes[:, 1].max())
    a = pynnet3.compile(nnet, req, optimize=False)
    b = pynnet3.compile(nnet, req, optimize=False)
    da = apply_pass(limit_derivative_times, nnet, a,
                    OptimizeOptions(min_deriv_time=2, max_deriv_time_relative=-3))
    db = apply_pass(limit_derivative_times, nnet, b,
                    OptimizeOptions(min_deriv_time=2, max_deriv_time=last - 3))
    assert da == db and f"[2, {last - 3}]" in da
    assert str(a) == str(b)


def test_empty_window_is_an_error():
    nnet, req, _, _ = _rnn()
    c = pynnet3.compile(nnet, req, optimize=False)
    with pytest.raises(ComputeError):
        limit_derivative_times(c, nnet, OptimizeOptions(min_deriv_time=5, max_deriv_time=4))


def test_removed_backprop_drops_its_memo():
    # BatchNorm in training mode keeps a memo from Propagate for Backprop. Its rows
    # are t = 5..7 (read at Offset -5 by outputs at t = 10..12): a window starting at
    # t = 8 removes its backprop, so the propagate must stop making the memo.
    config = """
input-node name=input dim=3
component name=a1 type=AffineComponent input-dim=3 output-dim=4
component-node name=a1 component=a1 input=input
component name=bn type=BatchNormComponent dim=4 test-mode=false
component-node name=bn component=bn input=a1
component name=a2 type=AffineComponent input-dim=7 output-dim=2
component-node name=a2 component=a2 input=Append(Offset(bn, -5), input)
output-node name=output input=a2
"""
    nnet = pynnet3.Nnet.from_config(config, seed=2)
    req = nets.request({"input": nets.frames(0, 13)}, {"output": nets.frames(10, 13)},
                       input_deriv=True, output_deriv=True, model=True)
    rng = np.random.default_rng(0)
    inputs = nets.random_inputs(nnet, req, rng, np.float32)
    derivs = nets.random_output_derivs(nnet, req, rng, np.float32)
    c = pynnet3.compile(nnet, req, optimize=False)
    assert any(cmd.memo for cmd in c.commands if cmd.type is CT.PROPAGATE)
    full = run(nnet, c, inputs, derivs)
    apply_pass(limit_derivative_times, nnet, c, OptimizeOptions(min_deriv_time=8))
    assert not any(cmd.memo for cmd in c.commands)
    assert {cmd.node for cmd in c.commands if cmd.type is CT.BACKPROP} == {"a2"}
    got = run(nnet, c, inputs, derivs)
    # a2's gradient and the input derivative at t >= 8 are unaffected by the window
    np.testing.assert_allclose(got.gradients["a2"]["linear_params"],
                               full.gradients["a2"]["linear_params"], rtol=1e-6)
    t = req.inputs[0].indexes[:, 1]
    np.testing.assert_allclose(got.input_derivs["input"][t >= 8],
                               full.input_derivs["input"][t >= 8], rtol=1e-6)
    assert not got.input_derivs["input"][t < 8].any()
