"""pynnet3.export.to_torch: the exported fx module equals Kaldi's outputs and
pynnet3.run (NumPy backend) on the realistic reference networks, the bundled
example, its network-optimized form and random networks; its parameters train."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pynnet3  # noqa: E402
from pynnet3.errors import ExportError  # noqa: E402
from pynnet3.export import ops, to_torch  # noqa: E402
from pynnet3.testing import case_for_seed  # noqa: E402
from tests.reference import REF, component_cases, ref_params  # noqa: E402

from .common import (  # noqa: E402
    example_nnet,
    max_rel,
    random_inputs,
    reference_outputs,
    reference_request,
    run_module,
)

# The four realistic networks, read in text or binary form; their decode requests are
# 150 output frames with exactly the network's context, i.e. the export's interface.
REALISTIC = [("tdnnf_chain", "model.bin"), ("tdnn_lstm", "model.txt"),
             ("tdnn_relu_bn", "model.bin"), ("xvector", "model.txt")]


@pytest.mark.parametrize("name,model", ref_params(REALISTIC, "realistic networks", 2))
def test_realistic_equals_kaldi_and_run(name, model):
    case = REF / "realistic" / name
    nnet = pynnet3.read_nnet(case / model)
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=150)
    with np.load(case / "decode" / "arrays.npz") as z:
        kaldi = {k: z[k] for k in z.files}
    assert module.input_frames == len(kaldi["input:input"])
    # sequence 0: Kaldi's own input; sequence 1: random frames
    inputs = random_inputs(module, 2, seed=1)
    for input_name in module.input_names:
        inputs[input_name][0] = kaldi[f"input:{input_name}"].reshape(inputs[input_name][0].shape)
    got = run_module(module, inputs)
    want = reference_outputs(nnet, module, inputs)
    for out in module.output_names:
        expected_rows = 1 if name == "xvector" else 150
        assert got[out].shape == (2, expected_rows, nnet.output_dim(out))
        assert max_rel(got[out][0], kaldi[f"output:{out}"]) < 1e-4, out
        assert max_rel(got[out], want[out]) < 1e-4, out


@pytest.mark.parametrize("name", ref_params(["tdnnf_chain", "tdnn_relu_bn"], "am models"))
def test_final_mdl(name):
    nnet = pynnet3.read_nnet(REF / "am" / name / "final.mdl")
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=9)
    assert to_torch(pynnet3.read_am(REF / "am" / name / "final.mdl"), frames=9).code \
        == module.code  # an AcousticModel exports its network
    inputs = random_inputs(module, 3)
    got, want = run_module(module, inputs), reference_outputs(nnet, module, inputs)
    for out in module.output_names:
        assert max_rel(got[out], want[out]) < 1e-4


def test_example_network_interface_and_values():
    nnet = example_nnet()
    left, right = nnet.context()
    module = to_torch(nnet, frames=7)
    assert isinstance(module, torch.fx.GraphModule)
    assert module.input_names == ["ivector", "input"]
    assert module.output_names == ["output"]
    assert (module.left_context, module.right_context) == (left, right)
    assert module.input_frames == left + 7 + right
    for n in (1, 4):  # N is free
        inputs = random_inputs(module, n, seed=n)
        got = run_module(module, inputs)
        assert got["output"].shape == (n, 7, nnet.output_dim("output"))
        assert max_rel(got["output"], reference_outputs(nnet, module, inputs)["output"]) < 1e-4
    text = str(module.graph)  # readable: the graph lists the torch calls
    assert "linear" in text and "placeholder" not in module.code


def test_network_optimized_form_equals_original():
    nnet = example_nnet()
    fast = pynnet3.optimize_network(nnet)
    module = to_torch(fast, frames=6)
    inputs = random_inputs(module, 2)
    got = run_module(module, inputs)
    assert max_rel(got["output"], reference_outputs(nnet, module, inputs)["output"]) < 1e-4


def test_float64_and_sequences_independent():
    """module.double() runs in float64 (equal to pynnet3.run in float64 to rounding),
    and each sequence's outputs depend on its own inputs only."""
    nnet = example_nnet()
    module = to_torch(nnet, frames=5).double()
    inputs = random_inputs(module, 3, dtype=np.float64)
    got = run_module(module, inputs)
    want = reference_outputs(nnet, module, inputs, dtype=np.float64)
    assert max_rel(got["output"], want["output"]) < 1e-9
    alone = run_module(module, {k: v[1:2] for k, v in inputs.items()})
    assert max_rel(alone["output"][0], got["output"][1]) < 1e-12


