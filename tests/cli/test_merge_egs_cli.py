"""pynnet3 merge-egs (nnet3-merge-egs) on Kaldi's examples: same bytes as Kaldi's merged.ark."""

from __future__ import annotations

import pytest

from pynnet3.cli.main import main
from tests.reference import REF, ref_params


@pytest.mark.parametrize("case", ref_params(["tdnn_relu_bn", "xvector"], "train-cli cases"))
def test_merge_egs_reproduces_kaldi(case, tmp_path, capsys):
    folder = REF / "train-cli" / case
    out = tmp_path / "merged.ark"
    assert main(["merge-egs", "--minibatch-size=8", f"ark:{folder / 'egs.ark'}",
                 f"ark:{out}"]) == 0
    assert out.read_bytes() == (folder / "merged.ark").read_bytes()
    err = capsys.readouterr().err
    assert "Processed 32 egs" in err and "into 4 minibatches" in err


def test_merge_egs_bad_input_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.ark"
    bad.write_bytes(b"k1 \0B<Nnet3Eg> <NumIo> \x04\x00\x00\x00\x00</Nnet3Eg> ")
    assert main(["merge-egs", f"ark:{bad}", f"ark:{tmp_path / 'o.ark'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.ark" in err[0] and "<NumIo>" in err[0]
    assert not (tmp_path / "o.ark").exists()
    assert main(["merge-egs", "--minibatch-size=x", f"ark:{bad}", "ark:-"]) == 1
    assert "minibatch-size" in capsys.readouterr().err
