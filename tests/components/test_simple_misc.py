"""Tests of simple_misc.py: SumGroup, SumBlock, NoOp, ClipGradient,
BackpropTruncation, ElementwiseProduct, Permute."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import component_class
from pynnet3.components.base import Flags
from pynnet3.components.simple_misc import match_rows
from pynnet3.errors import ComputeError, ConfigError, FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader, make_writer
from tests.components.common import (
    ALL_NNET_FILES,
    finite_difference_check,
    reference_files,
    rel_err,
    roundtrip_spans,
)
from tests.components.test_nonlinear import (
    backward,
    component_cases,
    direct_cases,
    forward,
    make,
    run_reference_case,
    truncation_and_garbage,
    whole_file_roundtrip,
)
from tests.reference import needs_reference, ref_params, require_reference

TYPES = ["SumGroupComponent", "SumBlockComponent", "NoOpComponent", "ClipGradientComponent",
         "BackpropTruncationComponent", "ElementwiseProductComponent", "PermuteComponent"]
SHORT = [t[:-len("Component")] for t in TYPES]


@needs_reference
def test_roundtrip_every_reference_component():
    count = sum(roundtrip_spans(p, TYPES) for p in reference_files(TYPES, ALL_NNET_FILES))
    assert count >= 50


@pytest.mark.parametrize("case", ref_params([c for s in SHORT
                                              for c in component_cases(s + "_")], "cases"),
                         ids=lambda c: c.name)
def test_whole_file_roundtrip(case):
    whole_file_roundtrip(case)


@pytest.mark.parametrize("case", ref_params([c for s in SHORT for c in direct_cases(s)], "cases"),
                         ids=lambda c: c.name)
@pytest.mark.parametrize("grad", [None, {}], ids=["plain", "training"])
def test_reference_case(case, grad):
    run_reference_case(case, grad=grad)


def test_reference_cases_found():
    require_reference()
    assert len([c for s in SHORT for c in direct_cases(s)]) == 12


# -- gradients --------------------------------------------------------------------
@pytest.mark.parametrize("config", [
    "type=SumGroupComponent sizes=1,2,3",
    "type=SumGroupComponent input-dim=6 output-dim=2",
    "type=SumBlockComponent input-dim=6 output-dim=2 scale=0.5",
    "type=NoOpComponent dim=4",
    "type=ElementwiseProductComponent input-dim=6 output-dim=2",
    "type=ElementwiseProductComponent input-dim=6 output-dim=3",
    "type=PermuteComponent column-map=2,0,3,1",
    "type=ClipGradientComponent dim=4 clipping-threshold=1000",
    "type=ClipGradientComponent dim=4 clipping-threshold=1000 norm-based-clipping=true",
])
def test_finite_difference_gradient(config):
    comp = make(config)
    x = np.random.default_rng(1).standard_normal((4, comp.input_dim))
    finite_difference_check(comp, x, params=False)


def test_backprop_truncation_finite_difference_when_inactive():
    comp = make("type=BackpropTruncationComponent dim=3 scale=0.7 clipping-threshold=0 "
                "zeroing-threshold=0")
    idx = np.array([[0, t, 0] for t in range(5)])
    indexes = comp.precompute_indexes(idx, idx, True)
    x = np.random.default_rng(2).standard_normal((5, 3))
    finite_difference_check(comp, x, indexes=indexes, params=False)


def test_sum_block_adds():
    comp = make("type=SumBlockComponent input-dim=4 output-dim=2 scale=2")
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    out = np.ones((1, 2))
    comp.propagate(None, x, out)
    np.testing.assert_allclose(out, [[1 + 2 * 4, 1 + 2 * 6]])
    dx = np.ones((1, 4))
    comp.backprop(None, x, out, np.array([[1.0, -1.0]]), None, None, dx)
    np.testing.assert_allclose(dx, [[3, -1, 3, -1]])


def test_values_and_in_place():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    comp = make("type=SumGroupComponent sizes=1,2,3")
    np.testing.assert_allclose(forward(comp, x), [[0, 3, 12], [6, 15, 30]])
    comp = make("type=PermuteComponent column-map=5,4,3,2,1,0")
    np.testing.assert_array_equal(forward(comp, x), x[:, ::-1])
    comp = make("type=ElementwiseProductComponent input-dim=6 output-dim=2")
    np.testing.assert_allclose(forward(comp, x), x[:, 0:2] * x[:, 2:4] * x[:, 4:6])
    comp = make("type=NoOpComponent dim=6 backprop-scale=0.5")
    buf = x.copy()
    comp.propagate(None, buf, buf)
    np.testing.assert_array_equal(buf, x)
    comp.backprop(None, None, None, buf, None, None, buf)
    np.testing.assert_array_equal(buf, 0.5 * x)


def test_clip_gradient_elementwise_and_norm():
    comp = make("type=ClipGradientComponent dim=3 clipping-threshold=1")
    dy = np.array([[0.5, -3.0, 2.0]], dtype=np.float32)
    buf = dy.copy()
    comp.backprop(None, dy, dy, buf, None, None, buf)  # in place
    np.testing.assert_array_equal(buf, [[0.5, -1.0, 1.0]])
    comp = make("type=ClipGradientComponent dim=2 clipping-threshold=5 "
                "norm-based-clipping=true self-repair-scale=0")
    x = np.zeros((2, 2))
    dy = np.array([[3.0, 4.0 * 3], [1.5, 2.0]])
    d = backward(comp, x, x, dy, grad={})
    np.testing.assert_allclose(d[0], dy[0] * 5 / np.linalg.norm(dy[0]), rtol=1e-6)
    np.testing.assert_allclose(d[1], dy[1])
    assert (comp.num_clipped, comp.count, comp.num_backpropped) == (1, 2, 1)
    comp = make("type=ClipGradientComponent dim=2 clipping-threshold=0")
    np.testing.assert_array_equal(backward(comp, x, x, dy), 0)


def test_clip_gradient_self_repair():
    comp = make("type=ClipGradientComponent dim=2 clipping-threshold=1 "
                "norm-based-clipping=true self-repair-scale=0.5 self-repair-target=0.5")
    x = np.array([[2.0, -0.2], [-1.0, 3.0]])
    dy = np.array([[3.0, 0.0], [0.0, 0.5]])
    d = backward(comp, x, x, dy, grad={})
    # Row 0 is clipped, so 1 of 2 rows so far: clipped proportion 0.5 > 0.01.
    assert comp.num_self_repaired == 1
    clipped = np.array([[1.0, 0.0], [0.0, 0.5]])
    repair = np.array([[1.5, 0.0], [-0.5, 2.5]])  # max(|x| - target, 0) * sign(x)
    norm_sum = np.linalg.norm(clipped, axis=1).sum()
    magnitude = 0.5 * 0.5 * norm_sum / 2
    scale = magnitude / (np.linalg.norm(repair, axis=1).sum() / 2)
    expected = clipped - scale / 0.5 * repair
    expected *= norm_sum / np.linalg.norm(expected, axis=1).sum()
    np.testing.assert_allclose(d, expected, rtol=1e-6)
    # Without a training backprop: plain clipping, no counters.
    comp = make("type=ClipGradientComponent dim=2 clipping-threshold=1 "
                "norm-based-clipping=true")
    np.testing.assert_allclose(backward(comp, x, x, dy), clipped)
    assert comp.count == 0 and comp.num_self_repaired == 0


def test_backprop_truncation_zeroing_follows_n():
    comp = make("type=BackpropTruncationComponent dim=2 zeroing-threshold=1 "
                "zeroing-interval=4 recurrence-interval=1")
    idx = np.array([[n, t, 0] for n in (0, 1) for t in range(10)])
    ind = comp.precompute_indexes(idx, idx, True)
    zeroed = {(n, t) for (n, t, _), z in zip(idx.tolist(), ind.zeroing, strict=True) if z}
    assert zeroed == {(0, 0), (0, 4), (0, 8), (1, 1), (1, 5), (1, 9)}
    dy = np.full((20, 2), 2.0)
    d = backward(comp, dy, dy, dy, ind, grad={})
    assert np.all((d == 0).all(axis=1) == ind.zeroing.astype(bool))
    assert comp.num_zeroed == 6 and comp.count_zeroing_boundaries == 6 and comp.count == 20


def test_backprop_truncation_without_backprop_needs_no_zeroing_rows():
    """Compiled without a backprop, the precomputed object has no zeroing rows; the
    forward pass is the same, and a backprop through it is refused."""
    comp = make("type=BackpropTruncationComponent dim=2 scale=2 zeroing-interval=4")
    out_idx = np.array([[n, t, 0] for n in (0, 1) for t in range(6)])
    in_idx = out_idx[::-1].copy()
    with_bp = comp.precompute_indexes(in_idx, out_idx, True)
    without = comp.precompute_indexes(in_idx, out_idx, False)
    assert without.zeroing is None and without.zeroing_sum == 0.0
    assert with_bp.zeroing is not None and with_bp.zeroing_sum == 4.0
    np.testing.assert_array_equal(without.in_rows, with_bp.in_rows)
    x = np.arange(24, dtype=np.float64).reshape(12, 2)
    np.testing.assert_array_equal(forward(comp, x, without), forward(comp, x, with_bp))
    with pytest.raises(ComputeError):
        backward(comp, x, x, x, without)


def test_backprop_truncation_other_row_order():
    comp = make("type=BackpropTruncationComponent dim=2 scale=2 zeroing-threshold=1 "
                "zeroing-interval=2")
    out_idx = np.array([[0, t, 0] for t in range(4)])
    in_idx = out_idx[[2, 0, 3, 1]]
    x = np.arange(8, dtype=np.float64).reshape(4, 2)
    ind = comp.precompute_indexes(in_idx, out_idx, True)
    y = forward(comp, x, ind)
    np.testing.assert_array_equal(y, 2 * x[[1, 3, 0, 2]])
    dy = np.full((4, 2), 0.25)
    d = backward(comp, x, y, dy, ind)
    ref_ind = comp.precompute_indexes(out_idx, out_idx, True)
    d_ref = backward(comp, x, y, dy, ref_ind)
    np.testing.assert_array_equal(d[[1, 3, 0, 2]], d_ref)
    with pytest.raises(ComputeError):
        match_rows(in_idx[:3], out_idx)
    assert comp.input_indexes(out_idx).indexes.tolist() == out_idx.tolist()


def test_backprop_truncation_clipping():
    comp = make("type=BackpropTruncationComponent dim=2 clipping-threshold=1 scale=0.5")
    idx = np.array([[0, 3, 0], [0, 5, 0]])
    ind = comp.precompute_indexes(idx, idx, True)
    dy = np.array([[6.0, 8.0], [0.2, 0.0]])
    d = backward(comp, dy, dy, dy, ind)
    np.testing.assert_allclose(d, [[0.6, 0.8], [0.1, 0.0]])


# -- properties -------------------------------------------------------------------
S = Flags.SIMPLE
PIP, BIP = Flags.PROPAGATE_IN_PLACE, Flags.BACKPROP_IN_PLACE


@pytest.mark.parametrize("config,flags", [
    ("type=SumGroupComponent sizes=1,2", S),
    ("type=SumBlockComponent input-dim=4 output-dim=2", S | Flags.PROPAGATE_ADDS
     | Flags.BACKPROP_ADDS),
    ("type=NoOpComponent dim=3", S | PIP | BIP),
    ("type=ClipGradientComponent dim=3", S | PIP | BIP | Flags.BACKPROP_NEEDS_INPUT),
    ("type=BackpropTruncationComponent dim=3", PIP | BIP),
    ("type=ElementwiseProductComponent input-dim=4 output-dim=2",
     S | Flags.BACKPROP_NEEDS_INPUT),
    ("type=PermuteComponent column-map=1,0", S),
])
def test_properties(config, flags):
    assert make(config).properties() == flags


# -- config -----------------------------------------------------------------------
def test_config_dims_and_defaults():
    c = make("type=SumGroupComponent sizes=1,2,3,2")
    assert (c.input_dim, c.output_dim) == (8, 4)
    c = make("type=SumGroupComponent input-dim=12 output-dim=4")
    assert c.sizes.tolist() == [3, 3, 3, 3]
    c = make("type=SumBlockComponent input-dim=12 output-dim=4")
    assert (c.input_dim, c.output_dim, c.scale) == (12, 4, 1.0)
    c = make("type=NoOpComponent dim=5")
    assert (c.input_dim, c.output_dim, c.backprop_scale) == (5, 5, 1.0)
    c = make("type=ClipGradientComponent dim=5")
    assert (c.clipping_threshold, c.norm_based_clipping, c.self_repair_scale,
            c.self_repair_target) == (15.0, False, 1.0, 0.0)
    assert c.self_repair_clipped_proportion_threshold == np.float32(0.01)
    c = make("type=BackpropTruncationComponent dim=5")
    assert (c.scale, c.clipping_threshold, c.zeroing_threshold, c.zeroing_interval,
            c.recurrence_interval) == (1.0, 30.0, 15.0, 20, 1)
    c = make("type=ElementwiseProductComponent input-dim=9 output-dim=3")
    assert (c.input_dim, c.output_dim) == (9, 3)
    c = make("type=PermuteComponent column-map=2,0,1")
    assert (c.input_dim, c.output_dim) == (3, 3)


@pytest.mark.parametrize("config", [
    "type=SumGroupComponent sizes=1,0",
    "type=SumGroupComponent sizes=1,2 input-dim=3",
    "type=SumGroupComponent input-dim=7 output-dim=2",
    "type=SumBlockComponent input-dim=6",
    "type=SumBlockComponent input-dim=6 output-dim=4",
    "type=NoOpComponent",
    "type=NoOpComponent dim=3 scale=2",
    "type=ClipGradientComponent dim=3 clipping-threshold=-1",
    "type=ClipGradientComponent dim=3 self-repair-scale=-1",
    "type=BackpropTruncationComponent dim=3 zeroing-interval=0",
    "type=BackpropTruncationComponent dim=3 scale=0",
    "type=BackpropTruncationComponent dim=3 recurrence-interval=0",
    "type=ElementwiseProductComponent input-dim=4 output-dim=4",
    "type=ElementwiseProductComponent input-dim=6 output-dim=4",
    "type=PermuteComponent column-map=0,0,1",
    "type=PermuteComponent column-map=0,x",
    "type=PermuteComponent",
])
def test_bad_config(config):
    with pytest.raises(ConfigError):
        make(config)


# -- malformed files ---------------------------------------------------------------
@pytest.mark.parametrize("config", [
    "type=SumGroupComponent sizes=1,2,3",
    "type=SumBlockComponent input-dim=4 output-dim=2 scale=0.5",
    "type=NoOpComponent dim=3 backprop-scale=0.5",
    "type=ClipGradientComponent dim=3 norm-based-clipping=true",
    "type=BackpropTruncationComponent dim=3 scale=0.5",
    "type=ElementwiseProductComponent input-dim=4 output-dim=2",
    "type=PermuteComponent column-map=2,0,1",
])
def test_malformed(config):
    truncation_and_garbage(make(config))


def test_malformed_values():
    read = component_class("PermuteComponent").read
    with pytest.raises(FormatError, match="permutation"):
        read(TextReader(b"<ColumnMap> [ 0 0 1 ]\n</PermuteComponent> "))
    with pytest.raises(FormatError):
        read(TextReader(b"<ColumnMap> [ 0 x 1 ]\n</PermuteComponent> "))
    with pytest.raises(FormatError):
        read(BinaryReader(b"<ColumnMap> \x04\xff\x00\x00\x00\x00\x00</PermuteComponent> "))
    with pytest.raises(FormatError):
        component_class("SumGroupComponent").read(
            TextReader(b"<Sizes> [ 2 -1 ]\n</SumGroupComponent> "))
    with pytest.raises(FormatError):
        component_class("ElementwiseProductComponent").read(
            TextReader(b"<InputDim> 4 <OutputDim> 4 </ElementwiseProductComponent> "))
    with pytest.raises(FormatError):
        component_class("BackpropTruncationComponent").read(
            TextReader(b"<Dim> 3 <ClippingThreshold> 1 <ZeroingThreshold> 1 "
                       b"<ZeroingInterval> 0 "))


def test_old_formats_read():
    noop = component_class("NoOpComponent").read(TextReader(
        b"<Dim> 3 <ValueAvg> [ ]\n<DerivAvg> [ ]\n<Count> 0 <OderivRms> [ ]\n"
        b"<OderivCount> 0 <NumDimsSelfRepaired> 0 <NumDimsProcessed> 0 </NoOpComponent> "))
    assert (noop.dim, noop.backprop_scale) == (3, 1.0)
    clip = component_class("ClipGradientComponent").read(TextReader(
        b"<Dim> 3 <ClippingThreshold> 2 <NormBasedClipping> T <NumElementsClipped> 1 "
        b"<NumElementsProcessed> 4 </ClipGradientComponent> "))
    assert (clip.self_repair_scale, clip.num_clipped, clip.count) == (0.0, 1, 4)
    bt = component_class("BackpropTruncationComponent").read(TextReader(
        b"<Dim> 3 <ClippingThreshold> 2 <ZeroingThreshold> 1 <ZeroingInterval> 4 "
        b"<RecurrenceInterval> 1 <NumElementsClipped> 0 <NumElementsZeroed> 0 "
        b"<NumElementsProcessed> 0 <NumZeroingBoundaries> 0 </BackpropTruncationComponent> "))
    assert bt.scale == 1.0
    sg = component_class("SumGroupComponent").read(
        TextReader(b"<Sizes> [ 2 1 ]\n<SumGroupComponent> "))
    assert sg.sizes.tolist() == [2, 1]
    # Binary PermuteComponent with an old float column map.
    data = b"<ColumnMap> FV \x04\x03\x00\x00\x00" + np.array(
        [1.0, 0.0, 7.0], "<f4").tobytes() + b"</PermuteComponent> "
    perm = component_class("PermuteComponent").read(BinaryReader(data))
    assert perm.column_map.tolist() == [1, 0, 2]


def test_binary_int_vector_layout():
    w = make_writer(True)
    make("type=SumGroupComponent sizes=1,2").write(w)
    assert (w.getvalue() == b"<SumGroupComponent> <Sizes> \x04\x02\x00\x00\x00"
            b"\x01\x00\x00\x00\x02\x00\x00\x00</SumGroupComponent> ")


def test_float32_dtype_kept():
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    for config in ["type=SumGroupComponent sizes=1,2,3",
                   "type=ElementwiseProductComponent input-dim=6 output-dim=3",
                   "type=PermuteComponent column-map=5,4,3,2,1,0",
                   "type=SumBlockComponent input-dim=6 output-dim=3"]:
        comp = make(config)
        y = forward(comp, x)
        dx = backward(comp, x, y, np.ones_like(y))
        assert y.dtype == dx.dtype == np.float32
        assert rel_err(y, forward(comp, x.astype(np.float64))) < 1e-6


@pytest.mark.parametrize("kw", [{"zeroing_interval": 0}, {"recurrence_interval": 0},
                                {"recurrence_interval": -2}])
def test_backprop_truncation_rejects_non_positive_intervals_when_built_directly(kw):
    cls = component_class("BackpropTruncationComponent")
    with pytest.raises(ConfigError, match="must be >= 1"):
        cls(4, **kw)
