"""Helpers shared by the cache tests: regular requests, running two computations on
the same data, and comparing what they produce."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np

import pynnet3


def frames(n_seqs: int, t0: int, t1: int, order: str = "n", n0: int = 0) -> np.ndarray:
    """(n, t, 0) for n in n0..n0+n_seqs-1 and t in [t0, t1): ``order`` "n" = one
    sequence after another, "t" = n innermost."""
    n, t = np.meshgrid(np.arange(n0, n0 + n_seqs), np.arange(t0, t1), indexing="ij")
    idx = np.stack([n.ravel(), t.ravel(), np.zeros(n.size, dtype=np.int64)], axis=1)
    if order == "t":
        idx = idx[np.lexsort((idx[:, 0], idx[:, 1]))]
    return idx


def request(inputs: dict, outputs: dict, *, input_deriv: bool = False,
            output_deriv: bool = False, model: bool = False,
            stats: bool = False) -> pynnet3.ComputationRequest:
    return pynnet3.ComputationRequest(
        [pynnet3.IoSpecification(k, v, input_deriv) for k, v in inputs.items()],
        [pynnet3.IoSpecification(k, v, output_deriv) for k, v in outputs.items()],
        need_model_derivative=model, store_component_stats=stats)


def random_data(nnet, req, seed: int = 0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name))).astype(dtype)
              for s in req.inputs}
    derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
              .astype(dtype) for s in req.outputs if s.has_deriv}
    return inputs, derivs


def run_on_copy(nnet, comp, inputs, derivs, dtype=np.float64):
    """Run on a deep copy of ``nnet`` with its random components reseeded, so two
    runs see the same model state and draw the same masks."""
    model = copy.deepcopy(nnet)
    model.seed_random_components(0)
    return pynnet3.run(model, comp, inputs, derivs, dtype=dtype)


def assert_same_results(a, b, rtol: float = 1e-9, what: str = "") -> None:
    """Outputs, input derivatives and gradients of two RunResults agree (relative
    to the largest magnitude of each array)."""
    for kind in ("outputs", "input_derivs"):
        da, db = getattr(a, kind), getattr(b, kind)
        assert set(da) == set(db), f"{what}: {kind} names {sorted(da)} vs {sorted(db)}"
        for k in da:
            _close(da[k], db[k], rtol, f"{what} {kind}[{k}]")
    assert set(a.gradients) == set(b.gradients), f"{what}: gradient components differ"
    for comp, ga in a.gradients.items():
        for p, v in ga.items():
            _close(v, b.gradients[comp][p], rtol, f"{what} grad {comp}.{p}")


def _close(x, y, rtol, what):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape, f"{what}: shape {x.shape} vs {y.shape}"
    scale = max(float(np.abs(y).max(initial=0.0)), 1e-6)
    err = float(np.abs(x - y).max(initial=0.0))
    assert err <= rtol * scale, f"{what}: max diff {err:g} (scale {scale:g})"


def checker():
    """pynnet3's computation checker, or None while it does not exist."""
    if importlib.util.find_spec("pynnet3.analysis.checker") is None:
        return None
    from pynnet3.analysis.checker import check_computation

    return check_computation


def check(comp, nnet, context: str = "") -> None:
    fn = checker()
    if fn is not None:
        fn(comp, nnet, context=context)
