"""--num-threads (compute, xvector-compute, train, demo): the CPU's BLAS threads, 1 by
default unless the user's environment names a count, 0 for the library's own default.
Each test puts the process's thread count back."""

from __future__ import annotations

from importlib import resources

import pytest

from pynnet3.cli.jobs import THREAD_VARIABLES, apply_num_threads
from pynnet3.cli.main import main
from pynnet3.components import blas
from pynnet3.errors import PynnetError

pytestmark = pytest.mark.skipif(blas.num_threads() is None,
                                reason="NumPy's BLAS is not a bundled OpenBLAS")


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch):
    for var in THREAD_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    before = blas.num_threads()
    yield
    blas.set_num_threads(before)


def test_set_and_read_back():
    assert blas.set_num_threads(2)
    assert blas.num_threads() == 2
    assert blas.set_num_threads(1)
    assert blas.num_threads() == 1
    assert not blas.set_num_threads(0)  # (not a thread count: nothing done)
    assert blas.num_threads() == 1


def test_default_is_one_thread():
    blas.set_num_threads(2)
    assert apply_num_threads(None) == 1
    assert blas.num_threads() == 1


@pytest.mark.parametrize("var", THREAD_VARIABLES)
def test_the_users_environment_stands(monkeypatch, var):
    blas.set_num_threads(2)
    monkeypatch.setenv(var, "2")
    assert apply_num_threads(None) is None
    assert blas.num_threads() == 2
    assert apply_num_threads(1) == 1  # (the flag still wins)
    assert blas.num_threads() == 1


def test_zero_leaves_the_library_default():
    blas.set_num_threads(2)
    assert apply_num_threads(0) is None
    assert blas.num_threads() == 2


def test_negative_is_an_error():
    with pytest.raises(PynnetError, match="--num-threads must be >= 0"):
        apply_num_threads(-1)


def test_torch_cpu_threads_too():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert apply_num_threads(2, "torch", "cpu") == 2
        assert torch.get_num_threads() == 2 and blas.num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("flag, want", [([], 1), (["--num-threads=2"], 2)])
def test_compute_sets_them(tmp_path, flag, want):
    examples = resources.files("pynnet3").joinpath("examples")
    blas.set_num_threads(3)
    out = tmp_path / "out.ark"
    assert main(["compute", *flag, f"--ivectors=ark:{examples.joinpath('ivectors.ark')}",
                 str(examples.joinpath("tdnnf.raw")),
                 f"ark:{examples.joinpath('feats.ark')}", f"ark:{out}"]) == 0
    assert out.stat().st_size > 0
    assert blas.num_threads() == want


def test_demo_and_bad_flag(capsys):
    blas.set_num_threads(2)
    assert main(["demo", "--num-threads=1"]) == 0
    assert blas.num_threads() == 1
    capsys.readouterr()
    assert main(["compute", "--num-threads=-2", "m", "ark:f", "ark:o"]) != 0
    assert "--num-threads must be >= 0" in capsys.readouterr().err
