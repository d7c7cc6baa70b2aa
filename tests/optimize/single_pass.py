"""Helpers for testing one optimizer pass on its own: compile unoptimized, apply the
pass (then renumber, as the driver does), run both versions on the same data and
compare. Expected values always come from the unoptimized run (or from an
independent reference computation built by the test)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

import pynnet3
from pynnet3.analysis import check_computation
from pynnet3.computation import NnetComputation
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.renumber import renumber
from tests.reference import REF, require_reference


def load_reference(name: str):
    """(nnet, request, inputs, output_derivs) of reference case ``name`` (e.g.
    ``generated/case_24``), with the model of the case or of its parent folder."""
    require_reference()
    case = REF / name
    base = case if (case / "model.txt").exists() else case.parent
    nnet = pynnet3.read_nnet(base / "model.txt")
    request = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("output_deriv:")}
    return nnet, request, inputs, derivs


def apply_pass(fn, nnet, computation: NnetComputation,
               options: OptimizeOptions | None = None) -> str:
    """Run pass ``fn`` alone on ``computation`` (in place), renumber, run the
    checker; returns the pass's description."""
    desc = fn(computation, nnet, options or OptimizeOptions())
    if desc:
        renumber(computation)
    check_computation(computation, nnet, context=f"after {fn.__name__}")
    return desc


def histogram(c: NnetComputation) -> Counter:
    return Counter(cmd.type for cmd in c.commands)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-6))


def assert_same_results(got, want, value_rtol: float = 2e-6, grad_rtol: float = 1e-4) -> None:
    """Outputs and input derivatives agree to float rounding (max-abs relative),
    gradients to ``grad_rtol`` (norm relative). A component missing from ``got``'s
    gradients counts as a zero gradient (its backprops may have been removed)."""
    assert set(got.outputs) == set(want.outputs)
    assert set(got.input_derivs) == set(want.input_derivs)
    for kind in ("outputs", "input_derivs"):
        for name, ref in getattr(want, kind).items():
            err = _rel(getattr(got, kind)[name], ref)
            assert err <= value_rtol, f"{kind}[{name}]: rel error {err:.3g}"
    assert set(got.gradients) <= set(want.gradients)
    for comp, params in want.gradients.items():
        for p, ref in params.items():
            ours = got.gradients.get(comp, {}).get(p, np.zeros_like(ref))
            ref64 = np.asarray(ref, np.float64)
            err = float(np.linalg.norm(ours - ref64) / max(np.linalg.norm(ref64), 1e-6))
            assert err <= grad_rtol, f"grad {comp}:{p}: rel error {err:.3g}"


def run(nnet, c: NnetComputation, inputs: dict, derivs: dict, dtype=np.float32):
    return pynnet3.run(nnet, c, inputs=dict(inputs), output_derivs=dict(derivs), dtype=dtype)


def compare_pass(fn, nnet, request, inputs: dict, derivs: dict,
                 options: OptimizeOptions | None = None, dtype=np.float32, **tol):
    """Compile unoptimized twice, apply ``fn`` to one copy, run both and assert they
    agree. Returns (unoptimized computation, rewritten computation, description)."""
    before = pynnet3.compile(nnet, request, optimize=False)
    after = pynnet3.compile(nnet, request, optimize=False)
    desc = apply_pass(fn, nnet, after, options)
    want = run(nnet, before, inputs, derivs, dtype)
    got = run(nnet, after, inputs, derivs, dtype)
    assert_same_results(got, want, **tol)
    return before, after, desc

