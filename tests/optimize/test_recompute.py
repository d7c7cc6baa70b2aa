"""recompute_cheap_values (issue 15's "memory" pass): cheap forward values freed
between the passes and recomputed in the backward pass give bit-identical
outputs, input derivatives, model gradients and stored statistics; the checker
accepts the result; on the realistic training requests the peak is lower than
without the pass; random components and overwritten inputs are never recomputed.

Expected values are always the same computation run without the pass (float32,
compared with ``array_equal``: the recompute re-runs the very same propagate on
the very same input, so not even the summation order can differ)."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import check_computation
from pynnet3.compiler import compile_computation
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.errors import CheckError
from pynnet3.optimize import OptimizeOptions, OptimizeReport, optimize
from pynnet3.optimize.recompute import (
    MemoryModel,
    choose,
    compatible,
    find_candidates,
    live_floats_compressed,
    with_recomputed,
)
from pynnet3.optimize.renumber import renumber
from pynnet3.testing import case_for_seed
from pynnet3.testing.differential import UndefinedMemoryBackend, component_state
from tests.reference import REF, needs_reference

ON = OptimizeOptions(recompute_cheap_values=True)
UNDEF = UndefinedMemoryBackend.name  # allocations hold garbage: undefined reads show


def _marker(c) -> int:
    return next(i for i, x in enumerate(c.commands) if x.type is CT.NO_OPERATION_MARKER)


def _run(nnet, comp, inputs, derivs):
    """Run on a copy of the model (stored stats land there); result and state."""
    model = copy.deepcopy(nnet)
    res = pynnet3.run(model, comp, inputs, derivs, backend=UNDEF, dtype=np.float32)
    return res, component_state(model)


def _assert_identical(got, want) -> None:
    (g, gs), (w, ws) = got, want
    for kind in ("outputs", "input_derivs"):
        a, b = getattr(g, kind), getattr(w, kind)
        assert a.keys() == b.keys()
        for k in b:
            assert np.array_equal(a[k], b[k]), f"{kind} {k} differs"
    assert g.gradients.keys() == w.gradients.keys()
    for comp, params in w.gradients.items():
        for p, v in params.items():
            assert np.array_equal(g.gradients[comp][p], v), f"gradient {comp}.{p} differs"
    assert gs.keys() == ws.keys()
    for k, v in ws.items():  # stored statistics counted once, as without the pass
        assert np.array_equal(gs[k], v), f"component state {k} differs"


def _forced(c, nnet):
    """``c`` with every candidate recomputed (whatever the peak), renumbered and
    checked; and the number of candidates."""
    cands = []
    for x in find_candidates(c, nnet, _marker(c)):
        if compatible(cands, x):
            cands.append(x)
    out = with_recomputed(c, nnet, cands)
    renumber(out)
    check_computation(out, nnet, context="forced recompute")
    return out, len(cands)


# -- random networks of ours ---------------------------------------------------------------

#: the default mix of layers (few recomputable values), and feed-forward / TDNN
#: layers only (the ReLU + BatchNorm recipe: many)
FF = ("ff", "tdnn")


@pytest.mark.parametrize("layers", [None, FF], ids=["all", "ff"])
@pytest.mark.parametrize("seed", range(20))
def test_random_networks_forced_and_driven(seed, layers):
    """Every candidate recomputed (forced), and the pass as the driver runs it
    (checker after every pass): results and stored stats equal the pass-off run."""
    case = case_for_seed(seed, layers)
    nnet = case.build_nnet()
    base = optimize(compile_computation(nnet, case.request), nnet, OptimizeOptions())
    want = _run(nnet, base, case.inputs, case.output_derivs)
    driven = optimize(compile_computation(nnet, case.request), nnet, ON, check=True)
    assert driven.peak_memory_floats() <= base.peak_memory_floats()
    _assert_identical(_run(nnet, driven, case.inputs, case.output_derivs), want)
    if any(x.type is CT.NO_OPERATION_MARKER for x in base.commands):
        # (before compression, which would otherwise have run last)
        pre = optimize(compile_computation(nnet, case.request), nnet,
                       OptimizeOptions(memory_compression_level=0))
        forced, _ = _forced(pre, nnet)
        _assert_identical(_run(nnet, forced, case.inputs, case.output_derivs), want)


def test_random_networks_have_candidates():
    """The forced test above is not vacuous: many random training cases have values
    to recompute, and the driven pass lowers the peak of some."""
    with_cands = lowered = 0
    kinds = set()
    for seed in range(20):
        case = case_for_seed(seed, FF)
        nnet = case.build_nnet()
        c = optimize(compile_computation(nnet, case.request), nnet,
                     OptimizeOptions(memory_compression_level=0))
        if any(x.type is CT.NO_OPERATION_MARKER for x in c.commands):
            cands = find_candidates(c, nnet, _marker(c))
            with_cands += bool(cands)
            # propagates, and row copies whose source must be kept longer
            kinds |= {(c.commands[x.prop].type, bool(x.extend)) for x in cands}
            on = optimize(compile_computation(nnet, case.request), nnet, ON)
            off = optimize(compile_computation(nnet, case.request), nnet, OptimizeOptions())
            lowered += on.peak_memory_floats() < off.peak_memory_floats()
    assert with_cands >= 5 and lowered >= 1, (with_cands, lowered)
    assert {(CT.PROPAGATE, False), (CT.COPY_ROWS, True)} <= kinds, kinds


# -- where it must not apply ------------------------------------------------------------------

DROPOUT = """
input-node name=input dim=6
component name=affine1 type=AffineComponent input-dim=6 output-dim=8
component-node name=affine1 component=affine1 input=input
component name=relu1 type=RectifiedLinearComponent dim=8
component-node name=relu1 component=relu1 input=affine1
component name=drop1 type=DropoutComponent dim=8 dropout-proportion=0.5
component-node name=drop1 component=drop1 input=relu1
component name=bn1 type=BatchNormComponent dim=8
component-node name=bn1 component=bn1 input=relu1
component name=affine2 type=AffineComponent input-dim=16 output-dim=4
component-node name=affine2 component=affine2 input=Append(drop1, bn1)
output-node name=output input=affine2
"""


def _train_request(nnet, frames: int = 10):
    idx = np.array([(0, t, 0) for t in range(frames)], dtype=np.int64)
    return pynnet3.ComputationRequest(
        inputs=[pynnet3.IoSpecification("input", idx)],
        outputs=[pynnet3.IoSpecification("output", idx.copy(), has_deriv=True)],
        need_model_derivative=True)


def test_random_component_is_never_recomputed():
    """Dropout (RANDOM) reads the same kept ReLU output as the BatchNorm: only the
    BatchNorm is a candidate (a second mask would differ)."""
    nnet = pynnet3.Nnet.from_config(DROPOUT, seed=1)
    c = optimize(compile_computation(nnet, _train_request(nnet)), nnet,
                 OptimizeOptions(memory_compression_level=0))
    nodes = [c.commands[x.prop].node for x in find_candidates(c, nnet, _marker(c))]
    assert nodes == ["bn1"]


def test_overwritten_input_is_never_recomputed():
    """A write to the propagate's input between it and the first backward use (here
    a zeroing inserted right after the marker) removes the candidate."""
    nnet = pynnet3.Nnet.from_config(DROPOUT, seed=1)
    c = optimize(compile_computation(nnet, _train_request(nnet)), nnet,
                 OptimizeOptions(memory_compression_level=0))
    (cand,) = find_candidates(c, nnet, _marker(c))
    src = c.commands[cand.prop].in_value
    c.commands.insert(_marker(c) + 1, Command(CT.SET_CONST, dst=src, alpha=0.0))
    assert find_candidates(c, nnet, _marker(c)) == []


def test_checker_refuses_a_late_propagate_with_memo_or_stats():
    """The checker lets a propagate follow a backprop only as a recomputation: one
    that would write a memo again, or store statistics again, is an error."""
    nnet = pynnet3.Nnet.from_config(DROPOUT, seed=1)
    c = optimize(compile_computation(nnet, _train_request(nnet)), nnet,
                 OptimizeOptions(memory_compression_level=0))
    forced, n = _forced(c, nnet)
    assert n == 1
    last_bp = max(i for i, x in enumerate(forced.commands)
                  if x.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE))
    bn = next(x for x in forced.commands if x.type is CT.PROPAGATE and x.node == "bn1"
              and x.memo)
    for bad in (dict(alpha=2.0, memo=0), dict(memo=bn.memo)):
        c2 = copy.copy(forced)
        c2.commands = list(forced.commands)
        late = copy.copy(bn)
        for k, v in bad.items():
            setattr(late, k, v)
        c2.commands.insert(last_bp + 1, late)
        with pytest.raises(CheckError, match="propagate after a backprop|memo"):
            check_computation(c2, nnet)


def test_no_change_without_backward_pass():
    nnet = pynnet3.Nnet.from_config(DROPOUT, seed=1)
    req = _train_request(nnet)
    req.outputs[0].has_deriv = False
    req.need_model_derivative = False
    rep = OptimizeReport()
    optimize(compile_computation(nnet, req), nnet, ON, report=rep)
    assert [p.changed for p in rep.passes if p.name == "recompute_cheap_values"] == [""]


# -- realistic networks ---------------------------------------------------------------------

def _scaling_request(nnet, n_seqs: int, frames: int = 20):
    """The train shape of scaling.json (benchmarks/realistic.py's scaling_request)."""
    left, right = nnet.context()

    def rows(t0, t1):
        return np.array([(n, t, 0) for t in range(t0, t1) for n in range(n_seqs)],
                        dtype=np.int64)

    inputs = [pynnet3.IoSpecification("input", rows(-left, frames + right))]
    if "ivector" in nnet.input_names():
        inputs.append(pynnet3.IoSpecification("ivector", rows(0, 1)))
    outputs = [pynnet3.IoSpecification(name, rows(0, frames), has_deriv=True)
               for name in nnet.output_names()]
    return pynnet3.ComputationRequest(inputs=inputs, outputs=outputs,
                                      need_model_derivative=True)


@needs_reference
@pytest.mark.parametrize("net", ["tdnn_relu_bn", "tdnnf_chain", "xvector", "tdnn_lstm"])
def test_realistic_training_requests(net):
    """Results identical; the pass must lower the peak, with and without memory
    compression: on tdnn_relu_bn and tdnnf_chain (BatchNorm after each ReLU)
    recomputing BatchNorm outputs, on all by recomputing the first layer's
    spliced input from the (smaller) input where that is a row copy."""
    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    if net == "xvector":
        idx = np.array([(n, t, 0) for t in range(27) for n in range(3)], dtype=np.int64)
        out = np.array([(n, 0, 0) for n in range(3)], dtype=np.int64)
        req = pynnet3.ComputationRequest(
            inputs=[pynnet3.IoSpecification("input", idx)],
            outputs=[pynnet3.IoSpecification("output", out, has_deriv=True)],
            need_model_derivative=True)
    else:
        req = _scaling_request(nnet, 3)
    rng = np.random.default_rng(0)
    inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
              for s in req.inputs}
    derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
              for s in req.outputs}
    for level in (1, 0):
        off = pynnet3.compile(nnet, req, optimize=OptimizeOptions(memory_compression_level=level))
        rep = OptimizeReport()
        on = optimize(compile_computation(nnet, req), nnet,
                      OptimizeOptions(recompute_cheap_values=True,
                                      memory_compression_level=level), report=rep, check=True)
        changed = [p.changed for p in rep.passes if p.name == "recompute_cheap_values"][0]
        assert on.peak_memory_floats() < off.peak_memory_floats(), (level, changed)
        if net in ("tdnn_relu_bn", "tdnnf_chain"):
            assert "batchnorm" in changed
        _assert_identical(_run(nnet, on, inputs, derivs), _run(nnet, off, inputs, derivs))


