"""LstmNonlinearity, GruNonlinearity and OutputGruNonlinearity components."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pynnet3.components import Flags
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.model_file import parse_model_bytes
from tests.components.common import (
    finite_difference_check,
    from_config,
    reference_files,
    to_float64,
)
from tests.components.test_tdnn import (
    check_malformed,
    check_round_trip,
    direct_cases,
    forward,
    reread,
    run_reference_case,
    written,
)
from tests.reference import REF, component_cases, ref_params, require_reference

TYPES = ["LstmNonlinearityComponent", "GruNonlinearityComponent",
         "OutputGruNonlinearityComponent"]

ROUND_TRIP = [(t, p) for t in TYPES for p in reference_files(t)]


@pytest.mark.parametrize("type_name,path", ref_params(ROUND_TRIP, nargs=2),
                         ids=[f"{t}:{p.relative_to(REF)}" for t, p in ROUND_TRIP])
def test_round_trip_reference_files(type_name, path):
    check_round_trip(path, type_name)


def test_round_trip_covers_reference():
    require_reference()
    names = {p.relative_to(REF).as_posix() for _, p in ROUND_TRIP}
    assert {"realistic/tdnn_lstm/model.txt", "realistic/tdnn_lstm/model.bin",
            "components/DropoutMask_1/model.txt", "components/GruNonlinearity_2/model.bin",
            "components/OutputGruNonlinearity_1/model.txt"} <= names


CASES = [c for prefix in ("LstmNonlinearity_", "GruNonlinearity_", "OutputGruNonlinearity_")
         for c in direct_cases(prefix)]


@pytest.mark.parametrize("case", ref_params(CASES, "cases"), ids=lambda p: p.name)
def test_reference_case(case):
    run_reference_case(case)


def test_reference_cases_found():
    require_reference()
    # LstmNonlinearity_2 is recurrent (IfDefined(Offset(c, -1))): left to the
    # compiler/conformance tests.
    assert {c.name for c in CASES} == {"LstmNonlinearity_1", "GruNonlinearity_1",
                                       "GruNonlinearity_2", "OutputGruNonlinearity_1"}
    assert len(component_cases("LstmNonlinearity_")) == 2


def test_lstm_self_repair_is_active_with_zero_stats():
    """The README quirk: count = 1 + count, so zero stats turn self-repair ON."""
    case = REF / "components" / "LstmNonlinearity_1"
    require_reference()
    comp = parse_model_bytes((case / "model.txt").read_bytes()).components[0][1]
    assert comp.count == 0 and not comp.deriv_avg.any()
    x = np.random.default_rng(0).standard_normal((6, comp.input_dim))
    d = np.random.default_rng(1).standard_normal((6, comp.output_dim))

    def derivs(c):
        out, _ = forward(c, None, x, len(x))
        in_deriv = np.zeros_like(x)
        grad = {k: np.zeros_like(v, dtype=np.float64) for k, v in c.params().items()}
        c.backprop(None, x, out, d, None, grad, in_deriv)
        return out, in_deriv, grad["params"]

    out, with_repair, grad_repair = derivs(comp)
    plain = comp.copy()
    plain.self_repair_config[5:] = 0
    _, without, grad_plain = derivs(plain)
    diff = with_repair - without
    assert 0 < np.abs(diff).max() < 1e-4
    assert np.abs(grad_repair - grad_plain).max() > 0  # flows into the peephole gradient
    # the o-gate pre-activation gets exactly -scale * (2 * sigmoid - 1)
    c = comp.cell_dim
    w_oc = comp.params_[2].astype(np.float64)
    o_t = 1 / (1 + np.exp(-(x[:, 3 * c:4 * c] + w_oc * out[:, :c])))
    np.testing.assert_allclose(diff[:, 3 * c:4 * c], -1e-5 * (2 * o_t - 1),
                               rtol=1e-6, atol=1e-13)

    # with large enough average derivatives in the stats, self-repair switches off
    stats = comp.copy()
    stats.count = 100.0
    stats.deriv_avg[:] = 1.0
    np.testing.assert_array_equal(derivs(stats)[1], without)


@pytest.mark.parametrize("use_dropout", [False, True])
def test_lstm_finite_differences(use_dropout):
    comp = from_config("component name=c type=LstmNonlinearityComponent cell-dim=3 "
                       f"self-repair-scale=0 use-dropout={str(use_dropout).lower()}")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, comp.input_dim))
    if use_dropout:
        x[:, 15:] = rng.uniform(0.5, 1.5, (5, 3))
        # masks are inputs too: their derivative is taken as zero (they are constants),
        # so check only the other columns numerically.
        to_float64(comp)
        out, _ = forward(comp, None, x, len(x))
        in_deriv = np.full_like(x, 7.0)
        comp.backprop(None, x, out, np.ones_like(out), None, None, in_deriv)
        assert not in_deriv[:, 15:].any()
        x_masks = x.copy()
        x_masks[:, 15:] = 1.0
        plain = from_config("component name=c type=LstmNonlinearityComponent cell-dim=3 "
                            "self-repair-scale=0")
        plain.params_ = comp.params_.copy()
        to_float64(plain)
        np.testing.assert_allclose(forward(comp, None, x_masks, 5)[0],
                                   forward(plain, None, x_masks[:, :15], 5)[0])
        return
    finite_difference_check(comp, x)


@pytest.mark.parametrize("line", [
    "type=GruNonlinearityComponent cell-dim=3",
    "type=GruNonlinearityComponent cell-dim=4 recurrent-dim=2",
    "type=OutputGruNonlinearityComponent cell-dim=3",
])
def test_gru_finite_differences(line):
    comp = from_config("component name=c " + line, seed=5)
    x = np.random.default_rng(6).standard_normal((5, comp.input_dim))
    finite_difference_check(comp, x)


@pytest.mark.parametrize("line", [
    "type=GruNonlinearityComponent cell-dim=3",
    "type=GruNonlinearityComponent cell-dim=4 recurrent-dim=2",
    "type=OutputGruNonlinearityComponent cell-dim=3",
])
def test_gru_backprop_adds(line):
    comp = from_config("component name=c " + line)
    x = np.random.default_rng(7).standard_normal((4, comp.input_dim))
    out, _ = forward(comp, None, x, 4)
    d = np.random.default_rng(8).standard_normal(out.shape)
    a = np.zeros_like(x)
    comp.backprop(None, x, out, d, None, None, a)
    b = np.ones_like(x)
    comp.backprop(None, x, out, d, None, None, b)
    np.testing.assert_allclose(b, a + 1)


def test_float32_and_float64():
    for line in ("type=LstmNonlinearityComponent cell-dim=2",
                 "type=GruNonlinearityComponent cell-dim=2",
                 "type=OutputGruNonlinearityComponent cell-dim=2"):
        comp = from_config("component name=c " + line)
        for dt in (np.float32, np.float64):
            x = np.ones((3, comp.input_dim), dtype=dt)
            out, _ = forward(comp, None, x, 3)
            assert out.dtype == dt and np.all(np.isfinite(out))


def test_properties():
    lstm = from_config("component name=c type=LstmNonlinearityComponent cell-dim=2")
    assert lstm.properties() == Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT
    gru_flags = (Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT
                 | Flags.BACKPROP_NEEDS_OUTPUT | Flags.BACKPROP_ADDS)
    assert from_config("component name=c type=GruNonlinearityComponent cell-dim=2"
                       ).properties() == gru_flags
    assert from_config("component name=c type=OutputGruNonlinearityComponent cell-dim=2"
                       ).properties() == gru_flags


def test_lstm_config():
    comp = from_config("component name=c type=LstmNonlinearityComponent cell-dim=5", seed=1)
    assert (comp.input_dim, comp.output_dim) == (25, 10)
    assert comp.params_.shape == (3, 5) and comp.value_avg.shape == (5, 5)
    np.testing.assert_allclose(comp.self_repair_config,
                               [0.05, 0.05, 0.2, 0.05, 0.2] + [1e-5] * 5, rtol=1e-6)
    text = written(comp, False).decode()
    assert "<SelfRepairConfig>  [ 0.05 0.05 0.2 0.05 0.2 1e-05 1e-05 1e-05 1e-05 1e-05 ]" in text
    assert "<UseDropout>" not in text and text.endswith("<Count> 0 </LstmNonlinearityComponent> ")
    comp = from_config("component name=c type=LstmNonlinearityComponent cell-dim=2 "
                       "use-dropout=true param-stddev=0 tanh-self-repair-threshold=0.3 "
                       "self-repair-scale=0.001")
    assert comp.input_dim == 13 and not comp.params_.any()
    assert "<UseDropout> T <Count>" in written(comp, False).decode()
    np.testing.assert_allclose(comp.self_repair_config[[2, 4, 5]], [0.3, 0.3, 0.001], rtol=1e-6)


def test_gru_config():
    comp = from_config("component name=c type=GruNonlinearityComponent cell-dim=16", seed=2)
    assert (comp.input_dim, comp.output_dim) == (64, 32)
    assert comp.w_h.shape == (16, 16)
    assert abs(comp.w_h.std() - 0.25) < 0.05  # 1 / sqrt(cell-dim)
    assert "<RankInOut> 20 80 <UpdatePeriod> 4 " in written(comp, False).decode()
    comp = from_config("component name=c type=GruNonlinearityComponent cell-dim=6 recurrent-dim=2 "
                       "rank-in=3 alpha=2")
    assert (comp.input_dim, comp.output_dim, comp.w_h.shape) == (22, 12, (6, 2))
    assert "<Alpha> 2 <RankInOut> 3 80 " in written(comp, False).decode()
    comp = from_config("component name=c type=OutputGruNonlinearityComponent cell-dim=4 "
                       "param-mean=3 param-stddev=0")
    assert (comp.input_dim, comp.output_dim) == (12, 8)
    np.testing.assert_array_equal(comp.w_h, 3.0)
    assert "<Rank> 8 <UpdatePeriod> 10 " in written(comp, False).decode()


@pytest.mark.parametrize("line", [
    "type=LstmNonlinearityComponent",
    "type=LstmNonlinearityComponent cell-dim=0",
    "type=LstmNonlinearityComponent cell-dim=2 self-repair-scale=0.5",
    "type=LstmNonlinearityComponent cell-dim=2 sigmoid-self-repair-threshold=0.3",
    "type=LstmNonlinearityComponent cell-dim=2 recurrent-dim=1",
    "type=GruNonlinearityComponent",
    "type=GruNonlinearityComponent cell-dim=2 recurrent-dim=3",
    "type=GruNonlinearityComponent cell-dim=2 recurrent-dim=0",
    "type=GruNonlinearityComponent cell-dim=2 rank=3",
    "type=OutputGruNonlinearityComponent cell-dim=-1",
    "type=OutputGruNonlinearityComponent cell-dim=2 recurrent-dim=2",
])
def test_config_errors(line):
    with pytest.raises(ConfigError):
        from_config("component name=c " + line)


@pytest.mark.parametrize("line", [
    "type=LstmNonlinearityComponent cell-dim=2",
    "type=LstmNonlinearityComponent cell-dim=2 use-dropout=true",
    "type=GruNonlinearityComponent cell-dim=3 recurrent-dim=2",
    "type=OutputGruNonlinearityComponent cell-dim=3",
])
def test_malformed_files(line):
    comp = from_config("component name=c " + line)
    check_malformed(comp)
    text = written(comp, False).decode()
    with_nan = re.sub(r"(\[\s*)(\S+)", r"\1nan", text, count=1)
    assert "nan" in with_nan
    with pytest.raises(FormatError, match="non-finite"):  # NaN parameters are refused
        reread(with_nan.encode())


def test_malformed_shapes():
    lstm = written(from_config("component name=c type=LstmNonlinearityComponent cell-dim=2"), False)
    with pytest.raises(FormatError):  # <SelfRepairConfig> must have 10 values
        reread(lstm.replace(b"1e-05 ]", b"]", 1))
    gru = written(from_config("component name=c type=GruNonlinearityComponent cell-dim=2"), False)
    with pytest.raises(FormatError):  # recurrent-dim > cell-dim
        reread(gru.replace(b"<RecurrentDim> 2", b"<RecurrentDim> 3"))
    with pytest.raises(FormatError):  # <w_h> no longer matches <CellDim>
        reread(gru.replace(b"<CellDim> 2", b"<CellDim> 3"))


class Sub(np.ndarray):
    """An ndarray subclass: LstmNonlinearity's general form (its fast path takes
    plain ndarrays only)."""


def _lstm_nonlinearity(seed: int):
    """An LstmNonlinearityComponent of 8 cells with random peephole weights."""
    import pynnet3

    cfg = ("input-node name=input dim=40\n"
           "component name=l type=LstmNonlinearityComponent cell-dim=8\n"
           "component-node name=l component=l input=input\n"
           "output-node name=output input=l\n")
    comp = pynnet3.Nnet.from_config(cfg, seed=3).components["l"]
    comp.params_[...] = np.random.default_rng(seed).standard_normal(comp.params_.shape)
    return comp


@pytest.fixture
def numpy_kernels(monkeypatch):
    """The compiled kernels switched off (their tanh is not NumPy's: they are
    checked against float64 math in test_c_kernels.py)."""
    from pynnet3.components import c_kernels

    monkeypatch.setattr(c_kernels, "_lib", None)


def test_lstm_nonlinearity_numpy_fast_path_is_bit_identical(numpy_kernels):
    """LstmNonlinearity's NumPy forward (gates in one block, results written in
    place) computes the general form's floats exactly: checked against the general
    form, reached through an ndarray subclass."""
    from pynnet3.components.recurrent import LstmNonlinearityComponent

    comp = _lstm_nonlinearity(2)
    assert isinstance(comp, LstmNonlinearityComponent) and not comp.use_dropout
    x = (np.random.default_rng(4).standard_normal((37, 40)) * 3).astype(np.float32)
    fast = np.full((37, 16), np.nan, np.float32)
    general = np.full((37, 16), np.nan, np.float32).view(Sub)
    comp.propagate(None, x, fast)
    comp.propagate(None, x.view(Sub), general)
    assert not np.isnan(fast).any()
    np.testing.assert_array_equal(fast, np.asarray(general))


@pytest.mark.parametrize("layout", ["column-views", "transposed-output", "one-row"])
def test_lstm_nonlinearity_fast_path_on_views(layout, numpy_kernels):
    """The fast path copies x's blocks into one contiguous buffer and c_t, m_t
    out of another: the general form's floats whatever the input's and output's
    strides (a column block of a wider matrix, an output whose rows are columns)."""
    comp = _lstm_nonlinearity(5)
    rows = 1 if layout == "one-row" else 23
    wide = (np.random.default_rng(6).standard_normal((rows, 47)) * 3).astype(np.float32)
    x = wide[:, 3:43]
    if layout == "transposed-output":
        fast = np.full((16, rows), np.nan, np.float32).T
    else:
        fast = np.full((rows, 20), np.nan, np.float32)[:, 2:18]
    general = np.full((rows, 16), np.nan, np.float32).view(Sub)
    comp.propagate(None, x, fast)
    comp.propagate(None, np.ascontiguousarray(x).view(Sub), general)
    assert not np.isnan(fast).any()
    np.testing.assert_array_equal(fast, np.asarray(general))


@pytest.mark.parametrize("layout", ["contiguous", "column-views", "transposed-output"])
def test_lstm_nonlinearity_propagate_equals_general_form_to_rounding(layout):
    """Whichever forward runs (the compiled kernel where built, else NumPy's), the
    component's propagate gives the general form's values to float32 rounding of
    the terms each output sums (the compiled tanh is within 6 ulps, NumPy's ~1.4)."""
    comp = _lstm_nonlinearity(7)
    rows = 29
    wide = (np.random.default_rng(8).standard_normal((rows, 47)) * 3).astype(np.float32)
    x = wide[:, 3:43] if layout == "column-views" else np.ascontiguousarray(wide[:, 3:43])
    if layout == "transposed-output":
        fast = np.full((16, rows), np.nan, np.float32).T
    else:
        fast = np.full((rows, 16), np.nan, np.float32)
    general = np.full((rows, 16), np.nan, np.float32).view(Sub)
    comp.propagate(None, x, fast)
    comp.propagate(None, np.ascontiguousarray(x).view(Sub), general)
    c_prev = np.abs(x[:, 32:40]).astype(np.float64)
    w2 = np.abs(comp.params_[2]).astype(np.float64)
    scale = c_prev + 1.0 + w2 * (c_prev + 1.0)
    bound = 16 * np.finfo(np.float32).eps * np.hstack([scale, scale])
    assert np.all(np.abs(fast - np.asarray(general)) <= bound)
