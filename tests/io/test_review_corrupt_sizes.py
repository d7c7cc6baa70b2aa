"""Review: a corrupt binary size field in an archive (``FM`` rows=2**30 cols=2**30, a
vector of 2**31-1, a compressed matrix, an integer vector) was a raw MemoryError
inside a FormatError, or an allocation of gigabytes, and a vector longer than the
file came back silently cut short. Now each is a FormatError naming the file, the
key and the byte offset, before anything that size is made; a model file says so
too (regression)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pynnet3.errors import FormatError
from pynnet3.io.ark import ark_bytes, parse_ark, random_access_table, read_table
from pynnet3.nnet import read_nnet


def _i4(v: int) -> bytes:
    return b"\x04" + struct.pack("<i", v)


BIG = 2 ** 30
# the entry's bytes after its key, and where in them the error points (the data)
CORRUPT = {
    "matrix": (b"\0BFM " + _i4(BIG) + _i4(BIG), 15),
    "vector": (b"\0BFV " + _i4(2 ** 31 - 1), 10),  # (kaldiio returned 16 floats)
    "double-vector": (b"\0BDV " + _i4(1000), 10),
    "compressed": (b"\0BCM2 " + struct.pack("<ffii", 0.0, 1.0, BIG, BIG), 22),
    "int-vector": (b"\0B" + _i4(2 ** 31 - 1), 7),
}


def _archive(tmp_path, kind):
    head, data_at = CORRUPT[kind]
    good = ark_bytes({"good": np.arange(6, dtype=np.float32).reshape(2, 3)})
    path = tmp_path / "bad.ark"
    path.write_bytes(good + b"bad " + head + b"\0" * 64)
    return path, len(good) + 4 + data_at


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_corrupt_size_in_an_archive(tmp_path, kind):
    path, offset = _archive(tmp_path, kind)
    entries = read_table(f"ark:{path}")
    key, first = next(entries)
    assert key == "good" and first.shape == (2, 3)
    with pytest.raises(FormatError, match=f"byte {offset}: entry 'bad'") as e:
        next(entries)
    assert str(path) in str(e.value)
    with pytest.raises(FormatError, match="entry 'bad'"):
        list(parse_ark(path.read_bytes()))
    assert [k for k, _ in read_table(f"ark,p:{path}")] == ["good"]  # (permissive: stops)


@pytest.mark.parametrize("kind", ["matrix", "vector", "compressed"])
def test_corrupt_size_through_a_pipe(tmp_path, kind):
    path, _ = _archive(tmp_path, kind)
    with pytest.raises(FormatError, match="entry 'bad': its header declares"):
        list(read_table(f"ark:cat {path} |"))


@pytest.mark.parametrize("kind", ["matrix", "vector", "compressed"])
def test_corrupt_size_through_an_scp(tmp_path, kind):
    path, offset = _archive(tmp_path, kind)
    start = offset - CORRUPT[kind][1]
    scp = tmp_path / "bad.scp"
    scp.write_text(f"bad {path}:{start}\n")
    with pytest.raises(FormatError, match=f"{path}, byte {offset}: entry 'bad'"):
        random_access_table(f"scp:{scp}")["bad"]
    ((key, err),) = list(read_table(f"scp:{scp}"))
    assert key == "bad" and "declares" in str(err)


def test_intact_entries_still_read(tmp_path):
    arrays = {"a": np.ones((3, 2), np.float32), "b": np.arange(4, dtype=np.float32)}
    path = tmp_path / "ok.ark"
    path.write_bytes(ark_bytes(arrays))
    for spec in (f"ark:{path}", f"ark:cat {path} |"):
        got = dict(read_table(spec))
        assert got.keys() == arrays.keys()
        for k, v in arrays.items():
            np.testing.assert_array_equal(got[k], v)


def test_model_file_with_a_corrupt_matrix_size(tmp_path):
    body = (b"\0B<Nnet3> input-node name=input dim=2\ncomponent-node name=a component=a "
            b"input=input\noutput-node name=output input=a\n\n<NumComponents> " + _i4(1)
            + b"<ComponentName> a <AffineComponent> <LearningRate> \x04" + b"\0" * 4
            + b"<LinearParams> FM " + _i4(BIG) + _i4(BIG) + b"\0" * 32)
    path = tmp_path / "bad.raw"
    path.write_bytes(body)
    with pytest.raises(FormatError, match=f"{path}.*1073741824x1073741824 matrix"):
        read_nnet(path)