@needs_reference
def test_realistic_request_case_matches_kaldi_arrays():
    """A Kaldi reference training case optimized with the pass still gives Kaldi's
    outputs (the independent check of the whole pipeline with the pass on)."""
    case = REF / "realistic" / "tdnn_relu_bn" / "train"
    nnet = pynnet3.read_nnet(REF / "realistic" / "tdnn_relu_bn" / "model.txt")
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items()
              if k.startswith("output_deriv:")}
    comp = pynnet3.compile(nnet, req, optimize=ON)
    res = pynnet3.run(copy.deepcopy(nnet), comp, inputs, derivs)
    for k, v in arrays.items():
        if k.startswith("output:"):
            got = res.outputs[k.split(":", 1)[1]]
            assert np.abs(got - v).max() <= 1e-4 * max(np.abs(v).max(), 1.0), k


# -- reached from the network optimizer's options ------------------------------------------

CHAIN = """
input-node name=input dim=10
component name=a1 type=AffineComponent input-dim=30 output-dim=24
component-node name=a1 component=a1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=r1 type=RectifiedLinearComponent dim=24
component-node name=r1 component=r1 input=a1
component name=b1 type=BatchNormComponent dim=24
component-node name=b1 component=b1 input=r1
component name=a2 type=AffineComponent input-dim=72 output-dim=24
component-node name=a2 component=a2 input=Append(Offset(b1, -2), b1, Offset(b1, 2))
component name=r2 type=RectifiedLinearComponent dim=24
component-node name=r2 component=r2 input=a2
component name=b2 type=BatchNormComponent dim=24
component-node name=b2 component=b2 input=r2
component name=a3 type=AffineComponent input-dim=72 output-dim=24
component-node name=a3 component=a3 input=Append(Offset(b2, -2), b2, Offset(b2, 2))
component name=r3 type=RectifiedLinearComponent dim=24
component-node name=r3 component=r3 input=a3
component name=b3 type=BatchNormComponent dim=24
component-node name=b3 component=b3 input=r3
component name=a4 type=AffineComponent input-dim=24 output-dim=5
component-node name=a4 component=a4 input=b3
output-node name=output input=a4
"""


