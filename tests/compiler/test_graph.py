"""The computation graph and its schedule: steps, epochs, phases and pruning."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler.graph import _longest_path_levels, build_graph
from pynnet3.index import pack
from tests.compiler import nets as N

# Two recurrent layers (the second with a 2-node loop and a -2 offset) between
# non-recurrent layers.
RNN2 = """
input-node name=input dim=2
component name=pre type=AffineComponent input-dim=4 output-dim=3
component-node name=pre component=pre input=Append(Offset(input, -1), input)
component name=a1 type=AffineComponent input-dim=5 output-dim=2
component-node name=a1 component=a1 input=Append(pre, IfDefined(Offset(h1, -1)))
component name=h1 type=TanhComponent dim=2
component-node name=h1 component=h1 input=a1
component name=a2 type=AffineComponent input-dim=4 output-dim=2
component-node name=a2 component=a2 input=Append(h1, IfDefined(Offset(g2, -2)))
component name=h2 type=SigmoidComponent dim=2
component-node name=h2 component=h2 input=a2
component name=g2 type=TanhComponent dim=2
component-node name=g2 component=g2 input=Sum(h2, Scale(0.5, h1))
component name=post type=AffineComponent input-dim=2 output-dim=2
component-node name=post component=post input=Sum(g2, Offset(g2, 1))
output-node name=output input=post
"""


def _graph(cfg, inputs, outputs):
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    builder, graph = build_graph(nnet, N.request(inputs, outputs))
    return nnet, builder, graph


def _assert_txn_sorted(idx: np.ndarray) -> None:
    keys = [(t, x, n) for n, t, x in idx.tolist()]
    assert keys == sorted(keys)


def _check_dependencies_earlier(builder, graph) -> int:
    """Every cindex of every step only reads cindexes of strictly earlier steps.
    Returns the number of dependency pairs checked."""
    where: dict[str, dict[int, int]] = {}
    checked = 0
    for i, step in enumerate(graph.steps):
        for src, rows, sidx in builder.used_sources(step.node, step.indexes):
            loc = where.get(src, {})
            for r, key in zip(rows.tolist(), pack(sidx).tolist(), strict=True):
                assert key in loc, f"step {i} ({step.node}) row {r} reads unscheduled {src}"
                assert loc[key] < i, f"step {i} ({step.node}) reads {src} of step {loc[key]}"
                checked += 1
        d = where.setdefault(step.node, {})
        for key in pack(step.indexes).tolist():
            assert key not in d, f"{step.node}: cindex in two steps"
            d[key] = i
    return checked


def test_non_recurrent_one_step_per_node():
    nnet, builder, g = _graph(N.TDNN, {"input": N.frames(-3, 9, n=2)},
                              {"output": N.frames(0, 6, n=2)})
    names = [s.node for s in g.steps]
    assert names == ["input", "affine1", "tanh1", "affine2", "sig2", "output"]
    assert [s.kind for s in g.steps] == ["input"] + ["component"] * 4 + ["output"]
    assert not any(s.recurrent for s in g.steps)
    epochs = [s.epoch for s in g.steps]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
    assert _check_dependencies_earlier(builder, g) > 0


def test_rows_sorted_txn_but_io_in_request_order():
    rng = np.random.default_rng(0)
    inp = N.frames(-3, 9, n=3)
    out = np.concatenate([N.frames(0, 6, n=3), N.frames(2, 4, n=3, x=1)])
    inp, out = inp[rng.permutation(len(inp))], out[rng.permutation(len(out))]
    # x=1 outputs need x=1 inputs too.
    inp = np.concatenate([inp, N.frames(-1, 7, n=3, x=1)])
    nnet, builder, g = _graph(N.TDNN, {"input": inp}, {"output": out})
    np.testing.assert_array_equal(g.steps[0].indexes, inp)
    np.testing.assert_array_equal(g.steps[-1].indexes, out)
    for s in g.steps[1:-1]:
        _assert_txn_sorted(s.indexes)
    _check_dependencies_earlier(builder, g)


def test_pruning_keeps_exactly_the_needed_cindexes():
    nnet, builder, g = _graph(N.TDNN, {"input": N.frames(-20, 30)}, {"output": N.frames(0, 6)})
    times = {s.node: s.indexes[:, 1].tolist() for s in g.steps}
    # output(t) <- sig2(t), sig2(t+1) <- tanh1(t-1), tanh1(t+1) <- input t-2, t, t+1
    assert times["sig2"] == list(range(0, 7))
    assert times["affine2"] == list(range(0, 7))
    assert times["tanh1"] == list(range(-1, 8))
    assert times["affine1"] == list(range(-1, 8))
    assert times["input"] == list(range(-20, 30))  # inputs are kept as given


def test_pruning_drops_unused_nodes_and_unused_ifdefined_reads():
    cfg = N.TDNN + """
