"""``pynnet3 xvector-compute`` (Kaldi's nnet3-xvector-compute): Kaldi's runs in
kaldi-reference/xvector-compute reproduced through the command line (chunked and whole,
log-softmax and embedding outputs), and a small statistics-pooling network checked
against ``pynnet3.run`` on chunks padded and averaged by hand."""

from __future__ import annotations

import json

import kaldiio
import numpy as np
import pytest

import pynnet3
from pynnet3.cli.main import main
from pynnet3.cli.xvector import pad_chunk, xvector_chunks
from pynnet3.io.ark import read_ark
from pynnet3.io.atomic import TAG
from tests.reference import REF, ref_params

_CASES = REF / "xvector-compute"


def _cases() -> list[str]:
    if not _CASES.is_dir():
        return []
    return sorted(p.name for p in _CASES.iterdir() if (p / "options.json").is_file())


def _flags(options: dict) -> list[str]:
    return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in options.items()]


@pytest.mark.parametrize("case", ref_params(_cases(), "xvector-compute runs"))
def test_reproduces_kaldi_xvector_compute(case, tmp_path, monkeypatch, capsys):
    d = _CASES / case
    options = json.loads((d / "options.json").read_text())
    info = json.loads((d / "run_info.json").read_text())
    monkeypatch.chdir(d)  # the model path is relative to the case folder
    out = tmp_path / "output.ark"
    rc = main(["xvector-compute", *_flags(options), info["model"], "ark:feats.ark",
               f"ark:{out}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "done 3 utterances, failed 0" in err
    got, expected = read_ark(out), read_ark(d / "output.ark")
    assert list(got) == list(expected)
    for key, want in expected.items():
        assert got[key].shape == want.shape == tuple(info["output_shapes"][key])
        # the README's tolerance: 1e-4 of the vector's max |value| (measured <= 1.6e-5)
        assert np.abs(got[key] - want).max() <= 1e-4 * np.abs(want).max(), key
    # the chunks Kaldi computed, with its padding
    for key, chunks in info["chunks"].items():
        n = info["feature_shapes"][key][0]
        ours = xvector_chunks(n, options["chunk-size"], options["min-chunk-size"],
                              options["pad-input"])
        assert ours == [(c["start"], c["num_frames"]) for c in chunks]
        for c in chunks:
            if "padded_to" in c:
                rows = pad_chunk(np.arange(c["num_frames"])[:, None], c["padded_to"])[:, 0]
                assert len(rows) == c["padded_to"]
                assert (rows == 0).sum() == c["pad_left_copies_of_first_frame"] + 1
                assert (rows == c["num_frames"] - 1).sum() == \
                    c["pad_right_copies_of_last_frame"] + 1


# -- a small statistics-pooling network, checked by hand ----------------------------------------
_CONFIG = """\
input-node name=input dim=4
component name=affine1 type=AffineComponent input-dim=12 output-dim=6
component-node name=affine1 component=affine1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=relu1 type=RectifiedLinearComponent dim=6
component-node name=relu1 component=relu1 input=affine1
component name=extract type=StatisticsExtractionComponent input-dim=6 input-period=1 output-period=1 include-variance=true
component-node name=extract component=extract input=relu1
component name=pool type=StatisticsPoolingComponent input-dim=13 input-period=1 left-context=0 right-context=10000 num-log-count-features=0 output-stddevs=true
component-node name=pool component=pool input=extract
component name=affine2 type=AffineComponent input-dim=12 output-dim=3
component-node name=affine2 component=affine2 input=Round(pool, 1)
output-node name=output input=affine2
"""  # noqa: E501


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.txt"
    pynnet3.Nnet.from_config(_CONFIG, seed=7).write(path, binary=False)
    return path


def _by_hand(model_path, feats, chunks, min_chunk_size):
    """The chunk outputs of pynnet3.run (input t = 0..len-1, output t = 0), chunks
    padded by hand, averaged with the unpadded lengths as weights."""
    nnet = pynnet3.read_nnet(model_path)
    total, weight = np.zeros(3), 0
    for start, n in chunks:
        chunk = feats[start:start + n]
        if n < min_chunk_size:
            left = (min_chunk_size - n) // 2
            chunk = np.concatenate([np.repeat(chunk[:1], left, axis=0), chunk,
                                    np.repeat(chunk[-1:], min_chunk_size - n - left, axis=0)])
        req = pynnet3.ComputationRequest.from_json({
            "inputs": [{"name": "input", "indexes": [[0, t, 0] for t in range(len(chunk))]}],
            "outputs": [{"name": "output", "indexes": [[0, 0, 0]]}]})
        out = pynnet3.run(nnet, pynnet3.compile(nnet, req), {"input": chunk})
        total += n * out.outputs["output"][0]
        weight += n
    return total / weight


@pytest.mark.parametrize("chunk_size, min_chunk_size, pad_input, chunks", [
    (-1, 5, True, {"a": [(0, 23)], "b": [(0, 3)], "c": [(0, 12)]}),
    (10, 5, True, {"a": [(0, 10), (10, 10), (20, 3)], "b": [(0, 3)], "c": [(0, 10), (10, 2)]}),
    (10, 3, False, {"a": [(0, 10), (10, 10), (20, 3)], "b": [(0, 3)], "c": [(0, 10)]}),
])
def test_small_network_matches_chunks_averaged_by_hand(model, tmp_path, capsys, chunk_size,
                                                       min_chunk_size, pad_input, chunks):
    rng = np.random.default_rng(chunk_size + min_chunk_size)
    feats = {k: rng.standard_normal((n, 4)).astype(np.float32)
             for k, n in (("a", 23), ("b", 3), ("c", 12))}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    rc = main(["xvector-compute", f"--chunk-size={chunk_size}",
               f"--min-chunk-size={min_chunk_size}", f"--pad-input={str(pad_input).lower()}",
               "--cache-capacity=2", "--use-gpu=no", str(model), f"ark:{tmp_path}/feats.ark",
               f"ark,scp:{tmp_path}/xv.ark,{tmp_path}/xv.scp"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.strip().splitlines()[-1].startswith("pynnet3 xvector-compute: summary: done 3 "
                                                   "utterances, failed 0")
    got = dict(kaldiio.load_scp(str(tmp_path / "xv.scp")))
    assert list(got) == ["a", "b", "c"]
    for key, f in feats.items():
        assert xvector_chunks(len(f), chunk_size, min_chunk_size, pad_input) == chunks[key]
        want = _by_hand(model, f, chunks[key], min_chunk_size if pad_input else 0)
        assert got[key].shape == (3,)
        np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-5)


def test_failures_are_counted_and_nothing_written_when_all_fail(model, tmp_path, capsys):
    rng = np.random.default_rng(0)
    feats = {"short": rng.standard_normal((3, 4)).astype(np.float32),
             "wrongdim": rng.standard_normal((30, 5)).astype(np.float32),
             "good": rng.standard_normal((30, 4)).astype(np.float32)}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    common = ["--min-chunk-size=5", "--pad-input=false", str(model)]
    rc = main(["xvector-compute", *common, f"ark:{tmp_path}/feats.ark",
               f"ark:{tmp_path}/out.ark"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "utterance short:" in err and "utterance wrongdim:" in err
    assert "done 1 utterances, failed 2" in err
    assert list(read_ark(tmp_path / "out.ark")) == ["good"]
    del feats["good"]
    kaldiio.save_ark(str(tmp_path / "bad.ark"), feats)
    rc = main(["xvector-compute", *common, f"ark:{tmp_path}/bad.ark",
               f"ark:{tmp_path}/none.ark"])
    assert rc == 1
    assert "done 0 utterances, failed 2" in capsys.readouterr().err
    assert not (tmp_path / "none.ark").exists()
    assert not [p for p in tmp_path.iterdir() if TAG in p.name]


def test_gzipped_model(model, tmp_path, capsys):
    import gzip

    gz = tmp_path / "model.txt.gz"
    gz.write_bytes(gzip.compress(model.read_bytes()))
    feats = {"a": np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    for m, out in ((model, "plain"), (gz, "gz")):
        assert main(["xvector-compute", "--min-chunk-size=5", str(m),
                     f"ark:{tmp_path}/feats.ark", f"ark:{tmp_path}/{out}.ark"]) == 0
    capsys.readouterr()
    np.testing.assert_array_equal(read_ark(tmp_path / "gz.ark")["a"],
                                  read_ark(tmp_path / "plain.ark")["a"])