def test_network_options_memory_switches_the_pass_on():
    """NetworkOptions.memory (default on) makes a CachingCompiler with
    ``network_optimize`` compile training requests with the recompute pass: a lower
    peak than with ``memory=False``, the same results."""
    nnet = pynnet3.Nnet.from_config(CHAIN, seed=3)
    idx = np.array([(n, t, 0) for n in range(2) for t in range(-7, 27)], dtype=np.int64)
    out = np.array([(n, t, 0) for n in range(2) for t in range(20)], dtype=np.int64)
    req = pynnet3.ComputationRequest(
        inputs=[pynnet3.IoSpecification("input", idx)],
        outputs=[pynnet3.IoSpecification("output", out, has_deriv=True)],
        need_model_derivative=True)
    on = pynnet3.CachingCompiler(nnet, network_optimize=pynnet3.NetworkOptions())
    off = pynnet3.CachingCompiler(nnet, network_optimize=pynnet3.NetworkOptions(memory=False))
    assert on.options.recompute_cheap_values and not off.options.recompute_cheap_values
    assert not pynnet3.CachingCompiler(nnet).options.recompute_cheap_values
    c_on, c_off = on.compile(req), off.compile(req)
    assert c_on.peak_memory_floats() < c_off.peak_memory_floats()
    rng = np.random.default_rng(1)
    inputs = {"input": rng.standard_normal((len(idx), 10))}
    derivs = {"output": rng.standard_normal((len(out), 5))}
    _assert_identical(_run(on.compiled_nnet, c_on, inputs, derivs),
                      _run(off.compiled_nnet, c_off, inputs, derivs))


