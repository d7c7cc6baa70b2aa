"""``pynnet3 compute --jobs`` / ``--ray-address`` (cli/scaleout.py): the scp split as
Kaldi's split_scp.pl splits it, workers on a local Ray cluster (2 CPUs, started once
for the module, shut down at the end), shards, the final scp in input order, outputs
equal to a single-process run, --resume, and the errors (no Ray, not an scp, a job
that fails)."""

from __future__ import annotations

import os
import subprocess
import sys

import kaldiio
import numpy as np
import pytest

from pynnet3.cli.main import main
from pynnet3.cli.scaleout import split_scp
from pynnet3.errors import PynnetError
from tests.cli.test_compute import _data
from tests.cli.test_compute import model as model  # noqa: F401 (the fixture)


# -- the split -----------------------------------------------------------------------------------
@pytest.mark.parametrize("num_lines, parts, sizes", [
    (10, 3, [4, 3, 3]), (3, 3, [1, 1, 1]), (7, 1, [7]), (11, 4, [3, 3, 3, 2])])
def test_split_scp_like_split_scp_pl(num_lines, parts, sizes):
    lines = [f"u{i} f.ark:{i}\n" for i in range(num_lines)]
    pieces = split_scp(lines, parts)
    assert [len(p) for p in pieces] == sizes  # the first (lines % parts) one longer
    assert sum(pieces, []) == lines  # contiguous, in order


def test_split_scp_refuses_too_many_pieces():
    with pytest.raises(PynnetError, match="too many pieces"):
        split_scp(["a x\n", "b y\n"], 3)


# -- errors that need no cluster -------------------------------------------------------------------
def _write_data(folder, seed=21, lengths=(23, 1, 7, 50, 12, 9, 30)):
    feats, ivecs = _data(seed, lengths=lengths)
    kaldiio.save_ark(str(folder / "feats.ark"), feats, scp=str(folder / "feats.scp"))
    kaldiio.save_ark(str(folder / "iv.ark"), ivecs)
    return feats, ivecs


def test_without_ray_a_clear_error(model, tmp_path, monkeypatch, capsys):  # noqa: F811
    _write_data(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray raises ImportError)
    rc = main(["compute", "--jobs=2", f"--ivectors=ark:{tmp_path}/iv.ark", str(model),
               f"scp:{tmp_path}/feats.scp", f"ark:{tmp_path}/o.ark"])
    err = capsys.readouterr().err
    assert rc == 1 and "pip install 'pynnet3[ray]'" in err and "Traceback" not in err


def test_jobs_need_an_scp(model, tmp_path, capsys):  # noqa: F811
    pytest.importorskip("ray")
    _write_data(tmp_path)
    assert main(["compute", "--jobs=2", str(model), f"ark:{tmp_path}/feats.ark",
                 f"ark:{tmp_path}/o.ark"]) == 1
    assert "the features must be 'scp:...'" in capsys.readouterr().err


# -- on a local cluster ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    if "ray" not in sys.modules:  # (on 127.0.0.1 only, as --jobs starts its own)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


def _single(model_path, folder, wspec, *flags):
    assert main(["compute", *flags, f"--ivectors=ark:{folder}/iv.ark", str(model_path),
                 f"scp:{folder}/feats.scp", wspec]) == 0


