"""The runtime: dtypes, input validation, outputs as copies, determinism, row order."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.errors import PynnetError, RuntimeInputError
from tests.compiler import nets as N


@pytest.fixture(scope="module")
def tdnn():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9, n=2)}, {"output": N.frames(0, 6, n=2)},
                    True, True, True)
    return nnet, req, pynnet3.compile(nnet, req, optimize=False)


@pytest.fixture(scope="module")
def ivector():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    req = N.request({"input": N.frames(-1, 6), "ivector": [[0, 0, 0]]},
                    {"output": N.frames(0, 6)}, True, True, False)
    return nnet, req, pynnet3.compile(nnet, req, optimize=False)


def _data(nnet, req, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return N.random_inputs(nnet, req, rng, dtype), N.random_output_derivs(nnet, req, rng, dtype)


def test_float32_by_default(tdnn):
    nnet, req, c = tdnn
    x, d = _data(nnet, req, dtype=np.float64)  # float64 data is converted
    res = pynnet3.run(nnet, c, x, d)
    assert res.outputs["output"].dtype == np.float32
    assert res.outputs["output"].shape == (12, 4)
    assert res.input_derivs["input"].dtype == np.float32
    assert res.input_derivs["input"].shape == (24, 3)
    for g in res.gradients.values():
        for v in g.values():
            assert v.dtype == np.float32


def test_float64_on_request(tdnn):
    nnet, req, c = tdnn
    x, d = _data(nnet, req, dtype=np.float64)
    r64 = pynnet3.run(nnet, c, x, d, dtype=np.float64)
    r32 = pynnet3.run(nnet, c, x, d)
    assert r64.outputs["output"].dtype == np.float64
    assert r64.input_derivs["input"].dtype == np.float64
    assert set(r64.gradients) == {"affine1", "affine2"}
    assert r64.gradients["affine1"]["linear_params"].dtype == np.float64
    np.testing.assert_allclose(r32.outputs["output"], r64.outputs["output"], rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(r32.input_derivs["input"], r64.input_derivs["input"],
                               rtol=1e-3, atol=1e-5)
    # float64 differs from float32 beyond float32 rounding somewhere (it really is float64).
    assert not np.array_equal(r32.outputs["output"].astype(np.float64), r64.outputs["output"])


def test_missing_input_names_the_node(ivector):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    del x["ivector"]
    with pytest.raises(RuntimeInputError, match="ivector"):
        pynnet3.run(nnet, c, x, d)


def test_extra_input_names_the_node(ivector):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    x["speaker"] = np.zeros((1, 2), np.float32)
    with pytest.raises(RuntimeInputError, match="speaker"):
        pynnet3.run(nnet, c, x, d)


def test_extra_output_derivative_names_the_node(ivector):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    d["tanh1"] = np.zeros((6, 4), np.float32)
    with pytest.raises(RuntimeInputError, match="tanh1"):
        pynnet3.run(nnet, c, x, d)


@pytest.mark.parametrize("shape", [(6, 3), (7, 2), (3,), (1, 7, 3), (7, 3, 1)])
def test_wrong_shape_names_the_node(ivector, shape):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    x["input"] = np.zeros(shape, np.float32)
    with pytest.raises(RuntimeInputError, match=r"input.*\(7, 3\)"):
        pynnet3.run(nnet, c, x, d)


def test_wrong_shape_output_derivative(ivector):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    d["output"] = d["output"][:-1]
    with pytest.raises(RuntimeInputError, match="output"):
        pynnet3.run(nnet, c, x, d)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_names_node_and_position(ivector, bad):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    x["ivector"][0, 1] = bad
    with pytest.raises(RuntimeInputError, match=r"ivector.*row 0, column 1"):
        pynnet3.run(nnet, c, x, d)


def test_non_finite_output_derivative(ivector):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    d["output"][3, 2] = np.nan
    with pytest.raises(RuntimeInputError, match=r"output.*row 3, column 2"):
        pynnet3.run(nnet, c, x, d)


def test_non_numeric_input(ivector):
    nnet, req, c = ivector
    x, d = _data(nnet, req)
    x["input"] = np.full((7, 2), "a")
    with pytest.raises(RuntimeInputError, match="input"):
        pynnet3.run(nnet, c, x, d)


def test_missing_output_derivative_names_the_node(ivector):
    nnet, req, c = ivector
    x, _ = _data(nnet, req)
    with pytest.raises(RuntimeInputError, match="derivative.*'output'"):
        pynnet3.run(nnet, c, x, {})
    with pytest.raises(RuntimeInputError, match="'output'"):
        pynnet3.run(nnet, c, x)


def test_errors_are_raised_before_anything_runs():
    """A missing output derivative is found before the forward pass stores stats."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)}, False, True, True)
    req.store_component_stats = True
    c = pynnet3.compile(nnet, req, optimize=False)
    tanh = nnet.components["tanh1"]
    before = {k: np.copy(v) for k, v in vars(tanh).items() if isinstance(v, np.ndarray)}
    before_count = getattr(tanh, "count", None)
    x, _ = _data(nnet, req)
    with pytest.raises(RuntimeInputError):
        pynnet3.run(nnet, c, x, {})
    after = {k: v for k, v in vars(tanh).items() if isinstance(v, np.ndarray)}
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    assert getattr(tanh, "count", None) == before_count


def test_runtime_errors_are_pynnet_errors(ivector):
    nnet, req, c = ivector
    with pytest.raises(PynnetError):
        pynnet3.run(nnet, c, {})


