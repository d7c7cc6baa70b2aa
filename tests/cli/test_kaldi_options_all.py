"""The commands that stand in for Kaldi programs (info, init, copy, am-info, am-copy,
compute, xvector-compute; train, merge-egs and average in test_review_egs_cli.py)
accept every option their program registers (src/nnet3bin/<program>.cc and the
Register() of the options structs it uses: NnetSimpleComputationOptions,
NnetOptimizeOptions under ``--optimization.``, NnetComputeOptions under
``--computation.``, CachingOptimizingCompilerOptions, CuDevice's device options,
ParseOptions' standard ones), and follow Kaldi's ParseOptions conventions:
``--config=FILE`` read first and overridden by the command line, ``--x_y`` is
``--x-y``, a bare boolean is true. An unknown option is still one error line and
exit status 1."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

import pynnet3
from pynnet3.am import AcousticModel, read_am
from pynnet3.cli.main import main
from pynnet3.components.affine import BlockAffineComponent
from pynnet3.io.am_file import HmmState, HmmTopology, TransitionModel
from pynnet3.io.ark import parse_ark, read_ark, write_ark
from pynnet3.nnet import nnet_from_bytes, read_nnet

from .test_xvector_compute import _CONFIG as XVECTOR_CONFIG  # (a statistics-pooling net)

# a network with an iVector input (for --ivectors / --utt2spk), a RepeatedAffineComponent
# (for --convert-repeated-to-block) and context on both sides
CONFIG = "\n".join([
    "input-node name=input dim=4",
    "input-node name=ivector dim=2",
    "component name=rep type=RepeatedAffineComponent input-dim=12 output-dim=6 "
    "num-repeats=3 learning-rate=0.002 max-change=0.5",
    "component-node name=rep component=rep input=Append(Offset(input,-1), input, "
    "Offset(input,1))",
    "component name=affine type=AffineComponent input-dim=8 output-dim=3",
    "component-node name=affine component=affine input=Append(rep, "
    "ReplaceIndex(ivector, t, 0))",
    "component name=sm type=LogSoftmaxComponent dim=3",
    "component-node name=sm component=sm input=affine",
    "output-node name=output input=sm"]) + "\n"
# what init / --nnet-config add to it: a second output, one more frame of left context
EXTRA = "\n".join([
    "component name=extra type=AffineComponent input-dim=8 output-dim=2",
    "component-node name=extra component=extra input=Append(Offset(input,-2), input)",
    "output-node name=output-extra input=extra"]) + "\n"
UTTS = ("u1", "u2", "u3")
SPEAKER = {"u1": "spkA", "u2": "spkB", "u3": "spkA"}


def run(argv, monkeypatch) -> tuple[int, bytes, str]:
    """main(argv); (status, stdout bytes, stderr)."""
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", err)
    rc = main([str(a) for a in argv])
    stdout.flush()
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """config files, a raw model, an acoustic model, features, per-speaker iVectors,
    utt2spk, and the same iVectors per utterance."""
    d = tmp_path_factory.mktemp("kaldi-options")
    rng = np.random.default_rng(0)
    (d / "nnet.config").write_text(CONFIG)
    (d / "extra.config").write_text(EXTRA)
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=1)
    nnet.write(d / "m.raw", binary=True)
    entry = [HmmState(0, 0, [(0, 0.5), (1, 0.5)]), HmmState()]
    tm = TransitionModel.build(HmmTopology([entry], np.array([-1, 0, 0])),
                               lambda phone, c: phone - 1)
    AcousticModel(tm, nnet, np.array([0.2, 0.3, 0.5])).write(d / "final.mdl", binary=True)
    write_ark(d / "feats.ark", {u: rng.standard_normal((23, 4)).astype(np.float32)
                                for u in UTTS})
    spk = {s: rng.standard_normal(2).astype(np.float32) for s in ("spkA", "spkB")}
    write_ark(d / "spk_ivectors.ark", spk)
    write_ark(d / "utt_ivectors.ark", {u: spk[SPEAKER[u]] for u in UTTS})
    (d / "utt2spk").write_text("".join(f"{u} {SPEAKER[u]}\n" for u in UTTS))
    return d


# -- the runners: each command on the fixture's files, its output as bytes ---------------


def _output(files, command: str, flags: list[str], monkeypatch, tmp_path):
    """(status, what the command wrote, stderr) for ``command`` with ``flags``."""
    d = files
    out = tmp_path / "out"
    if out.exists():
        out.unlink()
    args = {
        "info": [d / "m.raw"],
        "am-info": [d / "final.mdl"],
        "init": [d / "nnet.config", out],
        "copy": [d / "m.raw", out],
        "am-copy": [d / "final.mdl", out],
        "compute": [d / "m.raw", f"ark:{d / 'feats.ark'}", f"ark:{out}"],
        "xvector-compute": [d / "xvector.raw", f"ark:{d / 'feats.ark'}", f"ark:{out}"],
    }[command]
    if command == "compute" and not any(f.startswith("--ivectors") for f in flags):
        flags = [f"--ivectors=ark:{d / 'utt_ivectors.ark'}", *flags]
    if command == "xvector-compute" and not (d / "xvector.raw").exists():
        pynnet3.Nnet.from_config(XVECTOR_CONFIG, seed=2).write(d / "xvector.raw")
    rc, stdout, err = run([command, *flags, *args], monkeypatch)
    return rc, (out.read_bytes() if out.exists() else stdout), err


_OPTIMIZATION_DEFAULTS = [  # NnetOptimizeOptions::Register, at Kaldi's defaults
    "--optimization.optimize=true", "--optimization.consolidate-model-update=true",
    "--optimization.propagate-in-place=true", "--optimization.backprop-in-place=true",
    "--optimization.extend-matrices=true", "--optimization.optimize-row-ops=true",
    "--optimization.split-row-ops=true", "--optimization.convert-addition=true",
    "--optimization.remove-assignments=true", "--optimization.allow-left-merge=true",
    "--optimization.allow-right-merge=true", "--optimization.initialize-undefined=true",
    "--optimization.move-sizing-commands=true", "--optimization.allocate-from-other=true",
    "--optimization.min-deriv-time=-2147483648", "--optimization.max-deriv-time=2147483647",
    "--optimization.max-deriv-time-relative=2147483647",
    "--optimization.snip-row-ops=true", "--optimization.memory-compression-level=1"]
_SIMPLE_COMPUTATION_DEFAULTS = [  # NnetSimpleComputationOptions::Register (+computation.)
    "--extra-left-context=0", "--extra-right-context=0", "--extra-left-context-initial=-1",
    "--extra-right-context-final=-1", "--frame-subsampling-factor=1",
    "--acoustic-scale=1.0", "--frames-per-chunk=50", "--debug-computation=false",
    "--computation.debug=false"]
_STANDARD = ["--verbose=0", "--verbose=2", "--print-args=true", "--print-args=false"]
_CUDA = ["--cuda-use-tensor-cores=false", "--cuda-use-tf32-compute=false"]

KALDI_OPTIONS = {
    "info": _STANDARD,  # (nnet3-info registers nothing else)
    "am-info": _STANDARD,
    "init": ["--binary=true", "--srand=0", *_STANDARD],
    "copy": ["--binary=true", "--learning-rate=-1", "--nnet-config=", "--edits-config=",
             "--edits=", "--scale=1.0", "--prepare-for-test=false",
             "--batchnorm-test-mode=false", *_STANDARD],
    "am-copy": ["--binary=true", "--raw=false", "--set-raw-nnet=",
                "--convert-repeated-to-block=false", "--nnet-config=", "--edits-config=",
                "--edits=", "--learning-rate=-1", "--scale=1", "--prepare-for-test=false",
                *_STANDARD],
    "compute": [*_SIMPLE_COMPUTATION_DEFAULTS, *_OPTIMIZATION_DEFAULTS, "--utt2spk=",
                "--online-ivectors=", "--online-ivector-period=0", "--apply-exp=false",
                "--use-gpu=no", "--use-priors=false", *_CUDA, *_STANDARD],
    "xvector-compute": [*_SIMPLE_COMPUTATION_DEFAULTS, *_OPTIMIZATION_DEFAULTS,
                        "--use-shortcut=true", "--cache-capacity=64", "--use-gpu=no",
                        "--chunk-size=-1", "--min-chunk-size=100", "--pad-input=true",
                        "--cached-compiler-in=", "--cached-compiler-out=", *_CUDA,
                        *_STANDARD],
}
_CASES = [(c, f) for c, flags in KALDI_OPTIONS.items() for f in flags]
_BASELINE: dict[str, bytes] = {}


@pytest.mark.parametrize("command, flag", _CASES, ids=[f"{c} {f}" for c, f in _CASES])
def test_each_kaldi_option_at_its_default_changes_nothing(files, command, flag,
                                                          monkeypatch, tmp_path):
    """Each option the Kaldi program registers, given at its default, is accepted
    and the command writes what it writes without it."""
    if command not in _BASELINE:
        rc, plain, _ = _output(files, command, [], monkeypatch, tmp_path)
        assert rc == 0
        _BASELINE[command] = plain
    rc, got, err = _output(files, command, [flag], monkeypatch, tmp_path)
    assert rc == 0, err
    assert got == _BASELINE[command]


@pytest.mark.parametrize("command", list(KALDI_OPTIONS))
def test_unknown_option_is_one_line_and_status_1(files, command, monkeypatch, tmp_path):
    rc, got, err = _output(files, command, ["--no-such-option=1"], monkeypatch, tmp_path)
    assert rc == 1 and got == b""
    # (as before: argparse's top-level parser reports unknown options)
    assert err.count("\n") == 1 and err.startswith("pynnet3")
    assert "unrecognized arguments: --no-such-option=1" in err
    # a missing or malformed --config file: one line too
    rc, _, err = _output(files, command, [f"--config={tmp_path / 'none.conf'}"], monkeypatch,
                         tmp_path)
    assert rc == 1 and err.count("\n") == 1 and "cannot open config file" in err
    (tmp_path / "bad.conf").write_text("binary=false\n")
    rc, _, err = _output(files, command, [f"--config={tmp_path / 'bad.conf'}"], monkeypatch,
                         tmp_path)
    assert rc == 1 and err.count("\n") == 1 and "line 1" in err and "--x=y" in err


# -- --config, --x_y, bare booleans -----------------------------------------------------


@pytest.mark.parametrize("command, conf, override, same_as", [
    # (the config's lines, a command-line flag overriding one, the flags it equals)
    ("init", "--srand=3\n--binary=false  # text\n", ["--srand=4"],
     ["--srand=4", "--binary=false"]),
    ("copy", "--binary=false\n--scale=2\n", ["--Scale=3"], ["--binary=false", "--scale=3"]),
    ("am-copy", "# raw network, text\n--raw=true\n--binary=false\n", ["--binary"],
     ["--raw=true", "--binary=true"]),
    ("compute", "--apply-exp=true\n--frames_per_chunk=7\n--acoustic-scale=0.5\n",
     ["--acoustic_scale=2"], ["--apply-exp=true", "--frames-per-chunk=7",
                              "--acoustic-scale=2"]),
    ("xvector-compute", "--chunk-size=5\n--min-chunk-size=3\n", ["--pad_input=false"],
     ["--chunk-size=5", "--min-chunk-size=3", "--pad-input=false"]),
])
def test_config_file_then_command_line(files, command, conf, override, same_as, monkeypatch,
                                       tmp_path):
    """Kaldi reads --config first; the command line overrides it; names normalized
    (ParseOptions::NormalizeArgName: '_' is '-', case ignored); a bare bool is true."""
    path = tmp_path / "opts.conf"
    path.write_text(conf)
    rc, got, err = _output(files, command, [f"--config={path}", *override], monkeypatch,
                           tmp_path)
    assert rc == 0, err
    rc, expected, _ = _output(files, command, same_as, monkeypatch, tmp_path)
    assert rc == 0 and got == expected
    rc, plain, _ = _output(files, command, [], monkeypatch, tmp_path)
    assert rc == 0 and got != plain  # (the options did something)


def test_bare_booleans_and_underscores_on_every_command(files, monkeypatch, tmp_path):
    def same(command, a, b):
        ra, oa, _ = _output(files, command, a, monkeypatch, tmp_path)
        rb, ob, _ = _output(files, command, b, monkeypatch, tmp_path)
        assert ra == rb == 0 and oa == ob, (command, a, b)

    same("copy", ["--prepare-for-test"], ["--prepare-for-test=true"])
    same("copy", ["--binary=false", "--batchnorm_test_mode"], ["--binary=false",
                                                               "--batchnorm-test-mode=true"])
    same("am-copy", ["--Raw", "--convert_repeated_to_block"],
         ["--raw=true", "--convert-repeated-to-block=true"])
    same("compute", ["--apply-exp"], ["--apply-exp=true"])
    same("compute", ["--optimization.optimize", "--APPLY_EXP"],
         ["--optimization.optimize=true", "--apply-exp=true"])
    same("xvector-compute", ["--pad-input"], ["--pad-input=true"])
    same("init", ["--binary", "--SRAND=2"], ["--binary=true", "--srand=2"])
    same("info", ["--print_args"], [])


# -- the options' effects ------------------------------------------------------------------


def test_init_adds_to_an_existing_model(files, monkeypatch, tmp_path):
    """nnet3-init EXISTING CONFIG OUT: the config's lines are added to the model, its
    own components kept; the same network as copy --nnet-config makes."""
    out = tmp_path / "added.raw"
    rc, _, err = run(["init", files / "m.raw", files / "extra.config", out], monkeypatch)
    assert rc == 0, err
    added, old = read_nnet(out), read_nnet(files / "m.raw")
    assert set(added.output_names()) == {"output", "output-extra"}
    np.testing.assert_array_equal(added.components["affine"].linear_params,
                                  old.components["affine"].linear_params)
    rc, _, _ = run(["copy", f"--nnet-config={files / 'extra.config'}", files / "m.raw",
                    tmp_path / "copied.raw"], monkeypatch)
    assert rc == 0 and out.read_bytes() == (tmp_path / "copied.raw").read_bytes()
    rc, _, err = run(["init", "a", "b", "c", "d"], monkeypatch)
    assert rc == 1 and "unrecognized arguments: d" in err


def _raw_outputs(files, monkeypatch, tmp_path, model) -> dict:
    out = tmp_path / "o.ark"
    rc, _, err = run(["compute", f"--ivectors=ark:{files / 'utt_ivectors.ark'}", model,
                      f"ark:{files / 'feats.ark'}", f"ark:{out}"], monkeypatch)
    assert rc == 0, err
    return read_ark(out)


def test_am_copy_convert_repeated_to_block(files, monkeypatch, tmp_path):
    """ConvertRepeatedToBlockAffine: a BlockAffineComponent with the repeated block
    stacked num-repeats times and the learning-rate settings; the same outputs."""
    out = tmp_path / "block.mdl"
    rc, _, err = run(["am-copy", "--convert-repeated-to-block=true", files / "final.mdl",
                      out], monkeypatch)
    assert rc == 0, err
    rep = read_am(files / "final.mdl").nnet.components["rep"]
    am = read_am(out)
    block = am.nnet.components["rep"]
    assert type(block) is BlockAffineComponent and block.num_blocks == 3
    np.testing.assert_array_equal(block.linear_params, np.vstack([rep.linear_params] * 3))
    np.testing.assert_array_equal(block.bias_params, np.concatenate([rep.bias_params] * 3))
    assert (block.learning_rate, block.max_change) == (rep.learning_rate, rep.max_change)
    np.testing.assert_array_equal(am.priors, read_am(files / "final.mdl").priors)
    raw = tmp_path / "block.raw"
    assert run(["am-copy", "--raw", out, raw], monkeypatch)[0] == 0
    got = _raw_outputs(files, monkeypatch, tmp_path, raw)
    expected = _raw_outputs(files, monkeypatch, tmp_path, files / "m.raw")
    for u in UTTS:
        np.testing.assert_allclose(got[u], expected[u], rtol=1e-5, atol=1e-6)


def test_am_copy_edits_learning_rate_scale_as_copy(files, monkeypatch, tmp_path):
    """--nnet-config, --learning-rate, --edits-config, --edits, --scale and
    --prepare-for-test change the network as copy's do (the transition model and
    priors kept); --raw=true writes that network."""
    edits = tmp_path / "edits"
    edits.write_text("set-learning-rate-factor name=aff* learning-rate-factor=0.5\n")
    flags = [f"--nnet-config={files / 'extra.config'}", "--learning-rate=0.25",
             f"--edits-config={edits}", "--edits=rename-node old-name=sm new-name=smx",
             "--scale=0.5", "--prepare-for-test=true"]
    rc, _, err = run(["am-copy", "--raw=true", *flags, files / "final.mdl",
                      tmp_path / "am.raw"], monkeypatch)
    assert rc == 0, err
    rc, _, err = run(["copy", *flags, files / "m.raw", tmp_path / "copy.raw"], monkeypatch)
    assert rc == 0, err
    assert (tmp_path / "am.raw").read_bytes() == (tmp_path / "copy.raw").read_bytes()
    rc, _, _ = run(["am-copy", *flags, files / "final.mdl", tmp_path / "full.mdl"],
                   monkeypatch)
    assert rc == 0
    am, before = read_am(tmp_path / "full.mdl"), read_am(files / "final.mdl")
    assert am.nnet.to_bytes() == read_nnet(tmp_path / "copy.raw").to_bytes()
    np.testing.assert_array_equal(am.priors, before.priors)
    # (SetContext: the context is the edited network's)
    assert (am.left_context, am.right_context) == am.nnet.context()


def test_am_copy_recomputes_the_stored_context(files, monkeypatch, tmp_path):
    """AmNnetSimple::Read and SetContext: nnet3-am-copy writes the network's own
    context, whatever the file said."""
    am = read_am(files / "final.mdl")
    wrong = AcousticModel(am.transition_model, am.nnet, am.priors, 7, 9)
    wrong.write(tmp_path / "wrong.mdl")
    rc, _, _ = run(["am-copy", tmp_path / "wrong.mdl", tmp_path / "right.mdl"], monkeypatch)
    assert rc == 0
    assert (tmp_path / "right.mdl").read_bytes() == (files / "final.mdl").read_bytes()


def test_am_copy_set_raw_nnet(files, monkeypatch, tmp_path):
    """--set-raw-nnet replaces the network (before the other options); the priors
    stay when the output dim does, and are removed with a warning when not."""
    other = pynnet3.Nnet.from_config(CONFIG, seed=5)
    other.write(tmp_path / "other.raw")
    rc, _, err = run(["am-copy", f"--set-raw-nnet={tmp_path / 'other.raw'}", "--scale=2",
                      files / "final.mdl", tmp_path / "set.mdl"], monkeypatch)
    assert rc == 0 and err == ""
    am = read_am(tmp_path / "set.mdl")
    np.testing.assert_array_equal(am.priors, read_am(files / "final.mdl").priors)
    np.testing.assert_allclose(am.nnet.components["affine"].linear_params,
                               2 * other.components["affine"].linear_params, rtol=1e-6)
    wider = pynnet3.Nnet.from_config(CONFIG.replace("output-dim=3", "output-dim=5")
                                     .replace("dim=3", "dim=5"), seed=5)
    wider.write(tmp_path / "wider.raw")
    rc, _, err = run(["am-copy", f"--set-raw-nnet={tmp_path / 'wider.raw'}",
                      files / "final.mdl", tmp_path / "wider.mdl"], monkeypatch)
    assert rc == 0
    assert err == ("WARNING (pynnet3 am-copy) Removing priors since there is a dimension "
                   "mismatch after changing the nnet: 3 vs. 5\n")
    am = read_am(tmp_path / "wider.mdl")
    assert am.priors.size == 0 and am.num_pdfs == 5


def test_compute_utt2spk_looks_ivectors_up_by_speaker(files, monkeypatch, tmp_path):
    """--utt2spk with --ivectors (RandomAccessBaseFloatVectorReaderMapped): each
    utterance takes its speaker's iVector; without --ivectors it is not used; an
    utterance missing from the map fails."""
    feats = f"ark:{files / 'feats.ark'}"
    out = tmp_path / "spk.ark"
    rc, _, err = run(["compute", f"--ivectors=ark:{files / 'spk_ivectors.ark'}",
                      f"--utt2spk=ark:{files / 'utt2spk'}", files / "m.raw", feats,
                      f"ark:{out}"], monkeypatch)
    assert rc == 0, err
    by_utt = _raw_outputs(files, monkeypatch, tmp_path, files / "m.raw")
    got = read_ark(out)
    assert list(got) == list(UTTS)
    for u in UTTS:
        np.testing.assert_array_equal(got[u], by_utt[u])
    # without it, the speakers' table has no utterance keys: every utterance fails
    rc, _, err = run(["compute", f"--ivectors=ark:{files / 'spk_ivectors.ark'}",
                      files / "m.raw", feats, f"ark:{tmp_path / 'none.ark'}"], monkeypatch)
    assert rc == 1 and "no iVector available" in err
    (tmp_path / "partial").write_text("u1 spkA\nu2 spkB\n")
    rc, _, err = run(["compute", f"--ivectors=ark:{files / 'spk_ivectors.ark'}",
                      f"--utt2spk=ark:{tmp_path / 'partial'}", files / "m.raw", feats,
                      f"ark:{out}"], monkeypatch)
    assert rc == 0 and "not in the --utt2spk map" in err
    assert list(read_ark(out)) == ["u1", "u2"]
    (tmp_path / "bad").write_text("u1 spkA extra\n")
    rc, _, err = run(["compute", f"--ivectors=ark:{files / 'spk_ivectors.ark'}",
                      f"--utt2spk=ark:{tmp_path / 'bad'}", files / "m.raw", feats,
                      f"ark:{out}"], monkeypatch)
    assert rc == 1 and err.count("\n") == 1 and "line 1" in err


@pytest.mark.parametrize("command", ["compute", "xvector-compute"])
def test_optimization_and_compiler_options_reach_the_compiler(files, command, monkeypatch,
                                                              tmp_path):
    """--optimization.* (NnetOptimizeOptions) build the compiler's options, as
    Kaldi's CachingOptimizingCompiler gets them; xvector-compute's --use-shortcut
    and --cache-capacity (CachingOptimizingCompilerOptions) too."""
    import pynnet3.cache as cache

    made = []
    real = cache.CachingCompiler

    class Recording(real):
        def __init__(self, nnet, optimize=True, capacity=64, use_shortcut=True, **kw):
            made.append((optimize, capacity, use_shortcut))
            super().__init__(nnet, optimize, capacity, use_shortcut, **kw)

    monkeypatch.setattr(cache, "CachingCompiler", Recording)
    flags = ["--optimization.allow-left-merge=false", "--optimization.max-deriv-time=5",
             "--optimization.memory-compression-level=0"]
    if command == "xvector-compute":
        flags += ["--use-shortcut=false", "--cache-capacity=3"]
    rc, got, err = _output(files, command, flags, monkeypatch, tmp_path)
    assert rc == 0, err
    (options, capacity, shortcut), = made
    assert (options.allow_left_merge, options.max_deriv_time,
            options.memory_compression_level, options.allow_right_merge) == (False, 5, 0, True)
    if command == "xvector-compute":
        assert (capacity, shortcut) == (3, False)
    made.clear()
    rc, plain, _ = _output(files, command, [], monkeypatch, tmp_path)
    (options, _, _), = made
    assert options == type(options)()  # (Kaldi's defaults)
    # the outputs are the same computation's up to float rounding
    a, b = (dict(parse_ark(x)) for x in (got, plain))
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_compute_looped_takes_the_optimization_options(files, monkeypatch, tmp_path):
    import pynnet3.runtime.looped as looped

    seen = []
    real = looped.LoopedDecodingInfo

    def recording(nnet, options):
        seen.append(options.optimize)
        return real(nnet, options)

    monkeypatch.setattr(looped, "LoopedDecodingInfo", recording)
    rc, _, err = _output(files, "compute", ["--looped=true",
                                            "--optimization.snip-row-ops=false"],
                         monkeypatch, tmp_path)
    assert rc == 0, err
    assert seen and seen[0].snip_row_ops is False


def test_xvector_cached_compiler_options_are_noted(files, monkeypatch, tmp_path):
    """--cached-compiler-in/out (Kaldi's compiled-computation cache) cannot be honoured:
    a note says so, no cache file is written and the x-vectors are the same."""
    cache_file = tmp_path / "cache"
    rc, got, err = _output(files, "xvector-compute",
                           [f"--cached-compiler-out={cache_file}",
                            f"--cached-compiler-in={tmp_path / 'in'}"], monkeypatch, tmp_path)
    assert rc == 0
    assert f"--cached-compiler-out={cache_file} not used" in err
    assert "--cached-compiler-in=" in err
    assert not cache_file.exists()
    assert got == _output(files, "xvector-compute", [], monkeypatch, tmp_path)[1]


@pytest.mark.parametrize("command, words", [
    ("compute", ["--debug-computation", "--computation.debug", "--cuda-use-tensor-cores",
                 "--cuda-use-tf32-compute", "--print-args", "--verbose", "--config",
                 "--utt2spk", "--optimization.optimize"]),
    ("xvector-compute", ["--cached-compiler-in", "--cached-compiler-out", "--use-shortcut",
                         "--extra-left-context", "--acoustic-scale", "no effect",
                         "--optimization.snip-row-ops"]),
    ("am-copy", ["--set-raw-nnet", "--convert-repeated-to-block", "--edits-config",
                 "--prepare-for-test", "--config"]),
    ("init", ["EXISTING-MODEL", "--srand", "--config"]),
])
def test_help_lists_them(command, words, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    for word in words:
        assert word in out, word


def test_copy_reads_a_kaldi_style_options_file(files, monkeypatch, tmp_path):
    """A Kaldi options file may hold several options, comments and blank lines;
    copy's --edits value keeps its spaces and case."""
    conf = tmp_path / "copy.conf"
    conf.write_text("# copy options\n\n--binary=false\n"
                    "--edits=rename-node old-name=sm new-name=Soft_Max\n")
    rc, got, err = _output(files, "copy", [f"--config={conf}"], monkeypatch, tmp_path)
    assert rc == 0, err
    nnet = nnet_from_bytes(got)
    assert "Soft_Max" in {n.name for n in nnet.nodes} and got.startswith(b"<Nnet3>")


def test_options_that_change_no_output_leave_the_resume_fingerprint(tmp_path):
    """compute --jobs --resume: a shard finished before is kept when only --verbose,
    --print-args, --config (its lines are in the options), the debug or CUDA options
    differ; an option that changes the outputs still starts it again."""
    from pynnet3.cli.scaleout import _fingerprint

    model = str(tmp_path / "m.raw")
    base = {"model": model, "apply_exp": False, "verbose": 0, "print_args": True,
            "kaldi_config": None, "debug_computation": False, "computation_debug": False,
            "cuda_use_tensor_cores": False, "cuda_use_tf32_compute": False}
    same = dict(base, verbose=3, print_args=False, kaldi_config=["x.conf"],
                debug_computation=True, computation_debug=True, cuda_use_tensor_cores=True,
                cuda_use_tf32_compute=True)
    assert _fingerprint(base, ["a x\n"], 0, 2) == _fingerprint(same, ["a x\n"], 0, 2)
    assert _fingerprint(base, ["a x\n"], 0, 2) != _fingerprint(dict(base, apply_exp=True),
                                                               ["a x\n"], 0, 2)
