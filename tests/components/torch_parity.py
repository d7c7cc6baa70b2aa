"""Helpers for the torch-backend parity tests of the components (issue 17).

Each component type's math is written once against the array namespace of the
arrays it is handed; these helpers run one network on the NumPy backend and on
the torch backend (CPU) and compare outputs, input derivatives and parameter
gradients: float64 to ~1e-10 (the same math, different BLAS), float32 to float32
rounding. They also run the Kaldi reference cases of a component type on the
torch backend against Kaldi's own arrays, with the conformance tolerances.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

import pynnet3
from tests.compiler import nets as N
from tests.reference import HAVE_REFERENCE, REF

# (output, input derivative, gradient) relative-error bounds per dtype
TOL = {np.dtype(np.float64): (1e-10, 1e-10, 1e-10),
       np.dtype(np.float32): (1e-5, 1e-4, 1e-4)}
# the conformance tests' bounds against Kaldi's arrays
KALDI_TOL = {"output": 1e-4, "input_deriv": 1e-3, "grad": 1e-3}


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape or not np.isfinite(ours).all():
        return float("inf")
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-6))


def torch_devices() -> list[str]:
    """The devices the parity checks run on: the CPU, and CUDA when there is one
    (the CUDA checks then also prove that propagate/backprop never make the host wait
    for the GPU)."""
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run_torch(nnet, comp, inputs, derivs, dtype, device="cpu"):
    """``pynnet3.run`` on the torch backend."""
    return pynnet3.run(nnet, comp, dict(inputs), dict(derivs), backend="torch", dtype=dtype,
                       device=device)


def _as_numpy(value):
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return np.asarray(value)


def compare_results(ref, got, dtype, label: str = "") -> None:
    """Assert that two RunResults agree (same keys; errors within TOL[dtype])."""
    t_out, t_din, t_grad = TOL[np.dtype(dtype)]
    failures = []
    assert set(got.outputs) == set(ref.outputs), label
    assert set(got.input_derivs) == set(ref.input_derivs), label
    assert set(got.gradients) == set(ref.gradients), label
    pairs = [(f"output:{k}", v, got.outputs[k], t_out) for k, v in ref.outputs.items()]
    pairs += [(f"input_deriv:{k}", v, got.input_derivs[k], t_din)
              for k, v in ref.input_derivs.items()]
    for c, g in ref.gradients.items():
        assert set(got.gradients[c]) == set(g), f"{label} {c}"
        pairs += [(f"grad:{c}:{p}", v, got.gradients[c][p], t_grad) for p, v in g.items()]
    for key, want, have, tol in pairs:
        err = rel_err(_as_numpy(have), _as_numpy(want))
        if not err <= tol:
            failures.append(f"{key}: rel error {err:.3g} > {tol:g}")
    assert not failures, f"{label}: " + "; ".join(failures)


@contextlib.contextmanager
def _counting_uploads():
    """Counts, while active, the host arrays the torch namespace copies to a device:
    new index-table or parameter copies (``tables``) and per-call uploads of host
    values (``host values``, xp.asarray)."""
    from pynnet3.components import xp_torch

    counts = {"tables": 0, "host values": 0}
    remember, asarray = xp_torch._remember, xp_torch.asarray

    def counted_remember(*args, **kw):
        counts["tables"] += 1
        return remember(*args, **kw)

    def counted_asarray(*args, **kw):
        counts["host values"] += 1
        return asarray(*args, **kw)

    xp_torch._remember, xp_torch.asarray = counted_remember, counted_asarray
    try:
        yield counts
    finally:
        xp_torch._remember, xp_torch.asarray = remember, asarray


def check_network(config: str, inputs: dict, outputs: dict, *, seed: int = 0,
                  dtypes=(np.float64, np.float32), optimize: bool = True,
                  model_deriv: bool = True, input_deriv: bool = True,
                  prepare=None) -> None:
    """Build ``config``, request ``outputs`` (name -> indexes) from ``inputs`` (name ->
    indexes) with output, input and model derivatives, and check that the torch
    backend gives what the NumPy backend gives, in each dtype; a second torch run
    uploads no index table, parameter or host value again. ``prepare(nnet)`` may
    change the network (e.g. give it nonzero statistics) before the runs."""
    nnet = pynnet3.Nnet.from_config(config, seed=seed)
    if prepare is not None:
        prepare(nnet)
    # (no derivative wanted: a forward-only computation, as in decoding)
    req = N.request(inputs, outputs, input_deriv, input_deriv or model_deriv, model_deriv)
    comp = pynnet3.compile(nnet, req, optimize=optimize)
    for dtype in dtypes:
        rng = np.random.default_rng(seed + 1)
        x = N.random_inputs(nnet, req, rng, dtype)
        d = N.random_output_derivs(nnet, req, rng, dtype)
        ref = pynnet3.run(nnet, comp, dict(x), dict(d), dtype=dtype)
        for device in torch_devices():
            got = run_torch(nnet, comp, x, d, dtype, device)
            compare_results(ref, got, dtype, f"{device} {np.dtype(dtype).name}")
            with _counting_uploads() as uploads:
                again = run_torch(nnet, comp, x, d, dtype, device)
            compare_results(ref, again, dtype, f"{device} {np.dtype(dtype).name} again")
            # Index tables and parameters reached the device in the first run; a
            # second run of the same computation uploads none of them again.
            assert uploads == {"tables": 0, "host values": 0}, uploads


def reference_cases(*prefixes: str) -> list[Path]:
    """The kaldi-reference component cases whose names start with one of ``prefixes``."""
    root = REF / "components"
    if not HAVE_REFERENCE or not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir()
                  and any(p.name.startswith(x + "_") for x in prefixes)
                  and (p / "arrays.npz").exists())


def check_reference_case(case: Path) -> None:
    """A Kaldi component case on the torch backend: Kaldi's arrays within the
    conformance tolerances, and the NumPy backend's within float32 parity."""
    nnet = pynnet3.read_nnet(case / "model.txt")
    request = pynnet3.ComputationRequest.from_json(
        json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items()
              if k.startswith("output_deriv:")}
    comp = pynnet3.compile(nnet, request, optimize=True)
    got = run_torch(nnet, comp, inputs, derivs, np.float32)
    failures = []
    for key, want in arrays.items():
        kind, _, name = key.partition(":")
        if kind == "output":
            have, tol = got.outputs.get(name), KALDI_TOL["output"]
        elif kind == "input_deriv":
            have, tol = got.input_derivs.get(name), KALDI_TOL["input_deriv"]
        elif kind == "grad":
            cname, _, param = name.partition(":")
            have, tol = got.gradients.get(cname, {}).get(param), KALDI_TOL["grad"]
        else:
            continue
        err = float("inf") if have is None else rel_err(_as_numpy(have), want)
        if not err <= tol:
            failures.append(f"{key}: rel error {err:.3g} > {tol:g}")
    assert not failures, f"{case.name} on torch: " + "; ".join(failures)
    ref = pynnet3.run(nnet, comp, dict(inputs), dict(derivs))
    compare_results(ref, got, np.float32, case.name)


