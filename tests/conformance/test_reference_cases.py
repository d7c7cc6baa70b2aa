"""Every Kaldi reference case: our outputs, input derivatives and gradients must
match Kaldi's (relative error ||ours - kaldi|| / ||kaldi||), and the optimized and
unoptimized computations must agree. Random (Kaldi-RNG) cases are skipped, as the
shared conformance tool does."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import pynnet3
from tests.reference import REF, needs_reference, ref_params

TOL = {"output": 1e-4, "input_deriv": 1e-3, "grad": 1e-3}


def _cases() -> list[Path]:
    if not REF.is_dir():
        return []
    out = []
    for req in sorted(REF.rglob("request.json")):
        case = req.parent
        stats = case / "stats.json"
        if stats.exists() and json.loads(stats.read_text()).get("random"):
            continue
        if not (case / "arrays.npz").exists():
            continue
        if not any((b / m).exists() for b in (case, case.parent)
                   for m in ("model.txt", "model.txt.gz")):
            continue
        with np.load(case / "arrays.npz") as z:
            if any(k.startswith("output:") for k in z.files):
                out.append(case)
    return out


CASES = _cases()

# Cases per top-level folder, as the reference README states them: generated/case_<seed>
# for seeds 1..40 (skipped.txt empty); 85 components/ cases, less Dropout_2 (moved to
# random/, Kaldi-RNG, not compared); realistic/<4 networks>/{decode,train}.
EXPECTED_CASES = {"generated": 40, "components": 84, "realistic": 8}


@needs_reference
def test_every_reference_case_is_found():
    """A partly missing reference folder fails here rather than shrinking the run."""
    found: dict[str, int] = {}
    for case in CASES:
        top = case.relative_to(REF).parts[0]
        found[top] = found.get(top, 0) + 1
    assert found == EXPECTED_CASES


def _model(case: Path, tmp_path: Path) -> pynnet3.Nnet:
    for base in (case, case.parent):
        if (base / "model.txt").exists():
            return pynnet3.read_nnet(base / "model.txt")
        gz = base / "model.txt.gz"
        if gz.exists():
            p = tmp_path / "model.txt"
            p.write_bytes(gzip.decompress(gz.read_bytes()))
            return pynnet3.read_nnet(p)
    raise FileNotFoundError(case)


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape or not np.isfinite(ours).all():
        return float("inf")
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-6))


@pytest.mark.parametrize("case", ref_params(CASES, "conformance cases"),
                         ids=lambda c: str(c.relative_to(REF)))
def test_reference_case(case: Path, tmp_path: Path):
    nnet = _model(case, tmp_path)
    request = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("output_deriv:")}
    results = {}
    for opt in (False, True):
        # the checker runs on the compiled computation and after every pass
        comp = pynnet3.compile(nnet, request, optimize=opt, check=True)
        results[opt] = pynnet3.run(nnet, comp, inputs=dict(inputs), output_derivs=dict(derivs))
    res = results[True]
    failures = []
    for key, ref in arrays.items():
        kind, _, name = key.partition(":")
        if kind == "output":
            ours, tol = res.outputs.get(name), TOL["output"]
        elif kind == "input_deriv":
            ours, tol = res.input_derivs.get(name), TOL["input_deriv"]
        elif kind == "grad":
            comp_name, _, param = name.partition(":")
            ours, tol = res.gradients.get(comp_name, {}).get(param), TOL["grad"]
        else:
            continue
        err = float("inf") if ours is None else rel_err(ours, ref)
        if not err <= tol:
            failures.append(f"{key}: rel error {err:.3g} > {tol:g}")
    unopt = results[False]
    pairs = [(f"output:{k}", res.outputs.get(k), v, 1e-5) for k, v in unopt.outputs.items()]
    pairs += [(f"input_deriv:{k}", res.input_derivs.get(k), v, 1e-5)
              for k, v in unopt.input_derivs.items()]
    pairs += [(f"grad:{c}:{p}", res.gradients.get(c, {}).get(p), v, 1e-4)
              for c, g in unopt.gradients.items() for p, v in g.items()]
    for key, ours, theirs, tol in pairs:
        err = float("inf") if ours is None else rel_err(ours, theirs)
        if not err <= tol:
            failures.append(f"opt_vs_unopt:{key}: rel error {err:.3g} > {tol:g}")
    assert not failures, f"case {case.relative_to(REF)}: " + "; ".join(failures)
