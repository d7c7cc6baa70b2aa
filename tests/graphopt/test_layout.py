"""The layout step of the network optimizer (graphopt/layout.py): every linear
layer's weights column-major, the same values and file, the same outputs and
derivatives to float32 rounding (BLAS sums the transposed product in another order)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3 import NetworkOptions
from pynnet3.components.fused import linear_part
from pynnet3.graphopt.layout import _weight_attr, column_major_weights
from tests.graphopt.common import assert_equivalent, build, optimize, request_for

# every kind of linear layer the step knows, a fused affine + ReLU among them,
# and an LSTM-like loop (per-step products of a few rows)
NET = """
input-node name=input dim=6
component name=a type=NaturalGradientAffineComponent input-dim=18 output-dim=10
component-node name=a component=a input=Append(Offset(input, -1), input, Offset(input, 1))
component name=relu type=RectifiedLinearComponent dim=10
component-node name=relu component=relu input=a
component name=lin type=LinearComponent input-dim=10 output-dim=8
component-node name=lin component=lin input=relu
component name=td type=TdnnComponent input-dim=8 output-dim=7 time-offsets=-1,0,1
component-node name=td component=td input=lin
component name=rec type=AffineComponent input-dim=12 output-dim=5
component-node name=rec component=rec input=Append(td, IfDefined(Offset(rec_out, -1)))
component name=tanh type=TanhComponent dim=5
component-node name=rec_out component=tanh input=rec
component name=fixed type=FixedAffineComponent input-dim=5 output-dim=4
component-node name=fixed component=fixed input=rec_out
output-node name=output input=fixed
"""


def _weights(nnet):
    out = {}
    for name, comp in nnet.components.items():
        lin = linear_part(comp)
        attr = _weight_attr(lin)
        if attr is not None:
            out[name] = getattr(lin, attr)
    return out


def test_weights_column_major_values_and_file_unchanged():
    nnet = build(NET)
    opt, report = optimize(nnet)
    plain, _ = optimize(nnet, NetworkOptions(layout=False))
    w, w_plain = _weights(opt), _weights(plain)
    assert len(w) >= 4 and w.keys() == w_plain.keys()
    for name in w:
        assert w[name].flags.f_contiguous and w_plain[name].flags.c_contiguous
        np.testing.assert_array_equal(w[name], w_plain[name])
    assert opt.to_bytes() == plain.to_bytes()
    assert report.passes[-1].name == "layout"
    assert report.passes[-1].notes == [f"{len(w)} weight matrices stored column-major"]
    for comp in nnet.components.values():  # (the input network is untouched)
        attr = _weight_attr(linear_part(comp))
        if attr is not None:
            assert getattr(linear_part(comp), attr).flags.c_contiguous


def test_outputs_and_derivatives_as_the_row_major_network():
    nnet = build(NET)
    plain, _ = optimize(nnet, NetworkOptions(layout=False))
    opt, _ = optimize(nnet)
    assert_equivalent(plain, opt, derivatives=True)
    assert_equivalent(nnet, opt)
    # a copy keeps the layout; the written file reads back as the same network
    assert all(x.flags.f_contiguous for x in _weights(opt.copy()).values())


def test_gradients_and_an_update_as_the_row_major_network():
    """The model gradients of the column-major network are the row-major one's, and
    an in-place update keeps the layout and gives the same weights."""
    nnet = build(NET)
    a, b = nnet.copy(), nnet.copy()
    assert column_major_weights(b)
    assert column_major_weights(b) == []  # (nothing left to change)
    req = request_for(nnet, deriv=True)
    req.need_model_derivative = True
    rng = np.random.default_rng(0)
    x = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
         for s in req.inputs}
    d = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
         for s in req.outputs}
    ga = pynnet3.run(a, req, inputs=x, output_derivs=d, dtype=np.float64).gradients
    gb = pynnet3.run(b, req, inputs=x, output_derivs=d, dtype=np.float64).gradients
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        for p in ga[k]:
            np.testing.assert_allclose(gb[k][p], ga[k][p], rtol=1e-12, atol=1e-12)
    wa, wb = _weights(a), _weights(b)
    for name in ga:  # (the fixed affine has none)
        g = ga[name].get("linear_params")
        if g is None:  # (LinearComponent: its one matrix, vectorized)
            g = ga[name]["params_vectorized"].reshape(wa[name].shape)
        wa[name] -= 0.1 * g.astype(np.float32)
        wb[name] -= 0.1 * g.astype(np.float32)
        assert wb[name].flags.f_contiguous
        np.testing.assert_array_equal(wa[name], wb[name])


def test_torch_parameter_cache_sees_changes_of_column_major_weights():
    """The torch backend's device copy of a parameter is remade when the host array
    changes: a byte comparison that must cover column-major arrays too."""
    pytest.importorskip("torch")
    from pynnet3.components.xp_torch import _same_bytes

    w = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    snap = np.array(w, copy=True)
    assert snap.flags.f_contiguous and _same_bytes(snap, w)
    w[2, 1] += 1
    assert not _same_bytes(snap, w)
    assert _same_bytes(np.ascontiguousarray(w), w)  # (mixed layouts: by value)
