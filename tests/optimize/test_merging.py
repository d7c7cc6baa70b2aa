"""Variable merging (optimize/merging.py): semantics, checker, and the effect Kaldi gets.

Every rewritten computation is checked and run next to the unoptimized one on a
backend whose fresh allocations are NaN, so a zeroing that a merge wrongly drops
or moves shows up as a wrong or non-finite result.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler import compile_computation
from pynnet3.computation import Command, NnetComputation
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.addition import convert_addition_to_assignment
from pynnet3.optimize.merging import variable_merging
from pynnet3.testing import case_for_seed
from pynnet3.testing.differential import component_state
from tests.compiler import nets
from tests.optimize.memory_cases import (
    RELU,
    apply,
    assert_same_results,
    reference_case,
    run,
    small_case,
)

CASES = ["realistic/tdnnf_chain/decode", "realistic/tdnn_relu_bn/train",
         "realistic/xvector/train", "generated/case_6", "generated/case_24",
         "generated/case_33"]


def merged(nnet, req, *passes, options=None):
    """(unoptimized, rewritten) computations of ``req``."""
    before = compile_computation(nnet, req)
    after = copy.deepcopy(before)
    apply(after, nnet, *passes, options=options)
    return before, after


@pytest.mark.parametrize("rel", CASES)
def test_reference_cases_keep_results(rel):
    nnet, req, inputs, derivs, _ = reference_case(rel)
    before, after = merged(nnet, req, convert_addition_to_assignment, variable_merging)
    assert after.num_matrices() < before.num_matrices()
    assert_same_results(run(nnet, before, inputs, derivs), run(nnet, after, inputs, derivs),
                        exact=True)


def test_tdnnf_decode_matches_kaldi_matrix_count():
    # Kaldi's optimized tdnnf_chain/decode has 26 matrices and 10 kMatrixCopy
    # (stats.json); merging is what removes matrices there.
    nnet, req, _, _, stats = reference_case("realistic/tdnnf_chain/decode")
    before, after = merged(nnet, req, variable_merging)
    copies = [c for c in after.commands if c.type is CT.MATRIX_COPY]
    assert sum(c.type is CT.MATRIX_COPY for c in before.commands) == 62
    assert after.num_matrices() == stats["optimized"]["num_matrices"] == 26
    assert len(copies) == stats["optimized"]["command_histogram"]["kMatrixCopy"] == 10
    assert after.peak_memory_floats() < before.peak_memory_floats() / 5


@pytest.mark.parametrize("config", [nets.TDNN, nets.RNN, nets.STATS, RELU, "IN_PLACE"])
def test_small_training_nets(config):
    nnet, req, inputs, derivs = small_case(IN_PLACE if config == "IN_PLACE" else config)
    before, after = merged(nnet, req, convert_addition_to_assignment, variable_merging)
    assert len(after.commands) < len(before.commands)
    assert_same_results(run(nnet, before, inputs, derivs), run(nnet, after, inputs, derivs))


@pytest.mark.parametrize("seed", range(8))
def test_random_networks_float64(seed):
    """Random nets (recurrences, stats, stored statistics), float64: results and
    stored component statistics unchanged under every merge switch."""
    case = case_for_seed(seed)
    nnet = case.build_nnet()
    base = compile_computation(nnet, case.request)
    m0 = copy.deepcopy(nnet)
    ref = pynnet3.run(m0, base, case.inputs, case.output_derivs, dtype=np.float64)
    for opts in (OptimizeOptions(), OptimizeOptions(allow_left_merge=False),
                 OptimizeOptions(allow_right_merge=False)):
        c = copy.deepcopy(base)
        apply(c, nnet, convert_addition_to_assignment, variable_merging, options=opts)
        m1 = copy.deepcopy(nnet)
        got = pynnet3.run(m1, c, case.inputs, case.output_derivs, dtype=np.float64)
        for kind in ("outputs", "input_derivs"):
            for k, v in getattr(ref, kind).items():
                np.testing.assert_allclose(getattr(got, kind)[k], v, rtol=1e-12, atol=1e-12)
        for comp, params in ref.gradients.items():
            for p, v in params.items():
                np.testing.assert_allclose(got.gradients[comp][p], v, rtol=1e-10, atol=1e-12)
        s0, s1 = component_state(m0), component_state(m1)
        for k, v in s0.items():
            np.testing.assert_allclose(s1[k], v, rtol=1e-10, atol=1e-12, err_msg=k)


# Normalize and NoOp can propagate and backprop in place (Normalize's backprop adds
# unless in place); the Sum makes an addition and the splice assignments.
IN_PLACE = """
input-node name=input dim=3
component name=affine1 type=AffineComponent input-dim=6 output-dim=5
component-node name=affine1 component=affine1 input=Append(Offset(input, -1), input)
component name=norm1 type=NormalizeComponent dim=5
component-node name=norm1 component=norm1 input=affine1
component name=relu1 type=RectifiedLinearComponent dim=5
component-node name=relu1 component=relu1 input=norm1
component name=noop1 type=NoOpComponent dim=5
component-node name=noop1 component=noop1 input=Sum(Offset(relu1, -1), relu1)
component name=affine2 type=AffineComponent input-dim=5 output-dim=3
component-node name=affine2 component=affine2 input=noop1
output-node name=output input=affine2
"""


_BACKPROPS = (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)


def _in_place(c: NnetComputation, a: int, b: int) -> bool:
    return bool(a and b and c.submatrices[a] == c.submatrices[b])


def test_switches():
    nnet, req, inputs, derivs = small_case(IN_PLACE)
    ref = run(nnet, compile_computation(nnet, req), inputs, derivs)
    results = {}
    for name in ("remove_assignments", "propagate_in_place", "backprop_in_place",
                 "allow_left_merge", "allow_right_merge"):
        before, after = merged(nnet, req, variable_merging,
                               options=OptimizeOptions().without(name))
        assert_same_results(ref, run(nnet, after, inputs, derivs))
        results[name] = after
        if name == "remove_assignments":
            assert sum(x.type is CT.MATRIX_COPY for x in after.commands) == \
                sum(x.type is CT.MATRIX_COPY for x in before.commands)
        if name == "propagate_in_place":
            assert not any(x.type is CT.PROPAGATE and _in_place(after, x.in_value, x.out_value)
                           for x in after.commands)
        if name == "backprop_in_place":
            assert not any(x.type in _BACKPROPS and _in_place(after, x.out_deriv, x.in_deriv)
                           for x in after.commands)
    _, full = merged(nnet, req, variable_merging)
    assert any(x.type is CT.PROPAGATE and _in_place(full, x.in_value, x.out_value)
               for x in full.commands)
    assert any(x.type in _BACKPROPS and _in_place(full, x.out_deriv, x.in_deriv)
               for x in full.commands)
    c = compile_computation(nnet, req)
    off = OptimizeOptions(allow_left_merge=False, allow_right_merge=False)
    assert variable_merging(c, nnet, off) == ""


# -- hand-built computations: the lifetime fix-ups ------------------------------------------

NET = """
input-node name=input dim=2
output-node name=output input=Append(input, input)
"""


def _build(spec):
    """A computation from (op, args...) tuples over matrices named by ints; returns it
    with the whole-submatrix map ``w``."""
    c = NnetComputation()
    w = {}
    for op, *a in spec:
        if op == "new":
            m = c.new_matrix(a[1], a[2])
            w[a[0]] = c.whole(m)
        elif op == "sub":  # name, of, row0, rows, col0, cols
            w[a[0]] = c.new_submatrix(c.submatrices[w[a[1]]].matrix, *a[2:])
        elif op == "input":
            c.add(Command(CT.ACCEPT_INPUT, dst=w[a[0]], node="input"))
        elif op == "output":
            c.add(Command(CT.PROVIDE_OUTPUT, src=w[a[0]], node="output"))
        elif op in ("alloc", "dealloc"):
            c.add(Command(CT.ALLOC_MATRIX if op == "alloc" else CT.DEALLOC_MATRIX,
                          matrix=c.submatrices[w[a[0]]].matrix))
        elif op == "zero":
            c.add(Command(CT.SET_CONST, dst=w[a[0]], alpha=0.0))
        elif op in ("copy", "add"):
            c.add(Command(CT.MATRIX_COPY if op == "copy" else CT.MATRIX_ADD, dst=w[a[0]],
                          src=w[a[1]], alpha=a[2] if len(a) > 2 else 1.0))
        elif op == "marker":
            c.add(Command(CT.NO_OPERATION_MARKER))
    return c


def _check_rewrite(spec, expect_matrices: int):
    nnet = pynnet3.Nnet.from_config(NET)
    inputs = {"input": np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)}
    before = _build(spec)
    after = _build(spec)
    desc = apply(after, nnet, variable_merging)[0]
    assert after.num_matrices() == expect_matrices, (desc, str(after))
    assert_same_results(run(nnet, before, inputs, {}), run(nnet, after, inputs, {}), exact=True)
    return after


def test_right_merge_moves_later_allocation_and_zeroing_up():
    # m2 (built by a copy and an add, so it needs its zeroing) is copied into the
    # right half of m3, which is allocated and zeroed only after m2 is complete.
    after = _check_rewrite([
        ("new", 1, 3, 2), ("new", 2, 3, 2), ("new", 3, 3, 4), ("new", 4, 3, 4),
        ("sub", "r", 3, 0, 3, 2, 2), ("sub", "l", 3, 0, 3, 0, 2),
        ("input", 1), ("alloc", 2), ("zero", 2), ("add", 2, 1, 3.0), ("add", 2, 1, -0.5),
        ("alloc", 3), ("zero", 3), ("copy", "r", 2), ("copy", "l", 1, 2.0),
        ("alloc", 4), ("zero", 4), ("add", 4, 3), ("output", 4),
        ("marker",), ("dealloc", 1), ("dealloc", 2), ("dealloc", 3)], expect_matrices=3)
    types = [x.type for x in after.commands]
    # the kept matrix is allocated and zeroed before the adds that build its right half
    assert types[:5] == [CT.ACCEPT_INPUT, CT.ALLOC_MATRIX, CT.SET_CONST, CT.MATRIX_ADD,
                         CT.MATRIX_ADD]


def test_left_merge_moves_deallocation_down():
    # m3 = m2 makes m3 a new name for m2; m2 is deallocated before m3's last use.
    _check_rewrite([
        ("new", 1, 3, 2), ("new", 2, 3, 2), ("new", 3, 3, 2), ("new", 4, 3, 4),
        ("sub", "l", 4, 0, 3, 0, 2), ("sub", "r", 4, 0, 3, 2, 2),
        ("input", 1), ("alloc", 2), ("zero", 2), ("copy", 2, 1, 2.0),
        ("alloc", 3), ("zero", 3), ("copy", 3, 2), ("dealloc", 2),
        ("alloc", 4), ("zero", 4), ("add", "l", 3), ("add", "r", 1), ("output", 4),
        ("marker",), ("dealloc", 3), ("dealloc", 1)], expect_matrices=3)


def test_no_merge_when_source_is_read_after_destination_changes():
    # m3 = m2; m3 += m1; then m2 is read again: m2 and m3 must stay apart.
    _check_rewrite([
        ("new", 1, 3, 2), ("new", 2, 3, 2), ("new", 3, 3, 2), ("new", 4, 3, 4),
        ("sub", "l", 4, 0, 3, 0, 2), ("sub", "r", 4, 0, 3, 2, 2),
        ("input", 1), ("alloc", 2), ("zero", 2), ("copy", 2, 1, 2.0),
        ("alloc", 3), ("zero", 3), ("copy", 3, 2), ("add", 3, 1),
        ("alloc", 4), ("zero", 4), ("add", "l", 3), ("add", "r", 2), ("output", 4),
        ("marker",), ("dealloc", 1), ("dealloc", 2), ("dealloc", 3)], expect_matrices=4)


def test_no_merge_when_a_zeroing_would_clobber_the_source():
    # The destination region is zeroed again after m2 is written: putting m2
    # there would wipe it, so the copy must stay.
    _check_rewrite([
        ("new", 1, 3, 2), ("new", 2, 3, 2), ("new", 3, 3, 4), ("new", 4, 3, 4),
        ("sub", "r", 3, 0, 3, 2, 2), ("sub", "l", 3, 0, 3, 0, 2),
        ("input", 1), ("alloc", 3), ("zero", 3), ("alloc", 2), ("zero", 2),
        ("add", 2, 1, 3.0), ("zero", "r"), ("copy", "r", 2), ("copy", "l", 1),
        ("alloc", 4), ("zero", 4), ("add", 4, 3), ("output", 4),
        ("marker",), ("dealloc", 1), ("dealloc", 2), ("dealloc", 3)], expect_matrices=4)
