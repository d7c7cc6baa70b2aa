"""A whole run holds the caller's input array itself (read-only) where the program
only reads that matrix (runtime/value_uses.read_only_inputs), and copies it where
any command writes, swaps or hands it out: the caller's data never changes."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.runtime.computer import NnetComputer
from pynnet3.runtime.value_uses import read_only_inputs
from tests.compiler import nets as N
from tests.compiler.test_commands import CASES, DERIVS
from tests.runtime.test_program import _assert_same, _both


def _input_matrices(c):
    return {c.submatrices[cmd.dst].matrix for cmd in c.commands
            if cmd.type is CT.ACCEPT_INPUT}


@pytest.mark.parametrize("derivs", DERIVS, ids=["fwd", "input-deriv", "model", "all"])
@pytest.mark.parametrize("name", list(CASES))
def test_inputs_unchanged_and_results_equal(name, derivs):
    cfg, inputs, outputs = CASES[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = N.request(inputs, outputs, *derivs)
    c = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(3)
    x = N.random_inputs(nnet, req, rng, np.float32)
    d = N.random_output_derivs(nnet, req, rng, np.float32)
    kept_x, kept_d = copy.deepcopy(x), copy.deepcopy(d)
    plain, fast = _both(nnet, c, x, d)
    for k in x:
        np.testing.assert_array_equal(x[k], kept_x[k])
    for k in d:
        np.testing.assert_array_equal(d[k], kept_d[k])
    _assert_same(plain, fast, c)


def test_a_read_only_input_is_found_and_a_written_one_is_not():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    inputs = _input_matrices(c)
    assert inputs and read_only_inputs(c) == inputs
    # a command writing the input after its ACCEPT_INPUT: no longer borrowable
    w = c.copy()
    k = next(i for i, cmd in enumerate(w.commands) if cmd.type is CT.ACCEPT_INPUT)
    dst = w.commands[k].dst
    w.commands.insert(k + 1, Command(CT.SET_CONST, dst=dst, alpha=0.5))
    assert read_only_inputs(w) == frozenset()
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    kept = {k: v.copy() for k, v in x.items()}
    NnetComputer(nnet, w, cache_program=True).run(x)
    for name in x:
        np.testing.assert_array_equal(x[name], kept[name])
    # a swap or an output handed out of that matrix disqualifies it too
    for cmd in (Command(CT.SWAP_MATRIX, matrix=c.submatrices[dst].matrix, src_matrix=1),
                Command(CT.PROVIDE_OUTPUT, src=dst, node="input")):
        v = c.copy()
        v.commands.insert(k + 1, cmd)
        assert c.submatrices[dst].matrix not in read_only_inputs(v)


def test_a_borrowed_input_is_a_read_only_view():
    """Inside the run, the input matrix is the caller's memory, not writable (a
    write a pass failed to declare would raise, not change the caller's array)."""
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    c = pynnet3.compile(nnet, req)
    x = N.random_inputs(nnet, req, np.random.default_rng(0), np.float32)
    seen = []
    k = next(i for i, cmd in enumerate(c.commands) if cmd.type is CT.ACCEPT_INPUT)
    m = c.submatrices[c.commands[k].dst].matrix

    def first_run(c, x):
        """(the input matrix as the run held it); a computation's first run (its
        second may run through kept buffers: runtime/arena.py)"""
        comp = NnetComputer(nnet, c, cache_program=True)
        original = comp._store_input

        def spy(dst, arr, borrow=False):
            original(dst, arr, borrow)
            seen.append(comp.matrices[m])

        comp._store_input = spy
        comp.run(x)
        return seen.pop()

    held = first_run(c, x)
    assert np.shares_memory(held, x["input"]) and not held.flags.writeable
    # float64 given to a float32 run: converted (a copy), as before
    x64 = {k: v.astype(np.float64) for k, v in x.items()}
    held = first_run(pynnet3.compile(nnet, req), x64)
    assert not np.shares_memory(held, x64["input"])
