"""Looped decoding (DecodableNnetSimpleLooped) against Kaldi's runs in
kaldi-reference/looped, against whole-utterance computations, and the stepping
interface of NnetComputer (accept_input / run_until_io / get_output)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from pynnet3.computation import CommandType as CT
from pynnet3.errors import RuntimeInputError
from pynnet3.io.ark import read_ark
from pynnet3.optimize.io_ops import consolidate_io_operations
from pynnet3.runtime.computer import NnetComputer
from pynnet3.runtime.looped import (
    DecodableNnetLooped,
    LoopedDecodingInfo,
    LoopedOptions,
    decode_looped,
)
from tests.compiler import nets as N
from tests.compiler.test_looped import ALL_OFF, LOOPED_RNN
from tests.reference import REF, require_reference

RUNS = ["tdnn_lstm_fpc20", "tdnnf_chain_fpc20", "tdnnf_chain_fpc9_fsf3"]
ATOL = 5e-5  # the README's suggested tolerance for another implementation


def _frames(t) -> np.ndarray:
    t = np.asarray(t, dtype=np.int64)
    return np.stack([np.zeros_like(t), t, np.zeros_like(t)], axis=1)


def whole_utterance(nnet, feats, ivector, fsf: int, dtype=np.float32) -> np.ndarray:
    """Kaldi's non-looped DecodableNnetSimple with one chunk for the whole utterance
    (frames-per-chunk = frames + 10): inputs -L .. last output + R (edge frames
    repeated), the iVector at t=0, outputs every ``fsf`` frames; the original
    network (ReplaceIndex iVector), an ordinary computation."""
    left, right = nnet.context()
    n = len(feats)
    out_t = np.arange(-(-n // fsf)) * fsf
    in_t = np.arange(-left, out_t[-1] + right + 1)
    inputs = {"input": _frames(in_t)}
    x = {"input": feats[np.clip(in_t, 0, n - 1)]}
    if ivector is not None:
        inputs["ivector"] = _frames([0])
        x["ivector"] = np.asarray(ivector)[None, :]
    c = pynnet3.compile(nnet, N.request(inputs, {"output": _frames(out_t)}))
    return pynnet3.run(nnet, c, x, dtype=dtype).outputs["output"]


class _Run:
    def __init__(self, name: str):
        d = REF / "looped" / name
        self.info = json.loads((d / "run_info.json").read_text())
        self.options = LoopedOptions.from_flags(json.loads((d / "options.json").read_text()))
        self.nnet = pynnet3.read_nnet(d / self.info["model"])
        self.nnet.set_test_mode(True)
        self.feats = read_ark(d / "feats.ark")["utt1"]
        self.ivector = read_ark(d / "ivector.ark")["utt1"]
        self.expected = read_ark(d / "output.ark")["utt1"]
        self.decoding = LoopedDecodingInfo(self.nnet, self.options)


_CACHE: dict[str, _Run] = {}


@pytest.fixture(params=RUNS)
def ref_run(request) -> _Run:
    require_reference()
    if request.param not in _CACHE:
        _CACHE[request.param] = _Run(request.param)
    return _CACHE[request.param]


# -- Kaldi's runs -------------------------------------------------------------------------
def test_output_matches_kaldi(ref_run):
    r = ref_run
    out = DecodableNnetLooped(r.decoding, r.feats, r.ivector).output()
    assert out.shape == tuple(r.info["output_shape"]) == r.expected.shape
    np.testing.assert_allclose(out, r.expected, rtol=0, atol=ATOL)
    # A second decodable on the same info repeats the result exactly (Kaldi: 0).
    again = DecodableNnetLooped(r.decoding, r.feats, r.ivector).output()
    np.testing.assert_array_equal(again, out)


def test_output_matches_kaldi_without_other_optimizations(ref_run):
    """The loop is formed on the compiler's own output too (every other pass off)."""
    r = ref_run
    opts = LoopedOptions(r.options.frames_per_chunk, r.options.frame_subsampling_factor,
                         r.options.extra_left_context_initial, r.options.acoustic_scale,
                         ALL_OFF)
    out = decode_looped(r.nnet, r.feats, r.ivector, opts)
    np.testing.assert_allclose(out, r.expected, rtol=0, atol=ATOL)


