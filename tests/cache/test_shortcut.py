"""Shortcut compilation: a computation compiled for two sequences and expanded to N
must equal (in results, and in size where Kaldi makes them equal) the full
compilation of the N-sequence request, and pass the checker."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import (
    CachingCompiler,
    ExpansionError,
    expand_computation,
    mini_request,
    request_layouts,
    snapshot_precomputed,
)
from pynnet3.compiler import compile_computation
from pynnet3.computation import CommandType as CT
from tests.cache.common import assert_same_results, check, frames, random_data, request, run_on_copy
from tests.compiler import nets

SIZE_KEYS = ("num_commands", "command_types", "num_matrices", "num_submatrices",
             "total_matrix_floats", "peak_memory_floats", "num_component_precomputed_indexes")


def _ivector_rows(n_seqs, order):
    return frames(n_seqs, 0, 1, order)


def _round_ivector(n_seqs, order):
    idx = frames(n_seqs, -3, 10, order)
    return idx[idx[:, 1] % 3 == 0]


# name -> (config, inputs(n_seqs, order), outputs(n_seqs, order))
CASES = {
    "tdnn": (nets.TDNN, lambda n, o: {"input": frames(n, -3, 9, o)},
             lambda n, o: {"output": frames(n, 0, 6, o)}),
    "ivector": (nets.IVECTOR, lambda n, o: {"input": frames(n, -1, 7, o),
                                            "ivector": _ivector_rows(n, o)},
                lambda n, o: {"output": frames(n, 0, 7, o)}),
    "rnn": (nets.RNN, lambda n, o: {"input": frames(n, 0, 7, o)},
            lambda n, o: {"output": frames(n, 0, 7, o)}),
    "failover": (nets.FAILOVER, lambda n, o: {"input": frames(n, 0, 5, o)},
                 lambda n, o: {"output": frames(n, 0, 5, o)}),
    "round": (nets.ROUND, lambda n, o: {"input": frames(n, 0, 7, o),
                                        "ivector": _round_ivector(n, o)},
              lambda n, o: {"output": frames(n, 0, 7, o)}),
    "stats": (nets.STATS, lambda n, o: {"input": frames(n, 0, 12, o)},
              lambda n, o: {"output": frames(n, 0, 12, o)[
                  np.isin(frames(n, 0, 12, o)[:, 1], [0, 6])]}),
}


def _build(name, n_seqs, order, derivs):
    cfg, ins, outs = CASES[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=3)
    nets.to_float64(nnet)
    req = request(ins(n_seqs, order), outs(n_seqs, order), input_deriv=derivs,
                  output_deriv=derivs, model=derivs)
    return nnet, req


@pytest.mark.parametrize("optimize", [False, True], ids=["unopt", "opt"])
@pytest.mark.parametrize("derivs", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("order", ["n", "t"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_shortcut_equals_full_compile(name, order, derivs, optimize):
    nnet, req = _build(name, 5, order, derivs)
    cc = CachingCompiler(nnet, optimize=optimize, check=True)
    sc = cc.compile(req)
    assert cc.info()["shortcut"] == 1 and cc.info()["shortcut_fallbacks"] == 0
    full = pynnet3.compile(nnet, req, optimize=optimize)
    st_sc, st_full = sc.stats(), full.stats()
    assert {k: st_sc[k] for k in SIZE_KEYS} == {k: st_full[k] for k in SIZE_KEYS}
    check(sc, nnet, "expanded")
    # Matrices keep their debug indexes: the same row sets as the full compile.
    for m_sc, m_full in zip(sc.matrices[1:], full.matrices[1:], strict=True):
        assert (m_sc.rows, m_sc.cols, m_sc.node, m_sc.is_deriv) == \
            (m_full.rows, m_full.cols, m_full.node, m_full.is_deriv)
        np.testing.assert_array_equal(m_sc.indexes, m_full.indexes)
    inputs, out_derivs = random_data(nnet, req)
    reference = run_on_copy(nnet, pynnet3.compile(nnet, req, optimize=False), inputs,
                            out_derivs)
    assert_same_results(run_on_copy(nnet, sc, inputs, out_derivs), reference, 1e-9, name)
    assert_same_results(run_on_copy(nnet, full, inputs, out_derivs), reference, 1e-9, name)


def test_mini_computation_is_shared_across_n():
    nnet, req5 = _build("tdnn", 5, "n", True)
    _, req9 = _build("tdnn", 9, "n", True)
    cc = CachingCompiler(nnet)
    a, b = cc.compile(req5), cc.compile(req9)
    info = cc.info()
    # 2 full keys + 1 mini key missed; the second shortcut found the mini computation.
    assert info["misses"] == 3 and info["hits"] == 1 and info["shortcut"] == 2
    assert a.matrices[1].rows * 9 == b.matrices[1].rows * 5
    inputs, derivs = random_data(nnet, req9, seed=1)
    assert_same_results(run_on_copy(nnet, b, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, req9), inputs, derivs))


@pytest.mark.parametrize("kind", ["ragged", "two_sequences", "shuffled", "different_n"])
def test_irregular_requests_compile_in_full(kind):
    nnet, req = _build("tdnn", 4, "n", True)
    if kind == "ragged":  # the last sequence has one output frame less
        req.outputs[0].indexes = req.outputs[0].indexes[:-1]
    elif kind == "two_sequences":
        nnet, req = _build("tdnn", 2, "n", True)
    elif kind == "shuffled":
        rng = np.random.default_rng(0)
        req.inputs[0].indexes = req.inputs[0].indexes[rng.permutation(len(req.inputs[0].indexes))]
    elif kind == "different_n":  # input has 4 sequences, output only 3
        req.outputs[0].indexes = req.outputs[0].indexes[req.outputs[0].indexes[:, 0] < 3]
    cc = CachingCompiler(nnet, check=True)
    comp = cc.compile(req)
    assert cc.info()["shortcut"] == 0
    inputs, derivs = random_data(nnet, req)
    assert_same_results(run_on_copy(nnet, comp, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, req, optimize=False), inputs,
                                    derivs))


def test_expansion_rejects_irregular_structure():
    nnet, req = _build("tdnn", 4, "n", False)
    mini = mini_request(req, request_layouts(req))
    comp = compile_computation(nnet, mini)
    snap = snapshot_precomputed(comp)
    # A submatrix that covers only the first sequence cannot be stretched along n.
    m = comp.submatrices[comp.whole(1)].matrix
    comp.new_submatrix(m, 0, comp.matrices[m].rows // 2, 0, comp.matrices[m].cols)
    comp.commands.insert(-1, pynnet3.computation.Command(
        CT.SET_CONST, dst=len(comp.submatrices) - 1, alpha=0.0))
    with pytest.raises(ExpansionError):
        expand_computation(comp, snap, 4, nnet)
    # A matrix without debug indexes cannot be expanded either.
    comp2 = compile_computation(nnet, mini)
    comp2.matrices[1].indexes = None
    with pytest.raises(ExpansionError):
        expand_computation(comp2, snapshot_precomputed(compile_computation(nnet, mini)), 4, nnet)


def test_shortcut_with_offset_sequence_numbers():
    """n = 3..7: the mini request is renumbered to 0, 1; results are unchanged."""
    cfg, ins, outs = CASES["ivector"]
    nnet = pynnet3.Nnet.from_config(cfg, seed=3)
    nets.to_float64(nnet)
    shifted = {k: v.copy() for k, v in ins(5, "n").items()}
    for v in shifted.values():
        v[:, 0] += 3
    out = outs(5, "n")
    out["output"][:, 0] += 3
    req = request(shifted, out, output_deriv=True, model=True)
    cc = CachingCompiler(nnet, check=True)
    comp = cc.compile(req)
    assert cc.info()["shortcut"] == 1
    inputs, derivs = random_data(nnet, req)
    assert_same_results(run_on_copy(nnet, comp, inputs, derivs),
                        run_on_copy(nnet, pynnet3.compile(nnet, req, optimize=False), inputs,
                                    derivs))
