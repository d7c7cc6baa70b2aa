"""Review of the export (issue 17) as a PyTorch user deploys it: TorchScript
(``torch.jit.script`` / ``trace``), ``torch.export`` with N dynamic, a state_dict
loaded into a fresh export, and the ONNX model at N = 1 and N = 5 with F = 1, all
against pynnet3.run (NumPy backend) of each sequence."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pynnet3.export import to_torch  # noqa: E402
from pynnet3.testing import case_for_seed  # noqa: E402

from .common import example_nnet, max_rel, random_inputs, reference_outputs  # noqa: E402


def _run(module, inputs: dict, names=None) -> dict:
    with torch.no_grad():
        y = module(*[torch.from_numpy(inputs[n]) for n in names or module.input_names])
    return {k: v.numpy() for k, v in y.items()}


def test_torch_jit_script():
    """torch.jit.script used to fail: "Error inferring type for param_names" (a dict
    with tuple keys that TorchScript cannot type)."""
    nnet = example_nnet()
    module = to_torch(nnet, frames=3)
    scripted = torch.jit.script(module)
    inputs = random_inputs(module, 4, seed=1)
    got = _run(scripted, inputs)
    want = reference_outputs(nnet, module, inputs)
    assert got["output"].shape == (4, 3, nnet.output_dim("output"))
    assert max_rel(got["output"], want["output"]) < 1e-4
    assert module.param_names  # (still there for the Python user)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    assert max_rel(_run(torch.jit.load(buf), inputs)["output"], want["output"]) < 1e-4


def test_trace_and_torch_export_keep_n_free():
    nnet = example_nnet()
    module = to_torch(nnet, frames=2)
    example = random_inputs(module, 2)
    traced = torch.jit.trace(module, tuple(torch.from_numpy(example[k])
                                           for k in module.input_names), strict=False)
    n = torch.export.Dim("N")
    ep = torch.export.export(module, tuple(torch.from_numpy(random_inputs(module, 2)[k])
                                           for k in module.input_names),
                             dynamic_shapes=[{0: n}] * len(module.input_names))
    for batch in (1, 5):
        inputs = random_inputs(module, batch, seed=batch)
        want = reference_outputs(nnet, module, inputs)["output"]
        for m in (traced, ep.module()):
            got = _run(m, inputs, module.input_names)["output"]
            assert got.shape == (batch, 2, nnet.output_dim("output"))
            assert max_rel(got, want) < 1e-4


def test_state_dict_round_trip_into_a_fresh_export():
    """A fine-tuned module's state_dict loads into a new export of the same network
    (names are stable) and reproduces its outputs."""
    nnet = example_nnet()
    tuned = to_torch(nnet, frames=2)
    with torch.no_grad():
        for p in tuned.parameters():
            p.mul_(0.5)
    buf = io.BytesIO()
    torch.save(tuned.state_dict(), buf)
    buf.seek(0)
    fresh = to_torch(nnet, frames=2)
    fresh.load_state_dict(torch.load(buf))
    inputs = random_inputs(fresh, 3)
    assert np.array_equal(_run(fresh, inputs)["output"], _run(tuned, inputs)["output"])
    assert not np.array_equal(_run(to_torch(nnet, frames=2), inputs)["output"],
                              _run(tuned, inputs)["output"])


@pytest.mark.parametrize("seed", [0, 27])  # (iVector given at several frame times)
def test_onnx_one_frame_n_1_and_5(seed, tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from pynnet3.export import to_onnx

    nnet = case_for_seed(seed).build_nnet()
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=1)
    assert len(module.ivector_times) > 1
    path = tmp_path / "m.onnx"
    to_onnx(nnet, path, frames=1, module=module)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        inputs = random_inputs(module, batch, seed=batch)
        want = reference_outputs(nnet, module, inputs)
        got = session.run(None, inputs)
        for name, value in zip(module.output_names, got, strict=True):
            assert value.shape == (batch, 1, module.output_dims[name])
            assert max_rel(value, want[name]) < 1e-4, name


def test_frames_must_be_a_sane_whole_number():
    """frames=2.5 used to export F = 2 silently (int() truncation), frames=True
    F = 1, and a huge F allocated the request's index arrays until the process was
    killed for memory (frames=10**9 took >23 GB here): now ExportErrors, checked
    before anything is allocated."""
    from pynnet3.errors import ExportError

    nnet = example_nnet()
    for bad in (2.5, True, "3", None):
        with pytest.raises(ExportError, match="whole number"):
            to_torch(nnet, frames=bad)
    with pytest.raises(ExportError, match="max_rows"):
        to_torch(nnet, frames=2**40)
    assert to_torch(nnet, frames=np.int64(2)).frames == 2
    assert to_torch(nnet, frames=2.0).frames == 2


def test_to_onnx_refuses_a_module_of_other_frames(tmp_path):
    """to_onnx(nnet, path, frames=5, module=<exported for 3>) used to write the
    3-frame model silently."""
    pytest.importorskip("onnx")
    from pynnet3.errors import ExportError
    from pynnet3.export import to_onnx

    nnet = example_nnet()
    module = to_torch(nnet, frames=3)
    with pytest.raises(ExportError, match="frames=5.*frames=3"):
        to_onnx(nnet, tmp_path / "m.onnx", frames=5, module=module)
    assert not (tmp_path / "m.onnx").exists()


def test_unsupported_part_of_a_composite_names_the_node(monkeypatch):
    """An unsupported sub-component of a CompositeComponent named the component and
    the type but not the node (every other unsupported component names its node)."""
    from pynnet3 import Nnet
    from pynnet3.errors import ExportError
    from pynnet3.export import ops

    config = """input-node name=input dim=4
component name=comp type=CompositeComponent num-components=2 \
component1='type=AffineComponent input-dim=4 output-dim=3' \
component2='type=TanhComponent dim=3'
component-node name=layer1 component=comp input=input
output-node name=output input=layer1
"""
    nnet = Nnet.from_config(config.replace("\\\n", ""), seed=0)
    assert to_torch(nnet, frames=2).frames == 2
    monkeypatch.delitem(ops.OPS, "TanhComponent")
    with pytest.raises(ExportError, match=r"node 'layer1'.*sub-component 1 of type "
                                          r"TanhComponent"):
        to_torch(nnet, frames=2)
