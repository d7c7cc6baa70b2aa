"""pynnet3 optimize-network, copy --prepare-for-test and show-computation
--network-optimize on a small network with foldable BatchNorm layers."""

from __future__ import annotations

import json

import numpy as np

import pynnet3
from pynnet3.cli.main import main

CONFIG = """\
component name=a1 type=AffineComponent input-dim=6 output-dim=8
component name=r1 type=RectifiedLinearComponent dim=8
component name=bn1 type=BatchNormComponent dim=8
component name=a2 type=NaturalGradientAffineComponent input-dim=24 output-dim=5
input-node name=input dim=6
component-node name=a1 component=a1 input=input
component-node name=r1 component=r1 input=a1
component-node name=bn1 component=bn1 input=r1
component-node name=a2 component=a2 input=Append(Offset(bn1, -1), bn1, Offset(bn1, 1))
output-node name=output input=a2
"""


def _model(tmp_path):
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=3)
    bn = nnet.components["bn1"]
    rng = np.random.default_rng(1)
    bn.count = 10.0  # stats as training would leave them
    bn.stats_sum = rng.standard_normal(8) * 10
    bn.stats_sumsq = bn.stats_sum ** 2 / 10 + rng.uniform(1, 3, 8) * 10
    path = tmp_path / "in.txt"
    nnet.write(path, binary=False)
    return path


def _request():
    idx = np.stack([np.zeros(12, np.int64), np.arange(-1, 11), np.zeros(12, np.int64)], 1)
    out = np.stack([np.zeros(10, np.int64), np.arange(10), np.zeros(10, np.int64)], 1)
    return pynnet3.ComputationRequest(inputs=[pynnet3.IoSpecification("input", idx)],
                                      outputs=[pynnet3.IoSpecification("output", out)])


def _outputs(nnet, x):
    return pynnet3.run(nnet, pynnet3.compile(nnet, _request()), inputs={"input": x}).outputs[
        "output"]


def test_prepare_for_test_folds_batchnorm_and_keeps_outputs(tmp_path):
    src = _model(tmp_path)
    out = tmp_path / "out.mdl"
    assert main(["copy", "--prepare-for-test=true", str(src), str(out)]) == 0
    reference = pynnet3.read_nnet(src)
    reference.set_test_mode(True)
    folded = pynnet3.read_nnet(out)
    types = [c.type_name for c in folded.components.values()]
    assert "BatchNormComponent" not in types and len(types) == 3
    x = np.random.default_rng(0).standard_normal((12, 6)).astype(np.float32)
    want, got = _outputs(reference, x), _outputs(folded, x)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


def test_optimize_network_flags_and_report(tmp_path, capsys):
    src = _model(tmp_path)
    out = tmp_path / "o.txt"
    assert main(["optimize-network", "--set-test-mode=true", "--constant-folding=false",
                 "--binary=false", str(src), str(out)]) == 0
    assert "BatchNormComponent" in out.read_text()  # folding switched off
    assert main(["optimize-network", "--set-test-mode=true", "--report", "--binary=false",
                 str(src), str(out)]) == 0
    err = capsys.readouterr().err
    assert "fold-batchnorm-into-next-linear: 1" in err
    assert "BatchNormComponent" not in out.read_text()


def test_optimize_network_leaves_training_mode_batchnorm(tmp_path):
    src = _model(tmp_path)  # BatchNorm in training mode: not a fixed map
    out = tmp_path / "o.txt"
    assert main(["optimize-network", "--binary=false", str(src), str(out)]) == 0
    assert "BatchNormComponent" in out.read_text()


def test_show_computation_network_optimize(tmp_path, capsys):
    src = _model(tmp_path)
    req = tmp_path / "req.json"
    r = _request()
    req.write_text(json.dumps({
        "inputs": [{"name": "input", "indexes": r.inputs[0].indexes.tolist()}],
        "outputs": [{"name": "output", "indexes": r.outputs[0].indexes.tolist()}]}))
    assert main(["show-computation", str(src), "--request", str(req),
                 "--network-optimize=true"]) == 0
    out = capsys.readouterr().out
    assert "# network optimizer report" in out
    assert "pruning" in out and "constant_folding" in out
