"""RestrictedAttentionComponent."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.components.attention import RestrictedAttentionComponent
from pynnet3.errors import ComputeError, ConfigError, FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader, make_writer
from pynnet3.io.model_file import read_component
from tests.components.common import cfg, grid, reference_files, rel_err, roundtrip_spans
from tests.reference import REF, component_cases, load_case, ref_params, require_reference

TYPE = "RestrictedAttentionComponent"


def run(comp, in_idx, out_idx, x, dy):
    ind = comp.precompute_indexes(np.asarray(in_idx), np.asarray(out_idx), True)
    y = np.zeros((len(out_idx), comp.output_dim), x.dtype)
    memo = comp.propagate(ind, x, y)
    if dy is None:
        return y, None, memo
    dx = np.zeros_like(x)
    comp.backprop(ind, x, None, dy, memo, None, dx)
    return y, dx, memo


def naive_forward(c: RestrictedAttentionComponent, in_idx, out_idx, x):
    """Kaldi's algorithm spelled out per output row: the input is padded on the
    time grid with zero rows where an index is missing."""
    table = {tuple(i): r for r, i in enumerate(np.asarray(in_idx).tolist())}
    zero = np.zeros(x.shape[1])
    y = np.zeros((len(out_idx), c.output_dim))
    kd, vd, cd = c.key_dim, c.value_dim, c.context_dim
    ipd, opd = c.input_dim_per_head, c.output_dim_per_head
    for o, (n, t, xx) in enumerate(np.asarray(out_idx).tolist()):
        q = x[table[(n, t, xx)]]
        ctx = [x[table[(n, t + k * c.time_stride, xx)]]
               if (n, t + k * c.time_stride, xx) in table else zero
               for k in range(-c.num_left_inputs, c.num_right_inputs + 1)]
        for h in range(c.num_heads):
            qh = q[h * ipd:(h + 1) * ipd]
            b = np.array([c.key_scale * np.dot(qh[kd + vd:2 * kd + vd], r[h * ipd:h * ipd + kd])
                          + qh[2 * kd + vd + j] for j, r in enumerate(ctx)])
            p = np.exp(b - b.max())
            p /= p.sum()
            val = sum(p[j] * ctx[j][h * ipd + kd:h * ipd + kd + vd] for j in range(cd))
            y[o, h * opd:h * opd + vd] = val
            if c.output_context:
                y[o, h * opd + vd:(h + 1) * opd] = p
    return y


def make(heads=2, kd=3, vd=2, left=3, right=1, stride=1, lreq=None, rreq=None, ctx=True,
         scale=None):
    return RestrictedAttentionComponent(heads, kd, vd, left, right, stride, lreq, rreq, ctx,
                                        scale)


# -- files -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ref_params(reference_files(TYPE)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_roundtrip_reference_files(path):
    assert roundtrip_spans(path, TYPE) >= 1


def test_roundtrip_count():
    require_reference()
    assert sum(roundtrip_spans(p, TYPE) for p in reference_files(TYPE)) == 18  # 9 txt + 9 bin


@pytest.mark.parametrize("binary", [False, True])
def test_roundtrip_with_stats_keeps_double_precision(binary):
    c = make()
    rng = np.random.default_rng(0)
    in_idx, out_idx = grid([0], range(-3, 9)), grid([0], range(0, 8))
    x = rng.standard_normal((len(in_idx), c.input_dim)).astype(np.float32)
    _, _, memo = run(c, in_idx, out_idx, x, None)
    c.store_stats(x, None, memo)
    c.store_stats(x, None, memo)
    assert c.stats_count == 16 and c.entropy_stats.shape == (2,)
    np.testing.assert_allclose(c.posterior_stats.sum(axis=1), [16, 16], rtol=1e-5)
    c.entropy_stats[0] = 1.0 / 3.0  # needs double precision in binary
    w = make_writer(binary)
    c.write(w)
    data = w.getvalue()
    back = read_component((BinaryReader if binary else TextReader)(data))
    w2 = make_writer(binary)
    back.write(w2)
    assert w2.getvalue() == data
    if binary:
        assert back.entropy_stats[0] == 1.0 / 3.0
        np.testing.assert_array_equal(back.posterior_stats, c.posterior_stats)
    assert "entropy=" in back.info()
    back.zero_stats()
    assert back.stats_count == 0 and not back.posterior_stats.any()


TEXT = (b"<RestrictedAttentionComponent> <NumHeads> 1 <KeyDim> 3 <ValueDim> 4 "
        b"<NumLeftInputs> 2 <NumRightInputs> 1 <TimeStride> 1 <NumLeftInputsRequired> 2 "
        b"<NumRightInputsRequired> 1 <OutputContext> T <KeyScale> 0.57735 <StatsCount> 0 "
        b"<EntropyStats>  [ ]\n<PosteriorStats>  [ ]\n</RestrictedAttentionComponent> ")


def test_malformed():
    c = read_component(TextReader(TEXT))
    assert (c.input_dim, c.output_dim) == (14, 8)
    w = make_writer(False)
    c.write(w)
    assert w.getvalue() == TEXT
    bad = [TEXT[:60], TEXT[:-20], TEXT.replace(b"<KeyDim>", b"<KeyDimm>"),
           TEXT.replace(b"<ValueDim> 4", b"<ValueDim> four"),
           TEXT.replace(b"<NumLeftInputsRequired> 2", b"<NumLeftInputsRequired> 3"),
           TEXT.replace(b"<NumHeads> 1", b"<NumHeads> 0"),
           TEXT.replace(b"<EntropyStats>  [ ]", b"<EntropyStats>  [ nan ]"),
           TEXT.replace(b"<EntropyStats>  [ ]", b"<EntropyStats>  [ 1 2 ]"),
           TEXT.replace(b"<EntropyStats>  [ ]", b"<EntropyStats>  [ 1 x ]"),
           TEXT.replace(b"<PosteriorStats>  [ ]", b"<PosteriorStats>  [ 1 2 ]"),
           TEXT.replace(b"<OutputContext> T", b"<OutputContext> 7")]
    for b in bad:
        with pytest.raises(FormatError):
            read_component(TextReader(b))
    w = make_writer(True)
    c.write(w)
    data = w.getvalue()
    for cut in (30, len(data) - 40, len(data) - 5):
        with pytest.raises(FormatError):
            read_component(BinaryReader(data[:cut]))


# -- properties / config -------------------------------------------------------------------
def test_properties():
    assert component_class(TYPE) is RestrictedAttentionComponent
    c = make()
    assert c.properties() == (Flags.REORDERS_INDEXES | Flags.BACKPROP_NEEDS_INPUT
                              | Flags.PROPAGATE_ADDS | Flags.BACKPROP_ADDS
                              | Flags.STORES_STATS | Flags.USES_MEMO)
    assert int(c.properties()) == 0x10 | 0x40 | 0x8 | 0x20 | 0x200 | 0x1000
    assert not c.is_updatable() and c.params() == {}


def test_config():
    c = RestrictedAttentionComponent.from_config(cfg(
        "component name=a type=RestrictedAttentionComponent key-dim=4 value-dim=3 "
        "num-left-inputs=2 num-right-inputs=1"), None)
    assert (c.num_heads, c.time_stride, c.output_context) == (1, 1, True)
    assert (c.num_left_inputs_required, c.num_right_inputs_required) == (2, 1)
    assert c.key_scale == pytest.approx(0.5)
    assert c.context_dim == 4 and c.input_dim == 4 + 3 + 4 + 4 and c.output_dim == 3 + 4
    c = RestrictedAttentionComponent.from_config(cfg(
        "component name=a type=RestrictedAttentionComponent num-heads=2 key-dim=2 value-dim=3 "
        "num-left-inputs=1 num-right-inputs=1 time-stride=2 output-context=false "
        "key-scale=0.8 num-left-inputs-required=0"), None)
    assert (c.input_dim, c.output_dim, c.key_scale) == (20, 6, 0.8)
    assert c.num_left_inputs_required == 0 and c.num_right_inputs_required == 1
    base = "component name=a type=RestrictedAttentionComponent "
    for bad in ("value-dim=3 num-left-inputs=1 num-right-inputs=1",
                "key-dim=2 value-dim=3 num-left-inputs=0 num-right-inputs=0",
                "key-dim=2 value-dim=3 num-left-inputs=1 num-right-inputs=1 "
                "num-left-inputs-required=2",
                "key-dim=2 value-dim=3 num-left-inputs=1 num-right-inputs=1 key-scale=2",
                "key-dim=2 value-dim=3 num-left-inputs=1 num-right-inputs=1 time-stride=0",
                "key-dim=2 value-dim=3 num-left-inputs=1 num-right-inputs=1 num-heads=0",
                "key-dim=2 value-dim=3 num-left-inputs=1 num-right-inputs=1 colour=red"):
        with pytest.raises(ConfigError):
            RestrictedAttentionComponent.from_config(cfg(base + bad), None)


def test_input_indexes():
    c = make(left=3, right=1, stride=2, lreq=1, rreq=0)
    deps = c.input_indexes(np.array([[0, 10, 0], [1, 0, 2]]))
    assert not deps.any_suffices
    assert deps.owner.tolist() == [0] * 5 + [1] * 5
    assert deps.indexes[:5, 1].tolist() == [4, 6, 8, 10, 12]
    assert deps.indexes[5:].tolist() == [[1, t, 2] for t in (-6, -4, -2, 0, 2)]
    assert deps.required.tolist() == [False, False, True, True, False] * 2


# -- math ---------------------------------------------------------------------------------
@pytest.mark.parametrize("ctx", [True, False])
def test_matches_naive_with_missing_optional_inputs(ctx):
    rng = np.random.default_rng(1)
    c = make(heads=2, left=3, right=2, stride=2, lreq=1, rreq=0, ctx=ctx)
    # n=0 has all inputs, n=1 starts late and ends early: optional inputs absent.
    in_idx = np.concatenate([grid([0], range(-6, 16)), grid([1], range(-2, 10))])
    out_idx = np.concatenate([grid([0], range(0, 10)), grid([1], range(0, 10))])
    pi, po = rng.permutation(len(in_idx)), rng.permutation(len(out_idx))
    in_idx, out_idx = in_idx[pi], out_idx[po]
    x = rng.standard_normal((len(in_idx), c.input_dim))
    y, _, _ = run(c, in_idx, out_idx, x, None)
    np.testing.assert_allclose(y, naive_forward(c, in_idx, out_idx, x), rtol=1e-12, atol=1e-12)
    # a required input missing -> error
    with pytest.raises(ComputeError):
        c.precompute_indexes(in_idx, np.array([[1, 12, 0]]), True)


@pytest.mark.parametrize("ctx,stride", [(True, 1), (False, 2)])
def test_gradient_check_float64(ctx, stride):
    rng = np.random.default_rng(2)
    c = make(heads=2, kd=2, vd=3, left=2, right=1, stride=stride, lreq=1, rreq=0, ctx=ctx,
             scale=0.7)
    in_idx = np.concatenate([grid([0], range(-4, 6)), grid([1], range(-1, 5), x=1)])
    out_idx = np.concatenate([grid([0], range(0, 4)), grid([1], range(1, 4), x=1)])
    x = rng.standard_normal((len(in_idx), c.input_dim))
    dy = rng.standard_normal((len(out_idx), c.output_dim))
    _, dx, _ = run(c, in_idx, out_idx, x, dy)
    num = np.zeros_like(x)
    eps = 1e-6
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            xp, xm = x.copy(), x.copy()
            xp[i, j] += eps
            xm[i, j] -= eps
            num[i, j] = (np.sum(run(c, in_idx, out_idx, xp, None)[0] * dy)
                         - np.sum(run(c, in_idx, out_idx, xm, None)[0] * dy)) / (2 * eps)
    assert rel_err(dx, num) < 1e-7


def test_propagate_and_backprop_add():
    rng = np.random.default_rng(3)
    c = make(ctx=True)
    in_idx, out_idx = grid([0], range(-3, 7)), grid([0], range(0, 6))
    x = rng.standard_normal((len(in_idx), c.input_dim)).astype(np.float32)
    dy = rng.standard_normal((len(out_idx), c.output_dim)).astype(np.float32)
    ind = c.precompute_indexes(in_idx, out_idx, True)
    y0 = np.zeros((6, c.output_dim), np.float32)
    memo = c.propagate(ind, x, y0)
    y1 = np.ones((6, c.output_dim), np.float32)
    c.propagate(ind, x, y1)
    opd = c.output_dim_per_head
    for h in range(2):  # value part added, context part (c) copied, as in Kaldi
        np.testing.assert_allclose(y1[:, h * opd:h * opd + 2], y0[:, h * opd:h * opd + 2] + 1,
                                   rtol=1e-6)
        np.testing.assert_array_equal(y1[:, h * opd + 2:(h + 1) * opd],
                                      y0[:, h * opd + 2:(h + 1) * opd])
    dx0 = np.zeros_like(x)
    c.backprop(ind, x, None, dy, memo, None, dx0)
    dx1 = np.full_like(x, 2.0)
    c.backprop(ind, x, None, dy, memo, None, dx1)
    np.testing.assert_allclose(dx1, dx0 + 2.0, rtol=1e-5, atol=1e-6)
    assert dx0.dtype == np.float32 and y0.dtype == np.float32


# -- Kaldi reference cases ----------------------------------------------------------------------
@pytest.mark.parametrize("case", ref_params(component_cases("RestrictedAttention_"), "cases"),
                         ids=lambda p: p.name)
def test_reference(case):
    req, arrays, _ = load_case(case)
    data = (case / "model.txt").read_bytes()
    c = read_component(TextReader(data, pos=data.index(f"<{TYPE}>".encode())))
    in_idx = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    y, dx, _ = run(c, in_idx, out_idx, arrays["input:input"], arrays["output_deriv:output"])
    assert rel_err(y, arrays["output:output"]) < 1e-4
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3
    assert not math.isnan(float(y.sum()))


def _generated_attention_cases() -> list:
    """Generated cases whose network is input -> affine -> attention -> output."""
    root = REF / "generated"
    if not root.is_dir():
        return []
    out = []
    for case in sorted(root.iterdir()):
        cfg_path = case / "nnet.config"
        if not cfg_path.is_file():
            continue
        lines = [ln for ln in cfg_path.read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        if (len(lines) == 6 and f"type={TYPE}" in cfg_path.read_text()
                and "component-node name=attention component=attention input=affine" in lines
                and "component-node name=affine component=affine input=input" in lines
                and "output-node name=output input=attention" in lines):
            out.append(case)
    return out


@pytest.mark.parametrize("case", ref_params(_generated_attention_cases(), "cases"),
                         ids=lambda p: p.name)
def test_reference_generated_affine_attention(case):
    """Composed by hand: the affine rows are the input rows; attention outputs are the
    request's. Several of these cases lack optional left inputs at the sequence
    start (case_1, case_35), which checks the zero-padding semantics."""
    req, arrays, _ = load_case(case)
    data = (case / "model.txt").read_bytes()
    att = read_component(TextReader(data, pos=data.index(f"<{TYPE}>".encode())))
    r = TextReader(data, pos=data.index(b"<LinearParams>"))
    w = r.read_tagged("<LinearParams>", "matrix")
    b = r.read_tagged("<BiasParams>", "vector")
    in_idx = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    x = arrays["input:input"]
    a = (x @ w.T + b).astype(np.float32)
    dy = arrays.get("output_deriv:output")
    y, da, _ = run(att, in_idx, out_idx, a, dy)
    assert rel_err(y, arrays["output:output"]) < 1e-4
    if "grad:affine:linear_params" in arrays:
        assert rel_err(da.T @ x, arrays["grad:affine:linear_params"]) < 1e-3
        assert rel_err(da.sum(0), arrays["grad:affine:bias_params"]) < 1e-3


def _kaldi_matrix_rows(listing: str, prefix: str) -> int:
    import re

    name = re.search(rf"^(m\d+) == value: {re.escape(prefix)}\[", listing, re.M).group(1)
    return int(re.search(rf"\b{name}\((\d+), \d+\)", listing).group(1))


@pytest.mark.parametrize("case", ref_params(_generated_attention_cases(), "cases"),
                         ids=lambda p: p.name)
def test_reorder_indexes_matches_kaldi_matrix_sizes(case):
    from pynnet3.components.attention import NO_TIME

    req, arrays, _ = load_case(case)
    data = (case / "model.txt").read_bytes()
    att = read_component(TextReader(data, pos=data.index(f"<{TYPE}>".encode())))
    avail = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    deps = att.input_indexes(out_idx)
    present = {tuple(i) for i in avail.tolist()}
    used = np.unique(np.array([i for i in deps.indexes.tolist() if tuple(i) in present]), axis=0)
    new_in, new_out = att.reorder_indexes(used, out_idx)
    listing = (case / "computation_unopt.txt").read_text()
    assert len(new_in) == _kaldi_matrix_rows(listing, "attention_input")
    assert len(new_out) == _kaldi_matrix_rows(listing, "attention")
    assert (new_in[:, 1] != NO_TIME).sum() == len(used)
    # The math on Kaldi's padded layout (zero rows) agrees with the compact layout.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((len(used), att.input_dim)).astype(np.float32)
    y, _, _ = run(att, used, out_idx, x, None)
    pos = {tuple(i): r for r, i in enumerate(used.tolist())}
    xp = np.zeros((len(new_in), att.input_dim), np.float32)
    for r, i in enumerate(new_in.tolist()):
        if i[1] != NO_TIME:
            xp[r] = x[pos[tuple(i)]]
    yp, _, _ = run(att, new_in, new_out, xp, None)
    opos = {tuple(i): r for r, i in enumerate(new_out.tolist())}
    np.testing.assert_allclose(yp[[opos[tuple(i)] for i in out_idx.tolist()]], y, rtol=1e-6,
                               atol=1e-7)
