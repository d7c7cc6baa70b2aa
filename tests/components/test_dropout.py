"""Tests of the dropout family: Dropout, DropoutMask, GeneralDropout, SpecAugmentTimeMask."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.components.dropout import (
    DropoutComponent,
    DropoutMaskComponent,
    GeneralDropoutComponent,
    SpecAugmentTimeMaskComponent,
)
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader, make_writer
from pynnet3.io.model_file import read_component
from tests.components.common import WITH_AM_FILES, cfg, reference_files, rel_err, roundtrip_spans
from tests.reference import REF, load_case, ref_params, require_reference

TYPES = ("DropoutComponent", "DropoutMaskComponent", "GeneralDropoutComponent",
         "SpecAugmentTimeMaskComponent")


# ----------------------------------------------------------------------------------
# helpers
def case_indexes(request, which="inputs"):
    return np.asarray(request[which][0]["indexes"], dtype=np.int64)


# ----------------------------------------------------------------------------------
# (a) byte-identical round trips
FILES = reference_files(TYPES, WITH_AM_FILES)


@pytest.mark.parametrize("path", ref_params(FILES), ids=lambda p: str(p.relative_to(REF)))
def test_roundtrip_reference_components(path):
    assert roundtrip_spans(path, TYPES) > 0


def test_roundtrip_whole_single_component_models():
    require_reference()
    from pynnet3.io.model_file import parse_model_bytes, write_model_parts

    for name in ("Dropout_1", "DropoutMask_2", "GeneralDropout_1", "GeneralDropout_2",
                 "SpecAugmentTimeMask_1"):
        for fname, binary in (("model.txt", False), ("model.bin", True)):
            data = (REF / "components" / name / fname).read_bytes()
            assert write_model_parts(parse_model_bytes(data), binary) == data
    for fname, binary in (("model.txt", False), ("model.bin", True)):
        data = (REF / "random" / "Dropout_2" / fname).read_bytes()
        assert write_model_parts(parse_model_bytes(data), binary) == data


@pytest.mark.parametrize("binary", [False, True])
def test_roundtrip_optional_tokens(binary):
    comps = [
        DropoutComponent(5, 0.25, True, False),
        DropoutMaskComponent(3, 0.1, continuous=True, test_mode=False),
        GeneralDropoutComponent(8, 4, 3, 0.2, 0.3, 2, False, True),
        GeneralDropoutComponent(8, 8, 0, 0.2, 0.3, 1, False, False),
        SpecAugmentTimeMaskComponent(6, 0.3, 5, False),
    ]
    for comp in comps:
        w = make_writer(binary)
        comp.write(w)
        data = (b"\0B" if binary else b"") + w.getvalue()
        r = make_reader(data)
        back = read_component(r)
        w2 = make_writer(binary)
        back.write(w2)
        assert w2.getvalue() == w.getvalue()
        assert vars(back).keys() >= {"test_mode"}
        assert back.test_mode == comp.test_mode


def test_read_old_dropout_without_optional_tokens():
    r = make_reader(b"<DropoutComponent> <Dim> 4 <DropoutProportion> 0.5 </DropoutComponent> ")
    comp = read_component(r)
    assert comp.dim == 4 and not comp.dropout_per_frame and not comp.test_mode


# ----------------------------------------------------------------------------------
# (c) reference arrays
def _run_direct(comp, x, idx, od, in_place=False):
    """Propagate and backprop; with ``in_place``, each writes over its input where the
    component's flags allow it (propagate-in-place, backprop-in-place)."""
    flags = comp.properties()
    fwd = in_place and bool(flags & Flags.PROPAGATE_IN_PLACE)
    bwd = in_place and bool(flags & Flags.BACKPROP_IN_PLACE)
    pre = comp.precompute_indexes(idx, idx, True)
    y = x.copy() if fwd else np.zeros((x.shape[0], comp.output_dim), x.dtype)
    memo = comp.propagate(pre, y if fwd else x, y)
    ind = od.copy() if bwd else np.zeros_like(x)
    comp.backprop(pre, x, y, ind if bwd else od, memo, None, ind)
    return y, ind


@pytest.mark.parametrize("name", ["Dropout_1", "GeneralDropout_1", "GeneralDropout_2",
                                  "SpecAugmentTimeMask_1"])
