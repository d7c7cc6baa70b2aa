"""fuse-spliced-affine-as-tdnn: an affine layer over one node at several time
offsets becomes a TDNN layer over that node (weights' column blocks reordered by
offset), with the same outputs and input derivatives and fewer commands."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.rewrite import NetworkRewriter, find_rule, why_not
from tests.graphopt.common import (
    assert_equivalent,
    assert_roundtrip,
    build,
    only,
    optimize,
    request_for,
    types_of,
)

SPLICED = """
input-node name=input dim=4
component name=a type=NaturalGradientAffineComponent input-dim=12 output-dim=5
component-node name=a component=a input=Append(Offset(input, 2), Offset(input, -1), input)
component name=tanh type=TanhComponent dim=5
component-node name=t component=tanh input=a
output-node name=output input=t
"""


def test_spliced_affine_becomes_tdnn(tmp_path):
    nnet = build(SPLICED)
    opt, report = optimize(nnet, only("fusion", keep_derivatives=True))
    assert report.rules_applied() == {"fuse-spliced-affine-as-tdnn": 1}
    assert types_of(opt)["a"] == "TdnnComponent"
    assert str(opt.node("a").descriptor) == "input"
    tdnn = opt.components[opt.node("a").component]
    assert tdnn.time_offsets == [-1, 0, 2]
    w = nnet.components["a"].linear_params
    # blocks reordered by offset: (-1 -> block 1, 0 -> block 2, 2 -> block 0)
    np.testing.assert_array_equal(tdnn.linear_params,
                                  np.hstack([w[:, 4:8], w[:, 8:12], w[:, 0:4]]))
    np.testing.assert_array_equal(tdnn.bias_params, nnet.components["a"].bias_params)
    assert_equivalent(nnet, opt, derivatives=True)
    assert_roundtrip(nnet, opt, tmp_path)
    req = request_for(nnet)
    # (the splice copies are what fusion removes; the output's reordering gather,
    # which hoist_output_permutations folds into those copies, is left out here)
    plain = pynnet3.OptimizeOptions(hoist_output_permutations=False)
    assert pynnet3.compile(opt, req, optimize=plain).stats()["num_commands"] < \
        pynnet3.compile(nnet, req, optimize=plain).stats()["num_commands"]


def test_not_spliced_inputs_stay_affine():
    rule = find_rule("fuse-spliced-affine-as-tdnn")
    single = build(SPLICED.replace("input-dim=12", "input-dim=4").replace(
        "Append(Offset(input, 2), Offset(input, -1), input)", "Offset(input, 1)"))
    assert "reads a single frame" in why_not(NetworkRewriter(single.copy()), rule, "a")
    repeated = build(SPLICED.replace("Offset(input, 2), Offset(input, -1), input",
                                     "input, Offset(input, -1), input"))
    assert "repeat" in why_not(NetworkRewriter(repeated.copy()), rule, "a")
    mixed = build(SPLICED.replace("Offset(input, 2), Offset(input, -1), input",
                                  "Offset(input, 2), Round(input, 2), input"))
    assert "not one node at time offsets" in why_not(NetworkRewriter(mixed.copy()), rule, "a")
    for nnet in (single, repeated, mixed):
        opt, report = optimize(nnet, only("fusion"))
        assert report.rules_applied() == {}
        assert types_of(opt)["a"] == "NaturalGradientAffineComponent"
