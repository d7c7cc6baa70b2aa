"""remove_unnecessary_zeroing: a zeroing goes only where every variable it covers
is fully written before anything reads it, proven by the checker and by runs
whose fresh allocations are NaN."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import AccessType, Analyzer, check_computation
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.errors import CheckError
from pynnet3.optimize.zeroing import remove_unnecessary_zeroing
from tests.compiler import nets
from tests.optimize import memory_cases as mc
from tests.reference import needs_reference

CASES = ["realistic/tdnn_relu_bn/train", "realistic/tdnn_lstm/train",
         "realistic/xvector/decode", "generated/case_3", "generated/case_10",
         "generated/case_23", "generated/case_24"]


def _zeroings(c) -> int:
    return sum(cmd.type is CT.SET_CONST and cmd.alpha == 0.0 for cmd in c.commands)


@needs_reference
@pytest.mark.parametrize("rel", CASES)
def test_reference_case(rel):
    nnet, req, inputs, derivs, _ = mc.reference_case(rel)
    c0 = pynnet3.compile(nnet, req, optimize=False)
    c = copy.deepcopy(c0)
    msg, = mc.apply(c, nnet, remove_unnecessary_zeroing)
    assert msg and _zeroings(c) < _zeroings(c0)
    assert len(c.commands) == len(c0.commands) - (_zeroings(c0) - _zeroings(c))
    mc.assert_same_results(mc.run(nnet, c0, inputs, derivs, backend="numpy"),
                           mc.run(nnet, c, inputs, derivs), exact=True)


@pytest.mark.parametrize("config", [mc.RELU, nets.TDNN, nets.RNN, nets.STATS])
def test_small_nets(config):
    nnet, req, inputs, derivs = mc.small_case(config)
    c0 = pynnet3.compile(nnet, req, optimize=False)
    c = copy.deepcopy(c0)
    mc.apply(c, nnet, remove_unnecessary_zeroing)
    mc.assert_same_results(mc.run(nnet, c0, inputs, derivs, backend="numpy"),
                           mc.run(nnet, c, inputs, derivs), exact=True)


def test_keeps_exactly_the_needed_zeroings():
    """Each zeroing survives iff some variable it covers is next read or added to
    (checked here from the variable accesses of the unoptimized computation)."""
    nnet, req, _, _ = mc.small_case(nets.TDNN)
    c = pynnet3.compile(nnet, req, optimize=False)
    a = Analyzer(c, nnet)
    keep = []
    for i, cmd in enumerate(c.commands):
        if cmd.type is not CT.SET_CONST:
            continue
        needed = False
        for v in a.variables.submatrix_variables(cmd.dst):
            cmds, acc = a.variable_accesses.of(int(v))
            later = acc[cmds > i]
            needed |= len(later) > 0 and later[0] != AccessType.WRITE
        keep.append(needed)
    assert any(keep) and not all(keep)  # the net exercises both outcomes
    remove_unnecessary_zeroing(c, nnet)
    zs = [cmd for cmd in c.commands if cmd.type in (CT.SET_CONST, CT.NO_OPERATION)]
    assert [z.type is CT.SET_CONST for z in zs] == keep


def test_harness_detects_a_wrong_removal():
    """Dropping every zeroing must be caught, by the checker and by the NaN runs
    (so the tests above can fail)."""
    nnet, req, inputs, derivs = mc.small_case(mc.RELU)
    c = pynnet3.compile(nnet, req, optimize=False)
    for i, cmd in enumerate(c.commands):
        if cmd.type is CT.SET_CONST:
            c.commands[i] = Command(CT.NO_OPERATION)
    with pytest.raises(CheckError, match="undefined"):
        check_computation(c, nnet)
    res = mc.run(nnet, c, inputs, derivs)
    assert not all(np.isfinite(v).all() for v in
                   list(res.outputs.values()) + list(res.input_derivs.values()))
