"""Examples archives (NnetExample, <Nnet3Eg>): the archives Kaldi wrote read back and
written again byte for byte, compressed features decoded as Kaldi decodes them,
sparse supervision as labels.txt says, text round trips, scp and pipes, and
malformed input named."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.errors import FormatError
from pynnet3.io.egs import (
    ExampleWriter,
    NnetExample,
    NnetIo,
    examples_bytes,
    parse_examples,
    read_examples,
)
from pynnet3.io.general_matrix import CompressedMatrix, SparseMatrix
from tests.reference import REF, ref_params

CASES = ["tdnn_relu_bn", "xvector"]
ARCHIVES = [(c, a) for c in CASES for a in ("egs.ark", "merged.ark")]


def _folder(case):
    return REF / "train-cli" / case


@pytest.mark.parametrize("case, archive", ref_params(ARCHIVES, "train-cli archives", 2))
def test_kaldi_archives_round_trip_byte_exact(case, archive):
    path = _folder(case) / archive
    egs = list(read_examples(f"ark:{path}"))
    assert len(egs) == (32 if archive == "egs.ark" else 4)
    assert examples_bytes(egs) == path.read_bytes()


@pytest.mark.parametrize("case", ref_params(CASES, "train-cli cases"))
def test_features_decode_as_kaldi_and_labels_match(case):
    import json

    import kaldiio

    folder = _folder(case)
    info = json.loads((folder / "run_info.json").read_text())
    decoded = dict(kaldiio.load_ark(str(folder / "egs_decoded.ark")))
    egs = dict(read_examples(f"ark:{folder / 'egs.ark'}"))
    layout = info["eg_layout"]
    for key, eg in egs.items():
        io = eg["input"]
        assert isinstance(io.features, CompressedMatrix) == (key in info["compressed_egs"])
        ref = decoded[f"{key}/input"]
        # Bitwise: Kaldi's CopyToMat roundings (kaldiio's float32 decoding is not).
        np.testing.assert_array_equal(io.dense().view(np.uint32), ref.view(np.uint32))
        t = np.arange(layout["t_begin"], layout["t_begin"] + layout["input_rows"])
        np.testing.assert_array_equal(io.indexes, np.stack([0 * t, t, 0 * t], 1))
    for line in (folder / "labels.txt").read_text().splitlines():
        key, name, *labels = line.split()
        io = egs[key][name]
        assert io.is_sparse()
        dense = io.dense()
        assert dense.shape == (len(labels), info.get("output_dim", dense.shape[1]))
        np.testing.assert_array_equal(dense.argmax(1), np.array(labels, dtype=int))
        np.testing.assert_array_equal(dense.sum(1), 1.0)
        np.testing.assert_array_equal(io.indexes[:, 1], layout["output_t"])


def _example(rng, n_rows=5, dim=3, t0=-2, sparse_rows=None):
    feats = rng.standard_normal((n_rows, dim)).astype(np.float32)
    labels = rng.integers(0, 7, size=sparse_rows or n_rows)
    return NnetExample([NnetIo.from_matrix("input", t0, feats),
                        NnetIo.from_labels("output", 7, 0, labels)])


def test_compact_index_encoding_by_hand():
    """Kaldi's WriteIndexVector: one signed byte per continuing index, 127 + three
    int32 otherwise (first index relative to (0,0,0))."""
    idx = np.array([[0, -3, 0], [0, -2, 0], [0, 200, 0], [1, 201, 0], [1, 202, 5]], np.int32)
    eg = NnetExample([NnetIo("a", idx, np.zeros((5, 1), np.float32))])
    data = eg.to_bytes()
    start = data.index(b"<I1V> ") + 6
    i4 = b"\x04" + (5).to_bytes(4, "little")
    full = [b"\x7f" + b"".join(b"\x04" + int(v).to_bytes(4, "little", signed=True) for v in row)
            for row in idx[2:]]
    assert data[start:start + 5] == i4
    assert data[start + 5:start + 7] == bytes([0xFD, 0x01])  # -3, then +1
    assert data[start + 7:start + 7 + 48] == b"".join(full)
    back = NnetExample.from_bytes(data)
    np.testing.assert_array_equal(back.io[0].indexes, idx)


def test_text_round_trip_and_fixed_point():
    rng = np.random.default_rng(0)
    egs = [(f"k{i}", _example(rng)) for i in range(3)]
    text = examples_bytes(egs, binary=False)
    assert text.startswith(b"k0 <Nnet3Eg> <NumIo> 2 <NnetIo> input <I1V> 5 <I1> 0 -2 0 ")
    assert b"rows=5 dim=7 [ " in text
    back = list(parse_examples(text))
    assert [k for k, _ in back] == ["k0", "k1", "k2"]
    for (_, a), (_, b) in zip(egs, back, strict=True):
        np.testing.assert_allclose(a["input"].dense(), b["input"].dense(), rtol=1e-6)
        np.testing.assert_array_equal(a["output"].dense(), b["output"].dense())
        np.testing.assert_array_equal(a["input"].indexes, b["input"].indexes)
    assert examples_bytes(back, binary=False) == text
    # Binary of what was read from binary: exact.
    data = examples_bytes(egs)
    assert examples_bytes(list(parse_examples(data))) == data


def test_sparse_rows_of_different_lengths():
    m = SparseMatrix(4, np.array([0, 2, 2, 3]), np.array([0, 3, 1], np.int32),
                     np.array([0.25, 0.75, 1.0], np.float32))
    eg = NnetExample([NnetIo("output", np.zeros((3, 3), np.int32), m)])
    for binary in (True, False):
        back = NnetExample.from_bytes(eg.to_bytes(binary))
        np.testing.assert_array_equal(back.io[0].dense(),
                                      [[0.25, 0, 0, 0.75], [0, 0, 0, 0], [0, 1, 0, 0]])


def test_writer_ark_scp_and_pipe(tmp_path):
    rng = np.random.default_rng(1)
    egs = [(f"k{i}", _example(rng)) for i in range(4)]
    ark, scp = tmp_path / "o.ark", tmp_path / "o.scp"
    with ExampleWriter(f"ark,scp:{ark},{scp}") as w:
        for key, eg in egs:
            w.write(key, eg)
    assert ark.read_bytes() == examples_bytes(egs)
    assert [line.split()[0] for line in scp.read_text().splitlines()] == ["k0", "k1", "k2", "k3"]
    from_scp = list(read_examples(f"scp:{scp}"))
    assert examples_bytes(from_scp) == ark.read_bytes()
    from_pipe = list(read_examples(f"ark:cat {ark} |"))
    assert examples_bytes(from_pipe) == ark.read_bytes()


def test_writer_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "o.ark"
    with pytest.raises(RuntimeError), ExampleWriter(f"ark:{out}") as w:
        w.write("k", _example(np.random.default_rng(2)))
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.replace(b"<NumIo> \x04\x02", b"<NumIo> \x04\x00"), "invalid <NumIo>"),
    (lambda d: d.replace(b"</NnetIo>", b"</NnetIX>", 1), "expected '</NnetIo>'"),
    (lambda d: d[:-40], "end of file"),
    (lambda d: d.replace(b"FM \x04\x05", b"FM \x04\x04", 1), "indexes but features"),
])
def test_malformed_archives_are_format_errors(mutate, message):
    data = examples_bytes([("key1", _example(np.random.default_rng(3)))])
    with pytest.raises(FormatError, match=message) as e:
        list(parse_examples(mutate(data), "bad.ark"))
    assert "bad.ark" in str(e.value) and "key1" in str(e.value)


def test_bad_compact_index_byte():
    data = _example(np.random.default_rng(4), t0=0).to_bytes()
    at = data.index(b"<I1V> ") + 11
    bad = data[:at] + bytes([126]) + data[at + 1:]
    with pytest.raises(FormatError, match="compact index"):
        NnetExample.from_bytes(bad, "x.ark")


def test_sparse_index_out_of_range_is_an_error():
    data = _example(np.random.default_rng(5)).to_bytes()
    at = data.index(b"SV ") + 13 + 1  # the first label's int32
    bad = data[:at] + (99).to_bytes(4, "little") + data[at + 4:]
    with pytest.raises(FormatError, match="sparse vector indexes"):
        NnetExample.from_bytes(bad, "x.ark")


def test_compressed_matrix_compress_then_decode_is_close():
    rng = np.random.default_rng(6)
    for rows, fmt in ((20, "CM"), (4, "CM2")):
        m = rng.standard_normal((rows, 6)).astype(np.float32)
        c = CompressedMatrix.compress(m)
        assert c.fmt == fmt and c.shape == (rows, 6)
        span = float(m.max() - m.min())
        # CM: 1 byte per value within quartile bins; CM2: 16 bits over the range.
        tol = span / 40 if fmt == "CM" else span / 60000
        np.testing.assert_allclose(c.to_array(), m, atol=tol)


@pytest.mark.parametrize("case", ref_params(CASES, "train-cli cases"))
def test_compressing_kaldi_decoded_features_gives_kaldi_bytes(case):
    """Kaldi's compression of its own decompressed values is a fixed point (the
    percentile and range values decode exactly): ours must give the same bytes."""
    egs = dict(read_examples(f"ark:{_folder(case) / 'egs.ark'}"))
    compressed = [eg["input"].features for eg in egs.values()
                  if isinstance(eg["input"].features, CompressedMatrix)]
    assert len(compressed) == 16
    for c in compressed:
        again = CompressedMatrix.compress(c.to_array())
        assert (again.fmt, again.payload) == (c.fmt, c.payload)