@pytest.mark.parametrize("in_place", [False, True])
def test_reference_case(name, in_place):
    require_reference()
    from tests.reference import load_components

    case = REF / "components" / name
    comp = load_components(case / "model.txt")["comp"]
    # every type here works in place one way or the other (Dropout: backprop only)
    assert comp.properties() & (Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE)
    req, arr, _ = load_case(case)
    assert req["inputs"][0]["indexes"] == req["outputs"][0]["indexes"]
    y, ind = _run_direct(comp, arr["input:input"], case_indexes(req),
                         arr["output_deriv:output"], in_place)
    assert rel_err(y, arr["output:output"]) < 1e-4
    assert rel_err(ind, arr["input_deriv:input"]) < 1e-3


def test_reference_dropout_mask_appended():
    """DropoutMask_2: output = Append(input, dropout_mask), composed by hand."""
    require_reference()
    from tests.reference import load_components

    case = REF / "components" / "DropoutMask_2"
    comp = load_components(case / "model.txt")["dropout_mask"]
    req, arr, _ = load_case(case)
    assert req["inputs"][0]["indexes"] == req["outputs"][0]["indexes"]
    x = arr["input:input"]
    deps = comp.input_indexes(case_indexes(req, "outputs"))
    assert len(deps.indexes) == 0
    mask = np.zeros((x.shape[0], comp.output_dim), np.float32)
    comp.propagate(None, np.zeros((0, comp.input_dim), np.float32), mask)
    out = np.concatenate([x, mask], axis=1)
    assert rel_err(out, arr["output:output"]) < 1e-4
    assert rel_err(arr["output_deriv:output"][:, :x.shape[1]], arr["input_deriv:input"]) < 1e-6


def test_reference_dropout_mask_into_lstm():
    """DropoutMask_1: lstm(Append(input, dropout_mask)), composed by hand."""
    require_reference()
    from tests.reference import load_components

    case = REF / "components" / "DropoutMask_1"
    comps = load_components(case / "model.txt")
    mask_comp, lstm = comps["dropout_mask"], comps["lstm"]
    req, arr, _ = load_case(case)
    x = arr["input:input"]
    mask = np.zeros((x.shape[0], mask_comp.output_dim), np.float32)
    mask_comp.propagate(None, np.zeros((0, 3), np.float32), mask)
    np.testing.assert_allclose(mask, 0.75)
    lstm_in = np.concatenate([x, mask], axis=1)
    out = np.zeros((x.shape[0], lstm.output_dim), np.float32)
    memo = lstm.propagate(None, lstm_in, out)
    assert rel_err(out, arr["output:output"]) < 1e-4
    in_deriv = np.zeros_like(lstm_in)
    lstm.backprop(None, lstm_in, out, arr["output_deriv:output"], memo, None, in_deriv)
    assert rel_err(in_deriv[:, :x.shape[1]], arr["input_deriv:input"]) < 1e-3


def test_random_dropout_2_structure():
    """random/Dropout_2 (training mode, per frame): only the structure is checkable."""
    require_reference()
    from tests.reference import load_components

    case = REF / "random" / "Dropout_2"
    comp = load_components(case / "model.txt")["comp"]
    assert not comp.test_mode and comp.dropout_per_frame and comp.dropout_proportion == 0.5
    req, arr, _ = load_case(case)
    x, y_ref = arr["input:input"], arr["output:output"]
    od, ind_ref = arr["output_deriv:output"], arr["input_deriv:input"]
    # Kaldi's own result: every row dropped entirely or kept unchanged.
    kept_ref = np.all(y_ref == x, axis=1)
    assert np.all(kept_ref | np.all(y_ref == 0, axis=1))
    np.testing.assert_array_equal(ind_ref, od * kept_ref[:, None])
    # Ours has the same structure.
    comp.reset_generator(3)
    y, ind = _run_direct(comp, x, case_indexes(req), od)
    kept = np.all(y == x, axis=1)
    assert np.all(kept | np.all(y == 0, axis=1))
    assert 0 < kept.sum() < len(kept)
    np.testing.assert_array_equal(ind, od * kept[:, None])


