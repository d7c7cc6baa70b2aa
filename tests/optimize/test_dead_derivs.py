"""remove_dead_input_derivatives (beyond Kaldi): unread input-derivative matrices
go, results stay those of the unoptimized computation."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.analysis import check_computation
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.dead_derivs import remove_dead_input_derivatives
from pynnet3.optimize.renumber import renumber
from tests.compiler import nets

OFF = OptimizeOptions(remove_dead_input_derivatives=False)


def _rnn(input_deriv: bool, model: bool = True):
    nnet = pynnet3.Nnet.from_config(nets.RNN, seed=2)
    nets.to_float64(nnet)
    req = nets.request({"input": nets.frames(0, 6)}, {"output": nets.frames(0, 4)},
                       input_deriv=input_deriv, output_deriv=True, model=model)
    return nnet, req


def _same(a, b):
    for k, v in a.outputs.items():
        np.testing.assert_allclose(b.outputs[k], v, rtol=1e-12, atol=1e-14)
    assert set(a.input_derivs) == set(b.input_derivs)
    for k, v in a.input_derivs.items():
        np.testing.assert_allclose(b.input_derivs[k], v, rtol=1e-12, atol=1e-14)
    for comp, params in a.gradients.items():
        for p, v in params.items():
            np.testing.assert_allclose(b.gradients[comp][p], v, rtol=1e-10, atol=1e-14)


def test_first_recurrent_step_loses_its_unread_input_derivative():
    nnet, req = _rnn(input_deriv=False)
    c = pynnet3.compile(nnet, req, optimize=False)
    before = [cmd.in_deriv for cmd in c.commands
              if cmd.type is CT.BACKPROP and cmd.node == "affine1"]
    assert all(before)  # the compiler computes every step's input derivative
    msg = remove_dead_input_derivatives(c, nnet)
    assert msg.startswith("dropped 1 ")
    renumber(c)
    check_computation(c, nnet)
    after = [cmd.in_deriv for cmd in c.commands
             if cmd.type is CT.BACKPROP and cmd.node == "affine1"]
    assert len(after) == len(before) and sum(d == 0 for d in after) == 1
    plain = pynnet3.compile(nnet, req, optimize=False)
    rng = np.random.default_rng(0)
    inputs, derivs = nets.random_inputs(nnet, req, rng), nets.random_output_derivs(nnet, req, rng)
    _same(pynnet3.run(nnet, plain, inputs, derivs, dtype=np.float64),
          pynnet3.run(nnet, c, inputs, derivs, dtype=np.float64))


def test_read_derivatives_stay():
    # with the input derivative requested, every step's derivative reaches `input`
    nnet, req = _rnn(input_deriv=True)
    c = pynnet3.compile(nnet, req, optimize=False)
    assert remove_dead_input_derivatives(c, nnet) == ""


def test_without_model_update_the_backprop_goes():
    # the training computation with its updates switched off: a derivative-only
    # backprop whose input derivative nobody reads has nothing left to do
    nnet, req = _rnn(input_deriv=False)
    base = pynnet3.compile(nnet, req, optimize=False)
    for cmd in base.commands:
        if cmd.type is CT.BACKPROP:
            cmd.type = CT.BACKPROP_NO_MODEL_UPDATE
    c = base.copy()
    assert "1 backprops with nothing left to do" in remove_dead_input_derivatives(c, nnet)
    renumber(c)
    check_computation(c, nnet)
    count = sum(cmd.type is CT.BACKPROP_NO_MODEL_UPDATE for cmd in c.commands)
    assert count == sum(cmd.type is CT.BACKPROP_NO_MODEL_UPDATE for cmd in base.commands) - 1
    rng = np.random.default_rng(1)
    inputs, derivs = nets.random_inputs(nnet, req, rng), nets.random_output_derivs(nnet, req, rng)
    _same(pynnet3.run(nnet, base, inputs, derivs, dtype=np.float64),
          pynnet3.run(nnet, c, inputs, derivs, dtype=np.float64))


def test_pipeline_option():
    nnet, req = _rnn(input_deriv=False)
    on = pynnet3.compile(nnet, req, optimize=True, check=True)
    off = pynnet3.compile(nnet, req, optimize=OFF, check=True)
    assert len(on.commands) < len(off.commands)
    rng = np.random.default_rng(2)
    inputs, derivs = nets.random_inputs(nnet, req, rng), nets.random_output_derivs(nnet, req, rng)
    _same(pynnet3.run(nnet, off, inputs, derivs, dtype=np.float64),
          pynnet3.run(nnet, on, inputs, derivs, dtype=np.float64))
