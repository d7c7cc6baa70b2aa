"""Review of the start-up / fast-path commits (text number parser, scp reads, table
writes, program cache, chunk requests, lazy RNG): each test failed before its fix."""

from __future__ import annotations

import pytest

from pynnet3.errors import FormatError
from pynnet3.io.kaldi_stream import TextReader


@pytest.mark.parametrize("body", [b" [ \x1c ]\n", b" [\x00]", b" [ \n\x1f\n ]"])
def test_text_fast_path_rejects_lone_control_byte(body):
    # bytes.split() keeps \x1c, \x00, \x1f as words, so the word-by-word reader
    # (before the fast path) reported a bad number; the fast path read an empty
    # vector / matrix because it gave up on control bytes only when there were words
    with pytest.raises(FormatError, match=r"f\.txt, line \d+: bad number in vector"):
        TextReader(body, "f.txt").read_vector()
    with pytest.raises(FormatError, match=r"f\.txt, line \d+: bad number in matrix"):
        TextReader(body, "f.txt").read_matrix()


def test_chunk_request_cache_keeps_the_max_rows_limit():
    # chunk_request() caches requests by shape; request_for_frames checks
    # pynnet3.limits' max_rows when it builds one. A shape cached under the default
    # limit must still be refused once the limit is lowered (as before the cache).
    from pynnet3 import limits
    from pynnet3.errors import ComputeError
    from pynnet3.runtime.simple import chunk_request

    args = (-7, 91, 31, 3, False, 5)  # 455 input rows
    chunk_request(*args)
    with limits.override(max_rows=100), pytest.raises(ComputeError, match="max_rows"):
        chunk_request(*args)
    assert chunk_request(*args) is chunk_request(*args)  # (the cache still serves)


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_exit_without_teardown_with_a_closed_standard_stream(closed):
    # a console run with stdout (or stderr) closed ('pynnet3 compute ... >&-') has
    # sys.stdout None: its outputs are written and it exited 0 before the exit
    # without teardown; flushing None raised AttributeError (a traceback, status 1)
    import subprocess
    import sys

    code = (f"import sys, pynnet3.cli.main as m\nsys.{closed} = None\n"
            "m._exit_without_teardown(0)\nraise SystemExit(5)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_compute_with_stderr_closed_writes_a_clean_archive_to_stdout(tmp_path):
    """``pynnet3 compute ... ark:- 2>&-``: no stderr (sys.stderr None) must not stop the
    run, nor send the summary line into the archive on stdout (print(file=None)
    writes to stdout)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    import kaldiio

    exe = shutil.which("pynnet3") or str(Path(__import__("sys").executable).parent / "pynnet3")
    ex = Path(__file__).resolve().parents[2] / "src" / "pynnet3" / "examples"
    res = subprocess.run(
        [exe, "compute", f"--ivectors=ark:{ex / 'ivectors.ark'}", str(ex / "tdnnf.raw"),
         f"ark:{ex / 'feats.ark'}", "ark:-"],
        stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), timeout=300)
    assert res.returncode == 0
    out = tmp_path / "out.ark"
    out.write_bytes(res.stdout)
    got = dict(kaldiio.load_ark(str(out)))
    assert len(got) == 6 and all(v.shape[1] == 200 for v in got.values())
    assert b"pynnet3 compute" not in res.stdout
