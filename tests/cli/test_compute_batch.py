"""``pynnet3 compute --batch-size=N``: chunks of several utterances run as the
sequences of one request. Checked against Kaldi's nnet3-compute runs, against the
whole utterance computed in one piece by hand (a small TDNN, where chunking must not
matter), and against the unbatched run (float rounding only); failures stay
per-utterance and the output keeps the input order."""

from __future__ import annotations

import json

import kaldiio
import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler
from pynnet3.cli.main import main
from pynnet3.io.ark import read_ark
from pynnet3.runtime.batching import ChunkQueue, decode_batched, frame_local
from pynnet3.runtime.simple import DecodableNnetSimple, SimpleOptions
from tests.cli.test_compute import _CASES, _cases, _data, _expected, _flags
from tests.cli.test_compute import model as model  # noqa: F401 (the fixture)
from tests.reference import needs_reference, ref_params


@pytest.mark.parametrize("case", ref_params(_cases(), "nnet3-compute runs"))
def test_batched_reproduces_kaldi_and_the_unbatched_run(case, tmp_path, monkeypatch, capsys):
    d = _CASES / case
    options = json.loads((d / "options.json").read_text())
    model_path = json.loads((d / "run_info.json").read_text())["model"]
    monkeypatch.chdir(d)
    outs = {}
    for batch in (1, 3):
        out = tmp_path / f"b{batch}.ark"
        rc = main(["compute", *_flags(options), f"--batch-size={batch}", model_path,
                   "ark:feats.ark", f"ark:{out}"])
        assert rc == 0, capsys.readouterr().err
        outs[batch] = read_ark(out)["utt1"]
    expected = read_ark(d / "output.ark")["utt1"]
    scale = np.abs(expected).max()
    assert np.abs(outs[3] - expected).max() <= 1e-4 * scale
    assert np.abs(outs[3] - outs[1]).max() <= 1e-5 * scale  # float rounding only


