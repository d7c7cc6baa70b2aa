"""Computability: which cindexes can be computed from the inputs of a request
(IfDefined / Failover over recurrences, Round, ReplaceIndex, dim-range nodes,
non-simple components) and the errors for requests that cannot be compiled."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler.computable import Computability
from pynnet3.compiler.graph import build_graph
from pynnet3.errors import ComputeError
from tests.compiler import nets as N


def _times(mask: np.ndarray, idx: np.ndarray) -> list[int]:
    return idx[mask, 1].tolist()


def _step_times(graph, node: str) -> list[int]:
    return sorted(t for s in graph.steps if s.node == node for t in s.indexes[:, 1].tolist())


# -- recurrences -------------------------------------------------------------------------

def test_ifdefined_recurrence_computable_exactly_where_input_exists():
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=1)
    comp = Computability(nnet, {"input": N.frames(0, 10)})
    probe = N.frames(-20, 30)
    for node in ("affine1", "tanh1", "rec", "out"):
        assert _times(comp.computable(node, probe), probe) == list(range(10)), node
    # affine2 reads IfDefined(Offset(out, 2)): never blocks.
    assert _times(comp.computable("output", probe), probe) == list(range(10))


def test_ifdefined_recurrence_long_sequence_terminates_quickly():
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=1)
    ok = Computability(nnet, {"input": N.frames(0, 2000)}).computable("output",
                                                                         N.frames(-5, 2005))
    assert ok.sum() == 2000
    comp = pynnet3.compile(nnet, N.request({"input": N.frames(0, 400)},
                                           {"output": N.frames(0, 400)}), optimize=False)
    assert sum(c.type.value == "kPropagate" for c in comp.commands) == 2 * 400 + 1


def test_ifdefined_recurrence_separate_sequences_start_separately():
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=1)
    inp = np.concatenate([N.frames(0, 5), N.frames(3, 9, n=2)[6:]])  # n=0: 0..4, n=1: 3..8
    comp = Computability(nnet, {"input": inp})
    probe = N.frames(-2, 12, n=2)
    ok = comp.computable("tanh1", probe)
    got = sorted(map(tuple, probe[ok, :2].tolist()))
    want = sorted([(0, t) for t in range(5)] + [(1, t) for t in range(3, 9)])
    assert got == want


def test_ifdefined_recurrence_values():
    """The compiled network computes r(t) = tanh(A [x(t); r(t-1)] + b), r(-1) := 0."""
    rng = np.random.default_rng(5)
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=2)
    T = 7
    req = N.request({"input": N.frames(0, T)}, {"output": N.frames(0, T)})
    x = rng.standard_normal((T, 3))
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False), {"input": x},
                      dtype=np.float64)
    a1, a2 = nnet.components["affine1"], nnet.components["affine2"]
    W1, b1 = a1.linear_params.astype(np.float64), a1.bias_params.astype(np.float64)
    W2, b2 = a2.linear_params.astype(np.float64), a2.bias_params.astype(np.float64)
    h = np.zeros((T, 5))
    prev = np.zeros(3)
    for t in range(T):
        h[t] = np.tanh(W1 @ np.concatenate([x[t], prev]) + b1)
        prev = h[t, :3]
    out = h[:, 3:]
    want = np.stack([W2 @ np.concatenate([out[t], out[t + 2] if t + 2 < T else np.zeros(2)])
                     + b2 for t in range(T)])
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-6, atol=1e-6)


def test_required_recurrence_is_not_computable_and_terminates():
    cfg = N.RNN.replace("IfDefined(Offset(rec, -1))", "Offset(rec, -1)")
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    probe = N.frames(-5, 60)
    assert not Computability(nnet, {"input": N.frames(0, 50)}).computable("tanh1", probe).any()
    with pytest.raises(ComputeError, match="output"):
        pynnet3.compile(nnet, N.request({"input": N.frames(0, 50)},
                                        {"output": N.frames(0, 50)}), optimize=False)


def test_failover_to_constant_node_recurrence():
    rng = np.random.default_rng(6)
    nnet = pynnet3.Nnet.from_config(N.FAILOVER, seed=4)
    # Two sequences starting at different times.
    inp = np.concatenate([N.frames(0, 4), N.frames(2, 7, n=2)[5:]])
    comp = Computability(nnet, {"input": inp})
    probe = N.frames(-3, 10, n=2)
    ok = comp.computable("output", probe)
    assert sorted(map(tuple, probe[ok, :2].tolist())) == sorted(
        [(0, t) for t in range(4)] + [(1, t) for t in range(2, 7)])
    # The constant node needs nothing: computable everywhere, even with no inputs.
    assert Computability(nnet, {}).computable("const", probe).all()

    req = N.request({"input": inp}, {"output": inp})
    x = rng.standard_normal((len(inp), 3))
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False), {"input": x},
                      dtype=np.float64)
    a = nnet.components["affine1"]
    W, b = a.linear_params.astype(np.float64), a.bias_params.astype(np.float64)
    const = nnet.components["const"].output.astype(np.float64)
    want = np.zeros((len(inp), 3))
    for n in (0, 1):
        prev = const
        for row in np.flatnonzero(inp[:, 0] == n):  # rows are in time order per n
            want[row] = 1.0 / (1.0 + np.exp(-(W @ np.concatenate([x[row], prev]) + b)))
            prev = want[row]
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-6, atol=1e-6)


# -- Round, ReplaceIndex, dim-range ------------------------------------------------------------

def test_round_uses_floor_division():
    nnet = pynnet3.Nnet.from_config(N.ROUND, seed=1)
    ivec = np.array([[0, -3, 0], [0, 0, 0], [0, 6, 0]])  # no ivector at t=3
    comp = Computability(nnet, {"input": N.frames(-4, 9), "ivector": ivec})
    probe = N.frames(-6, 12)
    want = [-3, -2, -1, 0, 1, 2, 6, 7, 8]
    assert _times(comp.computable("output", probe), probe) == want


def test_round_values():
    rng = np.random.default_rng(7)
    nnet = pynnet3.Nnet.from_config(N.ROUND, seed=3)
    ivec = np.array([[0, 0, 0], [0, 3, 0], [0, 6, 0]])
    req = N.request({"input": N.frames(0, 8), "ivector": ivec}, {"output": N.frames(0, 8)})
    x, iv = rng.standard_normal((8, 2)), rng.standard_normal((3, 2))
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False),
                      {"input": x, "ivector": iv}, dtype=np.float64)
    a = nnet.components["affine1"]
    W, b = a.linear_params.astype(np.float64), a.bias_params.astype(np.float64)
    want = np.stack([np.tanh(W @ np.concatenate([x[t], iv[t // 3]]) + b) for t in range(8)])
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-6, atol=1e-6)


def test_replace_index_broadcasts_ivector_at_t0():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    probe = N.frames(-3, 10, n=2)
    comp = Computability(nnet, {"input": N.frames(-1, 8, n=2), "ivector": [[0, 0, 0],
                                                                             [1, 0, 0]]})
    ok = comp.computable("output", probe)
    assert sorted(map(tuple, probe[ok, :2].tolist())) == sorted(
        (n, t) for n in (0, 1) for t in range(0, 8))
    # No ivector for n=1 (and one at t=5 for n=0, which is not t=0): only n=0.
    comp = Computability(nnet, {"input": N.frames(-1, 8, n=2), "ivector": [[0, 0, 0],
                                                                             [1, 5, 0]]})
    ok = comp.computable("output", probe)
    assert set(probe[ok, 0].tolist()) == {0}


def test_replace_index_graph_reads_only_t0():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    ivec = np.array([[0, 0, 0], [0, 1, 0], [0, 2, 0]])
    _, g = build_graph(nnet, N.request({"input": N.frames(-1, 5), "ivector": ivec},
                                       {"output": N.frames(0, 5)}))
    iv_step = [s for s in g.steps if s.node == "ivector"]
    assert len(iv_step) == 1 and iv_step[0].kind == "input"
    np.testing.assert_array_equal(iv_step[0].indexes, ivec)  # request order kept


def test_dim_range_follows_its_source():
    nnet = pynnet3.Nnet.from_config(N.RNN, seed=1)
    comp = Computability(nnet, {"input": N.frames(2, 6)})
    probe = N.frames(0, 8)
    np.testing.assert_array_equal(comp.computable("rec", probe),
                                  comp.computable("tanh1", probe))
    np.testing.assert_array_equal(comp.computable("out", probe),
                                  comp.computable("tanh1", probe))


# -- non-simple components ----------------------------------------------------------------

def _stats_expected(t_out: int, inputs: set[int]) -> bool:
    """pool(t) reads extract at t-4..t+4 step 2; extract(s) (s even) any of tanh1 s, s+1."""
    pool_t = (t_out // 2) * 2  # Round(pool, 2)
    for s in range(pool_t - 4, pool_t + 5, 2):
        if s in inputs or s + 1 in inputs:
            return True
    return False


@pytest.mark.parametrize("have", [range(0, 12), range(5, 6), [0, 1, 10, 11], range(-3, 2)])
def test_statistics_any_suffices(have):
    nnet = pynnet3.Nnet.from_config(N.STATS, seed=1)
    have = list(have)
    comp = Computability(nnet, {"input": np.array([[0, t, 0] for t in have])})
    probe = N.frames(-12, 24)
    got = comp.computable("output", probe)
    want = np.array([_stats_expected(t, set(have)) for t in range(-12, 24)])
    np.testing.assert_array_equal(got, want)


def test_statistics_graph_uses_only_available_inputs():
    nnet = pynnet3.Nnet.from_config(N.STATS, seed=1)
    _, g = build_graph(nnet, N.request({"input": N.frames(0, 12)},
                                       {"output": np.array([[0, 12, 0]])}))
    assert _step_times(g, "pool") == [12]
    assert _step_times(g, "extract") == [8, 10]
    assert _step_times(g, "tanh1") == [8, 9, 10, 11]


# -- errors -----------------------------------------------------------------------------

def test_uncomputable_output_error_names_output_indexes_and_missing_input():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(0, 12)}, {"output": N.frames(0, 8)})
    with pytest.raises(ComputeError) as e:
        pynnet3.compile(nnet, req, optimize=False)
    msg = str(e.value)
    assert "'output'" in msg
    assert "t=0" in msg and "t=1" in msg and "t=2" in msg  # the uncomputable frames
    assert "t=3," not in msg.split("missing")[0]  # t=3 is computable
    assert "missing" in msg and "input[" in msg and "t=-3" in msg


def test_uncomputable_ivector_names_ivector():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    req = N.request({"input": N.frames(-1, 5), "ivector": [[0, 3, 0]]},
                    {"output": N.frames(0, 5)})
    with pytest.raises(ComputeError, match=r"ivector\["):
        pynnet3.compile(nnet, req, optimize=False)


def test_missing_input_node_in_request():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    req = N.request({"input": N.frames(-1, 5)}, {"output": N.frames(0, 5)})
    with pytest.raises(ComputeError, match="ivector"):
        pynnet3.compile(nnet, req, optimize=False)


@pytest.mark.parametrize("inputs,outputs,bad", [
    ({"inptu": N.frames(0, 5)}, {"output": N.frames(0, 1)}, "inptu"),
    ({"input": N.frames(0, 5)}, {"outptu": N.frames(0, 1)}, "outptu"),
    ({"affine1": N.frames(0, 5)}, {"output": N.frames(0, 1)}, "affine1"),
    ({"input": N.frames(0, 5)}, {"tanh1": N.frames(0, 1)}, "tanh1"),
])
def test_unknown_names_in_request(inputs, outputs, bad):
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    with pytest.raises(ComputeError, match=bad):
        pynnet3.compile(nnet, N.request(inputs, outputs), optimize=False)


def test_statistics_uncomputable_output_is_a_compute_error():
    nnet = pynnet3.Nnet.from_config(N.STATS, seed=1)
    req = N.request({"input": N.frames(0, 12)}, {"output": np.array([[0, 0, 0], [0, 30, 0]])})
    with pytest.raises(ComputeError, match=r"'output'.*t=30"):
        pynnet3.compile(nnet, req, optimize=False)
