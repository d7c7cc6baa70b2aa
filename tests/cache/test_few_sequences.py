"""pynnet3.run(..., network_optimize=True): requests of a few sequences (no
derivatives) compile for the network with split-recurrent-affine on, where that
rule changes the network; the outputs are those of the network as read."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.cache.caching_compiler import (
    FEW_SEQUENCES,
    NetworkOptions,
    cache_for,
    few_sequences_cache,
)
from tests.compiler import nets as N

LSTM = N.FAST_LSTMP.format(x="input", delay=-1)


def _request(n_seqs: int, deriv: bool = False):
    return N.request({"input": N.frames(-2, 10, n=n_seqs)}, {"output": N.frames(0, 10, n=n_seqs)},
                     deriv, deriv)


def _split_cache(nnet):
    return cache_for(nnet, NetworkOptions(enable_rules=("split-recurrent-affine",)))


def _run_both(nnet, req, rng):
    x = N.random_inputs(nnet, req, rng, np.float32)
    d = ({"output": rng.standard_normal((len(req.outputs[0].indexes),
                                         nnet.output_dim("output"))).astype(np.float32)}
         if req.outputs[0].has_deriv else None)
    want = pynnet3.run(nnet, req, x, d)
    got = pynnet3.run(nnet, req, x, d, network_optimize=True)
    scale = float(np.abs(want.outputs["output"]).max())
    np.testing.assert_allclose(got.outputs["output"], want.outputs["output"], rtol=1e-5,
                               atol=1e-6 * scale)


def test_a_few_sequences_of_an_lstm_run_on_the_split_network():
    nnet = pynnet3.Nnet.from_config(LSTM, seed=4)
    rng = np.random.default_rng(0)
    _run_both(nnet, _request(1), rng)
    _run_both(nnet, _request(FEW_SEQUENCES), rng)
    split = _split_cache(nnet)
    assert split.info()["misses"] >= 2  # (both requests compiled there)
    assert len(cache_for(nnet, True)) == 0
    names = {n.name for n in split.compiled_nnet.nodes}
    assert names != {n.name for n in cache_for(nnet, True).compiled_nnet.nodes}


def test_more_sequences_or_derivatives_keep_the_default_options():
    nnet = pynnet3.Nnet.from_config(LSTM, seed=4)
    rng = np.random.default_rng(1)
    _run_both(nnet, _request(FEW_SEQUENCES + 1), rng)
    _run_both(nnet, _request(1, deriv=True), rng)
    assert len(_split_cache(nnet)) == 0
    assert len(cache_for(nnet, True)) > 0
    assert len(cache_for(nnet, True, derivatives=True)) > 0


def test_a_network_the_rule_does_not_change_uses_the_default_cache():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    x = N.random_inputs(nnet, req, np.random.default_rng(2), np.float32)
    want = pynnet3.run(nnet, req, x)
    got = pynnet3.run(nnet, req, x, network_optimize=True)
    np.testing.assert_allclose(got.outputs["output"], want.outputs["output"], rtol=1e-5,
                               atol=1e-6)
    default = cache_for(nnet, True)
    assert few_sequences_cache(nnet, default) is None
    assert len(default) == 1 and len(_split_cache(nnet)) == 0
