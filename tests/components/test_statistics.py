"""StatisticsExtractionComponent and StatisticsPoolingComponent."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.components.statistics import (
    StatisticsExtractionComponent,
    StatisticsPoolingComponent,
)
from pynnet3.errors import ComputeError, ConfigError, FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader, make_writer
from pynnet3.io.model_file import read_component
from tests.components.common import cfg, grid, reference_files, rel_err, roundtrip_spans
from tests.reference import REF, component_cases, load_case, ref_params, require_reference

TYPES = ("StatisticsExtractionComponent", "StatisticsPoolingComponent")


# -- helpers -----------------------------------------------------------------------------
def run(comp, in_idx, out_idx, x, dy, need_backprop=True):
    in_idx = np.asarray(in_idx, dtype=np.int64)
    out_idx = np.asarray(out_idx, dtype=np.int64)
    ind = comp.precompute_indexes(in_idx, out_idx, need_backprop)
    y = np.zeros((len(out_idx), comp.output_dim), dtype=x.dtype)
    memo = comp.propagate(ind, x, y)
    if dy is None:
        return y, None
    dx = np.zeros_like(x)
    flags = comp.properties()
    comp.backprop(ind, x if flags & Flags.BACKPROP_NEEDS_INPUT else None,
                  y if flags & Flags.BACKPROP_NEEDS_OUTPUT else None, dy, memo, None, dx)
    return y, dx


def round_map(idx: np.ndarray, period: int):
    """Kaldi's Round(node, period): the rows of the node, and for each request
    row the node row it copies."""
    r = idx.copy()
    r[:, 1] = np.floor_divide(r[:, 1], period) * period
    rows, inverse = np.unique(r, axis=0, return_inverse=True)
    return rows, inverse.ravel()


def ext(dim=4, ip=1, op=1, var=True):
    return StatisticsExtractionComponent(dim, ip, op, var)


def pool(dim=9, ip=1, left=0, right=10000, nlc=0, std=True, floor=1e-10):
    return StatisticsPoolingComponent(dim, ip, left, right, nlc, std, floor)


# -- file round trips ------------------------------------------------------------------------
@pytest.mark.parametrize("path", ref_params(reference_files(TYPES)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_roundtrip_reference_files(path):
    roundtrip_spans(path, TYPES)


def test_roundtrip_found_components():
    require_reference()
    total = sum(roundtrip_spans(p, TYPES) for p in reference_files(TYPES))
    assert total >= 36  # 10 extraction + 8 pooling model.txt, the same in model.bin


def test_whole_files_roundtrip_when_all_types_known():
    from pynnet3.io.model_file import parse_model_bytes, write_model_parts

    require_reference()
    done = 0
    for case in component_cases("Statistics"):
        for name, binary in (("model.txt", False), ("model.bin", True)):
            data = (case / name).read_bytes()
            parts = parse_model_bytes(data, str(case / name))
            assert write_model_parts(parts, binary) == data
            done += 1
    # 2 StatisticsExtraction + 2 StatisticsPooling cases (components/coverage.json), 2 files each
    assert done == 8


# -- properties and config ----------------------------------------------------------------------
def test_registered():
    assert component_class("StatisticsExtractionComponent") is StatisticsExtractionComponent
    assert component_class("StatisticsPoolingComponent") is StatisticsPoolingComponent


def test_extraction_properties_and_dims():
    c = ext(4, var=True)
    assert c.properties() == (Flags.PROPAGATE_ADDS | Flags.REORDERS_INDEXES
                              | Flags.BACKPROP_NEEDS_INPUT)
    assert int(c.properties()) == 0x8 | 0x10 | 0x40
    assert (c.input_dim, c.output_dim) == (4, 9)
    c = ext(4, var=False)
    assert c.properties() == Flags.PROPAGATE_ADDS | Flags.REORDERS_INDEXES
    assert c.output_dim == 5
    assert not c.is_simple() and not c.is_updatable()


@pytest.mark.parametrize("nlc,std,expected", [
    (0, False, Flags.BACKPROP_NEEDS_INPUT),
    (0, True, Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_NEEDS_OUTPUT),
    (2, False, Flags.BACKPROP_NEEDS_OUTPUT),
    (2, True, Flags.BACKPROP_NEEDS_OUTPUT),
])
def test_pooling_properties(nlc, std, expected):
    c = pool(9, nlc=nlc, std=std)
    assert c.properties() == Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS | expected
    assert c.output_dim == 9 + nlc - 1


def test_extraction_config_defaults_and_errors():
    c = StatisticsExtractionComponent.from_config(
        cfg("component name=s type=StatisticsExtractionComponent input-dim=5"), None)
    assert (c.input_dim, c.input_period, c.output_period, c.include_variance) == (5, 1, 1, True)
    c = StatisticsExtractionComponent.from_config(
        cfg("component name=s type=StatisticsExtractionComponent input-dim=5 input-period=2 "
            "output-period=6 include-variance=false"), None)
    assert (c.input_period, c.output_period, c.output_dim) == (2, 6, 6)
    for bad in ("input-period=2", "input-dim=5 output-period=3 input-period=2",
                "input-dim=0", "input-dim=5 foo=1", "input-dim=5 output-period=0"):
        with pytest.raises(ConfigError):
            StatisticsExtractionComponent.from_config(
                cfg("component name=s type=StatisticsExtractionComponent " + bad), None)


def test_pooling_config_defaults_and_errors():
    c = StatisticsPoolingComponent.from_config(
        cfg("component name=p type=StatisticsPoolingComponent input-dim=9 left-context=0 "
            "right-context=10"), None)
    assert (c.input_period, c.num_log_count_features, c.output_stddevs) == (1, 0, False)
    assert c.variance_floor == 1e-10 and c.output_dim == 8
    for bad in ("input-dim=9 left-context=2",  # right-context missing (-1)
                "input-dim=9 left-context=0 right-context=0",
                "input-dim=8 left-context=0 right-context=4 output-stddevs=true",
                "input-dim=9 input-period=3 left-context=2 right-context=3",
                "input-dim=9 left-context=1 right-context=1 variance-floor=2",
                "input-dim=9 left-context=1 right-context=1 num-log-count-features=-1",
                "input-dim=9 left-context=1 right-context=1 bogus=3",
                "left-context=1 right-context=1"):
        with pytest.raises(ConfigError):
            StatisticsPoolingComponent.from_config(
                cfg("component name=p type=StatisticsPoolingComponent " + bad), None)


# -- malformed files ----------------------------------------------------------------------
EXT_TEXT = (b"<StatisticsExtractionComponent> <InputDim> 4 <InputPeriod> 1 <OutputPeriod> 2 "
            b"<IncludeVarinance> T </StatisticsExtractionComponent> ")
POOL_TEXT = (b"<StatisticsPoolingComponent> <InputDim> 9 <InputPeriod> 1 <LeftContext> 0 "
             b"<RightContext> 10000 <NumLogCountFeatures> 0 <OutputStddevs> T "
             b"<VarianceFloor> 1e-10 </StatisticsPoolingComponent> ")


@pytest.mark.parametrize("text", [EXT_TEXT, POOL_TEXT])
def test_malformed(text):
    ok = read_component(TextReader(text))
    w = make_writer(False)
    ok.write(w)
    assert w.getvalue() == text
    bad = [text[:len(text) // 2], text[:-3],
           text.replace(b"<InputPeriod>", b"<InputPeriodX>"),
           text.replace(b"<InputDim> ", b"<InputDim> abc "),
           text.replace(b" T ", b" Q "),
           text.replace(b"<InputDim> 9", b"<InputDim> 8").replace(b"<InputDim> 4",
                                                                   b"<InputDim> 0")]
    if b"Extraction" in text:
        bad.append(text.replace(b"<OutputPeriod> 2", b"<OutputPeriod> 3").replace(
            b"<InputPeriod> 1", b"<InputPeriod> 2"))
    for b in bad:
        with pytest.raises(FormatError):
            read_component(TextReader(b))
    # binary: truncated
    w = make_writer(True)
    ok.write(w)
    data = w.getvalue()
    for cut in (len(data) // 2, len(data) - 5):
        with pytest.raises(FormatError):
            read_component(BinaryReader(data[:cut]))


# -- indexes ----------------------------------------------------------------------------------
def test_extraction_input_indexes():
    c = ext(3, ip=2, op=6)
    deps = c.input_indexes(np.array([[0, 7, 0], [1, -1, 2]]))
    assert deps.any_suffices and not deps.required.any()
    assert deps.owner.tolist() == [0, 0, 0, 1, 1, 1]
    assert deps.indexes[:, 1].tolist() == [6, 8, 10, -6, -4, -2]
    assert deps.indexes[3:, 0].tolist() == [1, 1, 1] and deps.indexes[3:, 2].tolist() == [2] * 3


def test_pooling_input_indexes():
    c = pool(7, ip=2, left=4, right=2)
    deps = c.input_indexes(np.array([[0, 2, 0], [0, 3, 0], [1, -4, 0]]))
    assert deps.any_suffices and not deps.required.any()
    assert deps.owner.tolist() == [0] * 4 + [2] * 4  # t=3 is not a multiple of 2: no deps
    assert deps.indexes[:, 1].tolist() == [-2, 0, 2, 4, -8, -6, -4, -2]


def test_missing_window_raises():
    c = pool(9, left=0, right=2)
    with pytest.raises(ComputeError):
        c.precompute_indexes(grid([0], range(5)), grid([0], [10]), True)


# -- math -------------------------------------------------------------------------------------
def numeric_grad(f, x, eps=1e-6, cols=None):
    g = np.zeros_like(x)
    cols = range(x.shape[1]) if cols is None else cols
    for i in range(x.shape[0]):
        for j in cols:
            old = x[i, j]
            x[i, j] = old + eps
            fp = f(x)
            x[i, j] = old - eps
            fm = f(x)
            x[i, j] = old
            g[i, j] = (fp - fm) / (2 * eps)
    return g


@pytest.mark.parametrize("ip,op,var", [(1, 1, True), (1, 3, False), (2, 4, True)])
def test_extraction_gradient(ip, op, var):
    rng = np.random.default_rng(0)
    c = ext(3, ip, op, var)
    in_idx = np.concatenate([grid([0], range(-2, 11, ip)), grid([1], range(0, 7, ip), x=1)])
    in_idx = in_idx[rng.permutation(len(in_idx))]
    out_idx = np.unique(np.column_stack([in_idx[:, 0], (in_idx[:, 1] // op) * op,
                                         in_idx[:, 2]]), axis=0)
    out_idx = out_idx[rng.permutation(len(out_idx))]
    x = rng.standard_normal((len(in_idx), 3))
    dy = rng.standard_normal((len(out_idx), c.output_dim))
    y, dx = run(c, in_idx, out_idx, x, dy)
    assert np.all(y[:, 0] >= 1)
    assert y[:, 0].sum() == len(in_idx)
    num = numeric_grad(lambda v: float(np.sum(run(c, in_idx, out_idx, v, None)[0] * dy)), x)
    assert rel_err(dx, num) < 1e-7


@pytest.mark.parametrize("nlc,std,ip,left,right", [
    (0, True, 1, 0, 10000), (2, True, 2, 4, 4), (1, False, 1, 3, 2), (0, False, 3, 3, 6)])
def test_extraction_then_pooling_gradient(nlc, std, ip, left, right):
    """Finite differences through extraction -> pooling (the count column of the
    pooling input is constant, so the chain is differentiable)."""
    rng = np.random.default_rng(1)
    d = 3
    e = ext(d, 1, ip, var=std)
    p = pool(e.output_dim, ip, left, right, nlc, std)
    in_idx = np.concatenate([grid([0], range(0, 13)), grid([1], range(-3, 6))])
    mid_idx, _ = round_map(in_idx, ip)
    out_idx = mid_idx[rng.permutation(len(mid_idx))]
    in_perm = rng.permutation(len(in_idx))
    in_idx = in_idx[in_perm]
    x = rng.standard_normal((len(in_idx), d))
    dy = rng.standard_normal((len(out_idx), p.output_dim))

    def forward(v, dy=None):
        m, _ = run(e, in_idx, mid_idx, v, None)
        y, dm = run(p, mid_idx, out_idx, m, dy)
        if dy is None:
            return y, None
        ind = e.precompute_indexes(in_idx, mid_idx, True)
        dx = np.zeros_like(v)
        e.backprop(ind, v, m, dm, None, None, dx)
        return y, dx

    y, dx = forward(x, dy)
    num = numeric_grad(lambda v: float(np.sum(forward(v)[0] * dy)), x)
    assert rel_err(dx, num) < 1e-6


def test_pooling_backprop_adds_and_skips_count_column():
    rng = np.random.default_rng(2)
    p = pool(9, left=0, right=5)
    in_idx = grid([0], range(8))
    x = rng.standard_normal((8, 9))
    x[:, 0] = 1.0
    out_idx = grid([0], [0, 1])
    ind = p.precompute_indexes(in_idx, out_idx, True)
    y = np.zeros((2, 8))
    p.propagate(ind, x, y)
    dy = rng.standard_normal((2, 8))
    dx = np.full_like(x, 5.0)
    p.backprop(ind, x, y, dy, None, None, dx)
    assert np.all(dx[:, 0] == 5.0)
    dx0 = np.zeros_like(x)
    p.backprop(ind, x, y, dy, None, None, dx0)
    np.testing.assert_allclose(dx[:, 1:], dx0[:, 1:] + 5.0)
    assert np.all(dx0[7:, 1:] == 0)  # row t=7 is in no window


def test_pooling_known_values_and_floor():
    p = pool(5, left=1, right=1, nlc=1, std=True, floor=1e-4)
    # feature dim 2; three frames with count 1 each: x = [1,2], [3,2], [5,2]
    x = np.array([[1, 1, 2, 1, 4], [1, 3, 2, 9, 4], [1, 5, 2, 25, 4]], dtype=np.float32)
    y, _ = run(p, grid([0], [0, 1, 2]), grid([0], [0, 1]), x, None)
    np.testing.assert_allclose(y[0], [np.log(2), 2, 2, 1, 1e-2], rtol=1e-6)
    np.testing.assert_allclose(y[1], [np.log(3), 3, 2, np.sqrt(8 / 3), 1e-2], rtol=1e-6)
    assert y.dtype == np.float32


def test_row_order_independence():
    rng = np.random.default_rng(3)
    e = ext(2, 1, 2, True)
    in_idx = np.concatenate([grid([0, 1], range(10)), grid([0], range(10), x=3)])
    out_idx = round_map(in_idx, 2)[0]
    x = rng.standard_normal((len(in_idx), 2)).astype(np.float32)
    dy = rng.standard_normal((len(out_idx), 5)).astype(np.float32)
    y, dx = run(e, in_idx, out_idx, x, dy)
    pi, po = rng.permutation(len(in_idx)), rng.permutation(len(out_idx))
    y2, dx2 = run(e, in_idx[pi], out_idx[po], x[pi], dy[po])
    np.testing.assert_allclose(y2, y[po], rtol=1e-6)
    np.testing.assert_allclose(dx2, dx[pi], rtol=1e-6)


def test_pooling_is_vectorized_on_long_windows():
    """x-vector sized: 4 sequences x 5000 frames, windows of 10001 frames."""
    rng = np.random.default_rng(4)
    e = ext(300, 1, 1, True)
    p = pool(601, 1, 0, 10000, 0, True)
    in_idx = grid(range(4), range(5000))
    x = rng.standard_normal((len(in_idx), 300)).astype(np.float32)
    out_idx = grid(range(4), [0, 100, 2000])
    start = time.perf_counter()
    m, _ = run(e, in_idx, in_idx, x, None)
    y, dm = run(p, in_idx, out_idx, m, rng.standard_normal((12, 600)).astype(np.float32))
    assert time.perf_counter() - start < 20
    seq0 = x[:5000].astype(np.float64)
    np.testing.assert_allclose(y[0, :300], seq0.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y[0, 300:], seq0.std(0), rtol=1e-4)
    np.testing.assert_allclose(y[1, :300], seq0[100:].mean(0), rtol=1e-4, atol=1e-5)


# -- Kaldi reference cases ----------------------------------------------------------------
def _case_components(case):
    from tests.reference import load_components

    return load_components(case / "model.txt")


def _check(y, dx, arrays):
    assert rel_err(y, arrays["output:output"]) < 1e-4
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3


@pytest.mark.parametrize("case", ref_params(component_cases("StatisticsExtraction_"), "cases"),
                         ids=lambda p: p.name)
def test_reference_extraction(case):
    req, arrays, _ = load_case(case)
    comps = _case_components(case)
    e = comps["stats-extraction"]
    in_idx = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    period = e.output_period
    mid, inverse = round_map(out_idx, period)  # output=Round(stats-extraction, P) or direct
    dmid = np.zeros((len(mid), e.output_dim), np.float32)
    np.add.at(dmid, inverse, dy)
    m, dx = run(e, in_idx, mid, x, dmid)
    _check(m[inverse], dx, arrays)


@pytest.mark.parametrize("case", ref_params(component_cases("StatisticsPooling_"), "cases"),
                         ids=lambda p: p.name)
def test_reference_pooling(case):
    req, arrays, _ = load_case(case)
    comps = _case_components(case)
    e, p = comps["stats-extraction"], comps["stats-pooling"]
    in_idx = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    ext_rows, _ = round_map(in_idx, e.output_period)  # the computable extraction outputs
    pool_rows, inverse = round_map(out_idx, p.input_period)  # Round(stats-pooling, P)
    dpool = np.zeros((len(pool_rows), p.output_dim), np.float32)
    np.add.at(dpool, inverse, dy)
    m, _ = run(e, in_idx, ext_rows, x, None)
    y, dm = run(p, ext_rows, pool_rows, m, dpool)
    ind = e.precompute_indexes(in_idx, ext_rows, True)
    dx = np.zeros_like(x)
    e.backprop(ind, x, m, dm, None, None, dx)
    _check(y[inverse], dx, arrays)


def test_float64_and_float32_agree():
    rng = np.random.default_rng(5)
    e = ext(3, 1, 1, True)
    p = pool(7, 1, 2, 2, 1, True)
    idx = grid([0], range(10))
    x = rng.standard_normal((10, 3))
    m64, _ = run(e, idx, idx, x, None)
    m32, _ = run(e, idx, idx, x.astype(np.float32), None)
    y64, _ = run(p, idx, idx, m64, None)
    y32, _ = run(p, idx, idx, m32, None)
    assert y32.dtype == np.float32 and y64.dtype == np.float64
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-6)


def test_reorder_indexes_sorts_nxt():
    idx = np.array([[1, 0, 0], [0, 5, 1], [0, 2, 1], [0, 9, 0]])
    for c in (ext(), pool()):
        new_in, new_out = c.reorder_indexes(idx, idx[::-1])
        assert new_in.tolist() == [[0, 9, 0], [0, 2, 1], [0, 5, 1], [1, 0, 0]]
        assert new_out.tolist() == new_in.tolist()