component name=unused type=TanhComponent dim=5
component-node name=unused component=unused input=affine1
output-node name=output2 input=unused
"""
    nnet, builder, g = _graph(cfg, {"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)})
    assert "unused" not in {s.node for s in g.steps}
    assert "output2" not in {s.node for s in g.steps}
    # IfDefined(Offset(out, 2)) reads nothing past the end of the input.
    nnet, builder, g = _graph(N.RNN, {"input": N.frames(0, 6)}, {"output": N.frames(4, 6)})
    times = {s.node: sorted(t for st in g.steps if st.node == s.node
                            for t in st.indexes[:, 1].tolist()) for s in g.steps}
    assert times["out"] == [4, 5]
    assert times["tanh1"] == list(range(6))
    assert times["rec"] == list(range(5))  # rec(5) would only feed affine1(6)


@pytest.mark.parametrize("cfg,T,n", [(N.RNN, 8, 2), (N.FAILOVER, 6, 3), (RNN2, 9, 2)])
def test_recurrent_phases_depend_only_on_earlier_steps(cfg, T, n):
    inputs = {"input": N.frames(-1, T, n=n)}
    nnet, builder, g = _graph(cfg, inputs, {"output": N.frames(0, T - 1, n=n)})
    assert any(s.recurrent for s in g.steps)
    assert _check_dependencies_earlier(builder, g) > 0
    for s in g.steps:
        if s.kind not in ("input", "output"):
            _assert_txn_sorted(s.indexes)
    # Epochs never go backwards, and each recurrent epoch is split into several steps.
    epochs = [s.epoch for s in g.steps]
    assert epochs == sorted(epochs)
    rec_epochs = {s.epoch for s in g.steps if s.recurrent}
    for e in rec_epochs:
        assert sum(s.epoch == e for s in g.steps) >= T - 1


def test_recurrent_epoch_phase_per_frame_and_batched_over_sequences():
    nnet, builder, g = _graph(N.RNN, {"input": N.frames(0, 5, n=3)},
                              {"output": N.frames(0, 5, n=3)})
    a1 = [s for s in g.steps if s.node == "affine1"]
    assert len(a1) == 5
    for t, s in enumerate(a1):
        assert s.indexes.tolist() == [[n, t, 0] for n in range(3)]
    # The dim-range 'out' mirrors its source's per-frame steps (same rows, so each
    # is a column range of the source matrix); the non-recurrent affine2 is one step.
    src = nnet.node("out").source
    src_steps = [s for s in g.steps if s.node == src]
    out_steps = [s for s in g.steps if s.node == "out"]
    assert len(out_steps) == len(src_steps) == 5
    for o, s in zip(out_steps, src_steps, strict=True):
        np.testing.assert_array_equal(o.indexes, s.indexes)
    assert sum(s.node == "affine2" for s in g.steps) == 1


def test_two_recurrent_layers_are_separate_epochs():
    nnet, builder, g = _graph(RNN2, {"input": N.frames(-1, 6)}, {"output": N.frames(0, 5)})
    ep = {}
    for s in g.steps:
        ep.setdefault(s.node, set()).add(s.epoch)
    assert all(len(v) == 1 for v in ep.values())
    assert ep["a1"] == ep["h1"]
    assert ep["a2"] == ep["h2"] == ep["g2"]
    assert ep["a1"] != ep["a2"]
    assert not any(s.recurrent for s in g.steps if s.node in ("pre", "post"))


def test_unused_inputs_are_still_steps():
    nnet, builder, g = _graph(N.IVECTOR, {"input": N.frames(-1, 3),
                                          "ivector": [[0, 0, 0], [0, 7, 0]]},
                              {"output": N.frames(0, 3)})
    assert [s.node for s in g.steps[:2]] == ["input", "ivector"]
    np.testing.assert_array_equal(g.steps[1].indexes, [[0, 0, 0], [0, 7, 0]])


def test_longest_path_levels():
    # 0 -> 1 -> 3, 0 -> 2 -> 3, 2 -> 4 (duplicate edge), 5 isolated
    src = np.array([0, 1, 0, 2, 2, 2])
    dst = np.array([1, 3, 2, 3, 4, 4])
    np.testing.assert_array_equal(_longest_path_levels(6, src, dst), [0, 1, 1, 2, 2, 0])
    assert _longest_path_levels(3, np.array([0, 1, 2]), np.array([1, 2, 0])) is None
    # A long chain given in scrambled edge order.
    rng = np.random.default_rng(0)
    perm = rng.permutation(999)
    lv = _longest_path_levels(1000, np.arange(999)[perm], np.arange(1, 1000)[perm])
    np.testing.assert_array_equal(lv, np.arange(1000))