# A NoOp reading the BatchNorm output: both values are candidates, but recomputing
# both would have the NoOp's recompute read the BatchNorm value the forward pass
# freed -- only one of the two may be chosen.
CHAINED = """
input-node name=input dim=6
component name=a1 type=AffineComponent input-dim=6 output-dim=8
component-node name=a1 component=a1 input=input
component name=r1 type=RectifiedLinearComponent dim=8
component-node name=r1 component=r1 input=a1
component name=b1 type=BatchNormComponent dim=8
component-node name=b1 component=b1 input=r1
component name=n1 type=NoOpComponent dim=8
component-node name=n1 component=n1 input=b1
component name=a2 type=AffineComponent input-dim=16 output-dim=4
component-node name=a2 component=a2 input=Append(b1, n1)
output-node name=output input=a2
"""


def test_chained_values_are_not_both_recomputed():
    nnet = pynnet3.Nnet.from_config(CHAINED, seed=2)
    req = _train_request(nnet, 12)
    c = optimize(compile_computation(nnet, req), nnet,
                 OptimizeOptions(memory_compression_level=0, propagate_in_place=False))
    cands = find_candidates(c, nnet, _marker(c))
    assert sorted(c.commands[x.prop].node for x in cands) == ["b1", "n1"]
    assert not compatible(cands[:1], cands[1])
    with pytest.raises(ValueError):
        with_recomputed(c, nnet, cands)
    forced, n = _forced(c, nnet)  # (the first of the two)
    assert n == 1
    rng = np.random.default_rng(2)
    inputs = {"input": rng.standard_normal((12, 6))}
    derivs = {"output": rng.standard_normal((12, 4))}
    _assert_identical(_run(nnet, forced, inputs, derivs), _run(nnet, c, inputs, derivs))