def test_outputs_are_copies(tdnn):
    nnet, req, c = tdnn
    x, d = _data(nnet, req)
    x_keep = {k: v.copy() for k, v in x.items()}
    d_keep = {k: v.copy() for k, v in d.items()}
    r1 = pynnet3.run(nnet, c, x, d)
    # The inputs were not modified.
    for k in x:
        np.testing.assert_array_equal(x[k], x_keep[k])
    for k in d:
        np.testing.assert_array_equal(d[k], d_keep[k])
    want_out = r1.outputs["output"].copy()
    want_deriv = r1.input_derivs["input"].copy()
    want_grad = r1.gradients["affine1"]["linear_params"].copy()
    r1.outputs["output"][...] = 1e6
    r1.input_derivs["input"][...] = 1e6
    r1.gradients["affine1"]["linear_params"][...] = 1e6
    x["input"][...] = 0  # mutating the caller's arrays after the run changes nothing either
    r2 = pynnet3.run(nnet, c, x_keep, d)
    np.testing.assert_array_equal(r2.outputs["output"], want_out)
    np.testing.assert_array_equal(r2.input_derivs["input"], want_deriv)
    np.testing.assert_array_equal(r2.gradients["affine1"]["linear_params"], want_grad)
    # Parameters are untouched by a run.
    assert not np.shares_memory(r2.gradients["affine1"]["linear_params"],
                                nnet.components["affine1"].linear_params)


@pytest.mark.parametrize("name", ["rnn", "stats", "failover"])
def test_running_twice_is_identical(name):
    from tests.compiler.test_commands import CASES

    cfg, inputs, outputs = CASES[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = N.request(inputs, outputs, True, True, True)
    c = pynnet3.compile(nnet, req, optimize=False)
    x, d = _data(nnet, req)
    r1 = pynnet3.run(nnet, c, x, d)
    r2 = pynnet3.run(nnet, c, x, d)
    for k in r1.outputs:
        np.testing.assert_array_equal(r1.outputs[k], r2.outputs[k])
    for k in r1.input_derivs:
        np.testing.assert_array_equal(r1.input_derivs[k], r2.input_derivs[k])
    assert r1.gradients.keys() == r2.gradients.keys()
    for k in r1.gradients:
        for p in r1.gradients[k]:
            np.testing.assert_array_equal(r1.gradients[k][p], r2.gradients[k][p])


def test_request_row_order_is_respected():
    """Permuting the request's rows permutes the outputs / derivatives the same way."""
    rng = np.random.default_rng(9)
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=2)
    inp, out = N.frames(-3, 9, n=2), N.frames(0, 6, n=2)
    req = N.request({"input": inp}, {"output": out}, True, True, True)
    x = {"input": rng.standard_normal((len(inp), 3))}
    d = {"output": rng.standard_normal((len(out), 4))}
    base = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False), x, d,
                       dtype=np.float64)
    pi, po = rng.permutation(len(inp)), rng.permutation(len(out))
    req2 = N.request({"input": inp[pi]}, {"output": out[po]}, True, True, True)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req2, optimize=False),
                      {"input": x["input"][pi]}, {"output": d["output"][po]},
                      dtype=np.float64)
    np.testing.assert_allclose(res.outputs["output"], base.outputs["output"][po], atol=1e-12)
    np.testing.assert_allclose(res.input_derivs["input"], base.input_derivs["input"][pi],
                               atol=1e-12)
    for k in base.gradients:
        for p in base.gradients[k]:
            np.testing.assert_allclose(res.gradients[k][p], base.gradients[k][p], atol=1e-12)


def test_sequences_are_independent():
    """A minibatch of two sequences gives the same outputs as each one alone."""
    rng = np.random.default_rng(10)
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=2)
    T = 6
    both = N.request({"input": N.frames(0, T, n=2)}, {"output": N.frames(0, T, n=2)})
    x = rng.standard_normal((2 * T, 3))
    r = pynnet3.run(nnet, pynnet3.compile(nnet, both, optimize=False), {"input": x},
                    dtype=np.float64)
    one = N.request({"input": N.frames(0, T)}, {"output": N.frames(0, T)})
    c1 = pynnet3.compile(nnet, one, optimize=False)
    for n in (0, 1):
        r1 = pynnet3.run(nnet, c1, {"input": x[n * T:(n + 1) * T]}, dtype=np.float64)
        np.testing.assert_allclose(r.outputs["output"][n * T:(n + 1) * T],
                                   r1.outputs["output"], atol=1e-12)


def test_unused_input_rows_get_zero_derivative():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=2)
    inp = N.frames(-10, 20)
    req = N.request({"input": inp}, {"output": N.frames(0, 6)}, True, True, False)
    x, d = _data(nnet, req)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False), x, d)
    g = res.input_derivs["input"]
    used = (inp[:, 1] >= -N.TDNN_LEFT) & (inp[:, 1] < 6 + N.TDNN_RIGHT)
    assert not g[~used].any()
    assert np.abs(g[used]).sum(axis=1).min() > 0


def test_unknown_backend():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    c = pynnet3.compile(nnet, N.request({"input": N.frames(-3, 4)}, {"output": N.frames(0, 1)}),
                        optimize=False)
    with pytest.raises(PynnetError, match="backend"):
        pynnet3.run(nnet, c, {"input": np.zeros((7, 3))}, backend="no-such-backend")
