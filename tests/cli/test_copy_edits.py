"""pynnet3 copy --nnet-config / --learning-rate / --scale / --edits-config / --edits,
as Kaldi's nnet3-copy: applied in that order, then written; bad input is one line
on stderr naming the file, line and token, exit status 1, and no output file."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from tests.cli.test_cli import assert_one_line_error as _one_line_error
from tests.cli.test_cli import run

CONFIG = """\
input-node name=input dim=4
component name=lda type=FixedAffineComponent input-dim=4 output-dim=4
component name=a1 type=NaturalGradientAffineComponent input-dim=12 output-dim=8 \
learning-rate-factor=0.5
component name=r1 type=RectifiedLinearComponent dim=8
component name=d1 type=DropoutComponent dim=8 dropout-proportion=0.2
component name=a2 type=AffineComponent input-dim=8 output-dim=3
component name=a3 type=AffineComponent input-dim=8 output-dim=2
component-node name=lda component=lda input=input
component-node name=a1 component=a1 input=Append(Offset(lda, -1), lda, Offset(lda, 1))
component-node name=r1 component=r1 input=a1
component-node name=d1 component=d1 input=r1
component-node name=a2 component=a2 input=d1
component-node name=a3 component=a3 input=d1
output-node name=output input=a2
output-node name=output-aux input=a3
""".replace("\\\n", "")


def assert_one_line_error(rc, err, *fragments):
    _one_line_error(rc, err, "pynnet3 copy: error", *fragments)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "in.mdl"
    pynnet3.Nnet.from_config(CONFIG, seed=2).write(path, binary=True)
    return path


def test_learning_rate_sets_every_updatable_component(tmp_path, model, capsys):
    out = tmp_path / "out.txt"
    rc, _, err = run(["copy", "--binary=false", "--learning-rate=0.2", model, out], capsys)
    assert rc == 0 and err == ""
    nnet = pynnet3.read_nnet(out)
    assert nnet.components["a1"].learning_rate == pytest.approx(0.1)  # (factor 0.5)
    assert nnet.components["a2"].learning_rate == pytest.approx(0.2)
    assert nnet.components["a3"].learning_rate == pytest.approx(0.2)


def test_negative_learning_rate_means_unchanged(tmp_path, model, capsys):
    out = tmp_path / "out.mdl"
    assert run(["copy", "--learning-rate=-1", model, out], capsys)[0] == 0
    assert out.read_bytes() == model.read_bytes()


def test_scale(tmp_path, model, capsys):
    out = tmp_path / "out.mdl"
    assert run(["copy", "--scale=0.5", model, out], capsys)[0] == 0
    before, after = pynnet3.read_nnet(model), pynnet3.read_nnet(out)
    for name in ("a1", "a2", "a3"):
        for key, p in before.components[name].params().items():
            np.testing.assert_array_equal(after.components[name].params()[key],
                                          p * np.float32(0.5))
    # a FixedAffineComponent has no trainable parameters: Kaldi's Scale leaves it
    np.testing.assert_array_equal(after.components["lda"].linear_params,
                                  before.components["lda"].linear_params)


def test_nnet_config_adds_and_replaces(tmp_path, model, capsys):
    extra = tmp_path / "extra.config"
    extra.write_text("component name=a4 type=AffineComponent input-dim=8 output-dim=6\n"
                     "component-node name=a4 component=a4 input=r1\n"
                     "output-node name=output-extra input=a4\n"
                     "output-node name=output input=a3\n")
    out = tmp_path / "out.mdl"
    assert run(["copy", f"--nnet-config={extra}", model, out], capsys)[0] == 0
    nnet = pynnet3.read_nnet(out)
    assert nnet.output_names() == ["output-aux", "output-extra", "output"]
    assert nnet.node("output").inputs() == ["a3"]
    assert nnet.output_dim("output-extra") == 6


def test_edits_config_then_edits_in_order(tmp_path, model, capsys):
    edits = tmp_path / "edits.txt"
    edits.write_text("# rename the auxiliary output, then drop it\n"
                     "rename-node old-name=output-aux new-name=xent\n"
                     "\n"
                     "set-learning-rate name=a* learning-rate=0.01   # all affine\n")
    out = tmp_path / "out.txt"
    rc, _, err = run(["copy", "--binary=false", "--learning-rate=0.5",
                      f"--edits-config={edits}",
                      "--edits=remove-output-nodes name=xent; remove-orphans; "
                      "set-dropout-proportion proportion=0",
                      model, out], capsys)
    assert rc == 0, err
    nnet = pynnet3.read_nnet(out)
    # --edits ran after --edits-config: the renamed output was found and removed
    assert nnet.output_names() == ["output"]
    assert "a3" not in nnet.components and not nnet.has_node("a3")
    # --edits-config's rate came after --learning-rate
    assert nnet.components["a2"].learning_rate == pytest.approx(0.01)
    assert nnet.components["a1"].learning_rate == pytest.approx(0.005)
    assert nnet.components["d1"].dropout_proportion == 0.0
    assert "LOG (pynnet3 copy) Removing 1 output nodes." in err.splitlines()


def test_nnet_config_comes_before_edits(tmp_path, model, capsys):
    extra = tmp_path / "extra.config"
    extra.write_text("output-node name=output2 input=a2\n")
    out = tmp_path / "out.mdl"
    assert run(["copy", f"--nnet-config={extra}", "--edits=rename-node old-name=output2 "
                "new-name=output3", model, out], capsys)[0] == 0
    assert pynnet3.read_nnet(out).output_names() == ["output", "output-aux", "output3"]


def _outputs(path):
    nnet = pynnet3.read_nnet(path)
    nnet.set_test_mode(True)
    idx = np.stack([np.zeros(7, np.int64), np.arange(-1, 6), np.zeros(7, np.int64)], 1)
    oidx = np.stack([np.zeros(5, np.int64), np.arange(5), np.zeros(5, np.int64)], 1)
    req = pynnet3.ComputationRequest(inputs=[pynnet3.IoSpecification("input", idx)],
                                     outputs=[pynnet3.IoSpecification("output", oidx)])
    x = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    return pynnet3.run(nnet, pynnet3.compile(nnet, req), inputs={"input": x}).outputs["output"]


def test_apply_svd_computes_what_reduce_rank_does(tmp_path, model, capsys):
    svd, low = tmp_path / "svd.mdl", tmp_path / "low.mdl"
    # (a1 is 12 -> 8: 4 * (12 + 8) / (12 * 8) = 0.83 of its parameters)
    rc, _, err = run(["copy", "--edits=apply-svd name=a1 bottleneck-dim=4", model, svd],
                     capsys)
    assert rc == 0, err
    assert run(["copy", "--edits=reduce-rank name=a1 rank=4", model, low], capsys)[0] == 0
    nnet = pynnet3.read_nnet(svd)
    assert [c.type_name for c in nnet.components.values()][-2:] == [
        "LinearComponent", "NaturalGradientAffineComponent"]
    assert nnet.num_params() < pynnet3.read_nnet(model).num_params()
    y_svd, y_low, y_full = _outputs(svd), _outputs(low), _outputs(model)
    np.testing.assert_allclose(y_svd, y_low, atol=1e-5)
    assert np.abs(y_low - y_full).max() > 1e-3  # (rank 4 of 8 is not the original)


def test_edits_to_stdout(model, capsys):
    rc, out, err = run(["copy", "--binary=false", "--edits=remove-orphans", model, "-"],
                       capsys)
    assert rc == 0 and out.startswith("<Nnet3>")
    assert "Removed 0 orphan nodes." in err


@pytest.mark.parametrize("edits_text, fragments", [
    ("remove-orphans\nfrobnicate name=x\n", ["edits.txt, line 2", "'frobnicate'"]),
    ("set-learning-rate learning-rate=0.1 colour=red\n", ["edits.txt, line 1", "colour="]),
    ("set-learning-rate learning-rate=quick\n", ["line 1", "'quick'"]),
    ("reduce-rank name=a1 rank=-2\n", ["line 1", "rank=-2"]),
    ("rename-node old-name=missing new-name=x\n", ["line 1", "'missing'"]),
    ("remove-output-nodes name=output*\n", ["line 1", "all outputs were removed"]),
])
def test_bad_edits_config(tmp_path, model, capsys, edits_text, fragments):
    edits = tmp_path / "edits.txt"
    edits.write_text(edits_text)
    out = tmp_path / "out.mdl"
    rc, _, err = run(["copy", f"--edits-config={edits}", model, out], capsys)
    assert_one_line_error(rc, err, *fragments)
    assert not out.exists()


def test_bad_inline_edits_name_the_directive(tmp_path, model, capsys):
    out = tmp_path / "out.mdl"
    rc, _, err = run(["copy", "--edits=remove-orphans; set-orthonormal-constraint name=*",
                      model, out], capsys)
    assert_one_line_error(rc, err, "--edits, line 2", "'set-orthonormal-constraint'",
                          "not supported")
    assert not out.exists()


def test_missing_edits_config_and_nnet_config(tmp_path, model, capsys):
    out = tmp_path / "out.mdl"
    rc, _, err = run(["copy", f"--edits-config={tmp_path / 'nope.txt'}", model, out], capsys)
    assert_one_line_error(rc, err, "nope.txt")
    rc, _, err = run(["copy", f"--nnet-config={tmp_path / 'nope.config'}", model, out],
                     capsys)
    assert_one_line_error(rc, err, "nope.config")
    assert not out.exists()


def test_bad_nnet_config_names_file_and_line(tmp_path, model, capsys):
    extra = tmp_path / "extra.config"
    extra.write_text("output-node name=output2 input=a2\n"
                     "component name=z type=NoSuchComponent dim=3\n")
    out = tmp_path / "out.mdl"
    rc, _, err = run(["copy", f"--nnet-config={extra}", model, out], capsys)
    assert_one_line_error(rc, err, "extra.config", "line 2", "NoSuchComponent")
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--scale=big", "--learning-rate=nan", "--scale=inf"])
def test_bad_numbers_are_usage_errors(tmp_path, model, capsys, flag):
    rc, _, err = run(["copy", flag, model, tmp_path / "out.mdl"], capsys)
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert flag.split("=")[0] in err
