"""pynnet3 export --format=onnx|torch --frames=F MODEL OUT: the written models load
(onnxruntime / torch.load) and compute what pynnet3.run computes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pynnet3  # noqa: E402
from pynnet3.cli.main import main  # noqa: E402
from pynnet3.export import to_torch  # noqa: E402
from tests.export.common import (  # noqa: E402
    example_nnet,
    max_rel,
    random_inputs,
    reference_outputs,
)
from tests.reference import REF, ref_params  # noqa: E402


def _model(tmp_path):
    path = tmp_path / "final.raw"
    example_nnet().write(path, binary=True)
    return path


def test_export_torch(tmp_path, capsys):
    model, out = _model(tmp_path), tmp_path / "model.pt"
    assert main(["export", "--format=torch", "--frames=6", str(model), str(out)]) == 0
    assert "inputs ivector [N, 100], input [N, " in capsys.readouterr().err
    module = torch.load(out, weights_only=False)
    nnet = pynnet3.read_nnet(model)
    inputs = random_inputs(module, 2)
    with torch.no_grad():
        got = module(*[torch.from_numpy(inputs[n]) for n in module.input_names])
    want = reference_outputs(nnet, module, inputs)
    assert got["output"].shape == (2, 6, nnet.output_dim("output"))
    assert max_rel(got["output"].numpy(), want["output"]) < 1e-4


def test_export_onnx_network_optimized(tmp_path, capsys):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model, out = _model(tmp_path), tmp_path / "model.onnx"
    assert main(["export", "--frames=5", "--network-optimize=true", str(model),
                 str(out)]) == 0
    nnet = pynnet3.read_nnet(model)
    nnet.set_test_mode(True)
    module = to_torch(nnet, frames=5)  # (the interface; the values come from the file)
    inputs = random_inputs(module, 3)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, inputs)
    assert max_rel(got[0], reference_outputs(nnet, module, inputs)["output"]) < 1e-4


@pytest.mark.parametrize("name", ref_params(["tdnnf_chain"], "am models"))
def test_export_final_mdl(name, tmp_path):
    pytest.importorskip("onnx")
    out = tmp_path / "am.onnx"
    assert main(["export", "--frames=4", str(REF / "am" / name / "final.mdl"), str(out)]) == 0
    assert out.stat().st_size > 0


def test_export_errors(tmp_path, capsys):
    model = _model(tmp_path)
    assert main(["export", "--frames=0", str(model), str(tmp_path / "x.onnx")]) == 1
    assert "frames" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.raw"), str(tmp_path / "x.onnx")]) == 1
    assert not (tmp_path / "x.onnx").exists()
