"""``pynnet3 compute`` when things go wrong (beyond test_compute.py's cases): a run
killed with SIGKILL leaves no complete-looking output and the next run cleans up;
corrupt feature and iVector archives, bad scp offsets, wrong iVector dims and too
few online iVector rows are one-line errors, and the other utterances are still
written -- unbatched and batched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib import resources

import kaldiio
import numpy as np
import pytest

from pynnet3.cli.main import main
from pynnet3.io.ark import read_ark
from pynnet3.io.atomic import TAG
from tests.cli.test_compute import _data, _expected
from tests.cli.test_compute import model as model  # noqa: F401 (the fixture)

BATCH = pytest.mark.parametrize("batch", [1, 4])


def _run(model_path, folder, feats_rspec, *flags, iv="iv.ark", out="out.ark"):
    return main(["compute", *flags, f"--ivectors=ark:{folder}/{iv}", str(model_path),
                 feats_rspec, f"ark:{folder}/{out}"])


def _check_written(model_path, got: dict, feats: dict, ivecs: dict, keys: list[str]):
    assert list(got) == keys
    for key in keys:
        np.testing.assert_allclose(got[key], _expected(model_path, feats[key], ivecs[key]),
                                   rtol=1e-5, atol=1e-5)


@BATCH
def test_a_corrupt_entry_mid_archive_keeps_the_entries_before_it(model, tmp_path, capsys,  # noqa: F811
                                                                 batch):
    feats, ivecs = _data(31)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    data = (tmp_path / "feats.ark").read_bytes()
    third = [i for i in range(len(data)) if data.startswith(b"BFM ", i)][2]
    (tmp_path / "feats.ark").write_bytes(data[:third] + b"BXM " + data[third + 4:])
    rc = _run(model, tmp_path, f"ark:{tmp_path}/feats.ark", f"--batch-size={batch}")
    err = capsys.readouterr().err
    assert rc == 1
    assert "reading the features stopped" in err and 'Unexpected format: "XM"' in err
    assert "Traceback" not in err
    _check_written(model, read_ark(tmp_path / "out.ark"), feats, ivecs, ["utt0", "utt1"])


@BATCH
def test_bad_scp_entries_fail_alone(model, tmp_path, capsys, batch):  # noqa: F811
    feats, ivecs = _data(32)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats, scp=str(tmp_path / "feats.scp"))
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    lines = (tmp_path / "feats.scp").read_text().splitlines()
    lines.insert(1, f"offset {tmp_path}/feats.ark:7")  # into the middle of an entry
    lines.insert(3, f"past {tmp_path}/feats.ark:99999999")  # beyond the end
    (tmp_path / "feats.scp").write_text("\n".join(lines) + "\n")
    rc = _run(model, tmp_path, f"scp:{tmp_path}/feats.scp", f"--batch-size={batch}")
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "utterance offset: cannot read" in err and "utterance past: cannot read" in err
    assert "done 4 utterances, failed 2" in err.splitlines()[-1]
    _check_written(model, read_ark(tmp_path / "out.ark"), feats, ivecs, list(feats))


@BATCH
def test_a_broken_ivector_archive_fails_only_the_utterances_after_the_break(  # noqa: F811
        model, tmp_path, capsys, batch):
    feats, ivecs = _data(33)
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    data = (tmp_path / "iv.ark").read_bytes()
    (tmp_path / "iv.ark").write_bytes(data[:-5])  # the last iVector (utt3's) cut short
    rc = _run(model, tmp_path, f"ark:{tmp_path}/feats.ark", f"--batch-size={batch}")
    err = capsys.readouterr().err
    assert rc == 1  # (a broken table fails the run, as a broken feature archive does)
    assert "--ivectors: ark:" in err and "corrupt or truncated archive" in err
    assert "utterance utt3: no iVector available for this utterance (--ivectors broke off " \
           "after 3 entries)" in err
    assert "done 3 utterances, failed 1" in err
    _check_written(model, read_ark(tmp_path / "out.ark"), feats, ivecs, ["utt0", "utt1", "utt2"])


@BATCH
def test_wrong_ivector_dim_and_too_few_online_rows_fail_alone(model, tmp_path, capsys,  # noqa: F811
                                                              batch):
    feats, ivecs = _data(34, lengths=(30, 12, 200, 9))
    ivecs["utt1"] = np.ones(4, dtype=np.float32)  # the network's iVector dim is 3
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), ivecs)
    rc = _run(model, tmp_path, f"ark:{tmp_path}/feats.ark", f"--batch-size={batch}")
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "utterance utt1: iVector: expected a vector of dim 3, got shape (4,)" in err
    _check_written(model, read_ark(tmp_path / "out.ark"), feats, ivecs,
                   ["utt0", "utt2", "utt3"])
    # online iVectors every 10 frames: utt2 (200 frames) gets 2 rows only
    online = {k: np.tile(v[:3] if len(v) == 3 else np.zeros(3, np.float32),
                         (-(-len(feats[k]) // 10), 1)) for k, v in ivecs.items()}
    online["utt2"] = online["utt2"][:2]
    kaldiio.save_ark(str(tmp_path / "oniv.ark"), online)
    rc = main(["compute", f"--batch-size={batch}", "--online-ivector-period=10",
               f"--online-ivectors=ark:{tmp_path}/oniv.ark", str(model),
               f"ark:{tmp_path}/feats.ark", f"ark:{tmp_path}/out2.ark"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "utterance utt2: could not get an iVector for frame" in err
    assert list(read_ark(tmp_path / "out2.ark")) == ["utt0", "utt1", "utt3"]


def test_sigkill_leaves_no_complete_output_and_the_next_run_cleans_up(tmp_path):
    """SIGKILL cannot be caught: the temporaries stay, but no output file exists
    under its real name; the next run to the same target removes them."""
    examples = resources.files("pynnet3").joinpath("examples")
    rng = np.random.default_rng(0)
    feats = {f"u{i}": rng.standard_normal((300, 40)).astype(np.float32) for i in range(400)}
    kaldiio.save_ark(str(tmp_path / "f.ark"), feats)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), {k: np.zeros(100, np.float32) for k in feats})
    argv = [sys.executable, "-m", "pynnet3.cli.main", "compute", "--ivectors=ark:iv.ark",
            str(examples.joinpath("tdnnf.raw"))]
    proc = subprocess.Popen([*argv, "ark:f.ark", "ark,scp:o.ark,o.scp"], cwd=tmp_path,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not any(TAG in p for p in os.listdir(tmp_path)) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    left = os.listdir(tmp_path)
    assert "o.ark" not in left and "o.scp" not in left
    assert any(TAG in p for p in left)  # (what SIGKILL leaves: temporaries only)
    # the next run (a short one) removes the dead run's temporaries
    kaldiio.save_ark(str(tmp_path / "f2.ark"), {"u0": feats["u0"]})
    done = subprocess.run([*argv, "ark:f2.ark", "ark,scp:o.ark,o.scp"], cwd=tmp_path,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert not [p for p in os.listdir(tmp_path) if TAG in p]
    assert list(kaldiio.load_scp(str(tmp_path / "o.scp"))) == ["u0"]
