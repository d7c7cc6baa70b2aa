"""optimize_memory_compression: level 1 compresses exactly the ReLU outputs that
only ReLU backprop reads again (as many as Kaldi on the realistic networks) and is
bit-identical; level 2 compresses the rest to int16 within its error bound."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import Analyzer
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.compression import optimize_memory_compression
from pynnet3.optimize.sizing import move_sizing_commands, remove_unnecessary_allocation
from pynnet3.optimize.zeroing import remove_unnecessary_zeroing
from pynnet3.runtime.compression import INT16, UINT8
from tests.compiler import nets
from tests.optimize import memory_cases as mc
from tests.reference import needs_reference

BEFORE = (remove_unnecessary_zeroing, move_sizing_commands, remove_unnecessary_allocation)

def _level(n: int) -> OptimizeOptions:
    return OptimizeOptions(memory_compression_level=n)


def _compressed(c) -> list[tuple[int, int, float]]:
    """(matrix, kind, range) of each COMPRESS_MATRIX, with its DECOMPRESS later."""
    out = []
    for i, cmd in enumerate(c.commands):
        if cmd.type is CT.COMPRESS_MATRIX:
            m = c.submatrices[cmd.dst].matrix
            assert cmd.dst == c.whole(m)
            later = [x for x in c.commands[i + 1:] if x.type is CT.DECOMPRESS_MATRIX
                     and x.dst == cmd.dst]
            assert len(later) == 1 and later[0].compress_kind == cmd.compress_kind
            out.append((m, cmd.compress_kind, cmd.alpha))
    return out


def _relu_only_matrices(c, nnet) -> set[int]:
    """Matrices (not outputs) used before the marker whose every later access is
    one ReLU backprop reading its output value: what level 1 may compress."""
    a = Analyzer(c, nnet)
    mid = next(i for i, x in enumerate(c.commands) if x.type is CT.NO_OPERATION_MARKER)
    out = set()
    for m, ma in enumerate(a.matrix_accesses):
        acc = [i for i, _ in ma.accesses]
        late = [i for i in acc if i > mid]
        if ma.is_output or len(late) != 1 or len(late) == len(acc):
            continue
        cmd = c.commands[late[0]]
        if cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE) and \
                nnet.components[nnet.node_map[cmd.node].component].type_name == \
                "RectifiedLinearComponent" and c.submatrices[cmd.out_value].matrix == m:
            out.add(m)
    return out


@pytest.mark.parametrize("prepare", [(), BEFORE], ids=["unoptimized", "sized"])
@pytest.mark.parametrize("model", [True, False])
def test_relu_net_is_bit_identical(prepare, model):
    nnet, req, inputs, derivs = mc.small_case(mc.RELU)
    req.need_model_derivative = model
    c0 = pynnet3.compile(nnet, req, optimize=False)
    c = copy.deepcopy(c0)
    mc.apply(c, nnet, *prepare)
    want = _relu_only_matrices(c, nnet)
    before = mc.peak_memory_bytes(c)
    msg, = mc.apply(c, nnet, optimize_memory_compression)
    got = _compressed(c)
    assert msg and got
    assert {m for m, _, _ in got} == want
    assert all(kind == UINT8 and rng == 0.0 for _, kind, rng in got)
    assert mc.peak_memory_bytes(c) <= before
    mc.assert_same_results(mc.run(nnet, c0, inputs, derivs, backend="numpy"),
                           mc.run(nnet, c, inputs, derivs), exact=True)


@needs_reference
@pytest.mark.parametrize("rel", ["realistic/tdnn_relu_bn/train", "realistic/xvector/train",
                                 "realistic/tdnnf_chain/train"])
def test_realistic_matches_kaldi_count(rel):
    """As many sign-only compressions as Kaldi's optimized computation has (these
    networks feed each ReLU into a BatchNorm, so merging does not change which
    ReLU outputs qualify)."""
    nnet, req, inputs, derivs, stats = mc.reference_case(rel)
    c0 = pynnet3.compile(nnet, req, optimize=False)
    c = copy.deepcopy(c0)
    mc.apply(c, nnet, *BEFORE)
    before = mc.peak_memory_bytes(c)
    mc.apply(c, nnet, optimize_memory_compression)
    got = _compressed(c)
    assert len(got) == mc.kaldi_histogram(stats)["kCompressMatrix"]
    assert all(kind == UINT8 for _, kind, _ in got)
    assert mc.peak_memory_bytes(c) < before
    if rel == "realistic/tdnn_relu_bn/train":  # the fast one: run it too
        mc.assert_same_results(mc.run(nnet, c0, inputs, derivs, backend="numpy"),
                               mc.run(nnet, c, inputs, derivs), exact=True)


def test_level2_int16_within_bound():
    """Level 2 on a tanh network: every matrix used in both passes is int16
    (range 10); results move only by the quantization (tanh values, |x| <= 1,
    step 10 / 32767)."""
    nnet, req, inputs, derivs = mc.small_case(nets.TDNN)
    c0 = pynnet3.compile(nnet, req, optimize=False)
    c = copy.deepcopy(c0)
    mc.apply(c, nnet, *BEFORE)
    assert optimize_memory_compression(copy.deepcopy(c), nnet, _level(1)) == ""
    mc.apply(c, nnet, optimize_memory_compression, options=_level(2))
    got = _compressed(c)
    assert got and all(kind == INT16 and rng == 10.0 for _, kind, rng in got)
    ref, res = (mc.run(nnet, c0, inputs, derivs, backend="numpy"),
                mc.run(nnet, c, inputs, derivs))
    diffs = []
    for k in ref.input_derivs:
        np.testing.assert_allclose(res.input_derivs[k], ref.input_derivs[k], rtol=0,
                                   atol=1e-2 * np.abs(ref.input_derivs[k]).max())
        diffs.append(np.abs(res.input_derivs[k] - ref.input_derivs[k]).max())
    for comp, params in ref.gradients.items():
        for p, g in params.items():
            err = np.linalg.norm(res.gradients[comp][p] - g) / np.linalg.norm(g)
            assert err < 1e-2, (comp, p, err)
    assert max(diffs) > 0  # it really is lossy: the test would notice a no-op
    for k in ref.outputs:  # the forward pass is untouched
        assert np.array_equal(ref.outputs[k], res.outputs[k])


@pytest.mark.parametrize("options", [_level(1), _level(0)])
def test_nothing_to_do(options):
    """No backward pass, or level 0: unchanged."""
    nnet, req, _, _ = mc.small_case(mc.RELU, train=options.memory_compression_level == 0)
    c = pynnet3.compile(nnet, req, optimize=False)
    n = len(c.commands)
    assert optimize_memory_compression(c, nnet, options) == ""
    assert len(c.commands) == n


def _relu1_matrix(c) -> int:
    return next(c.submatrices[x.out_value].matrix for x in c.commands
                if x.type is CT.PROPAGATE and x.node == "relu1")


def test_outputs_never_compressed():
    """A ReLU output that is also handed to the user stays exact: make relu1's
    matrix itself the matrix of a network output (as variable merging would) and
    check it is left alone, though it otherwise qualifies."""
    config = mc.RELU + "output-node name=hidden input=relu1\n"
    nnet, req, inputs, derivs = mc.small_case(config)
    c = pynnet3.compile(nnet, req, optimize=False)
    mr = _relu1_matrix(c)
    req.outputs.append(pynnet3.IoSpecification("hidden", c.matrices[mr].indexes, False))
    c = pynnet3.compile(nnet, req, optimize=False)
    mr = _relu1_matrix(c)
    provide = next(x for x in c.commands if x.type is CT.PROVIDE_OUTPUT and x.node == "hidden")
    mh = c.submatrices[provide.src].matrix
    for i, x in enumerate(c.commands):  # drop the hidden matrix and relu1's deallocation
        if (x.type is CT.DEALLOC_MATRIX and x.matrix == mr) or x.matrix == mh or (
                x.dst and c.submatrices[x.dst].matrix == mh):
            c.commands[i] = Command(CT.NO_OPERATION)
    provide.src = c.whole(mr)
    mc.apply(c, nnet, *BEFORE)
    mr = _relu1_matrix(c)
    a = Analyzer(c, nnet)
    mid = next(i for i, x in enumerate(c.commands) if x.type is CT.NO_OPERATION_MARKER)
    late = [c.commands[i] for i, _ in a.matrix_accesses[mr].accesses if i > mid]
    assert a.matrix_accesses[mr].is_output
    assert len(late) == 1 and late[0].node == "relu1"  # would qualify otherwise
    mc.apply(c, nnet, optimize_memory_compression, options=_level(2))
    assert mr not in {m for m, _, _ in _compressed(c)}
    assert _compressed(c)  # the others still are
    res = mc.run(nnet, c, inputs, derivs)
    assert (res.outputs["hidden"] > 0).any() and (res.outputs["hidden"] < 1).any()


@needs_reference
def test_default_pipeline():
    """Through ``pynnet3.compile(optimize=True)`` (level 1 by default): Kaldi's
    count of compressions, and the same results as the unoptimized computation."""
    rel = "realistic/tdnn_relu_bn/train"
    nnet, req, inputs, derivs, stats = mc.reference_case(rel)
    c = pynnet3.compile(nnet, req, optimize=True, check=True)
    assert len(_compressed(c)) == mc.kaldi_histogram(stats)["kCompressMatrix"]
    c0 = pynnet3.compile(nnet, req, optimize=False)
    mc.assert_same_results(mc.run(nnet, c0, inputs, derivs, backend="numpy"),
                           mc.run(nnet, c, inputs, derivs))


@pytest.mark.parametrize("seed", [692])
def test_partly_written_matrix_is_not_compressed(seed):
    """Compression reads the whole matrix: one with a part that the forward pass
    has not written (random networks whose component inputs are filled partly
    only) is left alone, and the pipeline's result passes the checker at level 2."""
    from pynnet3.analysis.checker import check_computation
    from pynnet3.testing import case_for_seed

    case = case_for_seed(seed)
    nnet, rq = case.build_nnet(), case.request
    specs = rq.inputs + rq.outputs
    n_keep = min(set.intersection(*[set(s.indexes[:, 0].tolist()) for s in specs]))
    made = []
    for s in specs:
        one = s.indexes[s.indexes[:, 0] == n_keep]
        one = one[np.lexsort((one[:, 2], one[:, 1]))]
        made.append(pynnet3.IoSpecification(
            s.name, np.concatenate([one + [n - n_keep, 0, 0] for n in range(3)]), True))
    k = len(rq.inputs)
    req = pynnet3.ComputationRequest(made[:k], made[k:], True, False)
    c = pynnet3.compile(nnet, req, optimize=_level(2), check=True)
    check_computation(c, nnet)
    assert _compressed(c)  # the other matrices still are