def test_looped_equals_whole_utterance(ref_run):
    """As in Kaldi (max_abs_diff_vs_nonlooped_whole_utterance: 4.8e-7 LSTM, 1.3e-5 /
    1.0e-5 TDNN-F): the state carried across chunks makes looped decoding equal to
    one computation over the whole utterance, up to float rounding."""
    r = ref_run
    out = DecodableNnetLooped(r.decoding, r.feats, r.ivector).output()
    whole = whole_utterance(r.nnet, r.feats, r.ivector, r.options.frame_subsampling_factor)
    np.testing.assert_allclose(out, whole, rtol=0, atol=ATOL)
    kaldi = r.info["max_abs_diff_vs_nonlooped_whole_utterance"]
    assert np.abs(out - whole).max() < max(4 * kaldi, 1e-6)


def test_frames_one_at_a_time(ref_run):
    r = ref_run
    dec = DecodableNnetLooped(r.decoding, r.feats, r.ivector)
    assert dec.num_frames == r.info["num_output_frames"]
    rows = [dec.output_for_frame(f) for f in range(0, dec.num_frames, 7)]
    np.testing.assert_allclose(np.stack(rows), r.expected[::7], rtol=0, atol=ATOL)
    with pytest.raises(RuntimeInputError, match="order"):
        dec.output_for_frame(0)
    with pytest.raises(RuntimeInputError, match="outside"):
        dec.output_for_frame(dec.num_frames)


def test_computation_size_vs_kaldi(ref_run):
    """Not a pass/fail comparison: Kaldi keeps its no-ops in looped computations and
    other passes are still being added; this records where we stand (pytest -s)."""
    r = ref_run
    s = r.decoding.computation.stats()
    kaldi_noops = r.info["command_histogram"].get("kNoOperation", 0)
    print(f"\n{r.info['model'].split('/')[-2]} fpc {r.options.frames_per_chunk}: commands "
          f"{s['num_commands']} (Kaldi {r.info['num_commands']}, {kaldi_noops} of them "
          f"no-ops), matrices {s['num_matrices']} (Kaldi {r.info['num_matrices']}), "
          f"peak floats {s['peak_memory_floats']} (Kaldi {r.info['peak_memory_floats']})")
    assert s["num_commands"] > 0 and s["peak_memory_floats"] > 0


# -- small networks, float64 ------------------------------------------------------------------
@pytest.mark.parametrize("config,has_iv", [(N.TDNN, False), (N.IVECTOR, True),
                                           (N.FAILOVER, False), (LOOPED_RNN, True)],
                         ids=["tdnn", "ivector", "failover", "rnn"])
@pytest.mark.parametrize("fpc,fsf", [(4, 1), (5, 1), (4, 2), (6, 3)])
def test_small_nets_equal_whole_utterance(config, has_iv, fpc, fsf):
    nnet = pynnet3.Nnet.from_config(config, seed=5)
    N.to_float64(nnet)
    rng = np.random.default_rng(fpc * 10 + fsf)
    feats = rng.standard_normal((23, nnet.input_dim("input")))
    iv = rng.standard_normal(nnet.input_dim("ivector")) if has_iv else None
    opts = LoopedOptions(frames_per_chunk=fpc, frame_subsampling_factor=fsf,
                         acoustic_scale=1.0)
    out = decode_looped(nnet, feats, iv, opts, dtype=np.float64)
    whole = whole_utterance(nnet, feats, iv, fsf, dtype=np.float64)
    assert out.shape == whole.shape == (-(-23 // fsf), nnet.output_dim("output"))
    np.testing.assert_allclose(out, whole, rtol=1e-12, atol=1e-12)


def test_acoustic_scale_and_short_utterances():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    N.to_float64(nnet)
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=4, acoustic_scale=0.5))
    rng = np.random.default_rng(0)
    for n in (1, 3, 4, 9):
        feats = rng.standard_normal((n, 3))
        out = DecodableNnetLooped(info, feats, dtype=np.float64).output()
        np.testing.assert_allclose(out, 0.5 * whole_utterance(nnet, feats, None, 1,
                                                              dtype=np.float64),
                                   rtol=1e-12, atol=1e-12)


