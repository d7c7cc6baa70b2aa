"""Review of examples handling against Kaldi's source (nnet3-merge-egs, NnetExample,
CompressedMatrix), with expectations derived from that source, not from pynnet3:

- compression (``NnetExample::Compress``, ``nnet3-merge-egs --compress=true``) is
  Kaldi's ``CompressedMatrix::CopyFromMat`` byte for byte: a scalar re-derivation of
  matrix/compressed-matrix.cc (float steps in float, the ``+ 0.499`` / ``+ 0.5`` of
  its roundings in double) is the reference; kaldiio's compression, used before,
  gave another byte in 1 of 6 CM and 1 of 3 CM2 matrices;
- merged examples merge again (Kaldi's MergeIo since 2020: n + i * stride);
- the merge statistics list minibatch sizes as Kaldi's unordered_map prints them;
- ``--backstitch-training-scale`` <= 0 with momentum trains (Kaldi asserts only
  when it backstitches, for a scale > 0).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pynnet3.io.egs import NnetExample, NnetIo, examples_bytes, read_examples
from pynnet3.io.egs_merge import ExampleMerger, merge_examples
from pynnet3.io.general_matrix import CompressedMatrix, SparseMatrix
from pynnet3.train import TrainerOptions
from tests.reference import require_reference

f32 = np.float32


# -- Kaldi's compressed-matrix.cc, one element at a time ---------------------------------------
def _uint(min_value, range_, value, top: int) -> int:
    """FloatToUint16 / FloatToUint8: f = (value - min) / range in float, clamped;
    static_cast<int>(f * top + 0.499): float times int is float, + 0.499 in double."""
    f = f32(f32(f32(value) - min_value) / range_)
    f = min(max(f, f32(0)), f32(1))
    return int(float(f32(f * f32(top))) + 0.499)


def _uint16_to_float(min_value, range_, q: int):
    """min_value + range * 1.52590218966964e-05F * value, all float."""
    return f32(min_value + f32(f32(range_ * f32(1.52590218966964e-05)) * f32(q)))


def _float_to_char(p0, p25, p75, p100, value) -> int:
    value = f32(value)
    if value < p25:
        f = f32(f32(value - p0) / f32(p25 - p0))
        return min(max(int(float(f32(f * f32(64))) + 0.5), 0), 64)
    if value < p75:
        f = f32(f32(value - p25) / f32(p75 - p25))
        return min(max(64 + int(float(f32(f * f32(128))) + 0.5), 64), 192)
    f = f32(f32(value - p75) / f32(p100 - p75))
    return min(max(192 + int(float(f32(f * f32(63))) + 0.5), 192), 255)


def _global_header(m):
    min_value, max_value = f32(m.min()), f32(m.max())
    if max_value == min_value:  # min_value + (1.0 + fabs(min_value)) in double
        max_value = f32(float(min_value) + (1.0 + abs(float(min_value))))
    return min_value, f32(max_value - min_value)


def kaldi_compress(m: np.ndarray, fmt: str) -> bytes:
    """The bytes after Kaldi's ``CM``/``CM2``/``CM3`` token for ``m`` (float32)."""
    m = np.asarray(m, f32)
    rows, cols = m.shape
    mn, rng = _global_header(m)
    out = struct.pack("<ffii", mn, rng, rows, cols)
    if fmt in ("CM2", "CM3"):
        top, code = (65535, "<H") if fmt == "CM2" else (255, "<B")
        return out + b"".join(struct.pack(code, _uint(mn, rng, v, top)) for v in m.ravel())
    assert rows >= 5
    heads, data = [], []
    q = rows // 4
    for c in range(cols):
        s = np.sort(m[:, c])  # (nth_element puts these four where sorting would)
        h0 = min(_uint(mn, rng, s[0], 65535), 65532)
        h25 = min(max(_uint(mn, rng, s[q], 65535), h0 + 1), 65533)
        h75 = min(max(_uint(mn, rng, s[3 * q], 65535), h25 + 1), 65534)
        h100 = max(_uint(mn, rng, s[rows - 1], 65535), h75 + 1)
        heads.append(struct.pack("<4H", h0, h25, h75, h100))
        p = [_uint16_to_float(mn, rng, h) for h in (h0, h25, h75, h100)]
        data.append(bytes(_float_to_char(*p, v) for v in m[:, c]))
    return out + b"".join(heads) + b"".join(data)


