"""tune_malloc: applied on Linux/glibc, and the process still compiles and runs."""

import subprocess
import sys

import pytest

from pynnet3.runtime.allocator import tune_malloc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt only")
def test_tune_malloc_applies_and_compiling_still_works():
    # in a child process: the setting is process-wide and must not leak into the suite
    code = (
        "import numpy as np, pynnet3\n"
        "from pynnet3.runtime.allocator import tune_malloc\n"
        "assert tune_malloc()\n"
        "from tests.compiler import nets as N\n"
        "nnet = pynnet3.Nnet.from_config(N.RNN, seed=1)\n"
        "req = N.request({'input': N.frames(0, 6)}, {'output': N.frames(0, 6)})\n"
        "c = pynnet3.compile(nnet, req, optimize=True)\n"
        "rows = len(req.inputs[0].indexes)\n"
        "x = np.random.default_rng(0).standard_normal((rows, nnet.input_dim('input')))\n"
        "r = pynnet3.run(nnet, c, {'input': x})\n"
        "assert np.isfinite(r.outputs['output']).all()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_root())


def test_tune_malloc_is_a_no_op_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    assert tune_malloc() is False


def _root() -> str:
    from pathlib import Path
    return str(Path(__file__).resolve().parents[2])
