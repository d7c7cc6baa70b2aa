"""nnet3-merge-egs: Kaldi's merged.ark reproduced byte for byte from egs.ark, the
--minibatch-size rule syntax and Kaldi's choice of sizes, MergeExamples' n
renumbering checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.errors import DimensionError, FormatError
from pynnet3.io.egs import NnetExample, NnetIo, examples_bytes, read_examples
from pynnet3.io.egs_merge import ExampleMerger, MinibatchSizeRules, merge_examples
from pynnet3.io.general_matrix import CompressedMatrix, SparseMatrix
from tests.reference import REF, ref_params


@pytest.mark.parametrize("case", ref_params(["tdnn_relu_bn", "xvector"], "train-cli cases"))
def test_merging_reproduces_kaldi_merged_ark(case):
    folder = REF / "train-cli" / case
    merger = ExampleMerger("8")
    out = list(merger.merge_all(eg for _, eg in read_examples(f"ark:{folder / 'egs.ark'}")))
    assert [k for k, _ in out] == [f"merged-{i}-8" for i in range(4)]
    assert examples_bytes(out) == (folder / "merged.ark").read_bytes()
    log = (folder / "log_nnet3-merge-egs.txt").read_text()
    for line in merger.stats_lines():
        assert line in log


def _eg(rng, rows=4, t0=0, dim=3, name="input", labels=2, compressed=False):
    feats = rng.standard_normal((rows, dim)).astype(np.float32)
    io = NnetIo.from_matrix(name, t0, CompressedMatrix.compress(feats) if compressed else feats)
    return NnetExample([NnetIo.from_labels("output", 5, 0, rng.integers(0, 5, labels)), io])


def test_merge_examples_by_hand():
    rng = np.random.default_rng(0)
    egs = [_eg(rng, compressed=(i % 2 == 1)) for i in range(3)]
    m = merge_examples(egs)
    assert m.names() == ["input", "output"]  # sorted, as Kaldi's std::set
    inp = m["input"]
    assert isinstance(inp.features, np.ndarray)
    np.testing.assert_array_equal(inp.features, np.concatenate([e["input"].dense() for e in egs]))
    np.testing.assert_array_equal(inp.indexes[:, 0], np.repeat([0, 1, 2], 4))
    np.testing.assert_array_equal(inp.indexes[:, 1], np.tile(np.arange(4), 3))
    out = m["output"]
    assert isinstance(out.features, SparseMatrix)
    np.testing.assert_array_equal(out.dense(), np.concatenate([e["output"].dense() for e in egs]))
    np.testing.assert_array_equal(out.indexes[:, 0], [0, 0, 1, 1, 2, 2])
    c = merge_examples(egs, compress=True)
    assert isinstance(c["input"].features, CompressedMatrix)
    assert isinstance(c["output"].features, SparseMatrix)


def test_merge_refuses_inconsistent_examples():
    """(Merged examples merge again, as in Kaldi since 2020: tests/train/
    test_review_egs.py; one of 2 sequences after a single example does not.)"""
    rng = np.random.default_rng(1)
    merged = merge_examples([_eg(rng), _eg(rng)])
    with pytest.raises(FormatError, match="n < 1"):
        merge_examples([_eg(rng), merged])
    with pytest.raises(DimensionError, match="different dims"):
        merge_examples([_eg(rng, dim=3), _eg(rng, dim=4)])


@pytest.mark.parametrize("text, eg_size, available, ended, expected", [
    ("128", 10, 127, False, 0), ("128", 10, 128, False, 128),
    ("128", 10, 100, True, 0),               # a partial minibatch is discarded
    ("64,128", 10, 100, True, 64), ("64,128", 10, 50, True, 0),
    ("1:32,64", 10, 40, True, 32), ("1:32,64", 10, 70, True, 64),
    ("32:64,128", 10, 20, True, 0),          # below every range: discarded
    ("32:64,128", 10, 50, True, 50),
    ("32:64,128", 10, 64, False, 0),         # before the end only the largest size
    ("100=16/300=64", 290, 64, False, 64),   # nearest rule: 300
    ("100=16/300=64", 150, 16, False, 16),   # nearest rule: 100
])
def test_minibatch_size_rules(text, eg_size, available, ended, expected):
    assert MinibatchSizeRules.parse(text).minibatch_size(eg_size, available, ended) == expected


@pytest.mark.parametrize("text", ["", "0", "a", "8=4/16", "8=4/8=2", "4:2", "1:2:", "1:2:3",
                                  "64,,128", "8=4/"])
def test_bad_minibatch_size(text):
    with pytest.raises(FormatError, match="minibatch-size"):
        MinibatchSizeRules.parse(text)


def test_merger_groups_by_structure_and_discards_leftovers():
    rng = np.random.default_rng(2)
    egs = [_eg(rng, rows=4 if i % 3 else 6) for i in range(10)]  # 4 of size 6, 6 of size 4
    merger = ExampleMerger("2,3:4")
    out = list(merger.merge_all(egs))
    sizes = [(eg["input"].num_rows // int(k.split("-")[2]), int(k.split("-")[2]))
             for k, eg in out]
    # Size 4: four at once (the largest size) when the 4th arrives (i=5); size 6: at i=9;
    # at the end the 2 size-4 examples left go as a minibatch of 2.
    assert sizes == [(4, 4), (6, 4), (4, 2)]
    assert [k.split("-")[1] for k, _ in out] == ["0", "1", "2"]
    assert merger.stats_lines()[1] == "4={2->1,4->1,d=0},6={4->1,d=0}"  # (newest first)
    merger = ExampleMerger("4")
    out = list(merger.merge_all(egs))
    assert len(out) == 2 and merger.stats_lines()[1] == "4={4->1,d=2},6={4->1,d=0}"
    assert "discarding 20% of egs" in merger.stats_lines()[2]