def test_jobs_equal_the_single_process_run_and_resume(ray_cluster, model, tmp_path,  # noqa: F811
                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # (the workers follow the caller's folder: relative paths)
    feats, _ = _write_data(tmp_path)
    _single(model, ".", "ark,scp:single.ark,single.scp")
    common = ["compute", "--jobs=2", "--ivectors=ark:iv.ark", str(model), "scp:feats.scp",
              "ark,scp:out.ark,out.scp"]
    assert main(common) == 0
    err = capsys.readouterr().err
    assert "done 7 utterances, failed 0" in err and "2 jobs on Ray (0 resumed)" in err
    got, want = dict(kaldiio.load_scp("out.scp")), dict(kaldiio.load_scp("single.scp"))
    assert list(got) == list(feats)  # input order
    for key in feats:
        assert np.array_equal(got[key], want[key])  # the same code on the same rows
    # split_scp.pl's pieces: 4 and 3 utterances, each shard its own ark and scp
    assert [k for k, _ in kaldiio.load_ark("out.1.ark")] == list(feats)[:4]
    assert [k for k, _ in kaldiio.load_ark("out.2.ark")] == list(feats)[4:]
    assert not os.path.exists("out.ark")

    # --resume=true: a finished shard is skipped, an unfinished one (no marker) redone
    os.unlink("out.2.ark.done")
    before = os.stat("out.1.ark").st_mtime_ns
    assert main([*common[:2], "--resume=true", *common[2:]]) == 0
    assert "(1 resumed)" in capsys.readouterr().err
    assert os.stat("out.1.ark").st_mtime_ns == before
    again = dict(kaldiio.load_scp("out.scp"))
    assert all(np.array_equal(again[k], want[k]) for k in feats)
    # all finished: nothing to run (no cluster needed)
    assert main([*common[:2], "--resume=true", *common[2:]]) == 0
    assert "(2 resumed)" in capsys.readouterr().err
    # other options: the markers do not match, everything is recomputed
    assert main([*common[:2], "--resume=true", "--acoustic-scale=0.5", *common[2:]]) == 0
    assert "(0 resumed)" in capsys.readouterr().err
    scaled = dict(kaldiio.load_scp("out.scp"))
    for key in feats:
        np.testing.assert_allclose(scaled[key], 0.5 * want[key], rtol=1e-6, atol=1e-7)


def test_an_ark_output_is_the_single_process_bytes(ray_cluster, model, tmp_path,  # noqa: F811
                                                   monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write_data(tmp_path, seed=22)
    _single(model, ".", "ark:single.ark", "--batch-size=4")
    assert main(["compute", "--jobs=2", "--batch-size=4", "--ivectors=ark:iv.ark",
                 str(model), "scp:feats.scp", "ark:out.ark"]) == 0
    capsys.readouterr()
    assert (tmp_path / "out.ark").read_bytes() == (tmp_path / "single.ark").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["feats.ark", "feats.scp", "iv.ark", "out.ark",
                                            "single.ark"]  # the shards are gone


def test_failed_utterances_are_counted_over_the_jobs(ray_cluster, model, tmp_path,  # noqa: F811
                                                     monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    feats, ivecs = _data(23, lengths=(20, 9, 14, 30, 5, 8))
    feats["bad_dim"] = np.zeros((9, 6), dtype=np.float32)
    ivecs["bad_dim"] = np.zeros(3, dtype=np.float32)
    del ivecs["utt1"]
    kaldiio.save_ark("feats.ark", feats, scp="feats.scp")
    kaldiio.save_ark("iv.ark", ivecs)
    assert main(["compute", "--jobs=2", "--ivectors=ark:iv.ark", str(model),
                 "scp:feats.scp", "ark,scp:out.ark,out.scp"]) == 0
    assert "done 5 utterances, failed 2" in capsys.readouterr().err
    assert list(kaldiio.load_scp("out.scp")) == ["utt0", "utt2", "utt3", "utt4", "utt5"]


def test_a_failed_job_leaves_no_final_output(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write_data(tmp_path)
    rc = main(["compute", "--jobs=2", "--ivectors=ark:iv.ark", "nothere.raw",
               "scp:feats.scp", "ark,scp:out.ark,out.scp"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "job 1 of 2 failed" in err and "nothere.raw" in err
    assert "no final output written" in err
    assert not os.path.exists("out.scp")


def test_ray_address_joins_an_existing_cluster(ray_cluster, model, tmp_path):  # noqa: F811
    address = ray_cluster.get_runtime_context().gcs_address
    _write_data(tmp_path, seed=25, lengths=(10, 20, 30, 5))
    _single(model, tmp_path, f"ark:{tmp_path}/single.ark")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    done = subprocess.run(
        [sys.executable, "-m", "pynnet3.cli.main", "compute", f"--ray-address={address}",
         "--jobs=2", "--ivectors=ark:iv.ark", str(model), "scp:feats.scp", "ark:out.ark"],
        cwd=tmp_path, env=env, capture_output=True, timeout=180, check=False)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "done 4 utterances, failed 0" in err and "2 jobs on Ray" in err
    assert (tmp_path / "out.ark").read_bytes() == (tmp_path / "single.ark").read_bytes()
    # the cluster outlives the run (its driver only disconnected)
    assert ray_cluster.get(ray_cluster.remote(lambda: 7).remote()) == 7


def test_jobs_start_and_stop_their_own_local_cluster(model, tmp_path):  # noqa: F811
    pytest.importorskip("ray")
    feats, _ = _write_data(tmp_path, seed=24, lengths=(10, 20, 30))
    _single(model, tmp_path, f"ark:{tmp_path}/single.ark")
    done = subprocess.run(
        [sys.executable, "-m", "pynnet3.cli.main", "compute", "--jobs=2",
         "--ivectors=ark:iv.ark", str(model), "scp:feats.scp", "ark:out.ark"],
        cwd=tmp_path, capture_output=True, timeout=180, check=False)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "done 3 utterances, failed 0" in err and "2 jobs on Ray" in err
    assert (tmp_path / "out.ark").read_bytes() == (tmp_path / "single.ark").read_bytes()


# -- one worker's job, in this process (no cluster) ---------------------------------------------
def _shard_options(model_path) -> dict:
    from pynnet3.cli.main import build_parser

    args = build_parser().parse_args(["compute", "--ivectors=ark:iv.ark", str(model_path),
                                      "scp:feats.scp", "ark,scp:out.ark,out.scp"])
    return {k: v for k, v in vars(args).items() if k != "fn"}


def test_an_interrupted_shard_is_not_marked_done(model, tmp_path, monkeypatch, capsys):  # noqa: F811
    from pynnet3.cli.scaleout import run_shard
    from pynnet3.runtime import simple

    monkeypatch.chdir(tmp_path)
    _write_data(tmp_path)
    lines = (tmp_path / "feats.scp").read_text().splitlines(keepends=True)

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(simple.DecodableNnetSimple, "output", interrupted)
    options = dict(_shard_options(model), batch_size=1)  # (the unbatched path calls output)
    result = run_shard(options, str(tmp_path), lines, "", "out.1.ark",
                       "out.1.scp", "out.1.ark.done", "fp")
    capsys.readouterr()
    assert result["error"] == "the job stopped (exit status 130)"
    assert not (tmp_path / "out.1.ark.done").exists()
    assert not (tmp_path / "out.1.ark").exists()


def test_a_shard_whose_utterances_all_failed_is_done_and_empty(model, tmp_path,  # noqa: F811
                                                               monkeypatch, capsys):
    import json

    from pynnet3.cli.scaleout import run_shard

    monkeypatch.chdir(tmp_path)
    _write_data(tmp_path)
    kaldiio.save_ark(str(tmp_path / "iv.ark"), {"other": np.zeros(3, np.float32)})
    lines = (tmp_path / "feats.scp").read_text().splitlines(keepends=True)[:2]
    result = run_shard(_shard_options(model), str(tmp_path), lines, "", "out.1.ark",
                       "out.1.scp", "out.1.ark.done", "fp")
    capsys.readouterr()
    assert "error" not in result and result["done"] == 0 and result["failed"] == 2
    assert json.loads((tmp_path / "out.1.ark.done").read_text())["fingerprint"] == "fp"
    assert not (tmp_path / "out.1.ark").exists()  # (nothing succeeded: nothing written)