def test_parameters_get_pynnet3_gradients():
    """Weights are nn.Parameters: autograd of sum(output * d) gives the gradients
    pynnet3.run computes for the same request (so the module fine-tunes)."""
    nnet = example_nnet()
    module = to_torch(nnet, frames=4)
    params = dict(module.named_parameters())
    assert len(params) == len(module.param_names)
    inputs = random_inputs(module, 1, seed=3)
    d = np.random.default_rng(4).standard_normal(
        (1, 4, nnet.output_dim("output"))).astype(np.float32)
    y = module(*[torch.from_numpy(inputs[n]) for n in module.input_names])["output"]
    (y * torch.from_numpy(d)).sum().backward()
    comp = pynnet3.compile(nnet, reference_request(module, with_derivs=True))
    seq = {n: (v[0:1] if n == "ivector" else v[0]) for n, v in inputs.items()}
    res = pynnet3.run(nnet, comp, seq, output_derivs={"output": d[0]})
    checked = 0
    for (component, param), attr in module.param_names.items():
        want = res.gradients.get(component, {}).get(param)
        if want is None:
            continue
        got = params[attr].grad.numpy()
        assert max_rel(got, want) < 1e-4, (component, param)
        checked += 1
    assert checked >= 10
    # one SGD step changes the output (the parameters are live)
    with torch.no_grad():
        for p in module.parameters():
            p -= 0.1 * p.grad
        y2 = module(*[torch.from_numpy(inputs[n]) for n in module.input_names])["output"]
    assert not torch.allclose(y, y2)


# Random networks of our own (pynnet3.testing): exported in float64 they equal
# pynnet3.run in float64 to rounding. (Seeds 20, 28, 31: outputs reading Round(x, 3)
# on some frames and x on others, whose Kaldi-style context is undefined.)
RANDOM_SEEDS = range(40)


def test_random_networks_equal_run_float64():
    exported, failures = 0, []
    for seed in RANDOM_SEEDS:
        nnet = case_for_seed(seed).build_nnet()
        nnet.set_test_mode(True)
        module = to_torch(nnet, frames=4).double()
        inputs = random_inputs(module, 2, seed=seed, dtype=np.float64)
        got = run_module(module, inputs)
        want = reference_outputs(nnet, module, inputs, dtype=np.float64)
        worst = max(max_rel(got[o], want[o]) for o in module.output_names)
        if worst > 1e-9:
            failures.append((seed, worst))
        exported += 1
    assert not failures
    assert exported == len(RANDOM_SEEDS)


def test_component_without_op_is_an_error(monkeypatch):
    monkeypatch.delitem(ops.OPS, "TdnnComponent")
    with pytest.raises(ExportError, match=r"node 'tdnn1.affine'.*TdnnComponent"):
        to_torch(example_nnet(), frames=3)


def test_infinite_context_is_an_error():
    """A recurrence forward in time with no IfDefined needs every future frame."""
    config = """input-node name=input dim=2
component name=a type=AffineComponent input-dim=4 output-dim=2
component-node name=a component=a input=Append(input, Offset(a, 1))
output-node name=output input=a
"""
    with pytest.raises(ExportError, match="too wide"):
        to_torch(pynnet3.Nnet.from_config(config, seed=0), frames=3)


def test_bad_frames():
    with pytest.raises(ExportError, match="frames"):
        to_torch(example_nnet(), frames=0)


@pytest.mark.parametrize("case", ref_params(component_cases(), "component cases"))
def test_every_component_type_float64(case):
    """Kaldi's one-component reference networks (every component type): the export
    equals pynnet3.run in float64 to rounding."""
    nnet = pynnet3.read_nnet(case / "model.txt")
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=6).double()
    inputs = random_inputs(module, 2, dtype=np.float64)
    got = run_module(module, inputs)
    want = reference_outputs(nnet, module, inputs, dtype=np.float64)
    for out in module.output_names:
        assert max_rel(got[out], want[out]) < 1e-9, out


def test_names_that_sanitize_alike():
    """Components 'a.b' and 'a_b' get distinct parameters; odd node names survive as
    the module's input/output names."""
    config = """input-node name=in.put dim=3
component name=a.b type=AffineComponent input-dim=3 output-dim=4
component-node name=a.b component=a.b input=in.put
component name=a_b type=AffineComponent input-dim=4 output-dim=2
component-node name=a_b component=a_b input=a.b
output-node name=out-put input=a_b
"""
    nnet = pynnet3.Nnet.from_config(config, seed=2)
    module = to_torch(nnet, frames=2)
    assert module.input_names == ["in.put"] and module.output_names == ["out-put"]
    assert len(set(module.param_names.values())) == 4
    inputs = random_inputs(module, 2)
    got = run_module(module, inputs)
    assert max_rel(got["out-put"], reference_outputs(nnet, module, inputs)["out-put"]) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_equals_cpu():
    """New tensors follow the input's device: module.to('cuda') runs on the GPU."""
    nnet = example_nnet()
    module = to_torch(nnet, frames=6)
    inputs = random_inputs(module, 3)
    want = run_module(module, inputs)["output"]
    module = module.to("cuda")
    with torch.no_grad():
        got = module(*[torch.from_numpy(inputs[n]).cuda() for n in module.input_names])
    assert max_rel(got["output"].cpu().numpy(), want) < 1e-4