def _matrices(seed: int, rows: tuple[int, int], count: int):
    rng = np.random.default_rng(seed)
    for i in range(count):
        shape = (int(rng.integers(*rows)), int(rng.integers(1, 24)))
        m = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0, 1e3])
        if i % 9 == 0:
            m[:] = m.flat[0]  # constant: Kaldi widens the range to 1 + |min|
        yield m.astype(f32)


def test_speech_feature_compression_is_kaldis_bytes():
    """kAutomaticMethod on more than 8 rows: CM, per-column percentile headers."""
    for m in _matrices(1, (9, 60), 120):
        c = CompressedMatrix.compress(m)
        assert c.fmt == "CM"
        assert c.payload == kaldi_compress(m, "CM"), m.shape


def test_two_byte_compression_is_kaldis_bytes():
    """kAutomaticMethod on 8 rows or fewer (an iVector row, a merged iVector NnetIo
    of a minibatch of up to 8): CM2, two bytes per element."""
    for m in _matrices(2, (1, 9), 200):
        c = CompressedMatrix.compress(m)
        assert c.fmt == "CM2"
        assert c.payload == kaldi_compress(m, "CM2"), m.shape


def test_one_byte_compression_is_kaldis_bytes():
    for m in _matrices(3, (1, 30), 60):
        assert CompressedMatrix.compress(m, "CM3").payload == kaldi_compress(m, "CM3")


def test_compressed_ivector_example_as_kaldi():
    """NnetExample::Compress on an example with an iVector: the 1-row iVector becomes
    CM2 (kAutomaticMethod), the features CM, the sparse supervision stays; decoding
    gives min + range/65535 * q per element (Kaldi's Uint16ToFloat)."""
    rng = np.random.default_rng(4)
    feats = rng.standard_normal((29, 13)).astype(f32)
    ivector = rng.standard_normal((1, 100)).astype(f32) * 3
    eg = NnetExample([NnetIo.from_matrix("input", -7, feats),
                      NnetIo.from_matrix("ivector", 0, ivector),
                      NnetIo.from_labels("output", 10, 0, rng.integers(0, 10, 15))]).compress()
    assert [type(io.features).__name__ for io in eg.io] == [
        "CompressedMatrix", "CompressedMatrix", "SparseMatrix"]
    assert eg["input"].features.fmt == "CM" and eg["ivector"].features.fmt == "CM2"
    assert eg["ivector"].features.payload == kaldi_compress(ivector, "CM2")
    mn, rng_ = _global_header(ivector)
    q = np.frombuffer(eg["ivector"].features.payload[16:], "<u2")
    want = [_uint16_to_float(mn, rng_, int(v)) for v in q]
    np.testing.assert_array_equal(eg["ivector"].dense().ravel(), np.array(want, f32))
    # A binary round trip keeps every byte.
    ((_, back),) = list(_parse(examples_bytes({"k": eg})))
    assert examples_bytes({"k": back}) == examples_bytes({"k": eg})


def _parse(data: bytes):
    from pynnet3.io.egs import parse_examples

    return parse_examples(data)


# -- merging ----------------------------------------------------------------------------------
def _single(rng, t_in: int = 12, ivector: bool = True) -> NnetExample:
    ios = [NnetIo.from_matrix("input", -2, rng.standard_normal((t_in, 5)).astype(f32)),
           NnetIo.from_labels("output", 7, 0, rng.integers(0, 7, t_in - 4))]
    if ivector:
        ios.insert(1, NnetIo.from_matrix("ivector", 0, rng.standard_normal((1, 3)).astype(f32)))
    return NnetExample(ios)


