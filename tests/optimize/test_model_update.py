"""consolidate_model_update: several BACKPROPs of one simple updatable component become
derivative-only backprops plus one model-update backprop on stacked matrices.

Evidence: the unoptimized run (outputs and input derivatives to float rounding,
gradients to summation-order rounding; float64 runs agree to 1e-12), the checker,
and Kaldi's own optimized computations, whose numbers of kBackprop /
kBackpropNoModelUpdate commands the consolidated computation must reproduce."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from pynnet3.components.base import Flags
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.model_update import consolidate_model_update
from tests.compiler import nets
from tests.optimize.single_pass import compare_pass, histogram, load_reference
from tests.reference import REF

BP, BP_NO = CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE


@pytest.mark.parametrize("name", ["generated/case_24", "generated/case_6", "generated/case_40",
                                  "realistic/tdnn_lstm/train"])
def test_reference_cases_match_unoptimized_and_kaldi_backprop_counts(name):
    nnet, req, inputs, derivs = load_reference(name)
    before, after, desc = compare_pass(consolidate_model_update, nnet, req, inputs, derivs)
    assert desc.startswith("consolidated model update of")
    kaldi = json.loads((REF / name / "stats.json").read_text())["optimized"]["command_histogram"]
    h = histogram(after)
    assert (h[BP], h[BP_NO]) == (kaldi.get("kBackprop", 0), kaldi.get("kBackpropNoModelUpdate", 0))
    assert h[BP] < histogram(before)[BP]


def test_structure_of_the_consolidated_update():
    nnet, req, inputs, derivs = load_reference("realistic/tdnn_lstm/train")
    c = pynnet3.compile(nnet, req, optimize=False)
    node_rows = {}
    for cmd in c.commands:
        comp = nnet.node_map[cmd.node].component if cmd.node else ""
        if cmd.type is BP and nnet.components[comp].is_updatable():
            node_rows.setdefault(comp, []).append(c.submatrices[cmd.out_deriv].num_rows)
    consolidate_model_update(c, nnet, OptimizeOptions())
    updates = [(k, cmd) for k, cmd in enumerate(c.commands)
               if cmd.type is BP and len(node_rows.get(nnet.node_map[cmd.node].component, ())) > 1]
    assert len(updates) == 6
    for k, cmd in updates:
        comp = nnet.node_map[cmd.node].component
        assert cmd.in_deriv == 0 and cmd.memo == 0
        od = c.submatrices[cmd.out_deriv]
        assert od.num_rows == sum(node_rows[comp]) == c.matrices[od.matrix].rows
        assert c.matrices[od.matrix].is_deriv
        # each stacked matrix is allocated before its first copy and freed right after
        for s in (cmd.in_value, cmd.out_value, cmd.out_deriv):
            if not s:
                continue
            m = c.submatrices[s].matrix
            alloc = [j for j, x in enumerate(c.commands)
                     if x.type is CT.ALLOC_MATRIX and x.matrix == m]
            copies = [j for j, x in enumerate(c.commands) if x.type is CT.MATRIX_COPY
                      and x.dst and c.submatrices[x.dst].matrix == m]
            dealloc = [j for j, x in enumerate(c.commands)
                       if x.type is CT.DEALLOC_MATRIX and x.matrix == m]
            assert len(alloc) == len(dealloc) == 1
            assert len(copies) == len(node_rows[comp])
            assert alloc[0] < min(copies) and max(copies) < k < dealloc[0]
            # the stacked rows carry the (n, t, x) of their pieces
            assert c.matrices[m].indexes.shape == (c.matrices[m].rows, 3)


def _rnn(model: bool = True, shared: bool = False):
    config = nets.RNN
    if shared:  # the output affine reused on a second path: one component, two nodes
        config = config.replace(
            "output-node name=output input=affine2",
            "component-node name=affine2b component=affine2 input=Append(out, Offset(out, -1))\n"
            "output-node name=output input=Sum(affine2, affine2b)")
    nnet = pynnet3.Nnet.from_config(config, seed=3)
    nets.to_float64(nnet)
    req = nets.request({"input": nets.frames(0, 9, n=2)}, {"output": nets.frames(1, 7, n=2)},
                       input_deriv=True, output_deriv=True, model=model)
    rng = np.random.default_rng(5)
    return (nnet, req, nets.random_inputs(nnet, req, rng),
            nets.random_output_derivs(nnet, req, rng))


@pytest.mark.parametrize("shared", [False, True])
def test_small_recurrent_net_float64(shared):
    nnet, req, inputs, derivs = _rnn(shared=shared)
    before, after, desc = compare_pass(consolidate_model_update, nnet, req, inputs, derivs,
                                       dtype=np.float64, value_rtol=1e-12, grad_rtol=1e-12)
    # affine1 (in the loop) is always consolidated; affine2 only when shared by two nodes
    assert "affine1" in desc and ("affine2" in desc) == shared
    per_comp: dict[str, list] = {}
    for cmd in before.commands:
        if cmd.type is BP and nnet.components[nnet.node_map[cmd.node].component].is_updatable():
            per_comp.setdefault(nnet.node_map[cmd.node].component, []).append(cmd)
    grouped = [cmd for cmds in per_comp.values() if len(cmds) > 1 for cmd in cmds]
    groups = sum(len(cmds) > 1 for cmds in per_comp.values())
    assert groups == (2 if shared else 1)
    ha = histogram(after)
    assert ha[BP] == histogram(before)[BP] - len(grouped) + groups
    assert ha[BP_NO] == sum(bool(cmd.in_deriv) for cmd in grouped)


def test_nothing_without_model_derivatives():
    nnet, req, _, _ = _rnn(model=False)
    c = pynnet3.compile(nnet, req, optimize=False)
    n = len(c.commands)
    assert consolidate_model_update(c, nnet, OptimizeOptions()) == ""
    assert len(c.commands) == n


def test_components_with_memos_or_not_simple_are_left_alone():
    # a TDNN (non-simple, updatable) applied twice in a chain, and the loop's affine
    # made to report a memo: neither may be consolidated.
    config = """
input-node name=input dim=3
component name=tdnn type=TdnnComponent input-dim=3 output-dim=3 time-offsets=-1,0
component-node name=t1 component=tdnn input=input
component-node name=t2 component=tdnn input=t1
output-node name=output input=t2
"""
    nnet = pynnet3.Nnet.from_config(config, seed=1)
    req = nets.request({"input": nets.frames(0, 8)}, {"output": nets.frames(2, 8)},
                       output_deriv=True, model=True)
    c = pynnet3.compile(nnet, req, optimize=False)
    assert histogram(c)[BP] == 2
    assert consolidate_model_update(c, nnet, OptimizeOptions()) == ""

    nnet, req, _, _ = _rnn()
    affine = nnet.components["affine1"]
    flags = affine.properties() | Flags.USES_MEMO
    affine.properties = lambda: flags
    c = pynnet3.compile(nnet, req, optimize=False)
    desc = consolidate_model_update(c, nnet, OptimizeOptions())
    assert "affine1" not in desc
