"""Every Kaldi reference case on the torch backend (CPU), issue 17: our outputs,
input derivatives and gradients must match Kaldi's with the tolerances the NumPy
backend is held to, the optimized and unoptimized computations must agree, and
the torch results must equal the NumPy backend's to float32 rounding.

Results come back as torch tensors; they are compared through ``.cpu().numpy()``.
A CUDA variant runs the same comparison on a GPU when there is one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pynnet3
from tests.conformance.test_reference_cases import CASES, TOL, _model, rel_err
from tests.reference import REF, ref_params

torch = pytest.importorskip("torch")

# torch vs NumPy backend, same computation, float32: the same math in a different
# order of float32 additions (BLAS blocking, reductions).
PARITY = {"output": 1e-5, "input_deriv": 1e-4, "grad": 1e-4}


def _numpy(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def _load(case: Path, tmp_path: Path):
    nnet = _model(case, tmp_path)
    request = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("output_deriv:")}
    return nnet, request, arrays, inputs, derivs


def _pick(res, kind: str, name: str):
    if kind == "output":
        return res.outputs.get(name)
    if kind == "input_deriv":
        return res.input_derivs.get(name)
    comp_name, _, param = name.partition(":")
    return res.gradients.get(comp_name, {}).get(param)


def _compare_with_kaldi(res, arrays: dict) -> list[str]:
    failures = []
    for key, ref in arrays.items():
        kind, _, name = key.partition(":")
        if kind not in TOL:
            continue
        ours = _pick(res, kind, name)
        err = float("inf") if ours is None else rel_err(_numpy(ours), ref)
        if not err <= TOL[kind]:
            failures.append(f"{key}: rel error {err:.3g} > {TOL[kind]:g}")
    return failures


def _check_case(case: Path, tmp_path: Path, device: str) -> None:
    nnet, request, arrays, inputs, derivs = _load(case, tmp_path)
    results = {}
    for opt in (False, True):
        comp = pynnet3.compile(nnet, request, optimize=opt)
        # inputs handed over as tensors on the device, as a torch user would
        t_in = {k: torch.from_numpy(v).to(device) for k, v in inputs.items()}
        t_d = {k: torch.from_numpy(v).to(device) for k, v in derivs.items()}
        results[opt] = pynnet3.run(nnet, comp, inputs=t_in, output_derivs=t_d,
                                   backend="torch", device=device)
    res = results[True]
    for value in res.outputs.values():
        assert isinstance(value, torch.Tensor) and value.device.type == device
    failures = _compare_with_kaldi(res, arrays)
    unopt = results[False]
    pairs = [(f"output:{k}", res.outputs.get(k), v, 1e-5) for k, v in unopt.outputs.items()]
    pairs += [(f"input_deriv:{k}", res.input_derivs.get(k), v, 1e-5)
              for k, v in unopt.input_derivs.items()]
    pairs += [(f"grad:{c}:{p}", res.gradients.get(c, {}).get(p), v, 1e-4)
              for c, g in unopt.gradients.items() for p, v in g.items()]
    for key, ours, theirs, tol in pairs:
        err = float("inf") if ours is None else rel_err(_numpy(ours), _numpy(theirs))
        if not err <= tol:
            failures.append(f"opt_vs_unopt:{key}: rel error {err:.3g} > {tol:g}")
    # the NumPy backend on the same optimized computation
    comp = pynnet3.compile(nnet, request, optimize=True)
    ref = pynnet3.run(nnet, comp, inputs=dict(inputs), output_derivs=dict(derivs))
    for key in arrays:
        kind, _, name = key.partition(":")
        if kind not in PARITY:
            continue
        want, have = _pick(ref, kind, name), _pick(res, kind, name)
        if want is None:
            continue
        err = float("inf") if have is None else rel_err(_numpy(have), want)
        if not err <= PARITY[kind]:
            failures.append(f"torch_vs_numpy:{key}: rel error {err:.3g} > {PARITY[kind]:g}")
    assert not failures, f"case {case.relative_to(REF)} on torch {device}: " + \
        "; ".join(failures)


@pytest.mark.parametrize("case", ref_params(CASES, "conformance cases"),
                         ids=lambda c: str(c.relative_to(REF)))
def test_reference_case_torch_cpu(case: Path, tmp_path: Path):
    _check_case(case, tmp_path, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("case", ref_params(CASES, "conformance cases"),
                         ids=lambda c: str(c.relative_to(REF)))
def test_reference_case_torch_cuda(case: Path, tmp_path: Path):
    _check_case(case, tmp_path, "cuda")


@pytest.mark.parametrize("case", ref_params(CASES, "conformance cases"),
                         ids=lambda c: str(c.relative_to(REF)))
def test_reference_case_torch_float64_equals_numpy(case: Path, tmp_path: Path):
    """In float64 the two backends run the same math to ~1e-10 (a different order of
    additions only): every output, input derivative and gradient."""
    nnet, request, arrays, inputs, derivs = _load(case, tmp_path)
    comp = pynnet3.compile(nnet, request, optimize=True)
    ref = pynnet3.run(nnet, comp, dict(inputs), dict(derivs), dtype=np.float64)
    got = pynnet3.run(nnet, comp, dict(inputs), dict(derivs), dtype=np.float64,
                      backend="torch")
    pairs = [(f"output:{k}", v, got.outputs.get(k)) for k, v in ref.outputs.items()]
    pairs += [(f"input_deriv:{k}", v, got.input_derivs.get(k))
              for k, v in ref.input_derivs.items()]
    pairs += [(f"grad:{c}:{p}", v, got.gradients.get(c, {}).get(p))
              for c, g in ref.gradients.items() for p, v in g.items()]
    assert pairs
    failures = []
    for key, want, have in pairs:
        assert have is None or have.dtype == torch.float64, key
        err = float("inf") if have is None else rel_err(_numpy(have), want)
        if not err <= 1e-10:
            failures.append(f"{key}: rel error {err:.3g}")
    assert not failures, f"case {case.relative_to(REF)} float64: " + "; ".join(failures)
