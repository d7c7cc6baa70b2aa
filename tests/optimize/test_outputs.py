"""Handing outputs over (beyond Kaldi): a released output frees its memory, results
are unchanged, the stepping API still reads it, and the checker guards misuse."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import check_computation
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.errors import CheckError
from pynnet3.optimize import OptimizeOptions
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets


def _train():
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=3)
    req = nets.request({"input": nets.frames(-4, 8, n=2)}, {"output": nets.frames(0, 4, n=2)},
                       input_deriv=True, output_deriv=True, model=True)
    return nnet, req


def test_release_lowers_peak_and_keeps_results():
    nnet, req = _train()
    rng = np.random.default_rng(0)
    inputs, derivs = nets.random_inputs(nnet, req, rng), nets.random_output_derivs(nnet, req, rng)
    kept = pynnet3.compile(nnet, req, optimize=OptimizeOptions(free_provided_outputs=False))
    ours = pynnet3.compile(nnet, req, optimize=True, check=True)
    released = [cmd for cmd in ours.commands if cmd.type is CT.PROVIDE_OUTPUT and cmd.release]
    # the output and the input derivative are both handed over
    assert {(cmd.node, cmd.is_deriv) for cmd in released} == {("output", False), ("input", True)}
    out_m = next(ours.submatrices[c.src].matrix for c in released if not c.is_deriv)
    size = ours.matrices[out_m].rows * ours.matrices[out_m].cols
    # the forward output no longer lives through the backward pass
    assert ours.peak_memory_floats() <= kept.peak_memory_floats()
    assert len(ours.commands) == len(kept.commands)
    a = pynnet3.run(nnet, kept, inputs, derivs, dtype=np.float64)
    b = pynnet3.run(nnet, ours, inputs, derivs, dtype=np.float64)
    for k in a.outputs:
        np.testing.assert_array_equal(a.outputs[k], b.outputs[k])
    for k in a.input_derivs:
        np.testing.assert_array_equal(a.input_derivs[k], b.input_derivs[k])
    assert size > 0


def test_peak_accounting_of_a_release():
    nnet, req = _train()
    c = pynnet3.compile(nnet, req, optimize=OptimizeOptions(free_provided_outputs=False))
    i = next(i for i, cmd in enumerate(c.commands)
             if cmd.type is CT.PROVIDE_OUTPUT and not cmd.is_deriv)
    m = c.submatrices[c.commands[i].src].matrix
    before = c.peak_memory_floats()
    # releasing it is the same, for the accounting, as deallocating right after
    c2 = pynnet3.compile(nnet, req, optimize=OptimizeOptions(free_provided_outputs=False))
    c2.commands.insert(i + 1, Command(CT.DEALLOC_MATRIX, matrix=m))
    c.commands[i].release = True
    assert c.peak_memory_floats() == c2.peak_memory_floats() <= before
    check_computation(c, nnet)
    check_computation(c2, nnet)


def test_stepping_reads_a_released_output():
    nnet, req = _train()
    c = pynnet3.compile(nnet, req, optimize=True)
    rng = np.random.default_rng(1)
    inputs, derivs = nets.random_inputs(nnet, req, rng), nets.random_output_derivs(nnet, req, rng)
    whole = pynnet3.run(nnet, c, inputs, derivs, dtype=np.float64)
    comp = NnetComputer(nnet, c, dtype=np.float64)
    comp.accept_input("input", inputs["input"])
    comp.run_until_io()
    np.testing.assert_array_equal(comp.get_output("output"), whole.outputs["output"])
    comp.accept_input("output", derivs["output"], is_deriv=True)
    comp.run_until_io()
    np.testing.assert_array_equal(comp.get_output("input", is_deriv=True),
                                  whole.input_derivs["input"])


def test_checker_guards_releases():
    nnet, req = _train()
    c = pynnet3.compile(nnet, req, optimize=OptimizeOptions(free_provided_outputs=False))
    i = next(i for i, cmd in enumerate(c.commands)
             if cmd.type is CT.PROVIDE_OUTPUT and not cmd.is_deriv)
    cmd = c.commands[i]
    m = c.submatrices[cmd.src].matrix
    cmd.release = True
    c.commands.insert(i + 1, Command(CT.PROVIDE_OUTPUT, src=cmd.src, node=cmd.node))
    with pytest.raises(CheckError, match="after it is deallocated"):
        check_computation(c, nnet)
    del c.commands[i + 1]
    info = c.matrices[m]
    cmd.src = c.new_submatrix(m, 0, info.rows - 1, 0, info.cols)
    with pytest.raises(CheckError, match="only a whole matrix"):
        check_computation(c, nnet)
