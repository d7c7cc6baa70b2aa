# ruff: noqa: E501  (network configs are long lines)
"""Optional-input specialization: a request without an optional input (an ivector
read through IfDefined / Failover) gets its own computation with that branch gone,
and an input broadcast over time that needs no derivative is left alone by the
backward pass."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler
from pynnet3.computation import CommandType as CT
from tests.cache.common import check, frames, random_data, request
from tests.compiler import nets

IFDEFINED = """
input-node name=input dim=3
input-node name=ivector dim=2
component name=ivec_affine type=AffineComponent input-dim=2 output-dim=4
component-node name=ivec_affine component=ivec_affine input=ReplaceIndex(ivector, t, 0)
component name=affine1 type=AffineComponent input-dim=6 output-dim=4
component-node name=affine1 component=affine1 input=Append(input, Offset(input, -1))
component name=tanh1 type=TanhComponent dim=4
component-node name=tanh1 component=tanh1 input=Sum(affine1, IfDefined(ivec_affine))
output-node name=output input=tanh1
"""

FAILOVER = """
input-node name=input dim=3
input-node name=ivector dim=2
component name=affine1 type=AffineComponent input-dim=5 output-dim=4
component-node name=affine1 component=affine1 input=Append(input, Failover(ReplaceIndex(ivector, t, 0), Const(0.0, 2)))
component name=tanh1 type=TanhComponent dim=4
component-node name=tanh1 component=tanh1 input=affine1
output-node name=output input=tanh1
"""
BRANCH = {"ifdefined": (IFDEFINED, {"ivector", "ivec_affine", "ivec_affine_input"}),
          "failover": (FAILOVER, {"ivector"})}


def _reqs(n_seqs=3, with_ivector=True, derivs=False):
    ins = {"input": frames(n_seqs, -1, 6)}
    if with_ivector:
        ins["ivector"] = frames(n_seqs, 0, 1)
    return request(ins, {"output": frames(n_seqs, 0, 6)}, output_deriv=derivs, model=derivs)


def _expected_without_ivector(kind, nnet, x: np.ndarray, n_seqs: int) -> np.ndarray:
    """The network's output with the optional branch contributing nothing, by hand."""
    a = nnet.components["affine1"]
    w, b = a.linear_params.astype(np.float64), a.bias_params.astype(np.float64)
    xs = x.reshape(n_seqs, 7, 3)
    if kind == "ifdefined":  # Append(input(t), input(t-1))
        spliced = np.concatenate([xs[:, 1:], xs[:, :-1]], axis=2)
    else:  # Append(input(t), Const(0, 2))
        spliced = np.concatenate([xs[:, 1:], np.zeros((n_seqs, 6, 2))], axis=2)
    return np.tanh(spliced @ w.T + b).reshape(-1, 4)


@pytest.mark.parametrize("optimize", [False, True], ids=["unopt", "opt"])
@pytest.mark.parametrize("kind", sorted(BRANCH))
def test_request_without_optional_input(kind, optimize):
    cfg, branch_nodes = BRANCH[kind]
    nnet = pynnet3.Nnet.from_config(cfg, seed=5)
    nets.to_float64(nnet)
    cc = CachingCompiler(nnet, optimize=optimize, check=True)
    with_iv = cc.compile(_reqs(with_ivector=True))
    without = cc.compile(_reqs(with_ivector=False))
    assert with_iv is not without and cc.info()["misses"] >= 2
    assert cc.compile(_reqs(with_ivector=False)) is without  # and it is cached
    check(without, nnet, "without ivector")
    # No matrix, and so no command, for the optional branch.
    nodes = {m.node for m in without.matrices[1:]}
    assert not nodes & branch_nodes, nodes
    assert not any(c.node in branch_nodes for c in without.commands if c.node)
    assert any(m.node in branch_nodes for m in with_iv.matrices[1:])
    req = _reqs(with_ivector=False)
    inputs, _ = random_data(nnet, req)
    res = pynnet3.run(nnet, without, inputs, dtype=np.float64)
    np.testing.assert_allclose(res.outputs["output"],
                               _expected_without_ivector(kind, nnet, inputs["input"], 3),
                               rtol=1e-10, atol=1e-12)


def _matrices_of(comp, node):
    return {m for m in range(1, len(comp.matrices)) if comp.matrices[m].node == node}


def _backward_matrices(comp):
    """Matrices a backward command touches (through any submatrix argument)."""
    marker = next(k for k, c in enumerate(comp.commands) if c.type is CT.NO_OPERATION_MARKER)
    out = set()
    for c in comp.commands[marker + 1:]:
        for s in (c.dst, c.src, c.in_value, c.out_value, c.out_deriv, c.in_deriv):
            if s:
                out.add(comp.submatrices[s].matrix)
        if c.type in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI,
                      CT.ADD_TO_ROWS_MULTI):
            subs = comp.indexes_multi[c.table][:, 0]
            out |= {comp.submatrices[s].matrix for s in subs[subs > 0].tolist()}
        if c.type in (CT.ALLOC_MATRIX, CT.DEALLOC_MATRIX):
            continue
    return out


@pytest.mark.parametrize("optimize", [False, True], ids=["unopt", "opt"])
@pytest.mark.parametrize("model", [False, True], ids=["input_deriv", "model_deriv"])
def test_broadcast_input_without_derivative_is_not_touched_backward(model, optimize):
    nnet = pynnet3.Nnet.from_config(IFDEFINED, seed=5)
    req = request({"input": frames(4, -1, 6), "ivector": frames(4, 0, 1)},
                  {"output": frames(4, 0, 6)}, output_deriv=True, model=model)
    req.inputs[0].has_deriv = not model  # the ivector never has a derivative
    comp = CachingCompiler(nnet, optimize=optimize, check=True).compile(req)
    ivec = _matrices_of(comp, "ivector")
    assert ivec and all(not comp.matrices[m].is_deriv for m in ivec)
    assert not ivec & _backward_matrices(comp)
    backprops = {c.node for c in comp.commands
                 if c.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)}
    # Without model derivatives nothing flows back into the ivector branch at all.
    assert ("ivec_affine" in backprops) == model
    assert "ivector" not in pynnet3.run(nnet, comp, *random_data(nnet, req)).input_derivs