def test_merged_examples_merge_again_as_kaldi():
    """Kaldi's MergeIo: stride = 1 + the first example's largest n, example i's n
    become n + i * stride. So two minibatches of 3 merged are the 6 examples merged
    at once, byte for byte (each minibatch is n-major, stacked in order)."""
    rng = np.random.default_rng(5)
    egs = [_single(rng) for _ in range(6)]
    direct = merge_examples(egs)
    again = merge_examples([merge_examples(egs[:3]), merge_examples(egs[3:])])
    assert examples_bytes({"k": again}) == examples_bytes({"k": direct})
    np.testing.assert_array_equal(again["ivector"].indexes,
                                  [[n, 0, 0] for n in range(6)])
    np.testing.assert_array_equal(again["input"].indexes[:, 0], np.repeat(np.arange(6), 12))
    # Three minibatches of 2 then merged: strides 2, n = 0..5.
    pairs = [merge_examples(egs[i:i + 2]) for i in (0, 2, 4)]
    assert examples_bytes({"k": merge_examples(pairs)}) == examples_bytes({"k": direct})


def test_merger_merges_minibatches_of_kaldis_merged_ark():
    """nnet3-merge-egs --minibatch-size=2 on Kaldi's merged.ark (4 minibatches of 8)
    writes what --minibatch-size=16 on egs.ark writes (2 minibatches of 16)."""
    folder = require_reference() / "train-cli" / "tdnn_relu_bn"
    merged = [eg for _, eg in read_examples(f"ark:{folder / 'merged.ark'}")]
    single = [eg for _, eg in read_examples(f"ark:{folder / 'egs.ark'}")]
    a = list(ExampleMerger("2").merge_all(merged))
    b = list(ExampleMerger("16").merge_all(single))
    assert [k for k, _ in a] == ["merged-0-2", "merged-1-2"]
    assert [k for k, _ in b] == ["merged-0-16", "merged-1-16"]
    assert [eg.to_bytes() for _, eg in a] == [eg.to_bytes() for _, eg in b]


def test_merge_stats_list_sizes_newest_first():
    """ExampleMergingStats keeps minibatch size -> count in an unordered_map<int32,
    int32> and prints it in iteration order; libstdc++ (Kaldi's usual build) iterates
    a map of up to 13 keys newest first (checked with g++: 13 buckets, each new node
    put at the front). 11 examples, --minibatch-size=2,4: two of 4 while reading, then
    at the end 3 left: one of 2, one discarded -> Kaldi prints 4={2->1,4->2,d=1}."""
    rng = np.random.default_rng(6)
    merger = ExampleMerger("2,4")
    out = list(merger.merge_all(_single(rng, ivector=False) for _ in range(11)))
    assert [k for k, _ in out] == ["merged-0-4", "merged-1-4", "merged-2-2"]
    lines = merger.stats_lines()
    assert lines[1] == "12={2->1,4->2,d=1}"
    # 11 egs of size 12; 3 minibatches; 1/11 discarded = 9.0909% -> setprecision(4);
    # avg minibatch 10/3; 1 eg type, 2 minibatch types.
    assert lines[2] == ("Processed 11 egs of avg. size 12 into 3 minibatches, discarding "
                        "9.091% of egs.  Avg minibatch size was 3.333, #distinct types of "
                        "egs/minibatches was 1/2")


def test_merged_sparse_and_full_supervision():
    """AppendGeneralMatrixRows: sparse supervision of every example stays sparse;
    dense supervision (a full matrix, e.g. quadratic-objective targets) of one
    example makes the merged one full, the sparse rows densified in place."""
    rng = np.random.default_rng(7)
    a, b = _single(rng, ivector=False), _single(rng, ivector=False)
    dense = rng.standard_normal((8, 7)).astype(f32)
    b.io[1] = NnetIo(b.io[1].name, b.io[1].indexes, dense)
    m = merge_examples([a, b])
    assert isinstance(merge_examples([a, a])["output"].features, SparseMatrix)
    assert isinstance(m["output"].features, np.ndarray)
    np.testing.assert_array_equal(m["output"].features[:8], a["output"].dense())
    np.testing.assert_array_equal(m["output"].features[8:], dense)


def test_negative_backstitch_scale_allows_momentum():
    """NnetTrainer asserts momentum == 0 only inside 'backstitch_training_scale > 0.0
    && ...': a scale <= 0 trains plainly, with momentum."""
    opts = TrainerOptions.from_flags({"momentum": 0.5, "backstitch-training-scale": -0.1})
    assert opts.momentum == 0.5
    with pytest.raises(Exception, match="incompatible with momentum"):
        TrainerOptions.from_flags({"momentum": 0.5, "backstitch-training-scale": 0.1})
