# ruff: noqa: E501  (network configs are long lines)
"""Checker-like properties of compiled (unoptimized) computations: submatrices in
range, matrix lifetimes, backward commands that never write a row twice,
forward/backward split, stats() and printing, and Kaldi's memory statistics."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import CommandType as CT
from tests.compiler import nets as N
from tests.compiler.test_graph import RNN2
from tests.reference import REF, require_reference

# (config, inputs, outputs): small networks covering every descriptor kind.
CASES = {
    "tdnn": (N.TDNN, {"input": N.frames(-3, 9, n=2)}, {"output": N.frames(0, 6, n=2)}),
    "ivector": (N.IVECTOR, {"input": N.frames(-1, 6, n=2), "ivector": [[0, 0, 0], [1, 0, 0]]},
                {"output": N.frames(0, 6, n=2)}),
    "rnn": (N.RNN, {"input": N.frames(0, 7, n=2)}, {"output": N.frames(0, 7, n=2)}),
    "rnn2": (RNN2, {"input": N.frames(-1, 8)}, {"output": N.frames(0, 7)}),
    "failover": (N.FAILOVER, {"input": N.frames(0, 5, n=2)}, {"output": N.frames(0, 5, n=2)}),
    "round": (N.ROUND, {"input": N.frames(0, 7), "ivector": [[0, 0, 0], [0, 3, 0], [0, 6, 0]]},
              {"output": N.frames(0, 7)}),
    "stats": (N.STATS, {"input": N.frames(0, 12, n=2)},
              {"output": [[0, 0, 0], [0, 4, 0], [1, 0, 0], [1, 6, 0], [1, 7, 0]]}),
}
# (input deriv, output deriv, model deriv)
DERIVS = [(False, False, False), (True, True, False), (False, True, True), (True, True, True)]


def _compile(name, derivs, optimize=False):
    cfg, inputs, outputs = CASES[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    req = N.request(inputs, outputs, *derivs)
    return nnet, req, pynnet3.compile(nnet, req, optimize=optimize)


@pytest.mark.parametrize("derivs", DERIVS, ids=["fwd", "input-deriv", "model", "all"])
@pytest.mark.parametrize("name", list(CASES))
def test_checker_properties(name, derivs):
    nnet, req, c = _compile(name, derivs)
    N.assert_valid(c, nnet)


@pytest.mark.parametrize("name", list(CASES))
def test_checker_properties_optimized(name):
    nnet, req, c = _compile(name, (True, True, True), optimize=True)
    # the compiler-specific invariants of N.check_computation (one marker, no row
    # written twice by a scatter, ...) hold for the compiler's output; optimized
    # computations answer to the library's checker
    pynnet3.check(c, nnet)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_before_marker_backward_after(name):
    nnet, req, c = _compile(name, (True, True, True))
    types = [cmd.type for cmd in c.commands]
    marker = types.index(CT.NO_OPERATION_MARKER)
    assert types.count(CT.NO_OPERATION_MARKER) == 1
    prop = [k for k, t in enumerate(types) if t is CT.PROPAGATE]
    back = [k for k, t in enumerate(types) if t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)]
    assert prop and back
    assert max(prop) < marker < min(back)
    # Every propagated component that is updatable, or leads back to the input, backprops.
    assert {c.commands[k].node for k in back} == {c.commands[k].node for k in prop}
    # Derivative matrices are only touched after the marker.
    for k, cmd in enumerate(c.commands[:marker]):
        for s in N.submatrices_used(cmd):
            assert not c.matrices[c.submatrices[s].matrix].is_deriv, f"c{k}"
    # The user's output derivative is accepted after the marker; outputs before it.
    for k, cmd in enumerate(c.commands):
        if cmd.type in (CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT):
            assert (k > marker) == cmd.is_deriv


@pytest.mark.parametrize("name", list(CASES))
def test_no_derivatives_no_backward(name):
    nnet, req, c = _compile(name, (False, False, False))
    types = [cmd.type for cmd in c.commands]
    marker = types.index(CT.NO_OPERATION_MARKER)
    assert all(t is CT.DEALLOC_MATRIX for t in types[marker + 1:])
    assert not any(m.is_deriv for m in c.matrices[1:])


def test_model_derivative_only_gives_no_input_derivative():
    nnet, req, c = _compile("tdnn", (False, True, True))
    provided = [cmd for cmd in c.commands if cmd.type is CT.PROVIDE_OUTPUT]
    assert [(p.node, p.is_deriv) for p in provided] == [("output", False)]
    kinds = Counter(cmd.type for cmd in c.commands)
    assert kinds[CT.BACKPROP] == 4 and kinds[CT.BACKPROP_NO_MODEL_UPDATE] == 0
    # The first affine needs no input derivative.
    bp = {cmd.node: cmd for cmd in c.commands if cmd.type is CT.BACKPROP}
    assert bp["affine1"].in_deriv == 0 and bp["affine2"].in_deriv != 0


def test_input_derivative_only_has_no_model_update():
    nnet, req, c = _compile("tdnn", (True, True, False))
    kinds = Counter(cmd.type for cmd in c.commands)
    assert kinds[CT.BACKPROP] == 0 and kinds[CT.BACKPROP_NO_MODEL_UPDATE] == 4
    provided = {(p.node, p.is_deriv) for p in c.commands if p.type is CT.PROVIDE_OUTPUT}
    assert provided == {("output", False), ("input", True)}


def _backward_row_writes(c, k, cmd):
    """Destination rows (as (matrix, row) pairs) written by a backward row command."""
    if cmd.type is CT.ADD_ROWS:
        d = c.submatrices[cmd.dst]
        tab = c.indexes[cmd.table]
        return [(d.matrix, d.row_offset + r) for r in np.flatnonzero(tab >= 0).tolist()]
    if cmd.type is CT.ADD_ROW_RANGES:
        d = c.submatrices[cmd.dst]
        tab = c.indexes_ranges[cmd.table]
        return [(d.matrix, d.row_offset + r)
                for r in np.flatnonzero(tab[:, 1] > tab[:, 0]).tolist()]
    if cmd.type in (CT.ADD_TO_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI):
        tab = c.indexes_multi[cmd.table]
        return [(c.submatrices[s].matrix, c.submatrices[s].row_offset + r)
                for s, r in tab.tolist() if s > 0]
    return []


# A network whose backward pass needs fan-in scatters: one source row feeds many
# rows of one descriptor (ReplaceIndex, Round, overlapping Offsets).
FANIN = """
input-node name=input dim=2
input-node name=ivector dim=2
component name=a type=AffineComponent input-dim=10 output-dim=3
component-node name=a component=a input=Append(Offset(input, -1), input, Offset(input, 1), Scale(0.5, ReplaceIndex(ivector, t, 0)), Round(input, 4))
component name=s type=SigmoidComponent dim=3
component-node name=s component=s input=Sum(a, Offset(a, 2))
output-node name=output input=Append(s, Scale(2.0, Round(s, 3)), Scale(-0.5, ReplaceIndex(s, t, 0)))
"""


@pytest.mark.parametrize("n,shuffle", [(1, False), (2, False), (2, True)])
def test_backward_commands_never_write_a_row_twice(n, shuffle):
    rng = np.random.default_rng(3)
    nnet = pynnet3.Nnet.from_config(FANIN, seed=1)
    out = N.frames(0, 12, n=n)
    if shuffle:
        out = out[rng.permutation(len(out))]
    ivec = [[1, 0, 0], [0, 0, 0]][2 - n:]
    req = N.request({"input": N.frames(-1, 16, n=n), "ivector": ivec},
                    {"output": out}, True, True, True)
    c = pynnet3.compile(nnet, req, optimize=False)
    N.assert_valid(c, nnet)
    marker = [cmd.type for cmd in c.commands].index(CT.NO_OPERATION_MARKER)
    kinds = Counter()
    for k, cmd in enumerate(c.commands[marker + 1:], start=marker + 1):
        rows = _backward_row_writes(c, k, cmd)
        assert len(rows) == len(set(rows)), f"c{k} {cmd.type.value} writes a row twice"
        kinds[cmd.type] += 1
    # The fan-in really was exercised.
    assert kinds[CT.ADD_ROW_RANGES] + kinds[CT.ADD_ROWS] > 0
    if n == 1:
        assert kinds[CT.ADD_ROW_RANGES] > 0  # contiguous fan-in (ReplaceIndex, Round)
    # And the numbers are right (the finite-difference tests check the rest).
    assert pynnet3.run(nnet, c, N.random_inputs(nnet, req, rng),
                       N.random_output_derivs(nnet, req, rng)).input_derivs["ivector"].any()


def test_backward_scatter_matches_dense_transpose():
    """With a linear network (no nonlinearity) the input derivative is exactly the
    transpose of the forward map, row op by row op."""
    rng = np.random.default_rng(4)
    cfg = """
