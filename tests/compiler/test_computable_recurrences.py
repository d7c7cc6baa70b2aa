"""Computability of recurrences is evaluated breadth-first (a worklist over the
recurrence, see the module doc of ``pynnet3.compiler.computable``): never one
Python call per time step, whatever the order of the descriptor's sides, the
length of the request, or how far back in time the answer is decided.

Regressions: a Failover whose first side is the recurrence (``Failover(Offset(c,
-1), ...)``) used to walk towards t = -inf depth-first and end in RecursionError
(the context of a network, or any request, even of 10 frames)."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler import computable as computable_mod
from pynnet3.compiler import graph as graph_mod
from pynnet3.compiler.computable import Computability
from pynnet3.errors import ComputeError
from pynnet3.index import pack
from pynnet3.testing import random_nets
from tests.compiler import nets as N

# The fuzzing find: lin(t) = Failover(lin(t-1), c0(t)).
FAILOVER_TO_CONSTANT = """
input-node name=input dim=4
component name=c0 type=ConstantComponent output-dim=4
component-node name=c0 component=c0 input=input
component name=lin type=LinearComponent input-dim=4 output-dim=4
component-node name=lin component=lin input=Failover(Offset(lin, -1), c0)
output-node name=output input=Sum(lin, input)
"""

# lin(t) = Failover(lin(t-1), input(t)): computable from the first input frame on.
FAILOVER_TO_INPUT = """
input-node name=input dim=4
component name=lin type=LinearComponent input-dim=4 output-dim=4
component-node name=lin component=lin input=Failover(Offset(lin, -1), input)
output-node name=output input=lin
"""

# An LSTM-shaped recurrence (the nodes of the realistic tdnn_lstm's fast LSTM):
# gates from the input and r(t-1), the cell from the gates and c(t-1), both read
# through IfDefined, the recurrent parts split off by dim-range nodes.
LSTM = """
input-node name=input dim=4
component name=W_all type=NaturalGradientAffineComponent input-dim=6 output-dim=12
component-node name=W_all component=W_all input=Append(input, IfDefined(Offset(r, -1)))
component name=lstm_nonlin type=LstmNonlinearityComponent cell-dim=3
component-node name=lstm_nonlin component=lstm_nonlin input=Append(W_all, IfDefined(Offset(c, -1)))
dim-range-node name=c input-node=lstm_nonlin dim-offset=0 dim=3
dim-range-node name=m input-node=lstm_nonlin dim-offset=3 dim=3
component name=W_rp type=NaturalGradientAffineComponent input-dim=3 output-dim=2
component-node name=rp component=W_rp input=m
dim-range-node name=r input-node=rp dim-offset=0 dim=2
component name=final type=NaturalGradientAffineComponent input-dim=2 output-dim=3
component-node name=final component=final input=r
output-node name=output input=final
"""

# c(t) = sigmoid(A [F(t); x(t)] + b) with F(t) = c(t-1) where computable, else the
# fallback; the recurrence is the first side of the first part (what recursed).
FAILOVER_FIRST = """
input-node name=input dim=3
component name=const type=ConstantComponent output-dim=3
component-node name=const component=const input=input
component name=affine1 type=AffineComponent input-dim=6 output-dim=3
component-node name=affine1 component=affine1 input=Append(Failover(Offset(c, -1), FALLBACK), input)
component name=c type=SigmoidComponent dim=3
component-node name=c component=c input=affine1
output-node name=output input=c
"""


def _times(mask: np.ndarray, idx: np.ndarray) -> list[int]:
    return idx[mask, 1].tolist()


def test_failover_to_constant_context_is_zero():
    """By hand: c0 is a ConstantComponent (not simple, no input dependencies, as in
    Kaldi), so c0(t) is computable at every t; hence lin(t) = Failover(lin(t-1),
    c0(t)) is too (the least fixed point of the rules), and output(t) = Sum(lin(t),
    input(t)) is computable exactly where input(t) is given: left and right
    context 0. (Kaldi's builder would not finish this one: lin(t-1) stays usable
    under a computable lin(t), so it walks back to its max_distance; only
    computability is asked here, and that is decided at once.)"""
    nnet = pynnet3.Nnet.from_config(FAILOVER_TO_CONSTANT, seed=1)
    assert nnet.left_context == 0
    assert nnet.right_context == 0
    assert nnet.context() == (0, 0)
    comp = Computability(nnet, {"input": N.frames(0, 40)})
    probe = N.frames(-3000, 3000)
    assert comp.computable("lin", probe).all()
    assert _times(comp.computable("output", probe), probe) == list(range(40))
    # no inputs at all: still computable (c0 needs nothing)
    assert Computability(nnet, {}).computable("lin", N.frames(-5, 5)).all()


def test_failover_first_recurrence_is_stopped_by_time_bounds():
    """lin(t) = Failover(lin(t-1), input(t)): computable for t >= 0 (the first
    input frame), for every later t too. Below 0 it is decided by the time bounds
    of the recurrence, not by walking to t = -inf."""
    nnet = pynnet3.Nnet.from_config(FAILOVER_TO_INPUT, seed=1)
    comp = Computability(nnet, {"input": N.frames(0, 10)})
    assert comp.solver_bounds("lin") == (0, np.inf)
    probe = N.frames(-3000, 3000)
    assert _times(comp.computable("output", probe), probe) == list(range(3000))
    assert nnet.context() == (0, 0)
    for frames in (10, 3000):  # used to fail even for 10 frames
        req = N.request({"input": N.frames(0, frames)}, {"output": N.frames(0, frames)})
        pynnet3.compile(nnet, req, optimize=False)


def test_decided_far_back_one_round_per_frame():
    """Asked only about t = 2999 with the input at t = 0 alone: each round goes one
    frame further back (3000 rounds, a loop, not a recursion)."""
    nnet = pynnet3.Nnet.from_config(FAILOVER_TO_INPUT, seed=1)
    comp = Computability(nnet, {"input": N.frames(0, 1)})
    assert comp.computable("output", N.frames(2999, 3000)).all()
    assert comp.computable("lin", N.frames(0, 3000)).all()
    assert not Computability(nnet, {"input": N.frames(5, 6)}).computable(
        "lin", N.frames(2999, 3000) - [0, 3000, 0]).any()


def test_rounds_are_limited_and_leave_nothing_pending(monkeypatch):
    """A recurrence that would need more rounds than MAX_SOLVER_ROUNDS (Kaldi's
    max_distance) is an error, and the evaluation can be asked again after it."""
    nnet = pynnet3.Nnet.from_config(FAILOVER_TO_INPUT, seed=1)
    comp = Computability(nnet, {"input": N.frames(0, 1)})
    monkeypatch.setattr(computable_mod, "MAX_SOLVER_ROUNDS", 50)
    with pytest.raises(ComputeError, match="does not terminate"):
        comp.computable("lin", N.frames(200, 201))
    state = comp.maps["lin"].lookup(pack(N.frames(-5, 300)), 0)
    assert not (state == computable_mod.PENDING).any()
    monkeypatch.setattr(computable_mod, "MAX_SOLVER_ROUNDS", 10000)
    assert comp.computable("lin", N.frames(200, 201)).all()


@pytest.mark.parametrize("frames", [5000])
def test_lstm_like_recurrence_long_request_compiles(frames):
    nnet = pynnet3.Nnet.from_config(LSTM, seed=1)
    comp = Computability(nnet, {"input": N.frames(0, frames)})
    probe = N.frames(-10, frames + 10)
    for node in ("W_all", "lstm_nonlin", "c", "r", "output"):
        assert _times(comp.computable(node, probe), probe) == list(range(frames)), node
    req = N.request({"input": N.frames(0, frames)}, {"output": N.frames(0, frames)})
    c = pynnet3.compile(nnet, req, optimize=False)
    # W_all, lstm_nonlin, rp, final once per frame (the recurrence goes step by step)
    assert sum(cmd.type.value == "kPropagate" for cmd in c.commands) == 3 * frames + 1
    # the same with the RNN of the compiler tests
    rnn = pynnet3.Nnet.from_config(N.RNN, seed=1)
    c = pynnet3.compile(rnn, N.request({"input": N.frames(0, frames)},
                                       {"output": N.frames(0, frames)}), optimize=False)
    assert sum(cmd.type.value == "kPropagate" for cmd in c.commands) == 2 * frames + 1


@pytest.mark.parametrize("fallback", ["const", "Offset(input, -1)"])
def test_failover_first_recurrence_3000_frames_values(fallback):
    """F(t) = c(t-1) where computable, else the fallback: const (everywhere) or
    x(t-1) (from the second frame of a sequence). Checked against the recurrence
    computed by hand in float64, for a 3000-frame sequence and a short one."""
    rng = np.random.default_rng(11)
    nnet = pynnet3.Nnet.from_config(FAILOVER_FIRST.replace("FALLBACK", fallback), seed=4)
    T = 3000
    inp = np.concatenate([N.frames(0, T), N.frames(7, 12, n=2)[5:]])  # n=1: t = 7..11
    start = 0 if fallback == "const" else 1  # c(t0) has neither side when x(t0-1) is absent
    want_idx = np.concatenate([N.frames(start, T), N.frames(7 + start, 12, n=2)[5 - start:]])
    comp = Computability(nnet, {"input": inp})
    probe = np.concatenate([N.frames(-5, T + 5), N.frames(-5, 20, n=2)[25:]])
    ok = comp.computable("output", probe)
    assert sorted(map(tuple, probe[ok].tolist())) == sorted(map(tuple, want_idx.tolist()))

    req = N.request({"input": inp}, {"output": want_idx})
    x = rng.standard_normal((len(inp), 3))
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req), {"input": x}, dtype=np.float64)
    a = nnet.components["affine1"]
    W, b = a.linear_params.astype(np.float64), a.bias_params.astype(np.float64)
    const = nnet.components["const"].output.astype(np.float64)
    x_at = {tuple(k): x[i] for i, k in enumerate(inp[:, :2].tolist())}
    c: dict[tuple[int, int], np.ndarray] = {}
    for n, t in want_idx[:, :2].tolist():  # in time order per sequence
        if (n, t - 1) in c:
            f = c[(n, t - 1)]
        else:
            f = const if fallback == "const" else x_at[(n, t - 1)]
        c[(n, t)] = 1.0 / (1.0 + np.exp(-(W @ np.concatenate([f, x_at[(n, t)]]) + b)))
    want = np.stack([c[(n, t)] for n, t in want_idx[:, :2].tolist()])
    np.testing.assert_allclose(res.outputs["output"], want, rtol=1e-6, atol=1e-6)


def test_order_of_parts_does_not_change_computability():
    """The answers are the least fixed point whatever the order in which the
    parts ask (depth-first, Append(recurrence, input) used to recurse forever
    where Append(input, recurrence) did not)."""
    probe = N.frames(-20, 40, n=2)
    inp = np.concatenate([N.frames(0, 10), N.frames(3, 30, n=2)[30:]])
    for fallback in ("const", "Offset(input, -1)", "Offset(input, 2)"):
        cfg = FAILOVER_FIRST.replace("FALLBACK", fallback)
        swapped = cfg.replace(f"Append(Failover(Offset(c, -1), {fallback}), input)",
                              f"Append(input, Failover(Offset(c, -1), {fallback}))")
        assert swapped != cfg
        got = [Computability(pynnet3.Nnet.from_config(c_, seed=1), {"input": inp})
               .computable("output", probe) for c_ in (cfg, swapped)]
        assert np.array_equal(got[0], got[1]), fallback
        assert got[0].any()


def test_solver_bounds_contain_every_computable_cindex():
    """The time bounds of recurrences (an interval fixed point, widened) are sound:
    a computable cindex is never outside them."""
    probe_t = np.arange(-60, 80)
    nets = [random_nets.case_for_seed(seed) for seed in range(60)]
    seen_recurrent = 0
    for case in nets:
        nnet = case.build_nnet()
        given = {s.name: s.indexes for s in case.request.inputs}
        comp = Computability(nnet, given)
        ns = np.unique(np.concatenate([s.indexes[:, 0] for s in case.request.inputs]))
        xs = np.unique(np.concatenate([s.indexes[:, 2] for s in case.request.inputs]))
        n, t, x = np.meshgrid(ns, probe_t, xs, indexing="ij")
        probe = np.stack([n.ravel(), t.ravel(), x.ravel()], axis=1)
        seen_recurrent += any(comp.recurrent.values())
        for node in nnet.node_map:
            lo, hi = comp.solver_bounds(node)
            t_ok = probe[comp.computable(node, probe), 1]
            assert ((t_ok >= lo) & (t_ok <= hi)).all(), (case.seed, node, lo, hi)
    assert seen_recurrent >= 5
    for cfg, inputs in ((N.RNN, N.frames(0, 10)), (N.FAILOVER, N.frames(0, 10)),
                        (FAILOVER_TO_INPUT, N.frames(3, 10)), (LSTM, N.frames(2, 9))):
        nnet = pynnet3.Nnet.from_config(cfg, seed=1)
        comp = Computability(nnet, {"input": inputs})
        probe = N.frames(-30, 40)
        for node in nnet.node_map:
            lo, hi = comp.solver_bounds(node)
            t_ok = probe[comp.computable(node, probe), 1]
            assert ((t_ok >= lo) & (t_ok <= hi)).all(), (node, lo, hi)
    # tight where it matters: the RNN's recurrence is bounded by its input
    comp = Computability(pynnet3.Nnet.from_config(N.RNN, seed=1), {"input": N.frames(0, 10)})
    assert comp.solver_bounds("rec") == (0, 9)


def test_runaway_recurrence_is_an_error_without_walking_the_round_limit():
    """lin(t) = Failover(lin(t-1), c0(t)) is computable at every t, so computing
    output(0..39) needs lin(t-1), lin(t-2), ... forever (Kaldi's builder would not
    finish either). The builder stops once the demand leaves every frame the
    request and the network's offsets can reach, long before _MAX_ROUNDS, and the
    error names the node and a cindex beyond that window."""
    nnet = pynnet3.Nnet.from_config(FAILOVER_TO_CONSTANT, seed=1)
    req = N.request({"input": N.frames(0, 40)}, {"output": N.frames(0, 40)})
    builder = graph_mod.GraphBuilder(nnet, req)
    lo, hi = builder._demand_window()
    assert lo < -1024 and hi > 40 + 1024  # the request's frames plus the margin
    with pytest.raises(ComputeError, match=r"does not terminate: node 'lin' is needed at "
                                           r"\(n=0, t=-\d+"):
        pynnet3.compile(nnet, req, optimize=False)


def test_long_legitimate_recurrence_is_not_mistaken_for_a_runaway():
    """lin(t) = Failover(lin(t-1), input(t)) over 3000 frames takes one round per
    frame inside the request's range: far more rounds than the check's threshold,
    never outside the window."""
    nnet = pynnet3.Nnet.from_config(FAILOVER_TO_INPUT, seed=1)
    assert graph_mod._RUNAWAY_CHECK_AFTER < 3000
    req = N.request({"input": N.frames(0, 3000)}, {"output": N.frames(0, 3000)})
    comp = pynnet3.compile(nnet, req, optimize=False)
    assert comp.stats()["num_commands"] > 0


ZERO_DELAY_LOOP = """
input-node name=input dim=4
component name=lin type=LinearComponent input-dim=8 output-dim=4
component-node name=lin component=lin input=Append(input, {read})
dim-range-node name=d input-node=lin dim-offset=0 dim=4
output-node name=output input=lin
"""


def test_zero_delay_loop_is_rejected_when_the_network_is_read():
    """lin(t) needs d(t), a column range of lin(t) itself: a cindex that needs
    itself is never computable. The error comes at load time and names the loop
    (it used to surface as a misleading 'no output frames are computable')."""
    from pynnet3.errors import GraphError

    with pytest.raises(GraphError, match=r"nodes lin -> d -> lin form a loop with no time "):
        pynnet3.Nnet.from_config(ZERO_DELAY_LOOP.format(read="d"), seed=1)


@pytest.mark.parametrize("read", ["Offset(d, -1)", "IfDefined(d)", "Failover(d, input)",
                                  "IfDefined(Offset(d, -2))"])
def test_delayed_or_optional_loops_are_recurrences_not_errors(read):
    """Through a time offset the same loop is an ordinary recurrence; through
    IfDefined/Failover the read is optional: both load."""
    nnet = pynnet3.Nnet.from_config(ZERO_DELAY_LOOP.format(read=read), seed=1)
    assert nnet.is_recurrent()
