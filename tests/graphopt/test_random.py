"""Every network pass on random networks (pynnet3.testing.random_nets): each pass
alone and all together, in test mode (so BatchNorm and dropout are foldable), must
give a network whose computations pass the checker and whose outputs -- and with
keep_derivatives its input derivatives -- equal the original's (float64 runs, so
the only difference is the float32 rounding of folded parameters)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import pynnet3
from pynnet3 import NetworkOptions, NetworkReport
from pynnet3.graphopt.meta import PASS_ORDER
from pynnet3.testing.random_nets import case_for_seed
from tests.graphopt.common import only, rel

SEEDS = range(60)
TOL = 1e-5

VARIANTS = [("all", NetworkOptions()),
            ("all+derivatives", NetworkOptions(keep_derivatives=True))] + \
    [(name, only(name)) for name in PASS_ORDER]


def test_variants_cover_every_pass():
    assert {name for name, _ in VARIANTS} >= set(PASS_ORDER)


def network_in_test_mode(seed: int):
    """The seed's network in test mode. BatchNorm without statistics would invent
    random ones from an unseeded generator; give it seeded ones first."""
    case = case_for_seed(seed)
    nnet = case.build_nnet()
    rng = np.random.default_rng(seed)
    for comp in nnet.components.values():
        parts = comp.sub_components() if comp.type_name == "CompositeComponent" else [comp]
        for c in parts:
            if c.type_name == "BatchNormComponent" and c.count == 0:
                c.count = 1.0
                c.stats_sum = rng.standard_normal(c.block_dim)
                c.stats_sumsq = rng.random(c.block_dim) + c.stats_sum ** 2 + 0.1
    nnet.set_test_mode(True)
    return case, nnet


def _run(nnet, case):
    comp = pynnet3.compile(nnet, case.request, optimize=True, check=True)
    return pynnet3.run(nnet, comp, case.inputs, case.output_derivs, dtype=np.float64)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_network(seed):
    case, nnet = network_in_test_mode(seed)
    original = nnet.to_bytes()
    optimized = {name: pynnet3.optimize_network(nnet, opts) for name, opts in VARIANTS}
    assert nnet.to_bytes() == original
    want = _run(nnet, case)
    for name, opt in optimized.items():
        if opt.to_bytes() == original:
            continue  # nothing changed: nothing to compare
        got = _run(opt, case)
        assert set(got.outputs) == set(want.outputs), name
        for out, value in want.outputs.items():
            err = rel(got.outputs[out], value)
            assert err <= TOL, f"seed {seed}, {name}: output {out!r} off by {err:.3g}"
        if name == "all+derivatives":
            assert set(got.input_derivs) == set(want.input_derivs)
            for inp, value in want.input_derivs.items():
                err = rel(got.input_derivs[inp], value)
                assert err <= TOL, f"seed {seed}: derivative of {inp!r} off by {err:.3g}"


def test_random_networks_exercise_the_passes():
    """The seeds above are not vacuous: over them every pass changes some network,
    and the fold / shatter / fusion rules fire. Each result is a fixed point (a
    second run changes nothing) and the same every time."""
    changed: Counter = Counter()
    rules: Counter = Counter()
    for seed in SEEDS:
        _, nnet = network_in_test_mode(seed)
        report = NetworkReport()
        opt = pynnet3.optimize_network(nnet, report=report)
        changed.update({p.name for p in report.passes if p.changes})
        rules.update(report.rules_applied())
        again = NetworkReport()
        assert pynnet3.optimize_network(opt, report=again).to_bytes() == opt.to_bytes(), seed
        assert again.rules_applied() == {} and again.iterations == 1, seed
        assert pynnet3.optimize_network(nnet).to_bytes() == opt.to_bytes(), seed
    assert set(changed) >= {"pruning", "shatter", "constant_folding", "arithmetic",
                            "parameter_fusion"}, changed
    assert rules["shatter-composite"] > 0, rules
    assert rules["fuse-sibling-affines"] > 0, rules
    assert sum(v for k, v in rules.items() if k.startswith("fold-")) > 0, rules
