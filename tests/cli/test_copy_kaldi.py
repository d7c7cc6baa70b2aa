"""``pynnet3 copy`` against Kaldi's own ``nnet3-copy``: kaldi-reference/train-cli's
``model_in.txt.gz`` files are ``nnet3-copy --binary=false [--learning-rate=0.01]`` of
realistic models (their run_info.json says so). The same command here must write the
same bytes: BatchNorm put in training mode (nnet3-copy's --batchnorm-test-mode=false
default), its statistics read as doubles and written from sums, learning rates set."""

from __future__ import annotations

import gzip
import json

import pytest

from pynnet3.cli.main import main
from tests.reference import REF, ref_params, require_reference

CASES = ["tdnn_relu_bn", "tdnn_relu_bn_lr0.01", "xvector"]


@pytest.mark.parametrize("case", ref_params(CASES, "train-cli runs"))
def test_copy_writes_kaldis_bytes(case, tmp_path):
    folder = REF / "train-cli" / case
    note = json.loads((folder / "run_info.json").read_text())["model_in_note"]
    assert note.startswith("nnet3-copy --binary=false")
    flags = ["--learning-rate=0.01"] if "--learning-rate=0.01" in note else []
    net = "xvector" if case == "xvector" else "tdnn_relu_bn"
    out = tmp_path / "copy.txt"
    assert main(["copy", "--binary=false", *flags,
                 str(REF / "realistic" / net / "model.txt"), str(out)]) == 0
    assert out.read_bytes() == gzip.decompress((folder / "model_in.txt.gz").read_bytes())


@pytest.mark.parametrize("flag, mode", [([], "F"), (["--batchnorm-test-mode=true"], "T"),
                                        (["--prepare-for-test=true"], None)])
def test_batchnorm_test_mode_flag(flag, mode, tmp_path):
    """nnet3-copy sets BatchNorm's test mode to --batchnorm-test-mode (false unless
    given) on every copy, except with --prepare-for-test (test mode, then folded)."""
    model = require_reference() / "realistic" / "tdnn_relu_bn" / "model.txt"
    out = tmp_path / "copy.txt"
    assert main(["copy", "--binary=false", *flag, str(model), str(out)]) == 0
    text = out.read_text()
    if mode is None:
        assert "<BatchNormComponent>" not in text  # (all folded into the affines)
    else:
        assert text.count(f"<TestMode> {mode}") == 6
        assert text.count("<TestMode> " + ("T" if mode == "F" else "F")) == 0