# ----------------------------------------------------------------------------------
# (b) finite-difference gradient checks (float64)
def _fd_check_input(comp, x, idx, seed=0, eps=1e-6, reseed=None):
    rng = np.random.default_rng(seed)
    pre = comp.precompute_indexes(idx, idx, True)

    def forward(inp):
        if reseed is not None:
            comp.reset_generator(reseed)
        out = np.zeros((inp.shape[0], comp.output_dim))
        memo = comp.propagate(pre, inp, out)
        return out, memo

    y, memo = forward(x)
    d = rng.standard_normal(y.shape)
    ind = np.zeros_like(x)
    comp.backprop(pre, x, y, d, memo, None, ind)
    num = np.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            xp, xm = x.copy(), x.copy()
            xp[i, j] += eps
            xm[i, j] -= eps
            num[i, j] = (np.sum(forward(xp)[0] * d) - np.sum(forward(xm)[0] * d)) / (2 * eps)
    assert rel_err(ind, num) < 1e-6


def _indexes(num_seq, num_t, t0=0):
    return np.array([[n, t, 0] for n in range(num_seq) for t in range(t0, t0 + num_t)],
                    dtype=np.int64)


@pytest.mark.parametrize("test_mode", [True, False])
@pytest.mark.parametrize("per_frame", [True, False])
def test_fd_dropout(test_mode, per_frame):
    comp = DropoutComponent(5, 0.4, per_frame, test_mode)
    x = np.random.default_rng(1).standard_normal((6, 5))
    _fd_check_input(comp, x, _indexes(2, 3), reseed=7)


@pytest.mark.parametrize("kwargs", [
    dict(dim=6, block_dim=3, time_period=2, dropout_proportion=0.3),
    dict(dim=6, dropout_proportion=0.4, continuous=True),
    dict(dim=8, block_dim=4, dropout_proportion=0.0, specaugment_max_proportion=0.5,
         specaugment_max_regions=2),
    dict(dim=6, test_mode=True),
])
def test_fd_general_dropout(kwargs):
    comp = GeneralDropoutComponent(**kwargs)
    x = np.random.default_rng(2).standard_normal((8, comp.dim))
    _fd_check_input(comp, x, _indexes(2, 4), reseed=5)


@pytest.mark.parametrize("test_mode", [True, False])
def test_fd_spec_augment(test_mode):
    comp = SpecAugmentTimeMaskComponent(4, 0.4, 3, test_mode)
    x = np.random.default_rng(3).standard_normal((10, 4))
    _fd_check_input(comp, x, _indexes(2, 5), reseed=11)


# ----------------------------------------------------------------------------------
# training-mode structure, seeding, float32/float64, in place
def test_dropout_training_structure_and_seed():
    comp = DropoutComponent(50, 0.3)
    x = np.random.default_rng(0).standard_normal((400, 50)).astype(np.float32)
    y = np.zeros_like(x)
    comp.reset_generator(1)
    comp.propagate(None, x, y)
    kept = y == x
    assert np.all(kept | (y == 0))
    assert abs(1 - kept.mean() - 0.3) < 0.01
    y2 = np.zeros_like(x)
    comp.reset_generator(1)
    comp.propagate(None, x, y2)
    np.testing.assert_array_equal(y, y2)
    # backprop in place: derivative masked the same way
    d = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    expected = d * kept
    comp.backprop(None, x, y, d, None, None, d)
    np.testing.assert_array_equal(d, expected)


def test_dropout_test_mode_zero_input_passes_derivative():
    comp = DropoutComponent(3, 0.5, test_mode=True)
    x = np.array([[1.0, 0.0, -2.0]], np.float32)
    y = np.zeros_like(x)
    comp.propagate(None, x, y)
    np.testing.assert_allclose(y, [[0.5, 0.0, -1.0]])
    ind = np.zeros_like(x)
    comp.backprop(None, x, y, np.ones_like(x), None, None, ind)
    np.testing.assert_allclose(ind, [[0.5, 1.0, 0.5]])  # Kaldi: unscaled where input is 0


