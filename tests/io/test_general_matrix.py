"""GeneralMatrix reading (pynnet3.io.general_matrix): bad input is a FormatError."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("text", [b"rows=1 dim=7 [ 99999999999999999999 1 ] ",
                                  b"rows=1 dim=99999999999999999999 [ 1 1 ] "])
def test_sparse_text_beyond_int32_is_a_format_error(text):
    """(review: a raw OverflowError that escaped ark,p: and the CLI's error handling)"""
    from pynnet3.errors import FormatError
    from pynnet3.io.general_matrix import read_general_matrix
    from pynnet3.io.kaldi_stream import make_reader

    with pytest.raises(FormatError, match="int32 range"):
        read_general_matrix(make_reader(text, "x"))