def test_decodable_input_errors():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=4))
    feats = np.zeros((6, 3))
    with pytest.raises(RuntimeInputError, match="ivector"):
        DecodableNnetLooped(info, feats)
    with pytest.raises(RuntimeInputError, match="dim 2"):
        DecodableNnetLooped(info, feats, np.zeros(3))
    with pytest.raises(RuntimeInputError, match="features"):
        DecodableNnetLooped(info, np.zeros((6, 4)), np.zeros(2))
    with pytest.raises(RuntimeInputError, match="frames-per-chunk|unknown"):
        LoopedOptions.from_flags({"frames_per_chunk": 3})
    dec = DecodableNnetLooped(info, feats, np.zeros(2))
    dec.output_for_frame(0)
    with pytest.raises(RuntimeInputError, match="fresh"):
        dec.output()


def test_online_ivectors_pick_the_row_of_the_last_input_frame():
    """With online iVectors, chunk k gets the row of its (one past) last input frame,
    clamped to the last row (Kaldi's GetCurrentIvector)."""
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=1)
    N.to_float64(nnet)
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=4, acoustic_scale=1.0))
    rng = np.random.default_rng(2)
    feats = rng.standard_normal((13, 3))
    online = rng.standard_normal((2, 2))
    out = DecodableNnetLooped(info, feats, online_ivectors=online, online_ivector_period=5,
                              dtype=np.float64).output()
    # Chunk 0 reads frames -1..3 (end 4 -> row 0); chunks 1.. end at 8, 12, 16 -> rows 1.
    for k, row in enumerate([0, 1, 1, 1]):
        ref = DecodableNnetLooped(info, feats, online[row], dtype=np.float64).output()
        np.testing.assert_array_equal(out[4 * k:4 * k + 4], ref[4 * k:4 * k + 4])


# -- the stepping interface of NnetComputer ------------------------------------------------------
@pytest.fixture(scope="module")
def tdnn_case():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    req = N.request({"input": N.frames(-3, 9)}, {"output": N.frames(0, 6)}, True, True, True)
    x = N.random_inputs(nnet, req, np.random.default_rng(0))
    d = N.random_output_derivs(nnet, req, np.random.default_rng(1))
    return nnet, req, x, d


def _compiled(nnet, req, optimize: bool):
    c = pynnet3.compile(nnet, req, optimize=optimize)
    # Kaldi's compiler consolidates I/O commands; stepping relies on it (the optimizer
    # always does it; the plain compiler may not).
    consolidate_io_operations(c)
    return c


@pytest.mark.parametrize("optimize", [False, True])
def test_stepping_equals_run(tdnn_case, optimize):
    nnet, req, x, d = tdnn_case
    c = _compiled(nnet, req, optimize)
    ref = pynnet3.run(nnet, c, x, d)
    comp = NnetComputer(nnet, c)
    comp.accept_input("input", x["input"])
    comp.run_until_io()
    out = comp.get_output("output")
    np.testing.assert_array_equal(out, ref.outputs["output"])
    np.testing.assert_array_equal(comp.get_output("output"), out)  # outputs can be re-read
    comp.accept_input("output", d["output"], is_deriv=True)
    comp.run_until_io()
    np.testing.assert_array_equal(comp.get_output("input", is_deriv=True),
                                  ref.input_derivs["input"])
    grads = comp.gradients()
    assert set(grads) == set(ref.gradients)
    for name, g in grads.items():
        for k, v in g.items():
            np.testing.assert_array_equal(v, ref.gradients[name][k])