@pytest.mark.parametrize("cols", [1, 2, 3, 5])
def test_dropout_mask_training(cols):
    comp = DropoutMaskComponent(cols, 0.3)
    out = np.zeros((2000, cols), np.float32)
    comp.propagate(None, np.zeros((0, cols), np.float32), out)
    assert set(np.unique(out)) <= {0.0, 1.0}
    assert abs(1 - out.mean() - 0.3) < 0.03
    if cols in (2, 3):
        assert not np.any((out[:, 0] == 0) & (out[:, 1] == 0))
    comp.test_mode = True
    comp.propagate(None, np.zeros((0, cols), np.float32), out)
    np.testing.assert_allclose(out, 0.7)


def test_dropout_mask_continuous_and_zero():
    comp = DropoutMaskComponent(4, 0.25, continuous=True)
    out = np.zeros((500, 4))
    comp.propagate(None, np.zeros((0, 4)), out)
    assert out.min() >= 0.5 and out.max() <= 1.5 and abs(out.mean() - 1.0) < 0.05
    comp.test_mode = True
    comp.propagate(None, np.zeros((0, 4)), out)
    np.testing.assert_array_equal(out, 1.0)
    comp = DropoutMaskComponent(4, 0.0)
    comp.propagate(None, np.zeros((0, 4)), out)
    np.testing.assert_array_equal(out, 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_general_dropout_mask_structure(dtype):
    comp = GeneralDropoutComponent(6, 2, time_period=3, dropout_proportion=0.5)
    idx = _indexes(3, 9, t0=-2)
    perm = np.random.default_rng(0).permutation(len(idx))
    idx = idx[perm]  # any row order
    x = np.ones((len(idx), 6), dtype)
    pre = comp.precompute_indexes(idx, idx, False)
    y = x.copy()
    memo = comp.propagate(pre, y, y)  # in place
    assert y.dtype == dtype
    assert set(np.unique(y)) <= {0.0, 2.0}
    np.testing.assert_array_equal(y[:, :2], y[:, 2:4])  # blocks share the mask
    np.testing.assert_array_equal(y[:, :2], y[:, 4:])
    groups = {}
    for row, (n, t, _) in enumerate(idx):
        groups.setdefault((n, t // 3), []).append(row)
    for rows in groups.values():
        assert np.all(y[rows] == y[rows[0]])
    assert pre.num_mask_rows == len(groups)
    d = np.ones_like(x)
    comp.backprop(pre, x, y, d, memo, None, d)  # in place
    np.testing.assert_array_equal(d, y)


def test_general_dropout_permuted_input_rows():
    comp = GeneralDropoutComponent(4, dropout_proportion=0.5, time_period=1)
    out_idx = _indexes(2, 5)
    perm = np.random.default_rng(4).permutation(len(out_idx))
    in_idx = out_idx[perm]
    x = np.random.default_rng(5).standard_normal((len(in_idx), 4))
    pre = comp.precompute_indexes(in_idx, out_idx, True)
    y = np.zeros_like(x)
    memo = comp.propagate(pre, x, y)
    x_out_order = np.empty_like(x)
    x_out_order[perm] = x  # input row i holds output index perm[i]
    assert np.all((y == 0) | (y == 2 * x_out_order))
    ind = np.zeros_like(x)
    comp.backprop(pre, x, y, np.ones_like(y), memo, None, ind)
    np.testing.assert_array_equal(ind, memo[perm])


def test_general_dropout_specaugment_bins():
    comp = GeneralDropoutComponent(10, dropout_proportion=0.0, specaugment_max_proportion=0.3)
    idx = _indexes(200, 1)
    pre = comp.precompute_indexes(idx, idx, False)
    x = np.ones((len(idx), 10))
    y = np.zeros_like(x)
    comp.propagate(pre, x, y)
    assert set(np.unique(y)) <= {0.0, 1.0}
    zeros = (y == 0).sum(axis=1)
    assert zeros.max() == 3 and zeros.min() == 0
    for row in y:  # one circular run of zeros
        changes = np.sum(row != np.roll(row, 1))
        assert changes in (0, 2)


def test_spec_augment_time_mask_structure():
    comp = SpecAugmentTimeMaskComponent(3, 0.3, 4)
    idx = _indexes(4, 60)
    perm = np.random.default_rng(1).permutation(len(idx))
    idx = idx[perm]
    x = np.ones((len(idx), 3), np.float32)
    pre = comp.precompute_indexes(idx, idx, True)
    y = x.copy()
    comp.propagate(pre, y, y)
    assert np.all((y == 0).all(1) | (y == 1).all(1))
    max_kept = int(4 * 0.7 / 0.3)  # 9
    for n in range(4):
        rows = np.flatnonzero(idx[:, 0] == n)
        seq = y[rows[np.argsort(idx[rows, 1])], 0]
        runs = np.split(seq, np.flatnonzero(np.diff(seq)) + 1)
        for run in runs[:-1]:
            assert len(run) <= (max_kept if run[0] == 1 else 4)
    assert 0.15 < (y[:, 0] == 0).mean() < 0.45


def test_test_mode_identity_and_toggle():
    for comp in (GeneralDropoutComponent(4, dropout_proportion=0.5),
                 SpecAugmentTimeMaskComponent(4)):
        comp.set_test_mode(True)
        idx = _indexes(1, 5)
        x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        y = np.zeros_like(x)
        assert comp.propagate(comp.precompute_indexes(idx, idx, True), x, y) is None
        np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------------
# (d) properties and config
def test_properties():
    base = Flags.RANDOM | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE | Flags.USES_MEMO
    assert DropoutComponent(3, 0.5).properties() == (
        Flags.BACKPROP_IN_PLACE | Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT
        | Flags.BACKPROP_NEEDS_OUTPUT | Flags.RANDOM)
    assert DropoutMaskComponent(3).properties() == Flags.RANDOM
    assert GeneralDropoutComponent(6).properties() == base
    assert GeneralDropoutComponent(6, 3).properties() == (
        base | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS)
    assert SpecAugmentTimeMaskComponent(6).properties() == base
    for t in TYPES:
        assert component_class(t) is not None


def test_config_defaults():
    rng = np.random.default_rng(0)
    c = DropoutComponent.from_config(cfg("dim=8 dropout-proportion=0.3"), rng)
    assert (c.input_dim, c.output_dim, c.dropout_proportion) == (8, 8, 0.3)
    assert not c.test_mode and not c.dropout_per_frame
    c = DropoutMaskComponent.from_config(cfg("output-dim=3"), rng)
    assert (c.output_dim, c.dropout_proportion, c.continuous) == (3, 0.5, False)
    c = GeneralDropoutComponent.from_config(cfg("dim=8"), rng)
    assert (c.block_dim, c.time_period, c.dropout_proportion) == (8, 0, 0.5)
    assert c.specaugment_max_proportion == 0.0 and c.specaugment_max_regions == 1
    c = GeneralDropoutComponent.from_config(
        cfg("dim=8 block-dim=4 time-period=2 continuous=true test-mode=true"), rng)
    assert c.block_dim == 4 and c.time_period == 2 and c.continuous and c.test_mode
    c = SpecAugmentTimeMaskComponent.from_config(cfg("dim=5"), rng)
    assert (c.dim, c.zeroed_proportion, c.time_mask_max_frames) == (5, 0.25, 10)


@pytest.mark.parametrize("cls,text", [
    (DropoutComponent, "dim=8"),                                  # proportion required
    (DropoutComponent, "dropout-proportion=0.5"),                 # dim required
    (DropoutComponent, "dim=8 dropout-proportion=1.5"),
    (DropoutComponent, "dim=0 dropout-proportion=0.5"),
    (DropoutComponent, "dim=8 dropout-proportion=0.5 bogus=1"),
    (DropoutMaskComponent, "dropout-proportion=0.5"),
    (DropoutMaskComponent, "output-dim=x"),
    (GeneralDropoutComponent, "dim=8 block-dim=3"),
    (GeneralDropoutComponent, "dim=8 specaugment-max-proportion=0.5 continuous=true"),
    (GeneralDropoutComponent, "dim=8 specaugment-max-proportion=0.5 "
                              "specaugment-max-regions=0"),
    (SpecAugmentTimeMaskComponent, "dim=8 time-mask-max-frames=1"),
    (SpecAugmentTimeMaskComponent, "dim=8 test-mode=true"),       # not a Kaldi option
])
def test_config_errors(cls, text):
    with pytest.raises(ConfigError):
        cls.from_config(cfg(text), np.random.default_rng(0))


def test_config_seeding_is_reproducible():
    a = DropoutComponent.from_config(cfg("dim=8 dropout-proportion=0.5"),
                                     np.random.default_rng(3))
    b = DropoutComponent.from_config(cfg("dim=8 dropout-proportion=0.5"),
                                     np.random.default_rng(3))
    x = np.ones((20, 8))
    ya, yb = np.zeros_like(x), np.zeros_like(x)
    a.propagate(None, x, ya)
    b.propagate(None, x, yb)
    np.testing.assert_array_equal(ya, yb)


# ----------------------------------------------------------------------------------
# (e) malformed input
GOOD = {
    "DropoutComponent": b"<DropoutComponent> <Dim> 8 <DropoutProportion> 0.3 "
                        b"<DropoutPerFrame> F <TestMode> T </DropoutComponent> ",
    "DropoutMaskComponent": b"<DropoutMaskComponent> <OutputDim> 3 <DropoutProportion> 0.25 "
                            b"<TestMode> T </DropoutMaskComponent> ",
    "GeneralDropoutComponent": b"<GeneralDropoutComponent> <Dim> 6 <BlockDim> 6 <TimePeriod> 2 "
                               b"<DropoutProportion> 0.4 <TestMode> <Continuous> "
                               b"</GeneralDropoutComponent> ",
    "SpecAugmentTimeMaskComponent": b"<SpecAugmentTimeMaskComponent> <Dim> 8 "
                                    b"<ZeroedProportion> 0.3 <TimeMaskMaxFrames> 4 <TestMode> "
                                    b"</SpecAugmentTimeMaskComponent> ",
}


@pytest.mark.parametrize("type_name", TYPES)
def test_malformed(type_name):
    good = GOOD[type_name]
    comp = read_component(make_reader(good))
    w = make_writer(False)
    comp.write(w)
    assert w.getvalue() == good
    cut = good.rfind(b"</")
    for bad in (good[:cut], good[: good.find(b"> ") + 5],
                good.replace(b"<Dim>", b"<Dum>").replace(b"<OutputDim>", b"<OutputDum>"),
                good[:cut] + b"<Garbage> " + good[cut:]):
        with pytest.raises(FormatError):
            read_component(make_reader(bad))
    # binary: truncated
    wb = make_writer(True)
    comp.write(wb)
    data = b"\0B" + wb.getvalue()
    for n in (len(data) - 3, len(data) // 2):
        with pytest.raises(FormatError):
            read_component(make_reader(data[:n]))


def test_malformed_values():
    bad = [
        b"<DropoutComponent> <Dim> -1 <DropoutProportion> 0.3 </DropoutComponent> ",
        b"<DropoutComponent> <Dim> 3 <DropoutProportion> nan </DropoutComponent> ",
        b"<DropoutComponent> <Dim> 3 <DropoutProportion> 2 </DropoutComponent> ",
        b"<DropoutComponent> <Dim> x <DropoutProportion> 0.3 </DropoutComponent> ",
        b"<GeneralDropoutComponent> <Dim> 6 <BlockDim> 4 <TimePeriod> 0 "
        b"<DropoutProportion> 0.4 </GeneralDropoutComponent> ",
    ]
    for data in bad:
        with pytest.raises(FormatError):
            read_component(make_reader(data))


def test_generator_made_on_first_use_as_seeded():
    """A component's generator is default_rng(0) until reseeded, made when first
    drawn from (reading a network never loads numpy.random)."""
    a, b = DropoutComponent(dim=4, dropout_proportion=0.5), DropoutComponent(dim=4)
    assert a.__dict__["_rng"] is None
    np.testing.assert_array_equal(a.rng.random(5), np.random.default_rng(0).random(5))
    b.reset_generator(7)
    np.testing.assert_array_equal(b.rng.random(3), np.random.default_rng(7).random(3))
    b.rng = np.random.default_rng(9)
    np.testing.assert_array_equal(b.rng.random(3), np.random.default_rng(9).random(3))


def test_reading_a_dropout_network_loads_no_random_module():
    import subprocess
    import sys

    path = require_reference() / "realistic" / "tdnnf_chain" / "model.txt"
    code = ("import sys, pynnet3\n"
            f"nnet = pynnet3.read_nnet({str(path)!r})\n"
            "assert any('Dropout' in c.type_name for c in nnet.components.values())\n"
            "print('numpy.random' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
