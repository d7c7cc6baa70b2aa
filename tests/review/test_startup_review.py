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
