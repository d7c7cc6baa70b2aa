"""Passes and rules working together: a rewrite made early must not keep a better
rewrite from happening later (the meta-optimizer repeats the passes so that one
pass's result can feed another's)."""

from __future__ import annotations

from pynnet3 import NetworkOptions
from pynnet3.graphopt import network_counts
from tests.graphopt.common import assert_equivalent, build, optimize
from tests.graphopt.test_passes import EVERYTHING


def test_tdnn_conversion_does_not_block_a_merge():
    """In EVERYTHING, c reads Scale(0.5, b) until arithmetic moves the scale into c's
    weights; then c reads b plainly and the two merge (18*3 multiply-adds per frame
    instead of 18*5 + 5*3)."""
    nnet = build(EVERYTHING)
    best, _ = optimize(nnet, NetworkOptions(fusion=False))
    opt, report = optimize(nnet)
    assert_equivalent(nnet, opt)
    assert len(opt.components) <= len(best.components), report.rules_applied()
    assert network_counts(opt)["num_parameters"] <= network_counts(best)["num_parameters"]
