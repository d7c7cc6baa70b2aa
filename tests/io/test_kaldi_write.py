"""Models written as Kaldi's tools write them (what the command line does: BatchNorm
statistics from their sums, ``BatchNormComponent.forget_file_stats``), against what
Kaldi's own read -> write did to the reference files (kaldi-reference/README.md, "Text
models" and "Binary models"): the same number of moved values, nothing else moved."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from pynnet3.nnet import read_nnet

from ..components.common import KALDI_BIN_BYTES, KALDI_TEXT_MOVES, same_but_batchnorm_stats
from ..components.test_affine import files_with_types
from ..reference import REF, ref_params

FILES = files_with_types(("BatchNormComponent",))


def _as_kaldi(path):
    nnet = read_nnet(path)
    for comp in nnet.components.values():
        if comp.type_name == "BatchNormComponent":
            comp.forget_file_stats()
    return nnet


@pytest.mark.parametrize("path", ref_params([p for p in FILES if p.suffix != ".bin"]),
                         ids=lambda p: str(p.relative_to(REF)))
def test_text_write_moves_what_kaldis_moved(path):
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    moved = same_but_batchnorm_stats(data, _as_kaldi(path).to_bytes(binary=False))
    assert moved == KALDI_TEXT_MOVES.get(str(path.relative_to(REF)), 0)


@pytest.mark.parametrize("path", ref_params([p for p in FILES if p.suffix == ".bin"]),
                         ids=lambda p: str(p.relative_to(REF)))
def test_binary_write_of_text_model_differs_where_kaldis_did(path):
    ours = _as_kaldi(path.with_suffix(".txt")).to_bytes(binary=True)
    kaldi = path.read_bytes()
    assert len(ours) == len(kaldi)
    differ = int(np.count_nonzero(np.frombuffer(ours, np.uint8) != np.frombuffer(kaldi, np.uint8)))
    assert differ == KALDI_BIN_BYTES.get(str(path.parent.relative_to(REF)), 0)
    same_but_batchnorm_stats(kaldi, ours)
