"""Finite-difference checks of whole networks in float64.

Objective J = sum(output * D) for a random D. Its gradient with respect to the
inputs is the input derivative of a run with output derivative D, and with
respect to the parameters the model gradient. Central differences of J (from
forward-only computations) must agree with both.
"""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from tests.compiler import nets as N
from tests.compiler.test_commands import FANIN
from tests.compiler.test_graph import RNN2

EPS = 1e-6
RTOL = 1e-5

CASES = {
    "tdnn_append_sum_scale": (N.TDNN, {"input": N.frames(-3, 9, n=2)},
                              {"output": N.frames(0, 6, n=2)}),
    "ivector_replace_index": (N.IVECTOR, {"input": N.frames(-1, 6, n=2),
                                          "ivector": [[1, 0, 0], [0, 0, 0]]},
                              {"output": N.frames(0, 6, n=2)}),
    "lstm_like_ifdefined_dim_range": (N.RNN, {"input": N.frames(0, 7, n=2)},
                                      {"output": N.frames(0, 7, n=2)}),
    "two_recurrent_layers": (RNN2, {"input": N.frames(-1, 8)}, {"output": N.frames(0, 7)}),
    "failover_constant": (N.FAILOVER, {"input": np.concatenate([N.frames(0, 4),
                                                                N.frames(2, 7, n=2)[5:]])},
                          {"output": N.frames(1, 4)}),
    "statistics_pooling": (N.STATS, {"input": N.frames(0, 12, n=2)},
                           {"output": [[0, 0, 0], [0, 5, 0], [1, 0, 0], [1, 6, 0],
                                       [1, 11, 0]]}),
    "round": (N.ROUND, {"input": N.frames(0, 7), "ivector": [[0, 0, 0], [0, 3, 0],
                                                              [0, 6, 0]]},
              {"output": N.frames(0, 7)}),
    "fan_in": (FANIN, {"input": N.frames(-1, 16, n=2), "ivector": [[1, 0, 0], [0, 0, 0]]},
               {"output": N.frames(0, 12, n=2)[::-1]}),
}


def _objective(nnet, comp, inputs, deriv) -> float:
    res = pynnet3.run(nnet, comp, inputs, dtype=np.float64)
    return sum(float(np.sum(res.outputs[k] * deriv[k])) for k in deriv)


def _close(fd: np.ndarray, an: np.ndarray, what: str) -> None:
    fd, an = np.asarray(fd), np.asarray(an)
    err = np.linalg.norm(fd - an)
    scale = max(np.linalg.norm(an), np.linalg.norm(fd), 1e-3)
    assert err <= RTOL * scale, f"{what}: |fd - analytic| = {err:.3g} (scale {scale:.3g})\n" \
                                f"fd={fd}\nanalytic={an}"


@pytest.mark.parametrize("optimize", [False, True], ids=["unopt", "opt"])
@pytest.mark.parametrize("name", list(CASES))
def test_finite_differences(name, optimize):
    cfg, inputs, outputs = CASES[name]
    rng = np.random.default_rng(sum(name.encode()))
    nnet = pynnet3.Nnet.from_config(cfg, seed=7)
    N.to_float64(nnet)
    req = N.request(inputs, outputs, True, True, True)
    fwd = pynnet3.compile(nnet, N.request(inputs, outputs), optimize=optimize)
    full = pynnet3.compile(nnet, req, optimize=optimize)
    x = N.random_inputs(nnet, req, rng)
    d = N.random_output_derivs(nnet, req, rng)
    res = pynnet3.run(nnet, full, {k: v.copy() for k, v in x.items()}, d, dtype=np.float64)
    np.testing.assert_allclose(
        _objective(nnet, fwd, x, d),
        sum(float(np.sum(res.outputs[k] * d[k])) for k in d), rtol=1e-12)

    # Input derivatives: a few random entries per input, plus one whole row.
    for k, v in x.items():
        entries = [tuple(rng.integers(0, s) for s in v.shape) for _ in range(6)]
        entries += [(int(rng.integers(0, v.shape[0])), j) for j in range(v.shape[1])]
        fd, an = [], []
        for e in entries:
            xp = {kk: vv.copy() for kk, vv in x.items()}
            xm = {kk: vv.copy() for kk, vv in x.items()}
            xp[k][e] += EPS
            xm[k][e] -= EPS
            fd.append((_objective(nnet, fwd, xp, d) - _objective(nnet, fwd, xm, d)) / (2 * EPS))
            an.append(res.input_derivs[k][e])
        _close(fd, an, f"{name}: d/d{k}")

    # Parameter gradients: a few entries of every parameter of every updatable component.
    updatable = [n for n, c in nnet.components.items() if c.is_updatable()]
    assert sorted(res.gradients) == sorted(updatable)
    for cname in updatable:
        comp = nnet.components[cname]
        for pname, p in comp.params().items():
            g = res.gradients[cname][pname]
            assert g.shape == p.shape, (cname, pname)
            fd, an = [], []
            for _ in range(4):
                e = tuple(int(rng.integers(0, s)) for s in p.shape)
                old = p[e]
                p[e] = old + EPS
                jp = _objective(nnet, fwd, x, d)
                p[e] = old - EPS
                jm = _objective(nnet, fwd, x, d)
                p[e] = old
                fd.append((jp - jm) / (2 * EPS))
                an.append(g[e])
            _close(fd, an, f"{name}: d/d{cname}.{pname}")


def test_constant_component_gets_a_gradient():
    """The ConstantComponent's output only enters at the first frame of each
    sequence (through Failover); its gradient must still come back."""
    nnet = pynnet3.Nnet.from_config(N.FAILOVER, seed=7)
    N.to_float64(nnet)
    rng = np.random.default_rng(0)
    req = N.request({"input": N.frames(0, 5)}, {"output": N.frames(0, 5)}, False, True, True)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req, optimize=False),
                      N.random_inputs(nnet, req, rng), N.random_output_derivs(nnet, req, rng),
                      dtype=np.float64)
    assert np.abs(res.gradients["const"]["output"]).sum() > 0
