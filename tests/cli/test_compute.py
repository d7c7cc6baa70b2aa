"""``pynnet3 compute`` (Kaldi's nnet3-compute): Kaldi's own runs reproduced through the
command line, and self-contained runs of a small network checked against
``pynnet3.run`` on the whole utterance padded by hand; tables through kaldiio (ark,
scp, compressed, text, pipes, stdout), atomic output and exit codes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import kaldiio
import numpy as np
import pytest

import pynnet3
from pynnet3.cli.main import main
from pynnet3.io.ark import read_ark
from pynnet3.io.atomic import TAG
from tests.reference import REF, ref_params, require_reference

# -- Kaldi's runs ------------------------------------------------------------------------------
_CASES = REF / "nnet3-compute"


def _cases() -> list[str]:
    return sorted(p.name for p in _CASES.iterdir()) if _CASES.is_dir() else []


def _flags(options: dict) -> list[str]:
    out = []
    for k, v in options.items():
        out.append(f"--{k}={str(v).lower() if isinstance(v, bool) else v}")
    return out


@pytest.mark.parametrize("case", ref_params(_cases(), "nnet3-compute runs"))
def test_reproduces_kaldi_nnet3_compute(case, tmp_path, monkeypatch, capsys):
    d = _CASES / case
    options = json.loads((d / "options.json").read_text())
    model = json.loads((d / "run_info.json").read_text())["model"]
    monkeypatch.chdir(d)  # the iVector rspecifiers are relative to the run folder
    out = tmp_path / "output.ark"
    rc = main(["compute", *_flags(options), model, "ark:feats.ark", f"ark:{out}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "done 1 utterances, failed 0" in err
    got, expected = read_ark(out)["utt1"], read_ark(d / "output.ark")["utt1"]
    assert got.shape == expected.shape
    # the README's tolerance: 1e-4 relative to the largest output (measured: <= 2.8e-6)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def test_use_priors_subtracts_the_log_priors(tmp_path, monkeypatch, capsys):
    ref = require_reference()
    mdl = ref / "am" / "tdnnf_chain" / "final.mdl"
    d = _CASES / "tdnnf_chain_fpc50"
    monkeypatch.chdir(d)
    common = ["--ivectors=ark:ivector.ark", str(mdl), "ark:feats.ark"]
    assert main(["compute", *common, f"ark:{tmp_path}/plain.ark"]) == 0
    assert main(["compute", "--use-priors=true", "--acoustic-scale=0.5", *common,
                 f"ark:{tmp_path}/priors.ark"]) == 0
    capsys.readouterr()
    plain = read_ark(tmp_path / "plain.ark")["utt1"]
    priors = pynnet3.read_am(mdl).priors
    np.testing.assert_allclose(read_ark(tmp_path / "priors.ark")["utt1"],
                               0.5 * (plain - np.log(priors)), rtol=1e-5, atol=1e-5)


# -- a small network, checked by hand ----------------------------------------------------------
_CONFIG = """\
input-node name=input dim=5
input-node name=ivector dim=3
component name=affine1 type=NaturalGradientAffineComponent input-dim=18 output-dim=8
component-node name=affine1 component=affine1 input=Append(Offset(input, -2), input, Offset(input, 1), ReplaceIndex(ivector, t, 0))
component name=relu1 type=RectifiedLinearComponent dim=8
component-node name=relu1 component=relu1 input=affine1
component name=affine2 type=AffineComponent input-dim=16 output-dim=4
component-node name=affine2 component=affine2 input=Append(Offset(relu1, -1), Offset(relu1, 2))
component name=logsm type=LogSoftmaxComponent dim=4
component-node name=logsm component=logsm input=affine2
output-node name=output input=logsm
"""  # noqa: E501
_LEFT, _RIGHT = 3, 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.txt"
    pynnet3.Nnet.from_config(_CONFIG, seed=3).write(path, binary=False)
    return path


def _expected(model_path, feats, ivector, fsf=1):
    """The output of the whole utterance in one computation, frames outside it
    repeating the first / last frame (what chunking must reproduce for a TDNN)."""
    nnet = pynnet3.read_nnet(model_path)
    t_in = np.arange(-_LEFT, len(feats) + _RIGHT)
    t_out = np.arange(0, len(feats), fsf)
    idx = lambda t: [[0, int(x), 0] for x in t]  # noqa: E731
    req = pynnet3.ComputationRequest.from_json({
        "inputs": [{"name": "input", "indexes": idx(t_in)},
                   {"name": "ivector", "indexes": [[0, 0, 0]]}],
        "outputs": [{"name": "output", "indexes": idx(t_out)}]})
    rows = np.clip(t_in, 0, len(feats) - 1)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req),
                      {"input": feats[rows], "ivector": ivector[None, :]})
    return res.outputs["output"]


def _data(seed=0, lengths=(23, 1, 7, 50)):
    rng = np.random.default_rng(seed)
    feats = {f"utt{i}": rng.standard_normal((n, 5)).astype(np.float32)
             for i, n in enumerate(lengths)}
    ivecs = {k: rng.standard_normal(3).astype(np.float32) for k in feats}
    return feats, ivecs


# The console script pauses the garbage collector while the modules load and the model
# is read and prepared (pynnet3.gcpause); compute turns it back on before decoding.
_GC_PROBE = """
import gc, sys
import pynnet3.cli.files as files, pynnet3.cli.main as m
read_model = files.read_model
seen = []
files.read_model = lambda path: (seen.append(gc.isenabled()), read_model(path))[1]
m._exit_without_teardown = lambda status: None
sys.argv = ["pynnet3", *sys.argv[1:]]
status = m.entry_point()
print(status, seen, gc.isenabled(), gc.get_freeze_count() > 0)
"""


def test_the_console_script_collects_no_garbage_while_starting(model, tmp_path, capsys):
    feats, ivecs = _data()
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    run = lambda *argv: subprocess.run(  # noqa: E731
        [sys.executable, "-c", _GC_PROBE, *argv], capture_output=True, text=True,
        timeout=120)
    res = run("compute", "--ivectors=ark:" + str(tmp_path / "iv.ark"), str(model),
              "ark:" + str(tmp_path / "feats.ark"), "ark:" + str(tmp_path / "out.ark"))
    assert res.stdout.split() == ["0", "[False]", "True", "True"], res.stderr
    # another command has the collector on once its arguments are parsed
    res = run("info", str(model))
    assert res.stdout.splitlines()[-1] == "0 [True] True True", res.stderr
    # and main() called as a library leaves it alone
    frozen = gc.get_freeze_count()
    assert main(["info", str(model)]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen


@pytest.mark.parametrize("flags, fsf", [
    ([], 1),
    (["--frames-per-chunk=7", "--frame-subsampling-factor=3"], 3),  # raised to 9
    (["--frames-per-chunk=4", "--extra-left-context=5", "--extra-right-context=2",
      "--extra-left-context-initial=0", "--extra-right-context-final=1"], 1),
    (["--frames-per-chunk=1"], 1),
])
def test_small_network_matches_the_whole_utterance(model, tmp_path, capsys, flags, fsf):
    feats, ivecs = _data()
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats, scp=str(tmp_path / "feats.scp"))
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    out = tmp_path / "out.ark"
    rc = main(["compute", *flags, "--ivectors", f"ark:{tmp_path}/iv.ark", str(model),
               f"scp:{tmp_path}/feats.scp", f"ark,scp:{out},{tmp_path}/out.scp"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"done {len(feats)} utterances, failed 0" in err
    got = dict(kaldiio.load_scp(str(tmp_path / "out.scp")))
    assert list(got) == list(feats)
    for key, f in feats.items():
        np.testing.assert_allclose(got[key], _expected(model, f, ivecs[key], fsf),
                                   rtol=1e-5, atol=1e-5)
    assert not [p for p in os.listdir(tmp_path) if TAG in p]


def test_compressed_text_and_scaled_exp(model, tmp_path, capsys):
    feats, ivecs = _data(1)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats, scp=str(tmp_path / "feats.scp"),
                     compression_method=2)  # Kaldi's kSpeechFeature: "CM " matrices
    assert (tmp_path / "feats.ark").read_bytes().count(b"\0BCM ") == len(feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs, scp=str(tmp_path / "iv.scp"))
    rc = main(["compute", "--acoustic-scale=0.5", "--apply-exp=true",
               "--ivectors=scp:" + str(tmp_path / "iv.scp"), str(model),
               f"ark:{tmp_path}/feats.ark", f"ark,t:{tmp_path}/out.txt"])
    assert rc == 0, capsys.readouterr().err
    got = dict(kaldiio.load_ark(str(tmp_path / "out.txt")))
    decompressed = dict(kaldiio.load_scp(str(tmp_path / "feats.scp")))
    for key in feats:
        want = np.exp(0.5 * _expected(model, decompressed[key], ivecs[key]))
        np.testing.assert_allclose(got[key], want, rtol=1e-4, atol=1e-6)


def test_online_ivectors_pick_the_middle_row_of_each_chunk(model, tmp_path, capsys):
    feats, _ = _data(2, lengths=(30,))
    f = feats["utt0"]
    period, rng = 4, np.random.default_rng(5)
    online = rng.standard_normal((8, 3)).astype(np.float32)  # ceil(30 / 4) rows
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "oniv.ark"), {"utt0": online})
    rc = main(["compute", "--frames-per-chunk=8", f"--online-ivector-period={period}",
               f"--online-ivectors=ark:{tmp_path}/oniv.ark", str(model),
               f"ark:{tmp_path}/feats.ark", f"ark:{tmp_path}/out.ark"])
    assert rc == 0, capsys.readouterr().err
    got = read_ark(tmp_path / "out.ark")["utt0"]
    for start in range(0, 30, 8):
        last = min(start + 8, 30) - 1
        row = min((start + (last - start) // 2) // period, len(online) - 1)
        want = _expected(model, f, online[row])[start:last + 1]
        np.testing.assert_allclose(got[start:last + 1], want, rtol=1e-5, atol=1e-5)


def test_pipes_and_stdout(model, tmp_path):
    feats, ivecs = _data(3)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    done = subprocess.run(
        [sys.executable, "-m", "pynnet3.cli.main", "compute",
         f"--ivectors=ark:cat {tmp_path}/iv.ark |", str(model),
         f"ark:cat {tmp_path}/feats.ark |", "ark:-"], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"summary: done 4 utterances" in done.stderr
    got = dict(kaldiio.load_ark(__import__("io").BytesIO(done.stdout)))
    for key in feats:
        np.testing.assert_allclose(got[key], _expected(model, feats[key], ivecs[key]),
                                   rtol=1e-5, atol=1e-5)


def test_the_console_command_writes_everything_before_it_ends(model, tmp_path, capsys):
    # (the command-line process ends without the interpreter's teardown)
    feats, ivecs = _data(8)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    argv = ["compute", "--ivectors=ark:iv.ark", str(model), "ark:feats.ark"]
    done = subprocess.run([sys.executable, "-m", "pynnet3.cli.main", *argv,
                           "ark,scp:sub.ark,sub.scp"], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith("pynnet3 compute: summary: done 4")
    assert main([*argv[:1], f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
                 f"ark:{tmp_path}/feats.ark", f"ark:{tmp_path}/here.ark"]) == 0
    capsys.readouterr()
    assert (tmp_path / "sub.ark").read_bytes() == (tmp_path / "here.ark").read_bytes()
    assert len((tmp_path / "sub.scp").read_text().splitlines()) == 4


# -- failures ----------------------------------------------------------------------------------
def test_failed_utterances_are_counted_and_the_rest_written(model, tmp_path, capsys):
    feats, ivecs = _data(4)
    feats["bad_dim"] = np.zeros((9, 6), dtype=np.float32)
    feats["empty"] = np.zeros((0, 5), dtype=np.float32)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats, scp=str(tmp_path / "feats.scp"))
    with open(tmp_path / "feats.scp", "a") as f:
        f.write(f"gone {tmp_path}/missing.ark:10\n")
    del ivecs["utt2"]  # no iVector for this one
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    out = tmp_path / "out.ark"
    rc = main(["compute", f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
               f"scp:{tmp_path}/feats.scp", f"ark:{out}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    for key in ("utt2", "bad_dim", "empty", "gone"):
        assert f"utterance {key}:" in err
    assert "done 3 utterances, failed 4" in err.splitlines()[-1]
    assert sorted(read_ark(out)) == ["utt0", "utt1", "utt3"]


def test_nothing_succeeded_is_exit_1_and_no_output(model, tmp_path, capsys):
    feats, _ = _data(5)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    out = tmp_path / "out.ark"
    rc = main(["compute", str(model), f"ark:{tmp_path}/feats.ark", f"ark,scp:{out},{out}.scp"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "expects 'ivector' features" in err and "done 0 utterances, failed 4" in err
    assert os.listdir(tmp_path) == ["feats.ark"]


def test_an_exception_mid_run_leaves_no_output(model, tmp_path, monkeypatch, capsys):
    from pynnet3.runtime import simple

    feats, ivecs = _data(6)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    calls = []
    real = simple.DecodableNnetSimple.output

    def failing(self):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a Ctrl-C or a SIGTERM
        return real(self)

    monkeypatch.setattr(simple.DecodableNnetSimple, "output", failing)
    out = tmp_path / "out.ark"
    (tmp_path / "out.scp").write_text("old\n")
    rc = main(["compute", "--batch-size=1", f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
               f"ark:{tmp_path}/feats.ark", f"ark,scp:{out},{tmp_path}/out.scp"])
    assert rc == 130
    assert "interrupted after 2 utterances; no output written" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["feats.ark", "iv.ark", "out.scp"]
    assert (tmp_path / "out.scp").read_text() == "old\n"  # the old file is untouched


def test_sigterm_removes_the_temporaries(tmp_path):
    import signal
    import time

    ref = require_reference()  # (a model slow enough to be killed mid-run)
    rng = np.random.default_rng(0)
    kaldiio.save_ark(str(tmp_path / "f.ark"), {f"u{i}": rng.standard_normal((300, 40)).astype(
        np.float32) for i in range(500)})
    kaldiio.save_ark(str(tmp_path / "iv.ark"), {f"u{i}": rng.standard_normal(100).astype(
        np.float32) for i in range(500)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pynnet3.cli.main", "compute", "--ivectors=ark:iv.ark",
         str(ref / "realistic" / "tdnnf_chain" / "model.txt"), "ark:f.ark",
         "ark,scp:o.ark,o.scp"], cwd=tmp_path, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not any(TAG in p for p in os.listdir(tmp_path)) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()
    assert b"terminated after" in err and b"Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["f.ark", "iv.ark"]


def test_a_truncated_archive_keeps_the_good_utterances_and_exits_1(model, tmp_path, capsys):
    feats, ivecs = _data(7)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    data = (tmp_path / "feats.ark").read_bytes()
    (tmp_path / "feats.ark").write_bytes(data[:-40])
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    out = tmp_path / "out.ark"
    rc = main(["compute", f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
               f"ark:{tmp_path}/feats.ark", f"ark:{out}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "reading the features stopped" in err and "truncated" in err
    assert sorted(read_ark(out)) == ["utt0", "utt1", "utt2"]


@pytest.mark.parametrize("argv, message", [
    (["ark:{d}/feats.ark", "out.ark"], "bad wspecifier"),
    (["feats.ark", "ark:{d}/out.ark"], "bad rspecifier"),
    (["ark:{d}/nothere.ark", "ark:{d}/out.ark"], "cannot open"),
])
def test_bad_specifiers_are_one_line_errors(model, tmp_path, capsys, argv, message):
    kaldiio.save_ark(str(tmp_path / "feats.ark"), _data()[0])
    argv = [a.format(d=tmp_path) for a in argv]
    assert main(["compute", str(model), *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out.ark").exists()
