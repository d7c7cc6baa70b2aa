"""--use-gpu (Kaldi's values) and --backend on compute and xvector-compute: the
torch backend's outputs equal the NumPy backend's (batched, one chunk at a time,
looped; x-vectors), --use-gpu=yes without a CUDA device is a clear error that
writes nothing, and --use-gpu=optional falls back to the CPU with a note."""

from __future__ import annotations

from importlib import resources

import kaldiio
import numpy as np
import pytest

from pynnet3.cli import jobs
from pynnet3.cli.main import main
from pynnet3.errors import PynnetError
from pynnet3.io.ark import read_ark
from tests.cli.test_xvector_compute import model as xvector_model  # noqa: F401

EXAMPLES = resources.files("pynnet3") / "examples"


def _compute(tmp_path, name: str, *flags: str) -> tuple[int, dict]:
    out = tmp_path / f"{name}.ark"
    rc = main(["compute", *flags, f"--ivectors=ark:{EXAMPLES / 'ivectors.ark'}",
               str(EXAMPLES / "tdnnf.raw"), f"ark:{EXAMPLES / 'feats.ark'}", f"ark:{out}"])
    return rc, (read_ark(out) if out.exists() else {})


@pytest.mark.parametrize("flags", [(), ("--batch-size=1",), ("--looped=true",)])
def test_torch_backend_equals_numpy(tmp_path, capsys, flags):
    pytest.importorskip("torch")
    rc, want = _compute(tmp_path, "numpy", *flags)
    assert rc == 0, capsys.readouterr().err
    rc, got = _compute(tmp_path, "torch", "--backend=torch", *flags)
    assert rc == 0, capsys.readouterr().err
    assert list(got) == list(want) and len(want) > 0
    for key in want:
        scale = float(np.abs(want[key]).max())
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5 * scale)


def test_xvector_torch_backend_equals_numpy(xvector_model, tmp_path, capsys):  # noqa: F811
    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    feats = {k: rng.standard_normal((n, 4)).astype(np.float32)
             for k, n in (("a", 23), ("b", 9))}
    kaldiio.save_ark(str(tmp_path / "feats.ark"), feats)
    got = {}
    for backend in ("numpy", "torch"):
        out = tmp_path / f"{backend}.ark"
        assert main(["xvector-compute", f"--backend={backend}", "--chunk-size=10",
                     "--min-chunk-size=4", str(xvector_model), f"ark:{tmp_path}/feats.ark",
                     f"ark:{out}"]) == 0, capsys.readouterr().err
        got[backend] = read_ark(out)
    for key in feats:
        np.testing.assert_allclose(got["torch"][key], got["numpy"][key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value", ["yes", "wait"])
def test_use_gpu_yes_without_cuda_is_an_error_and_writes_nothing(tmp_path, capsys,
                                                                 monkeypatch, value):
    monkeypatch.setattr(jobs, "cuda_available", lambda: False)
    rc, got = _compute(tmp_path, "out", f"--use-gpu={value}")
    err = capsys.readouterr().err
    assert rc == 1 and got == {}
    assert f"--use-gpu={value}: no CUDA device is available" in err
    assert not (tmp_path / "out.ark").exists()


def test_use_gpu_optional_without_cuda_runs_on_the_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(jobs, "cuda_available", lambda: False)
    rc, got = _compute(tmp_path, "out", "--use-gpu=optional")
    err = capsys.readouterr().err
    assert rc == 0 and len(got) > 0
    assert "--use-gpu=optional: no CUDA device is available; running on the CPU" in err


def test_choose_backend():
    notes = []

    def say(kind, message):
        notes.append((kind, message))

    real = jobs.cuda_available
    try:
        jobs.cuda_available = lambda: True
        assert jobs.choose_backend("yes", "numpy", say) == ("torch", "cuda")
        assert jobs.choose_backend("optional", "numpy", say) == ("torch", "cuda")
        jobs.cuda_available = lambda: False
        assert jobs.choose_backend("no", "numpy", say) == ("numpy", None)
        assert jobs.choose_backend("optional", "numpy", say) == ("numpy", None)
    finally:
        jobs.cuda_available = real
    assert notes == [("note", "--use-gpu=optional: no CUDA device is available; running "
                              "on the CPU")]
    with pytest.raises(PynnetError, match="--backend must be one of numpy, torch"):
        jobs.choose_backend("no", "jax", say)


@pytest.mark.skipif(not jobs.cuda_available(), reason="needs a CUDA device")
def test_use_gpu_yes_on_a_gpu_equals_the_cpu(tmp_path, capsys):
    rc, want = _compute(tmp_path, "cpu")
    assert rc == 0
    rc, got = _compute(tmp_path, "gpu", "--use-gpu=yes")
    assert rc == 0, capsys.readouterr().err
    for key in want:
        scale = float(np.abs(want[key]).max())
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-4 * scale)
