"""Differential tests of the optimizer on random networks (pynnet3.testing).

Every random case is compiled once; the unoptimized run is the reference and
each optimizer variant (defaults, every bool option off in turn, no memory
compression, derivative-time windows) must reproduce its outputs, input
derivatives, gradients and stored statistics (float64, relative 1e-10 / 1e-8).
The checker runs on the unoptimized computation and after every pass of the
default variant (of every variant for a few seeds: it costs more than the rest).
A failure prints seed, variant, array, error, the first pass that breaks it and
how to reproduce the case.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

import numpy as np
import pytest

from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import PIPELINE, OptimizeOptions, register_pass
from pynnet3.testing import Variant, case_for_seed, default_variants, run_differential
from pynnet3.testing.differential import _mismatch, checker_available, clone_computation

SEEDS = range(40)
FULL_CHECK_SEEDS = range(1000, 1004)
DESCRIPTOR_KINDS = ("Append", "Offset", "Sum", "IfDefined", "Failover", "Round",
                    "ReplaceIndex", "Switch", "Const", "Scale")


@cache
def _case(seed: int):
    return case_for_seed(seed)


def _report(case, findings) -> str:
    lines = [str(f) for f in findings[:25]]
    if len(findings) > 25:
        lines.append(f"... {len(findings)} findings in all")
    lines.append(f"reproduce: python benchmarks/soak_optimizer.py --show {case.seed}")
    lines.append(case.describe())
    return "\n".join(lines)


@pytest.mark.parametrize("seed", SEEDS)
def test_optimized_matches_unoptimized(seed):
    case = _case(seed)
    findings = run_differential(case, check=("default",))
    assert not findings, _report(case, findings)


@pytest.mark.parametrize("seed", FULL_CHECK_SEEDS)
def test_checker_after_every_pass_of_every_variant(seed):
    if not checker_available():
        pytest.fail("pynnet3.analysis.checker is missing")
    case = case_for_seed(seed)
    findings = run_differential(case, check=True)
    assert not findings, _report(case, findings)


@pytest.mark.parametrize("seed", (5, 9, 21))
def test_float32_runs_agree_within_float32_tolerance(seed):
    case = _case(seed)
    findings = run_differential(case, dtype=np.float32, check=False)
    assert not findings, _report(case, findings)


# -- the generator ---------------------------------------------------------------------------

def _features(case) -> set[str]:
    """What a case exercises, read from its config and request (not from what the
    generator says it did)."""
    nnet = case.build_nnet()
    req = case.request
    out = {k for k in DESCRIPTOR_KINDS if re.search(rf"\b{k}\(", case.config)}
    if nnet.is_recurrent():
        out.add("recurrence")
    if any(n.kind == "dim-range-node" for n in nnet.nodes):
        out.add("dim-range")
    used = {n.component for n in nnet.nodes if n.kind == "component-node"}
    if any(not nnet.components[c].is_simple() for c in used):
        out.add("non-simple")
    if "Offset(" in case.config and re.search(r"Offset\([^()]*, 0, [1-9]\)", case.config):
        out.add("x-offset")
    if nnet.has_node("ivector"):
        out.add("ivector-present" if req.input("ivector") else "ivector-absent")
    out.add("model-deriv" if req.need_model_derivative else "no-model-deriv")
    out.add("input-deriv" if any(s.has_deriv for s in req.inputs) else "no-input-deriv")
    if any(s.has_deriv for s in req.outputs):
        out.add("output-deriv")
    if req.store_component_stats:
        out.add("store-stats")
    if len(req.outputs) > 1:
        out.add("multiple-outputs")
    ns = np.unique(np.concatenate([s.indexes[:, 0] for s in req.inputs]))
    if len(ns) > 1:
        out.add("several-n")
    for s in req.outputs:
        for n in np.unique(s.indexes[:, 0]):
            ts = np.sort(s.indexes[s.indexes[:, 0] == n, 1])
            if len(ts) > 1 and (np.diff(ts) > 1).any():
                out.add("irregular-t")
    return out


def test_generator_covers_what_it_promises():
    counts = Counter()
    for seed in SEEDS:
        counts.update(_features(_case(seed)))
    wanted = set(DESCRIPTOR_KINDS) | {
        "recurrence", "dim-range", "non-simple", "x-offset", "ivector-present",
        "ivector-absent", "model-deriv", "no-model-deriv", "input-deriv", "no-input-deriv",
        "output-deriv", "store-stats", "multiple-outputs", "several-n", "irregular-t"}
    missing = sorted(wanted - set(counts))
    assert not missing, f"never generated over seeds {SEEDS}: {missing}; counts {counts}"


def test_generator_is_deterministic():
    for seed in (3, 17):
        a, b = case_for_seed(seed), case_for_seed(seed)
        assert a.config == b.config
        assert a.request.to_json() == b.request.to_json()
        for name in a.inputs:
            np.testing.assert_array_equal(a.inputs[name], b.inputs[name])
        for name in a.output_derivs:
            np.testing.assert_array_equal(a.output_derivs[name], b.output_derivs[name])
    assert case_for_seed(3).config != case_for_seed(4).config


def test_variants_cover_every_bool_option():
    names = {v.name for v in default_variants(_case(0))}
    for field in OptimizeOptions.field_names():
        if isinstance(getattr(OptimizeOptions(), field), bool) and getattr(
                OptimizeOptions(), field):
            assert f"without:{field}" in names
    assert {"default", "memory_compression_level=0", "deriv_time_wide",
            "deriv_time_narrow"} <= names


# -- the harness can fail ----------------------------------------------------------------------

def _sabotage(computation, nnet, options) -> str:
    """A broken pass: overwrite the first (value) output with a constant."""
    for i, cmd in enumerate(computation.commands):
        if cmd.type is CT.PROVIDE_OUTPUT and not cmd.is_deriv:
            computation.commands.insert(i, Command(CT.SET_CONST, dst=cmd.src, alpha=0.5))
            return "sabotaged an output"
    return ""


def test_a_broken_pass_is_found_and_blamed():
    case = _case(0)
    register_pass("sabotage", _sabotage, lambda o: True)
    try:
        findings = run_differential(case, [Variant("default", OptimizeOptions())], check=False)
    finally:
        PIPELINE[:] = [p for p in PIPELINE if p.name != "sabotage"]
    assert findings, "a pass that overwrites an output went unnoticed"
    assert any(f.array.startswith("output:") for f in findings)
    assert {f.pass_name for f in findings} == {"sabotage"}
    assert all(f.seed == 0 and f.variant == "default" for f in findings)


def test_mismatch_tolerates_rounding_but_not_errors():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 4))
    assert _mismatch(a, a + 1e-14, 1e-10) is None
    assert _mismatch(a, a * (1 + 1e-6), 1e-10) is not None
    assert _mismatch(a, a[:4], 1e-10).startswith("shape")
    assert _mismatch(a, None, 1e-10) == "missing"
    b = a.copy()
    b[1, 2] = np.nan
    assert "NaN" in _mismatch(a, b, 1e-10)
    assert _mismatch(np.zeros(3), np.full(3, 1e-18), 1e-10) is None


def test_clone_is_independent():
    case = _case(1)
    nnet = case.build_nnet()
    from pynnet3.compiler import compile_computation

    base = compile_computation(nnet, case.request)
    before = str(base)
    copy = clone_computation(base)
    copy.commands[0].alpha = 123.0
    copy.matrices[1].rows += 1
    if copy.indexes:
        copy.indexes[0][:] = -1
    assert str(base) == before
