"""pynnet3.export.to_onnx: a checked ONNX model of standard operators whose
onnxruntime outputs equal pynnet3.run, N free; the iVector path included."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import pynnet3  # noqa: E402
from pynnet3.export import to_onnx, to_torch  # noqa: E402
from pynnet3.testing import case_for_seed  # noqa: E402
from tests.reference import REF, ref_params  # noqa: E402

from .common import example_nnet, max_rel, random_inputs, reference_outputs  # noqa: E402

# The operator set of the ONNX standard (ai.onnx) at the exported opset: every node
# of an exported model must be one of these, in the default domain.
STANDARD_OPS = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}


def _session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _check_model(path, module):
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == module.input_names
    assert [o.name for o in model.graph.output] == module.output_names
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    assert {d for d, _ in ops} <= {"", "ai.onnx"}, ops
    assert {op for _, op in ops} <= STANDARD_OPS
    assert all(o.version <= 17 for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return {op for _, op in ops}


def _compare(nnet, module, path, n, seed=0, tol=1e-4):
    inputs = random_inputs(module, n, seed=seed)
    got = _session(path).run(None, inputs)
    want = reference_outputs(nnet, module, inputs)
    for name, value in zip(module.output_names, got, strict=True):
        assert value.shape == want[name].shape
        assert max_rel(value, want[name]) < tol, name


REALISTIC = [("tdnnf_chain", "model.txt"), ("tdnn_lstm", "model.bin"),
             ("tdnn_relu_bn", "model.txt"), ("xvector", "model.bin")]


@pytest.mark.parametrize("name,model", ref_params(REALISTIC, "realistic networks", 2))
def test_realistic_onnx(name, model, tmp_path):
    nnet = pynnet3.read_nnet(REF / "realistic" / name / model)
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=20)
    path = tmp_path / f"{name}.onnx"
    to_onnx(nnet, path, frames=20, module=module)
    ops = _check_model(path, module)
    if name == "tdnn_lstm":
        assert {"Sigmoid", "Tanh"} <= ops  # the LSTM, unrolled
    for n in (1, 3):  # the batch dimension is dynamic
        _compare(nnet, module, path, n, seed=n)


def test_example_with_ivector(tmp_path):
    nnet = example_nnet()
    path = tmp_path / "example.onnx"
    to_onnx(nnet, path, frames=8)  # (exports the module itself)
    module = to_torch(nnet, frames=8)
    _check_model(path, module)
    assert "ivector" in module.input_names
    _compare(nnet, module, path, 2)
    # the iVector matters: another iVector gives other outputs
    inputs = random_inputs(module, 1)
    a = _session(path).run(None, inputs)[0]
    inputs["ivector"] = inputs["ivector"] + 1.0
    b = _session(path).run(None, inputs)[0]
    assert np.abs(a - b).max() > 1e-3


@pytest.mark.parametrize("seed", [1, 5, 8, 16, 33])
def test_random_networks_onnx(seed, tmp_path):
    nnet = case_for_seed(seed).build_nnet()
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=4)
    path = tmp_path / "r.onnx"
    to_onnx(nnet, path, frames=4, module=module)
    _check_model(path, module)
    inputs = random_inputs(module, 2, seed=seed)
    got = _session(path).run(None, inputs)
    with torch.no_grad():
        want = module(*[torch.from_numpy(inputs[k]) for k in module.input_names])
    for name, value in zip(module.output_names, got, strict=True):
        assert max_rel(value, want[name].numpy()) < 1e-4, name
