# ruff: noqa: E501  (network configs are long lines)
"""Specialization keys, regular layouts, shift policies and mini requests."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import Layout, mini_request, regular_layout, request_key, shift_policy
from pynnet3.cache.key import ShiftPolicy, request_layouts
from tests.cache.common import frames, request
from tests.compiler import nets

EXACT = ShiftPolicy(False, 0)


# -- regular layouts ------------------------------------------------------------------------

@pytest.mark.parametrize("n_seqs,t0,t1", [(1, 0, 5), (2, -3, 4), (5, 0, 1), (7, 2, 9)])
def test_layout_of_sequence_major_and_time_major(n_seqs, t0, t1):
    T = t1 - t0
    assert regular_layout(frames(n_seqs, t0, t1, "n")) == Layout(0, n_seqs, 1, T)
    lay = regular_layout(frames(n_seqs, t0, t1, "t"))
    assert lay is not None and lay.num_n == n_seqs
    if n_seqs > 1:
        assert (lay.outer, lay.stride) == (T, 1)


def test_layout_with_offset_n_and_x():
    idx = frames(3, 0, 4, "n", n0=5)
    idx[:, 2] = np.tile([0, 1, 0, 2], 3)
    assert regular_layout(idx) == Layout(5, 3, 1, 4)


def test_layout_nested_blocks():
    # (O=2, N=3, S=2): two time blocks, each with 3 sequences of 2 frames.
    rows = [(n, t, 0) for blk in range(2) for n in range(3) for t in (2 * blk, 2 * blk + 1)]
    assert regular_layout(np.array(rows)) == Layout(0, 3, 2, 2)


@pytest.mark.parametrize("case", ["ragged", "missing_n", "shuffled", "reversed", "tx_differs",
                                  "n_gap"])
def test_irregular_layouts(case):
    idx = frames(4, 0, 5, "n")
    if case == "ragged":  # the last sequence is one frame shorter
        idx = idx[:-1]
    elif case == "missing_n":
        idx = idx[idx[:, 0] != 2]
    elif case == "shuffled":
        idx = idx[np.random.default_rng(0).permutation(len(idx))]
    elif case == "reversed":
        idx = idx[::-1].copy()
    elif case == "tx_differs":
        idx[7, 1] += 100
    elif case == "n_gap":
        idx[:, 0] *= 2
    assert regular_layout(idx) is None


# -- keys ---------------------------------------------------------------------------------------

def _req(n_seqs=3, t0=0, t1=6, n0=0, deriv=False, extra=None):
    ins = {"input": frames(n_seqs, t0 - 3, t1 + 3, n0=n0)}
    if extra:
        ins.update(extra)
    return request(ins, {"output": frames(n_seqs, t0, t1, n0=n0)}, output_deriv=deriv)


def _same(a, b, policy=EXACT) -> bool:
    ka, kb = request_key(a, policy), request_key(b, policy)
    return ka.key == kb.key and ka.matches(kb.arrays, kb.shift)


def test_fresh_equal_requests_match():
    assert _same(_req(), _req())


@pytest.mark.parametrize("other", [
    dict(n_seqs=4), dict(t1=7), dict(deriv=True), dict(t0=1, t1=7), dict(n0=1),
    dict(extra={"ivector": frames(3, 0, 1)})])
def test_different_requests_do_not_match(other):
    assert not _same(_req(), _req(**other))


def test_same_bucket_different_middle_rows_do_not_match():
    a, b = _req(), _req()
    b.inputs[0].indexes[5, 1] += 1  # first, middle and last probe rows unchanged
    assert not _same(a, b)


def test_flags_and_variant_are_part_of_the_key():
    a, b = _req(), _req()
    b.need_model_derivative = True
    assert not _same(a, b)
    assert request_key(a, EXACT, ("float32",)).key != request_key(a, EXACT, ("float64",)).key


def test_shift_policy_of_small_networks():
    tdnn = pynnet3.Nnet.from_config(nets.TDNN)
    assert shift_policy(tdnn) == ShiftPolicy(True, 1)
    assert shift_policy(pynnet3.Nnet.from_config(nets.ROUND)) == ShiftPolicy(True, 3)
    # ReplaceIndex(ivector, t, 0) pins time: no time shift.
    assert shift_policy(pynnet3.Nnet.from_config(nets.IVECTOR)) == ShiftPolicy(True, 0)
    # Statistics extraction (output-period 2) and pooling (input-period 2).
    assert shift_policy(pynnet3.Nnet.from_config(nets.STATS)).t_period == 2


def test_backprop_truncation_reads_absolute_n():
    cfg = """
input-node name=input dim=2
component name=bt type=BackpropTruncationComponent dim=2 clipping-threshold=30 zeroing-threshold=15 zeroing-interval=20 recurrence-interval=1
component-node name=bt component=bt input=input
output-node name=output input=bt
"""
    assert shift_policy(pynnet3.Nnet.from_config(cfg)) == ShiftPolicy(False, 20)


def test_shifts_share_a_key_only_when_allowed():
    tdnn_policy = ShiftPolicy(True, 1)
    assert _same(_req(), _req(t0=5, t1=11), tdnn_policy)
    assert _same(_req(), _req(n0=4), tdnn_policy)
    assert not _same(_req(), _req(t0=5, t1=11), ShiftPolicy(True, 0))
    round_policy = ShiftPolicy(True, 3)
    assert _same(_req(), _req(t0=6, t1=12), round_policy)
    assert not _same(_req(), _req(t0=5, t1=11), round_policy)


def test_mini_request_keeps_two_sequences():
    req = _req(n_seqs=5, extra={"ivector": frames(5, 0, 1, "t")})
    req.outputs[0].indexes = frames(5, 0, 6, "t")
    mini = mini_request(req, request_layouts(req))
    assert [s.name for s in mini.inputs] == ["input", "ivector"]
    np.testing.assert_array_equal(mini.inputs[0].indexes, frames(2, -3, 9, "n"))
    np.testing.assert_array_equal(mini.inputs[1].indexes, frames(2, 0, 1))
    np.testing.assert_array_equal(mini.outputs[0].indexes, frames(2, 0, 6, "t"))
    # Too few sequences, or sequences that differ: no mini request.
    small = _req(n_seqs=2)
    assert mini_request(small, request_layouts(small)) is None
    ragged = _req(n_seqs=4)
    ragged.outputs[0].indexes = ragged.outputs[0].indexes[:-1]
    assert mini_request(ragged, request_layouts(ragged)) is None


def test_mini_request_renumbers_n_from_zero():
    req = _req(n_seqs=4, n0=3)
    mini = mini_request(req, request_layouts(req))
    assert set(mini.inputs[0].indexes[:, 0].tolist()) == {0, 1}


def test_mini_request_from_other_n0_only_when_allowed():
    req = request({"input": frames(4, -3, 9, n0=2)}, {"output": frames(4, 0, 6, n0=2)})
    lay = request_layouts(req)
    mini = mini_request(req, lay)
    assert mini is not None and mini.inputs[0].indexes[:, 0].min() == 0
    assert mini_request(req, lay, any_n0=False) is None
    zero = request({"input": frames(4, -3, 9)}, {"output": frames(4, 0, 6)})
    assert mini_request(zero, request_layouts(zero), any_n0=False) is not None