@needs_reference
@pytest.mark.parametrize("net", ["tdnn_relu_bn", "tdnnf_chain", "xvector", "tdnn_lstm"])
def test_memory_model_predicts_the_measured_peak(net):
    """The pass chooses on a model of the live floats (compression as intervals);
    its peak for the chosen set, and for none, is the one measured on the built
    computation after the compression pass."""
    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    req = _scaling_request(nnet, 2) if net != "xvector" else None
    if req is None:
        idx = np.array([(n, t, 0) for t in range(27) for n in range(2)], dtype=np.int64)
        out = np.array([(n, 0, 0) for n in range(2)], dtype=np.int64)
        req = pynnet3.ComputationRequest(
            inputs=[pynnet3.IoSpecification("input", idx)],
            outputs=[pynnet3.IoSpecification("output", out, has_deriv=True)],
            need_model_derivative=True)
    c = optimize(compile_computation(nnet, req), nnet,
                 OptimizeOptions(memory_compression_level=0))
    cands = find_candidates(c, nnet, _marker(c))
    model = MemoryModel(c, nnet, cands, OptimizeOptions())
    chosen = choose(cands, model)
    assert chosen
    for subset in ([], chosen, chosen[:1]):
        measured = live_floats_compressed(with_recomputed(c, nnet, subset), nnet,
                                          OptimizeOptions())
        assert model(subset)[0] == measured.max()


def test_torch_backend_bitwise():
    """The torch backend (CPU tensors) runs the recomputing program to the same bits
    as the program without the pass."""
    torch = pytest.importorskip("torch")
    nnet = pynnet3.Nnet.from_config(CHAIN, seed=4)
    idx = np.array([(n, t, 0) for n in range(2) for t in range(-7, 27)], dtype=np.int64)
    out = np.array([(n, t, 0) for n in range(2) for t in range(20)], dtype=np.int64)
    req = pynnet3.ComputationRequest(
        inputs=[pynnet3.IoSpecification("input", idx)],
        outputs=[pynnet3.IoSpecification("output", out, has_deriv=True)],
        need_model_derivative=True)
    on = pynnet3.compile(nnet, req, optimize=ON)
    off = pynnet3.compile(nnet, req, optimize=True)
    assert on.peak_memory_floats() < off.peak_memory_floats()
    rng = np.random.default_rng(4)
    inputs = {"input": rng.standard_normal((len(idx), 10)).astype(np.float32)}
    derivs = {"output": rng.standard_normal((len(out), 5)).astype(np.float32)}
    got = pynnet3.run(copy.deepcopy(nnet), on, inputs, derivs, backend="torch")
    want = pynnet3.run(copy.deepcopy(nnet), off, inputs, derivs, backend="torch")
    assert torch.equal(got.outputs["output"], want.outputs["output"])
    for comp, params in want.gradients.items():
        for p, v in params.items():
            assert torch.equal(got.gradients[comp][p], v), (comp, p)


