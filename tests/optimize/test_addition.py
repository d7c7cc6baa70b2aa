"""Addition-to-assignment (optimize/addition.py): which additions become copies, and
that results do not change (allocations are NaN, so converting an addition whose
destination held data, or dropping a needed zero, shows)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler import compile_computation
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.addition import convert_addition_to_assignment
from tests.compiler import nets
from tests.optimize.memory_cases import (
    RELU,
    apply,
    assert_same_results,
    reference_case,
    run,
    small_case,
)
from tests.optimize.test_merging import NET, _build


@pytest.mark.parametrize("rel", ["realistic/tdnnf_chain/train", "realistic/xvector/train",
                                 "generated/case_24", "generated/case_23"])
def test_reference_cases_keep_results(rel):
    nnet, req, inputs, derivs, _ = reference_case(rel)
    before = compile_computation(nnet, req)
    after = copy.deepcopy(before)
    desc = apply(after, nnet, convert_addition_to_assignment)[0]
    assert desc.startswith("converted")
    assert_same_results(run(nnet, before, inputs, derivs), run(nnet, after, inputs, derivs),
                        exact=True)


def test_tdnnf_train_keeps_the_additions_kaldi_keeps():
    # Kaldi's optimized tdnnf_chain/train (stats.json) has 18 kMatrixAdd and 6
    # kCopyRows; our compiler emits 68 MATRIX_ADD, 2 ADD_ROWS and 4 COPY_ROWS.
    nnet, req, _, _, stats = reference_case("realistic/tdnnf_chain/train")
    c = compile_computation(nnet, req)
    apply(c, nnet, convert_addition_to_assignment)
    hist = stats["optimized"]["command_histogram"]
    types = [x.type for x in c.commands]
    assert types.count(CT.MATRIX_ADD) == hist["kMatrixAdd"] == 18
    assert types.count(CT.COPY_ROWS) == hist["kCopyRows"] == 6
    assert types.count(CT.ADD_ROWS) == 0


@pytest.mark.parametrize("config", [nets.TDNN, nets.RNN, RELU])
def test_small_training_nets(config):
    nnet, req, inputs, derivs = small_case(config)
    before = compile_computation(nnet, req)
    after = copy.deepcopy(before)
    apply(after, nnet, convert_addition_to_assignment)
    assert_same_results(run(nnet, before, inputs, derivs), run(nnet, after, inputs, derivs),
                        exact=True)


def _convert(spec, tables=()):
    nnet = pynnet3.Nnet.from_config(NET)
    c = _build(spec)
    for t in tables:
        c.indexes.append(np.asarray(t, dtype=np.int64))
    before = copy.deepcopy(c)
    apply(c, nnet, convert_addition_to_assignment)
    inputs = {"input": np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)}
    assert_same_results(run(nnet, before, inputs, {}), run(nnet, c, inputs, {}), exact=True)
    return [x.type for x in c.commands if x.type in (CT.MATRIX_ADD, CT.MATRIX_COPY,
                                                   CT.ADD_ROWS, CT.COPY_ROWS)]


PRE = [("new", 1, 3, 2), ("new", 2, 3, 2), ("new", 3, 3, 4),
       ("sub", "l", 3, 0, 3, 0, 2), ("sub", "r", 3, 0, 3, 2, 2), ("sub", "top", 2, 0, 1, 0, 2),
       ("input", 1), ("alloc", 2), ("zero", 2), ("alloc", 3), ("zero", 3)]
AT = 5  # the first command after PRE's
POST = [("add", "l", 2), ("copy", "r", 1), ("output", 3), ("marker",),
        ("dealloc", 1), ("dealloc", 2)]


def test_first_addition_into_zeros_becomes_a_copy():
    # (POST's add into the zeroed left half of m3 is a first access too)
    assert _convert(PRE + [("add", 2, 1, 2.0), ("add", 2, 1, -1.0)] + POST) == [
        CT.MATRIX_COPY, CT.MATRIX_ADD, CT.MATRIX_COPY, CT.MATRIX_COPY]


def test_addition_after_a_partial_write_stays():
    # the top row of m2 is written first: the later whole-matrix add must add
    assert _convert(PRE + [("copy", "top", "top"), ("add", 2, 1)] + POST)[:2] == [
        CT.MATRIX_COPY, CT.MATRIX_ADD]


def test_add_rows():
    nnet = pynnet3.Nnet.from_config(NET)
    c = _build(PRE + POST)
    c.indexes += [np.array([2, -1, 0]), np.array([1, 1, 1])]
    w2 = next(i for i, s in enumerate(c.submatrices) if s.matrix == 2 and s.num_rows == 3)
    w1 = next(i for i, s in enumerate(c.submatrices) if s.matrix == 1)
    c.commands[AT:AT] = [Command(CT.ADD_ROWS, dst=w2, src=w1, table=0, alpha=0.5),
                         Command(CT.ADD_ROWS, dst=w2, src=w1, table=1)]
    before = copy.deepcopy(c)
    apply(c, nnet, convert_addition_to_assignment)
    assert [x.type for x in c.commands[AT:AT + 2]] == [CT.COPY_ROWS, CT.ADD_ROWS]
    inputs = {"input": np.random.default_rng(2).standard_normal((3, 2)).astype(np.float32)}
    assert_same_results(run(nnet, before, inputs, {}), run(nnet, c, inputs, {}), exact=True)


def test_scatter_with_repeated_targets_stays_an_addition():
    nnet = pynnet3.Nnet.from_config(NET)
    c = _build(PRE + POST)
    w1 = next(i for i, s in enumerate(c.submatrices) if s.matrix == 1)
    w2 = next(i for i, s in enumerate(c.submatrices) if s.matrix == 2 and s.num_rows == 3)
    c.indexes_multi += [np.array([[w2, 0], [w2, 0], [w2, 2]]),
                        np.array([[w2, 0], [w2, 1], [w2, 2]])]
    for k in (0, 1):
        d = copy.deepcopy(c)
        d.commands.insert(AT, Command(CT.ADD_TO_ROWS_MULTI, src=w1, table=k))
        convert_addition_to_assignment(d, nnet, OptimizeOptions())
        assert d.commands[AT].type is (CT.ADD_TO_ROWS_MULTI if k == 0 else CT.COPY_TO_ROWS_MULTI)
