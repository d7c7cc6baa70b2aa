"""Matrix extension (optimize/extend.py): which copies are extended, that results and
the checker are unaffected, and that it lets merging reach Kaldi's matrix counts."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler import compile_computation
from pynnet3.computation import CommandType as CT
from pynnet3.optimize.addition import convert_addition_to_assignment
from pynnet3.optimize.extend import NO_TIME, extend_matrices
from pynnet3.optimize.merging import variable_merging
from tests.optimize.memory_cases import apply, assert_same_results, reference_case, run
from tests.optimize.test_merging import NET, _build


@pytest.mark.parametrize("rel,kaldi_matrices", [("realistic/tdnn_relu_bn/decode", 10),
                                                ("realistic/xvector/decode", 13)])
def test_extension_lets_merging_match_kaldi(rel, kaldi_matrices):
    nnet, req, inputs, derivs, stats = reference_case(rel)
    assert stats["optimized"]["num_matrices"] == kaldi_matrices
    before = compile_computation(nnet, req)
    plain = copy.deepcopy(before)
    apply(plain, nnet, convert_addition_to_assignment, variable_merging)
    after = copy.deepcopy(before)
    desc = apply(after, nnet, convert_addition_to_assignment, extend_matrices,
                 variable_merging)
    assert desc[1].startswith("extended")
    assert plain.num_matrices() > after.num_matrices() == kaldi_matrices
    assert_same_results(run(nnet, before, inputs, derivs), run(nnet, after, inputs, derivs),
                        exact=True)


@pytest.mark.parametrize("rel", ["realistic/tdnn_relu_bn/train", "realistic/tdnnf_chain/decode"])
def test_extension_alone_keeps_results(rel):
    nnet, req, inputs, derivs, _ = reference_case(rel)
    before = compile_computation(nnet, req)
    after = copy.deepcopy(before)
    apply(after, nnet, extend_matrices)
    grown = [m for m in range(1, after.num_matrices() + 1)
             if after.matrices[m].rows > before.matrices[m].rows]
    assert grown
    for m in grown:
        old, new = before.matrices[m], after.matrices[m]
        assert new.rows <= old.rows * 1.25 + 1
        assert np.array_equal(new.indexes[:old.rows], old.indexes)
        assert (new.indexes[old.rows:, 1] == NO_TIME).all()
    assert_same_results(run(nnet, before, inputs, derivs), run(nnet, after, inputs, derivs),
                        exact=True)


def _extend(spec):
    nnet = pynnet3.Nnet.from_config(NET)
    c = _build(spec)
    before = copy.deepcopy(c)
    desc = apply(c, nnet, extend_matrices)[0]
    inputs = {"input": np.random.default_rng(3).standard_normal((5, 2)).astype(np.float32)}
    assert_same_results(run(nnet, before, inputs, {}), run(nnet, c, inputs, {}), exact=True)
    return desc, c


def _spec(src_rows_used: int, zero_src: bool = True, out_is_dst: bool = False):
    """m2 (5x2, from the input) is copied, rows 0:k, into the last k rows of the
    right half of m3 (4x4; rows 4-k:4)."""
    k = src_rows_used
    spec = [("new", 1, 5, 2), ("new", 2, 5, 2), ("new", 3, 4, 4), ("new", 4, 4, 4),
            ("sub", "src", 2, 0, k, 0, 2), ("sub", "dst", 3, 4 - k, k, 2, 2),
            ("sub", "left", 3, 0, 4, 0, 2), ("sub", "in4", 1, 0, 4, 0, 2),
            ("input", 1), ("alloc", 2)]
    spec += [("zero", 2)] if zero_src else []
    spec += [("copy", 2, 1, 2.0) if zero_src else ("copy", "src", "in4"),
             ("alloc", 3), ("zero", 3), ("copy", "dst", "src"), ("copy", "left", "in4", 3.0)]
    if out_is_dst:
        spec += [("output", 3), ("marker",), ("dealloc", 1), ("dealloc", 2)]
    else:
        spec += [("alloc", 4), ("zero", 4), ("add", 4, 3), ("output", 4), ("marker",),
                 ("dealloc", 1), ("dealloc", 2), ("dealloc", 3)]
    return spec


def test_copy_of_most_of_a_source_is_extended():
    desc, c = _extend(_spec(4))
    assert desc == "extended 1 copies to whole source matrices"
    assert c.matrices[3].rows == 5
    copy_cmd = [x for x in c.commands if x.type is CT.MATRIX_COPY][1]
    assert c.submatrices[copy_cmd.src].num_rows == 5  # the whole source


@pytest.mark.parametrize("spec", [_spec(3),  # 3 of 5 rows: below Kaldi's 80%
                                  _spec(4, out_is_dst=True),  # the user gets the destination
                                  _spec(4, zero_src=False)])  # source row 4 never defined
def test_copies_that_must_not_be_extended(spec):
    desc, c = _extend(spec)
    assert desc == ""
    assert c.matrices[3].rows == 4


def test_source_zeroed_later_than_its_allocation_is_extended():
    # another allocation between the source's and its zeroing: the zeroing is still
    # its first access, which the access table (not the shortcut) tells
    spec = _spec(4)
    spec.remove(("alloc", 3))
    spec.insert(spec.index(("zero", 2)), ("alloc", 3))
    desc, c = _extend(spec)
    assert desc == "extended 1 copies to whole source matrices"
    assert c.matrices[3].rows == 5