def test_training_steps_with_the_pass_change_nothing():
    """Two Trainer steps (quadratic objective, statistics stored, natural gradient)
    through a CachingCompiler with the pass: parameters and BatchNorm statistics
    end bit-identical to those of the same steps without it (statistics are not
    counted again by the recomputing propagates)."""
    from pynnet3.train import Trainer, TrainerOptions

    text = CHAIN.replace("output-node name=output input=a4",
                         "output-node name=output input=a4 objective=quadratic")
    states = []
    for opts in (ON, OptimizeOptions()):
        nnet = pynnet3.Nnet.from_config(text, seed=5)
        cc = pynnet3.CachingCompiler(nnet, optimize=opts)
        trainer = Trainer(nnet, TrainerOptions(), compiler=cc)
        req = pynnet3.ComputationRequest.from_frames(range(-7, 27), range(20), 3)
        rng = np.random.default_rng(5)
        for _ in range(2):
            x = rng.standard_normal((3 * 34, 10)).astype(np.float32)
            y = rng.standard_normal((3 * 20, 5)).astype(np.float32)
            trainer.train_step(req, inputs={"input": x}, supervision={"output": y})
        train_req = dataclasses.replace(
            req, outputs=[dataclasses.replace(o, has_deriv=True) for o in req.outputs],
            need_model_derivative=True, store_component_stats=True)
        comp = cc.compile(train_req)
        states.append((comp.peak_memory_floats(), component_state(nnet)))
    (peak_on, got), (peak_off, want) = states
    assert peak_on < peak_off
    assert want.keys() == got.keys() and any("stats_sum" in k for k in want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k


def test_lossy_compression_level_chooses_by_measuring():
    """At compression level 2 (int16, lossy: no interval model) the pass chooses by
    building and measuring; the program checks, and its peak is lower."""
    nnet = pynnet3.Nnet.from_config(CHAIN, seed=6)
    req = pynnet3.ComputationRequest.from_frames(range(-7, 27), range(20), 2)
    req = dataclasses.replace(
        req, outputs=[dataclasses.replace(o, has_deriv=True) for o in req.outputs],
        need_model_derivative=True)
    level2 = OptimizeOptions(memory_compression_level=2)
    rep = OptimizeReport()
    on = optimize(compile_computation(nnet, req), nnet,
                  dataclasses.replace(level2, recompute_cheap_values=True), report=rep,
                  check=True)
    off = optimize(compile_computation(nnet, req), nnet, level2)
    changed = [p.changed for p in rep.passes if p.name == "recompute_cheap_values"][0]
    assert changed.startswith("recompute")
    assert on.peak_memory_floats() < off.peak_memory_floats()


BN_AFTER_AFFINE = """
input-node name=input dim=6
component name=a1 type=AffineComponent input-dim=6 output-dim=8
component-node name=a1 component=a1 input=input
component name=b1 type=BatchNormComponent dim=8
component-node name=b1 component=b1 input=a1
component name=a2 type=AffineComponent input-dim=8 output-dim=4
component-node name=a2 component=a2 input=b1
output-node name=output input=a2
"""


def test_freed_input_is_kept_until_the_recompute():
    """A BatchNorm reading an affine output nothing else needs: the input is freed
    right after the forward propagate, so recomputing needs it kept (``extend``);
    forced, the program checks and gives the same bits, stored stats included."""
    nnet = pynnet3.Nnet.from_config(BN_AFTER_AFFINE, seed=7)
    req = dataclasses.replace(_train_request(nnet, 12), store_component_stats=True)
    c = optimize(compile_computation(nnet, req), nnet,
                 OptimizeOptions(memory_compression_level=0, propagate_in_place=False))
    (cand,) = find_candidates(c, nnet, _marker(c))
    assert c.commands[cand.prop].node == "b1" and cand.extend
    forced, _ = _forced(c, nnet)
    rng = np.random.default_rng(7)
    inputs = {"input": rng.standard_normal((12, 6))}
    derivs = {"output": rng.standard_normal((12, 4))}
    _assert_identical(_run(nnet, forced, inputs, derivs), _run(nnet, c, inputs, derivs))
