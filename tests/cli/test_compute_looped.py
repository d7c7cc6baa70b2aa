"""``pynnet3 compute --looped=true`` (Kaldi's DecodableNnetSimpleLooped from the command
line): Kaldi's looped runs reproduced through the CLI, and a small network whose looped
output equals the chunked (non-looped) ``compute`` on the same utterances."""

from __future__ import annotations

import json

import kaldiio
import numpy as np
import pytest

import pynnet3
from pynnet3.cli.main import main
from pynnet3.io.ark import read_ark
from pynnet3.runtime.looped import DecodableNnetLooped, LoopedDecodingInfo, LoopedOptions
from tests.cli.test_compute import _CONFIG, _data
from tests.reference import REF, ref_params

_RUNS = REF / "looped"
ATOL = 5e-5  # as tests/runtime/test_looped_decoding.py (the README's suggestion)


def _runs() -> list[str]:
    return sorted(p.name for p in _RUNS.iterdir()) if _RUNS.is_dir() else []


@pytest.mark.parametrize("run", ref_params(_runs(), "looped runs"))
def test_reproduces_kaldi_looped(run, tmp_path, monkeypatch, capsys):
    d = _RUNS / run
    options = json.loads((d / "options.json").read_text())
    info = json.loads((d / "run_info.json").read_text())
    monkeypatch.chdir(d)
    out = tmp_path / "output.ark"
    flags = [f"--{k}={v}" for k, v in options.items()]
    rc = main(["compute", "--looped=true", *flags, "--ivectors=ark:ivector.ark",
               info["model"], "ark:feats.ark", f"ark:{out}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "done 1 utterances, failed 0" in err
    got, expected = read_ark(out)["utt1"], read_ark(d / "output.ark")["utt1"]
    assert got.shape == expected.shape == tuple(info["output_shape"])
    # measured: 4.2e-7 (tdnn_lstm), 2.4e-5 / 2.3e-5 (tdnnf; with the network optimizer)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.txt"
    pynnet3.Nnet.from_config(_CONFIG, seed=3).write(path, binary=False)
    return path


@pytest.mark.parametrize("flags", [["--frames-per-chunk=4"],
                                   ["--frames-per-chunk=7", "--acoustic-scale=0.5"],
                                   ["--frames-per-chunk=6", "--frame-subsampling-factor=3"]])
def test_looped_equals_chunked_compute(model, tmp_path, capsys, flags):
    """A TDNN (context 3, 3): looped decoding with state carried equals nnet3-compute's
    chunks with full context, up to float32 rounding."""
    feats, ivecs = _data(11)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    common = [*flags, f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
              f"ark:{tmp_path}/feats.ark"]
    assert main(["compute", *common, f"ark:{tmp_path}/plain.ark"]) == 0
    assert main(["compute", "--looped=true", *common, f"ark:{tmp_path}/looped.ark"]) == 0
    err = capsys.readouterr().err
    assert f"done {len(feats)} utterances, failed 0" in err
    plain, looped = read_ark(tmp_path / "plain.ark"), read_ark(tmp_path / "looped.ark")
    assert list(looped) == list(feats)
    for key in feats:
        assert looped[key].shape == plain[key].shape
        np.testing.assert_allclose(looped[key], plain[key], rtol=1e-5, atol=1e-5)


def test_looped_online_ivectors(model, tmp_path, capsys):
    """--online-ivectors reach the looped decoder (each chunk: the row of its last
    input frame), and the CLI's acoustic scale is applied once."""
    feats, _ = _data(12, lengths=(30, 9))
    rng = np.random.default_rng(0)
    online = {k: rng.standard_normal((-(-len(v) // 5), 3)).astype(np.float32)
              for k, v in feats.items()}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "online.ark"), online)
    rc = main(["compute", "--looped=true", "--frames-per-chunk=4", "--acoustic-scale=2",
               f"--online-ivectors=ark:{tmp_path}/online.ark", "--online-ivector-period=5",
               str(model), f"ark:{tmp_path}/feats.ark", f"ark:{tmp_path}/out.ark"])
    assert rc == 0, capsys.readouterr().err
    got = read_ark(tmp_path / "out.ark")
    nnet = pynnet3.read_nnet(model)
    nnet.set_test_mode(True)
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=4, acoustic_scale=1.0))
    for key, f in feats.items():
        ref = DecodableNnetLooped(info, f, online_ivectors=online[key],
                                  online_ivector_period=5).output()
        np.testing.assert_allclose(got[key], 2 * ref, rtol=1e-5, atol=1e-5)


def test_library_default_acoustic_scale_is_kaldis():
    assert LoopedOptions().acoustic_scale == 0.1