def test_stepping_errors(tdnn_case):
    nnet, req, x, d = tdnn_case
    c = _compiled(nnet, req, False)
    comp = NnetComputer(nnet, c)
    with pytest.raises(RuntimeInputError, match="no input given.*input"):
        comp.run_until_io()
    comp = NnetComputer(nnet, c)
    with pytest.raises(RuntimeInputError, match="does not expect input 'speaker'"):
        comp.accept_input("speaker", x["input"])
    with pytest.raises(RuntimeInputError, match=r"shape \(12, 3\)"):
        comp.accept_input("input", x["input"][:5])
    comp.accept_input("input", x["input"])
    with pytest.raises(RuntimeInputError, match="does not expect output 'output'"):
        comp.get_output("output")  # not computed yet
    comp.run_until_io()
    comp.get_output("output")
    comp.accept_input("output", d["output"], is_deriv=True)
    comp.run_until_io()
    assert not comp.finished
    comp.get_output("input", is_deriv=True)  # the last command
    assert comp.finished
    with pytest.raises(RuntimeInputError, match="finished"):
        comp.run_until_io()


def test_looped_computation_is_not_run_in_one_go():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=1)
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=4))
    assert info.computation.commands[-1].type is CT.GOTO_LABEL
    with pytest.raises(RuntimeInputError, match="looped"):
        pynnet3.run(info.nnet, info.computation, {"input": np.zeros((10, 3))})
    comp = NnetComputer(info.nnet, info.computation)
    assert not comp.finished


# -- the archive reader the tests use ------------------------------------------------------------
def test_ark_round_trip_and_errors():
    from pynnet3.errors import FormatError
    from pynnet3.io.ark import ark_bytes, parse_ark

    d = REF / "looped" / "tdnnf_chain_fpc20"
    require_reference()
    for f in ("feats.ark", "ivector.ark", "output.ark"):
        data = (d / f).read_bytes()
        entries = dict(parse_ark(data))
        assert ark_bytes(entries) == data  # byte-exact: the header sizes and data are right
    feats = read_ark(d / "feats.ark")["utt1"]
    assert feats.shape == (317, 40) and feats.dtype == np.float32
    m = np.arange(6, dtype=np.float64).reshape(2, 3)
    back = dict(parse_ark(ark_bytes({"a": m, "b": m[0]}, double=True)))
    np.testing.assert_array_equal(back["a"], m)
    np.testing.assert_array_equal(back["b"], m[0])
    with pytest.raises(FormatError, match="truncated"):
        list(parse_ark(ark_bytes({"a": m})[:-3]))
    # text entries are read too (kaldiio)
    np.testing.assert_array_equal(dict(parse_ark(b"a [ 1 2 ]\n"))["a"], [1, 2])


@pytest.mark.parametrize("config,has_iv", [(N.TDNN, False), (N.IVECTOR, True),
                                           (LOOPED_RNN, True)], ids=["tdnn", "ivector", "rnn"])
def test_prepared_stepping_ops_equal_executing_each_command(config, has_iv, monkeypatch):
    """run_until_io goes through each command's prepared call (program.step_ops,
    kept with the shared looped computation): the floats of _execute, chunk after
    chunk, utterance after utterance."""
    nnet = pynnet3.Nnet.from_config(config, seed=6)
    rng = np.random.default_rng(8)
    utts = [(rng.standard_normal((n, nnet.input_dim("input"))).astype(np.float32),
             rng.standard_normal(nnet.input_dim("ivector")).astype(np.float32)
             if has_iv else None) for n in (17, 9, 30)]
    info = LoopedDecodingInfo(nnet, LoopedOptions(frames_per_chunk=5, acoustic_scale=1.0))
    fast = [DecodableNnetLooped(info, f, iv).output() for f, iv in utts]
    assert info.computation is not None
    from pynnet3.runtime import program as P
    assert P.program_for(info.computation).steps is not None  # (prepared once, kept)
    monkeypatch.setattr(NnetComputer, "_step_ops", lambda self: None)
    slow = [DecodableNnetLooped(info, f, iv).output() for f, iv in utts]
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)
