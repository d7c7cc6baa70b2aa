"""NnetComputer(cache_program=True): the commands prepared once per computation
(runtime/program.py Program) run exactly as the command-by-command path does."""

from __future__ import annotations

import copy
import gc

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import CommandType as CT
from pynnet3.errors import PynnetError, RuntimeInputError
from pynnet3.runtime import program as P
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N
from tests.compiler.test_commands import CASES, DERIVS
from tests.reference import REF, needs_reference


def _both(nnet, c, x, d):
    """(result without the program, result with it), each on its own copy of the
    network (statistics a run stores stay apart)."""
    plain = NnetComputer(copy.deepcopy(nnet), c).run(x, d)
    fast = NnetComputer(copy.deepcopy(nnet), c, cache_program=True).run(x, d)
    return plain, fast


def _assert_same(a, b, c=None):
    """Equal results; where ``c``'s program multiplies a repeated-row block once per
    source row (``P.row_block_plans``, forward only), outputs equal up to float32
    rounding (the product's summation order changes), else bit for bit."""
    rounded = c is not None and bool(P.row_block_plans(c))
    for part in ("outputs", "input_derivs"):
        da, db = getattr(a, part), getattr(b, part)
        assert da.keys() == db.keys()
        for k in da:
            if rounded:
                scale = float(np.abs(da[k]).max(initial=0.0))
                np.testing.assert_allclose(db[k], da[k], rtol=1e-5, atol=1e-6 * scale)
            else:
                np.testing.assert_array_equal(da[k], db[k])
    assert a.gradients.keys() == b.gradients.keys()
    for k in a.gradients:
        for p in a.gradients[k]:
            np.testing.assert_array_equal(a.gradients[k][p], b.gradients[k][p])


@pytest.mark.parametrize("optimize", [False, True], ids=["plain", "optimized"])
@pytest.mark.parametrize("derivs", DERIVS, ids=["fwd", "input-deriv", "model", "all"])
@pytest.mark.parametrize("name", list(CASES))
def test_program_matches_command_by_command(name, derivs, optimize):
    cfg, inputs, outputs = CASES[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = N.request(inputs, outputs, *derivs)
    c = pynnet3.compile(nnet, req, optimize=optimize)
    rng = np.random.default_rng(3)
    x = N.random_inputs(nnet, req, rng, np.float32)
    d = N.random_output_derivs(nnet, req, rng, np.float32)
    plain, fast = _both(nnet, c, x, d)
    _assert_same(plain, fast, c)
    assert fast.outputs  # (something was computed)


@needs_reference
@pytest.mark.parametrize("net", ["tdnnf_chain", "tdnn_relu_bn"])
def test_program_on_a_decoding_chunk(net):
    from pynnet3.graphopt import optimize_network
    from pynnet3.runtime.simple import chunk_request

    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    nnet.set_test_mode(True)
    nnet = optimize_network(nnet)
    left, right = nnet.context()
    iv = nnet.has_node("ivector")
    req = chunk_request(-left, 51 + left + right, 17, 3, iv, 3)
    c = pynnet3.CachingCompiler(nnet).compile(req)
    kinds = {cmd.type for cmd in c.commands}
    assert CT.PROPAGATE in kinds and CT.ALLOC_MATRIX in kinds
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    plain, fast = _both(nnet, c, x, {})
    _assert_same(plain, fast, c)
    again = NnetComputer(nnet, c, cache_program=True).run(x)  # (the kept program)
    np.testing.assert_array_equal(again.outputs["output"], fast.outputs["output"])


def test_one_program_per_computation_while_it_lives():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    a = NnetComputer(nnet, c, cache_program=True)
    b = NnetComputer(nnet, c, cache_program=True)
    assert a._program is b._program
    assert NnetComputer(nnet, c)._program is None  # (not asked for: none kept)
    key = id(c)
    assert key in P._PROGRAMS
    del a, b, c
    gc.collect()
    assert key not in P._PROGRAMS


def test_program_reports_a_matrix_used_before_allocation():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req, optimize=False).copy()
    k = next(i for i, cmd in enumerate(c.commands) if cmd.type is CT.ALLOC_MATRIX)
    del c.commands[k]
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    with pytest.raises(PynnetError, match="not allocated"):
        NnetComputer(nnet, c).run(x)
    with pytest.raises(PynnetError, match="not allocated"):
        NnetComputer(nnet, c, cache_program=True).run(x)


def test_program_refuses_a_looped_computation():
    from pynnet3.runtime.looped import LoopedDecodingInfo, LoopedOptions

    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=6))
    x = {"input": np.zeros((20, nnet.input_dim("input")), np.float32)}
    for cache in (False, True):
        with pytest.raises(RuntimeInputError, match="looped"):
            NnetComputer(nnet, info.computation, cache_program=cache).run(x)


def test_run_with_a_request_keeps_outputs_apart():
    """pynnet3.run(request) uses the kept program; outputs handed over are never
    written by a later run."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    rng = np.random.default_rng(1)
    x1, x2 = N.random_inputs(nnet, req, rng, np.float32), N.random_inputs(nnet, req, rng,
                                                                         np.float32)
    r1 = pynnet3.run(nnet, req, x1)
    kept = r1.outputs["output"].copy()
    r2 = pynnet3.run(nnet, req, x2)
    np.testing.assert_array_equal(r1.outputs["output"], kept)
    assert not np.array_equal(r2.outputs["output"], kept)
    plain = NnetComputer(nnet, pynnet3.compile(nnet, req)).run(x2)
    np.testing.assert_array_equal(r2.outputs["output"], plain.outputs["output"])


def test_stepping_prepares_calls_only_where_they_pay():
    """run_until_io's prepared calls: kept with a shared computation, made by a
    computer of its own only for a looped computation (run again and again), not
    for a one-off computer of a plain one; the same outputs either way."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    outs = []
    for shared in (False, True):
        comp = NnetComputer(nnet, c, cache_program=shared)
        comp.accept_input("input", x["input"])
        comp.run_until_io()
        outs.append(comp.get_output("output"))
        assert (comp._step_ops() is not None) == shared
    np.testing.assert_array_equal(outs[0], outs[1])
    assert P.program_for(c).steps is not None


@pytest.mark.parametrize("shared", [False, True])
def test_stepping_reports_a_matrix_used_before_allocation(shared):
    """run_until_io through prepared calls reports a matrix used where it is not
    allocated as _execute does (a PynnetError naming it, not a bare KeyError)."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req, optimize=False).copy()
    allocs = [i for i, cmd in enumerate(c.commands) if cmd.type is CT.ALLOC_MATRIX]
    del c.commands[allocs[1]]
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    comp = NnetComputer(nnet, c, cache_program=shared)
    comp._steps = P.step_ops(c)  # (prepared calls even where they would not pay)
    comp.accept_input("input", x["input"])
    with pytest.raises(PynnetError, match="not allocated"):
        comp.run_until_io()
