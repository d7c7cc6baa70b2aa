"""gzip-compressed models through the Python API (read_nnet, read_am), as the
command line reads them: the same network as the uncompressed file; broken gzip
data is a FormatError naming the file."""

from __future__ import annotations

import gzip
from importlib import resources

import pytest

import pynnet3
from pynnet3.errors import FormatError
from tests.reference import REF

EXAMPLE = resources.files("pynnet3") / "examples" / "tdnnf.raw"


def test_read_nnet_reads_a_gzipped_model(tmp_path):
    raw = EXAMPLE.read_bytes()
    (tmp_path / "final.raw.gz").write_bytes(gzip.compress(raw))
    a = pynnet3.read_nnet(EXAMPLE)
    b = pynnet3.read_nnet(tmp_path / "final.raw.gz")
    a.write(tmp_path / "a.raw", binary=True)
    b.write(tmp_path / "b.raw", binary=True)
    assert (tmp_path / "a.raw").read_bytes() == (tmp_path / "b.raw").read_bytes()


def test_broken_gzip_is_a_format_error_naming_the_file(tmp_path):
    data = gzip.compress(EXAMPLE.read_bytes())
    bad = tmp_path / "broken.raw.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match="broken gzip data") as ei:
        pynnet3.read_nnet(bad)
    assert "broken.raw.gz" in str(ei.value)


def test_read_am_reads_a_gzipped_final_mdl(tmp_path):
    mdls = sorted((REF / "am").rglob("*.mdl")) if (REF / "am").is_dir() else []
    if not mdls:
        pytest.skip("no final.mdl in kaldi-reference/am")
    data = mdls[0].read_bytes()
    (tmp_path / "final.mdl.gz").write_bytes(gzip.compress(data))
    am = pynnet3.read_am(tmp_path / "final.mdl.gz")
    am.write(tmp_path / "back.mdl", binary=data[:2] == b"\0B")
    assert (tmp_path / "back.mdl").read_bytes() == data