@pytest.mark.parametrize("flags, fsf", [
    ([], 1),
    (["--frames-per-chunk=7", "--frame-subsampling-factor=3"], 3),
    (["--frames-per-chunk=4", "--extra-left-context=5", "--extra-right-context=2",
      "--extra-left-context-initial=0", "--extra-right-context-final=1"], 1),
])
@pytest.mark.parametrize("batch", [2, 5, 64])
def test_batched_small_network_matches_the_whole_utterance(model, tmp_path, capsys, flags,  # noqa: F811
                                                           fsf, batch):
    feats, ivecs = _data(11, lengths=(23, 1, 7, 50, 8, 8, 31, 2))
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    results = {}
    for b in (1, batch):
        out = tmp_path / f"out{b}.ark"
        rc = main(["compute", *flags, f"--batch-size={b}", f"--ivectors=ark:{tmp_path}/iv.ark",
                   str(model), f"ark:{tmp_path}/feats.ark", f"ark:{out}"])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert f"done {len(feats)} utterances, failed 0" in err
        results[b] = read_ark(out)
    assert list(results[batch]) == list(feats)  # the input order
    for key, f in feats.items():
        np.testing.assert_allclose(results[batch][key], _expected(model, f, ivecs[key], fsf),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(results[batch][key], results[1][key], rtol=1e-6, atol=1e-6)


def test_batched_failures_stay_per_utterance_in_order(model, tmp_path, capsys):  # noqa: F811
    feats, ivecs = _data(12, lengths=(20, 9, 14, 30, 5))
    feats["bad_dim"] = np.zeros((9, 6), dtype=np.float32)
    ivecs["bad_dim"] = np.zeros(3, dtype=np.float32)
    order = ["utt0", "bad_dim", "utt1", "utt2", "utt3", "utt4"]
    feats = {k: feats[k] for k in order}
    del ivecs["utt2"]
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    out = tmp_path / "out.ark"
    rc = main(["compute", "--batch-size=4", "--frames-per-chunk=8",
               f"--ivectors=ark:{tmp_path}/iv.ark", str(model), f"ark:{tmp_path}/feats.ark",
               f"ark:{out}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "utterance bad_dim: features have dim 6" in err
    assert "utterance utt2: no iVector" in err
    assert "done 4 utterances, failed 2" in err.splitlines()[-1]
    got = read_ark(out)
    assert list(got) == ["utt0", "utt1", "utt3", "utt4"]
    for key in got:
        np.testing.assert_allclose(got[key], _expected(model, feats[key], ivecs[key]),
                                   rtol=1e-5, atol=1e-5)


def test_bad_batch_size_is_an_error(model, tmp_path, capsys):  # noqa: F811
    kaldiio.save_ark(str(tmp_path / "feats.ark"), _data()[0])
    assert main(["compute", "--batch-size=0", str(model), f"ark:{tmp_path}/feats.ark",
                 f"ark:{tmp_path}/o.ark"]) == 1
    assert "--batch-size must be >= 1" in capsys.readouterr().err


def test_decode_batched_uses_the_shortcut_and_one_request_per_shape(model):  # noqa: F811
    nnet = pynnet3.read_nnet(model)
    feats, ivecs = _data(13, lengths=(40, 40, 40, 17))
    cc = CachingCompiler(nnet)
    options = SimpleOptions(frames_per_chunk=10)
    ds = [DecodableNnetSimple(nnet, cc, feats[k], options, ivector=ivecs[k],
                              pad_last_chunk=True) for k in feats]
    outs = decode_batched(ds, batch_size=100)
    for key, out in zip(feats, outs, strict=True):
        np.testing.assert_allclose(out, _expected(model, feats[key], ivecs[key]),
                                   rtol=1e-5, atol=1e-5)
    # 10-row chunks (4 + 4 + 4 + 1) and one 7-row last chunk, padded to 10 rows (a
    # frame-local network): one 14-sequence request, built by the shortcut from a
    # 2-sequence compile (itself an entry)
    assert frame_local(nnet)
    info = cc.info()
    assert info["misses"] == 2 and info["entries"] == 2
    assert info["shortcut"] == 1
    # without padding the short chunk is a request of its own
    cc2 = CachingCompiler(nnet)
    ds2 = [DecodableNnetSimple(nnet, cc2, feats[k], options, ivector=ivecs[k]) for k in feats]
    outs2 = decode_batched(ds2, 100, [d.plan(pad=False) for d in ds2])
    assert cc2.info()["misses"] == 3
    for a, b in zip(outs, outs2, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    with pytest.raises(pynnet3.errors.RuntimeInputError, match="batch size"):
        decode_batched(ds, 0)


def test_the_bundled_example_batched_equals_the_whole_utterances(tmp_path, capsys):
    """The README's first command's data (the bundled TDNN-F network, its features and
    iVectors), unbatched and with --batch-size=8, against each utterance computed in
    one piece with edges repeated (a TDNN: chunking must not change the output)."""
    from importlib import resources

    examples = resources.files("pynnet3").joinpath("examples")
    model_path = examples.joinpath("tdnnf.raw")
    nnet = pynnet3.read_nnet(model_path)
    feats = dict(kaldiio.load_ark(str(examples.joinpath("feats.ark"))))
    ivecs = dict(kaldiio.load_ark(str(examples.joinpath("ivectors.ark"))))
    assert len(feats) == 6 and sum(map(len, feats.values())) == 1520
    results = {}
    for batch in (1, 8):
        out = tmp_path / f"b{batch}.ark"
        assert main(["compute", f"--batch-size={batch}",
                     f"--ivectors=ark:{examples.joinpath('ivectors.ark')}", str(model_path),
                     f"ark:{examples.joinpath('feats.ark')}", f"ark:{out}"]) == 0
        assert "done 6 utterances, failed 0; 1520 frames" in capsys.readouterr().err
        results[batch] = read_ark(out)
    nnet.set_test_mode(True)
    left, right = nnet.context()
    for key, f in feats.items():
        req = pynnet3.ComputationRequest.from_frames(range(-left, len(f) + right),
                                                     range(len(f)), ivector=True)
        rows = np.clip(np.arange(-left, len(f) + right), 0, len(f) - 1)
        want = pynnet3.run(nnet, pynnet3.compile(nnet, req),
                           {"input": f[rows], "ivector": ivecs[key][None, :]}
                           ).outputs["output"]
        scale = np.abs(want).max()
        assert np.abs(results[1][key] - want).max() <= 1e-4 * scale
        assert np.abs(results[8][key] - results[1][key]).max() <= 1e-5 * scale


def test_frame_local_networks():
    tdnn = pynnet3.Nnet.from_config("""\
input-node name=input dim=2
component name=t type=TdnnComponent input-dim=2 output-dim=2 time-offsets=-1,0,2
component-node name=t component=t input=input
output-node name=output input=Sum(t, Offset(input, 1))
""")
    assert frame_local(tdnn)
    optional = pynnet3.Nnet.from_config("""\
input-node name=input dim=2
component name=a type=AffineComponent input-dim=4 output-dim=2
component-node name=a component=a input=Append(input, IfDefined(Offset(input, 3)))
output-node name=output input=a
""")
    assert not frame_local(optional)  # (a short chunk lacks t+3 at its end: zeros)
    pooling = pynnet3.Nnet.from_config("""\
input-node name=input dim=2
component name=s type=StatisticsExtractionComponent input-dim=2 input-period=1 output-period=1 include-variance=false
component-node name=s component=s input=input
output-node name=output input=s
""")  # noqa: E501
    assert not frame_local(pooling)


@pytest.mark.parametrize("pad", [True, False])
def test_chunk_queue_runs_full_batches_in_order_and_bounds_what_it_holds(model, monkeypatch,  # noqa: F811
                                                                         pad):
    from pynnet3.runtime import batching

    nnet = pynnet3.read_nnet(model)
    feats, ivecs = _data(14, lengths=(23, 1, 7, 50, 8, 8, 31, 2, 40, 17, 33, 5))
    cc = CachingCompiler(nnet)
    options = SimpleOptions(frames_per_chunk=10)
    sizes, real = [], batching.run_chunks

    def counting(d, chunks, features=None):
        sizes.append(len(chunks))
        return real(d, chunks, features)

    monkeypatch.setattr(batching, "run_chunks", counting)
    queue = ChunkQueue(batch_size=4, max_pending=3)
    finished, held = [], []
    for key, f in feats.items():
        d = DecodableNnetSimple(nnet, cc, f, options, ivector=ivecs[key])
        queue.add(key, d, d.plan(pad), len(f))
        if queue.ready():
            finished += queue.step()
        held.append(len(queue.utterances))
    before_final = len(sizes)
    finished += queue.step(final=True)
    assert [u.key for u in finished] == list(feats)  # input order
    assert max(held) <= 3 + 1  # (max_pending, plus the one just added)
    for u in finished:
        np.testing.assert_allclose(u.output(), _expected(model, feats[u.key], ivecs[u.key]),
                                   rtol=1e-5, atol=1e-5)
    assert sum(sizes) == sum(len(u.plan) for u in finished)  # every chunk ran once
    if pad:  # one shape: every batch full until the end
        assert set(sizes[:before_final]) == {4}


def test_pad_last_chunk_same_rows_one_computation(model, tmp_path, capsys):  # noqa: F811
    feats, ivecs = _data(15, lengths=(23, 1, 7, 50, 61))
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    got, compiled = {}, {}
    for flag in ("true", "false"):
        out = tmp_path / f"{flag}.ark"
        assert main(["compute", "--batch-size=1", f"--pad-last-chunk={flag}",
                     f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
                     f"ark:{tmp_path}/feats.ark", f"ark:{out}"]) == 0
        compiled[flag] = capsys.readouterr().err.split("compiled ")[1].split()[0]
        got[flag] = read_ark(out)
    # 50-frame chunks: chunks of 23, 1, 7, 50 and 50 + 11 frames (5 lengths); padded,
    # all are 50
    assert compiled == {"true": "1", "false": "5"}
    for key, f in feats.items():
        np.testing.assert_allclose(got["true"][key], _expected(model, f, ivecs[key]),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["true"][key], got["false"][key], rtol=1e-6, atol=1e-6)


def test_frame_local_after_kernel_fusion():
    """A fused TDNN + ReLU kernel (the network optimizer's) is as frame-local as the
    TDNN layer it holds (compute pads the last chunk instead of compiling anew)."""
    tdnn = pynnet3.Nnet.from_config("""\
input-node name=input dim=2
component name=t type=TdnnComponent input-dim=2 output-dim=3 time-offsets=-1,0,2
component-node name=t component=t input=input
component name=r type=RectifiedLinearComponent dim=3
component-node name=r component=r input=t
output-node name=output input=r
""")
    fused = pynnet3.optimize_network(tdnn)
    assert type(fused.components[fused.node("r").component]).__name__ == "AffineReluComponent"
    assert frame_local(tdnn) and frame_local(fused)


_RECURRENT = """\
input-node name=input dim=3
component name=a type=NaturalGradientAffineComponent input-dim=7 output-dim=4
component-node name=a component=a input=Append(Offset(input, {x}), IfDefined(Offset(r, {r})))
component name=t type=TanhComponent dim=4
component-node name=t component=t input=a
dim-range-node name=r input-node=t dim-offset=0 dim=4
component name=o type=AffineComponent input-dim=4 output-dim=2
component-node name=o component=o input=t
output-node name=output input=o
"""


@pytest.mark.parametrize("x, r, safe", [
    (0, -1, True),   # a recurrence running forward in time: padding the end is safe
    (2, -2, True),   # looking ahead 2 frames, the recurrence back 2: within the context
    (0, 1, False),   # a recurrence running backward: the end of the chunk matters
    (-1, -3, True),
])
def test_pads_at_end_for_recurrent_networks(x, r, safe):
    from pynnet3.runtime.simple import pads_at_end

    nnet = pynnet3.Nnet.from_config(_RECURRENT.format(x=x, r=r), seed=1)
    assert not frame_local(nnet)
    assert pads_at_end(nnet) is safe
    # what the analysis claims, computed: the padded last chunk's real rows
    f = np.random.default_rng(3).standard_normal((27, 3)).astype(np.float32)
    outs = [DecodableNnetSimple(nnet, CachingCompiler(nnet), f,
                                SimpleOptions(frames_per_chunk=10),
                                pad_last_chunk=pad).output() for pad in (True, False)]
    same = np.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    assert same if safe else not same


def test_pads_at_end_refuses_an_optional_input_that_needs_more_future_frames():
    """IfDefined(Offset(b, -1)) where b looks 3 frames ahead and the descriptor's
    required part only 0: at the short chunk's end b is undefined, padded it is not."""
    from pynnet3.runtime.simple import pads_at_end

    nnet = pynnet3.Nnet.from_config("""\
input-node name=input dim=2
component name=b type=AffineComponent input-dim=2 output-dim=2
component-node name=b component=b input=Offset(input, 3)
component name=a type=AffineComponent input-dim=4 output-dim=2
component-node name=a component=a input=Append(input, IfDefined(Offset(b, -1)))
output-node name=output input=a
""", seed=2)
    assert not pads_at_end(nnet)
    f = np.random.default_rng(3).standard_normal((27, 2)).astype(np.float32)
    outs = [DecodableNnetSimple(nnet, CachingCompiler(nnet), f,
                                SimpleOptions(frames_per_chunk=10),
                                pad_last_chunk=pad).output() for pad in (True, False)]
    assert not np.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)  # (it would matter)


@needs_reference
def test_recurrent_last_chunk_padded_gives_the_same_rows(tmp_path, capsys):
    """tdnn_lstm (LSTMs running forward, 20 frames of extra left context): the short
    last chunks computed full-size give the rows the short chunks give, with one
    computation instead of one per last-chunk length."""
    from pynnet3.runtime.simple import pads_at_end
    from tests.reference import REF

    model = REF / "realistic" / "tdnn_lstm" / "model.txt"
    assert pads_at_end(pynnet3.read_nnet(model))
    rng = np.random.default_rng(4)
    feats = {f"u{k}": rng.standard_normal((n, 40)).astype(np.float32)
             for k, n in enumerate((23, 57, 80, 131))}
    ivecs = {k: rng.standard_normal(100).astype(np.float32) for k in feats}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    got, compiled = {}, {}
    for flag in ("true", "false"):
        out = tmp_path / f"{flag}.ark"
        assert main(["compute", "--extra-left-context=20", f"--pad-last-chunk={flag}",
                     f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
                     f"ark:{tmp_path}/feats.ark", f"ark:{out}"]) == 0
        compiled[flag] = int(capsys.readouterr().err.split("compiled ")[1].split()[0])
        got[flag] = read_ark(out)
    assert compiled["true"] < compiled["false"]
    for key in feats:
        scale = float(np.abs(got["false"][key]).max())
        np.testing.assert_allclose(got["true"][key], got["false"][key], rtol=1e-5,
                                   atol=1e-5 * scale)


@needs_reference
def test_few_chunks_per_request_split_the_recurrent_product(tmp_path, capsys, monkeypatch):
    """Up to FEW_SEQUENCES chunks per request, compute splits an LSTM's input
    product from its recurrent one (split-recurrent-affine); outputs equal the
    unsplit batched run's to float rounding, and the padded last chunks still make
    one computation per chunk shape."""
    import pynnet3.graphopt as graphopt
    from pynnet3.cache.caching_compiler import FEW_SEQUENCES as SPLIT_RECURRENT_UP_TO
    from tests.reference import REF

    model = REF / "realistic" / "tdnn_lstm" / "model.txt"
    rng = np.random.default_rng(7)
    feats = {f"u{k}": rng.standard_normal((n, 40)).astype(np.float32)
             for k, n in enumerate((61, 95, 140))}
    ivecs = {k: rng.standard_normal(100).astype(np.float32) for k in feats}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    seen = []
    real = graphopt.optimize_network

    def spy(nnet, options=None, **kw):
        seen.append(options.enable_rules if options is not None else ())
        return real(nnet, options, **kw)

    monkeypatch.setattr(graphopt, "optimize_network", spy)
    got, compiled = {}, {}
    for batch in (1, SPLIT_RECURRENT_UP_TO, 32):
        out = tmp_path / f"{batch}.ark"
        assert main(["compute", "--extra-left-context=20", f"--batch-size={batch}",
                     f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
                     f"ark:{tmp_path}/feats.ark", f"ark:{out}"]) == 0
        compiled[batch] = int(capsys.readouterr().err.split("compiled ")[1].split()[0])
        got[batch] = read_ark(out)
    assert seen == [("split-recurrent-affine",)] * 2 + [()]
    assert compiled[1] == 1  # (every chunk full-size: the last ones padded)
    for batch in (1, SPLIT_RECURRENT_UP_TO):
        for key in feats:
            scale = float(np.abs(got[32][key]).max())
            np.testing.assert_allclose(got[batch][key], got[32][key], rtol=1e-5,
                                       atol=1e-5 * scale)