def reference_params(*prefixes: str) -> list:
    """``pytest.mark.parametrize`` values: the cases, or one skipped parameter."""
    cases = reference_cases(*prefixes)
    if not cases:
        reason = "Kaldi reference data not found" if not HAVE_REFERENCE else \
            f"no reference case {prefixes}"
        return [pytest.param(None, id="no-reference", marks=pytest.mark.skip(reason=reason))]
    return cases


def _call_component(comp, pre, arrays, to, strict: bool) -> dict:
    """propagate + backprop on ``to``-converted copies of ``(y0, x, dy, dx0)``;
    ``strict``: under torch's sync debug mode "error" (CUDA)."""
    import torch

    y0, x, dy, dx0 = arrays
    y, xs, dys, dx = to(y0), to(x), to(dy), to(dx0)
    grad = {k: to(np.zeros(v.shape, x.dtype)) for k, v in comp.params().items()}
    if strict:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        memo = comp.propagate(pre, xs, y)
        comp.backprop(pre, xs, y, dys, memo, grad if comp.is_updatable() else None, dx)
    finally:
        if strict:
            torch.cuda.set_sync_debug_mode("default")
    return {"output": _as_numpy(y), "input_deriv": _as_numpy(dx),
            **{f"grad:{k}": _as_numpy(v) for k, v in grad.items()}}


def check_component(comp, input_indexes, output_indexes, *, seed: int = 0,
                    dtypes=(np.float64, np.float32), need_backprop: bool = True,
                    in_value=None) -> None:
    """One component's propagate and backprop called directly with NumPy arrays and
    with torch tensors (CPU; CUDA when present), on the same precomputed indexes (any
    row order, absent inputs included): outputs, input derivatives and gradients
    agree. The output and input-derivative matrices start with the same random
    values in both, so "adds" and "assigns" must be the same too. On CUDA the second
    call runs with torch's sync debug mode set to "error": a propagate or backprop
    that makes the host wait for the GPU fails (the first call may upload the
    component's tables and parameters)."""
    torch = pytest.importorskip("torch")
    input_indexes = np.asarray(input_indexes, dtype=np.int64)
    output_indexes = np.asarray(output_indexes, dtype=np.int64)
    if comp.is_simple():
        pre = None
    else:
        pre = comp.precompute_indexes(input_indexes, output_indexes, need_backprop)
    for dtype in dtypes:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((len(input_indexes), comp.input_dim)).astype(dtype) \
            if in_value is None else np.asarray(in_value, dtype)
        y0 = rng.standard_normal((len(output_indexes), comp.output_dim)).astype(dtype)
        dy = rng.standard_normal(y0.shape).astype(dtype)
        dx0 = rng.standard_normal(x.shape).astype(dtype)
        arrays = (y0, x, dy, dx0)
        want_all = _call_component(comp, pre, arrays, lambda a: a.copy(), False)
        t_out, t_din, t_grad = TOL[np.dtype(dtype)]
        for device in torch_devices():
            def to(a, device=device):
                return torch.from_numpy(a.copy()).to(device)
            got_all = _call_component(comp, pre, arrays, to, False)
            if device != "cpu":  # tables and parameters are on the device now
                got_all = _call_component(comp, pre, arrays, to, True)
            for key, want in want_all.items():
                tol = t_out if key == "output" else t_din if key == "input_deriv" else t_grad
                err = rel_err(got_all[key], want)
                assert err <= tol, \
                    f"{comp.type_name} {device} {np.dtype(dtype).name} {key}: {err:.3g}"