input-node name=input dim=2
input-node name=ivector dim=2
output-node name=output input=Append(Sum(Offset(input, -1), Scale(2.0, input)), ReplaceIndex(ivector, t, 0), Round(input, 3), IfDefined(Offset(input, 5)))
"""
    nnet = pynnet3.Nnet.from_config(cfg, seed=1)
    inp = N.frames(-1, 9, n=2)
    out = N.frames(0, 9, n=2)
    req = N.request({"input": inp, "ivector": [[0, 0, 0], [1, 0, 0]]}, {"output": out},
                    True, True, False)
    c = pynnet3.compile(nnet, req, optimize=False)
    N.assert_valid(c, nnet)
    x = {"input": rng.standard_normal((len(inp), 2)), "ivector": rng.standard_normal((2, 2))}
    d = {"output": rng.standard_normal((len(out), 8))}
    res = pynnet3.run(nnet, c, x, d, dtype=np.float64)
    # Dense forward map, by probing unit vectors.
    fwd = pynnet3.compile(nnet, N.request({"input": inp, "ivector": [[0, 0, 0], [1, 0, 0]]},
                                          {"output": out}), optimize=False)
    sizes = {"input": len(inp) * 2, "ivector": 4}
    for name in ("input", "ivector"):
        grad = np.zeros(sizes[name])
        for j in range(sizes[name]):
            probe = {k: np.zeros_like(v) for k, v in x.items()}
            probe[name].reshape(-1)[j] = 1.0
            y = pynnet3.run(nnet, fwd, probe, dtype=np.float64).outputs["output"]
            grad[j] = (y * d["output"]).sum()
        np.testing.assert_allclose(res.input_derivs[name].reshape(-1), grad, atol=1e-12)
    # Forward values directly.
    xi = {tuple(ix): x["input"][r] for r, ix in enumerate(inp.tolist())}
    for r, (n, t, _) in enumerate(out.tolist()):
        want = np.concatenate([xi[(n, t - 1, 0)] + 2 * xi[(n, t, 0)], x["ivector"][n],
                               xi[(n, t // 3 * 3, 0)],
                               xi.get((n, t + 5, 0), np.zeros(2))])
        np.testing.assert_allclose(res.outputs["output"][r], want, atol=1e-12)


# -- stats and printing ---------------------------------------------------------------

def _peak(c) -> int:
    cur = peak = 0
    live = set()
    for cmd in c.commands:
        if cmd.type is CT.ALLOC_MATRIX:
            m = cmd.matrix
        elif cmd.type is CT.ACCEPT_INPUT and c.submatrices[cmd.dst].matrix not in live:
            m = c.submatrices[cmd.dst].matrix
        elif cmd.type is CT.DEALLOC_MATRIX:
            live.discard(cmd.matrix)
            cur -= c.matrices[cmd.matrix].rows * c.matrices[cmd.matrix].cols
            continue
        else:
            continue
        live.add(m)
        cur += c.matrices[m].rows * c.matrices[m].cols
        peak = max(peak, cur)
    return peak


@pytest.mark.parametrize("name", list(CASES))
def test_stats_consistent_with_commands(name):
    nnet, req, c = _compile(name, (True, True, True))
    s = c.stats()
    assert s["num_commands"] == len(c.commands)
    assert s["command_types"] == dict(Counter(cmd.type.value for cmd in c.commands))
    assert sum(s["command_types"].values()) == s["num_commands"]
    assert s["num_matrices"] == len(c.matrices) - 1
    assert s["num_submatrices"] == len(c.submatrices) - 1
    assert s["num_indexes"] == len(c.indexes)
    assert s["num_indexes_multi"] == len(c.indexes_multi)
    assert s["num_indexes_ranges"] == len(c.indexes_ranges)
    assert s["total_matrix_floats"] == sum(m.rows * m.cols for m in c.matrices[1:])
    assert s["peak_memory_floats"] == _peak(c)
    assert 0 < s["peak_memory_floats"] <= s["total_matrix_floats"]
    json.dumps(s)  # plain data


@pytest.mark.parametrize("name", list(CASES))
def test_print_lists_every_command(name):
    nnet, req, c = _compile(name, (True, True, True))
    text = str(c)
    lines = text.splitlines()
    for k in range(len(c.commands)):
        assert sum(line.startswith(f"c{k}: ") for line in lines) == 1
    for m in range(1, len(c.matrices)):
        assert f"m{m} ==" in text
    assert "Propagate" in text and "Backprop" in text
    assert "user input [for node: 'input']" in text


# -- Kaldi's unoptimized statistics ------------------------------------------------------

KALDI_CASES = ["generated/case_1", "generated/case_12", "generated/case_22",
               "components/Constant_1", "components/StatisticsPooling_1",
               "realistic/xvector/train", "realistic/tdnn_lstm/train"]


@pytest.mark.parametrize("case", KALDI_CASES)
def test_unoptimized_memory_vs_kaldi(case):
    path = REF / case
    require_reference()
    model = path / "model.txt" if (path / "model.txt").exists() else path.parent / "model.txt"
    nnet = pynnet3.read_nnet(model)
    req = pynnet3.ComputationRequest.from_json(json.loads((path / "request.json").read_text()))
    c = pynnet3.compile(nnet, req, optimize=False)
    N.assert_valid(c, nnet)
    ours, kaldi = c.stats(), json.loads((path / "stats.json").read_text())["unoptimized"]
    mats = ours["num_matrices"] / kaldi["num_matrices"]
    peak = ours["peak_memory_floats"] / kaldi["peak_memory_floats"]
    print(f"{case}: num_matrices ratio {mats:.3f}, peak_memory_floats ratio {peak:.3f}")
    assert peak <= 1.05
    assert 0.5 <= mats <= 1.2


GRU_LIKE_SUM = """
input-node name=input dim=3
component name=a type=AffineComponent input-dim=3 output-dim=3
component-node name=a component=a input=input
component name=sig type=SigmoidComponent dim=3
component-node name=sig component=sig input=a
component name=p type=ElementwiseProductComponent input-dim=6 output-dim=3
component-node name=p component=p input=Append(Sum(Scale(-1.0, sig), Const(1.0, 3)), input)
output-node name=output input=p
"""


@pytest.mark.parametrize("optimize", [False, True])
def test_const_after_other_terms_of_a_sum(optimize):
    """Kaldi's GRU layers write Sum(Scale(-1.0, z), Const(1.0, d)): the constant is
    set first and the other terms added. Output from the formula, input derivative
    against central differences (float64)."""
    nnet = pynnet3.Nnet.from_config(GRU_LIKE_SUM, seed=1)
    N.to_float64(nnet)
    req = N.request({"input": N.frames(0, 4)}, {"output": N.frames(0, 4)},
                    input_deriv=True, output_deriv=True)
    comp = pynnet3.compile(nnet, req, optimize=optimize, check=True)
    rng = np.random.default_rng(0)
    x, d = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    res = pynnet3.run(nnet, comp, {"input": x}, output_derivs={"output": d}, dtype=np.float64)
    a = nnet.components["a"]

    def f(x):
        return (1.0 - 1.0 / (1.0 + np.exp(-(x @ a.linear_params.T + a.bias_params)))) * x

    np.testing.assert_allclose(res.outputs["output"], f(x), rtol=1e-12)
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = 1e-6
        fd[i] = np.sum((f(x + e) - f(x - e)) * d) / 2e-6
    np.testing.assert_allclose(res.input_derivs["input"], fd, rtol=1e-6, atol=1e-8)
