"""Tests of the nonlinearity components (nonlinear.py): Sigmoid, Tanh,
RectifiedLinear, Softmax, LogSoftmax, Normalize, Pnorm.

The helpers at the top are shared with test_simple_misc.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pynnet3.components import component_class
from pynnet3.components.base import Flags
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader, make_writer
from pynnet3.io.model_file import parse_model_bytes, write_model_parts
from tests.components.common import (
    ALL_NNET_FILES,
    finite_difference_check,
    from_config,
    reference_files,
    rel_err,
    roundtrip_spans,
)
from tests.reference import (
    REF,
    component_cases,
    load_case,
    needs_reference,
    ref_params,
    require_reference,
)

# ----------------------------------------------------------------------------------
# Shared helpers


def component_spans(data: bytes, type_name: str):
    """(start, body_start, end) of every ``<ComponentName> x <Type> ... </Type> ``."""
    open_tok = f"<{type_name}> ".encode()
    close_tok = f"</{type_name}> ".encode()
    for m in re.finditer(rb"<ComponentName> \S+ " + re.escape(open_tok), data):
        start = m.end() - len(open_tok)
        end = data.find(close_tok, start)
        assert end > 0, f"no closing token for {type_name}"
        yield start, m.end(), end + len(close_tok)


def whole_file_roundtrip(case: Path) -> None:
    """Text and binary model files of a case read and write back byte for byte."""
    for name, binary in (("model.txt", False), ("model.bin", True)):
        data = (case / name).read_bytes()
        parts = parse_model_bytes(data, str(case / name))
        assert write_model_parts(parts, binary) == data, f"{case.name}/{name}"


def model_types(case: Path) -> set[str]:
    text = (case / "model.txt").read_text()
    return set(re.findall(r"<ComponentName> \S+ <(\w+)>", text))


def make(config: str, seed: int = 0):
    """A component from the options of a ``component`` config line."""
    return from_config("component name=c " + config, seed)


def forward(comp, x: np.ndarray, indexes=None) -> np.ndarray:
    out = np.zeros((x.shape[0], comp.output_dim), dtype=x.dtype)
    comp.propagate(indexes, x, out)
    return out


def backward(comp, x, y, dy, indexes=None, grad=None) -> np.ndarray:
    dx = np.zeros_like(x)
    comp.backprop(indexes, x, y, dy, None, grad, dx)
    return dx


def direct_cases(type_short: str) -> list[Path]:
    """Reference cases ``input -> comp -> output`` with ``input=input``."""
    out = []
    for case in component_cases(type_short + "_"):
        if not re.fullmatch(re.escape(type_short) + r"_\d+", case.name):
            continue
        config = (case / "nnet.config").read_text()
        if "component-node name=comp component=comp input=input\n" in config:
            out.append(case)
    return out


def affine_cases(type_short: str) -> list[Path]:
    """Reference cases ``input -> affine -> comp -> output``."""
    out = []
    for case in component_cases(type_short + "_"):
        if not re.fullmatch(re.escape(type_short) + r"_\d+", case.name):
            continue
        config = (case / "nnet.config").read_text()
        if "component-node name=comp component=comp input=affine\n" in config:
            out.append(case)
    return out


def affine_params(case: Path) -> tuple[np.ndarray, np.ndarray]:
    """The ``affine`` component's LinearParams and BiasParams, read directly."""
    data = (case / "model.txt").read_bytes()
    start = data.index(b"<ComponentName> affine <AffineComponent>")
    r = TextReader(data, str(case), pos=data.index(b"<LinearParams>", start))
    w = r.read_tagged("<LinearParams>", "matrix")
    b = r.read_tagged("<BiasParams>", "vector")
    return w.astype(np.float64), b.astype(np.float64)


def run_reference_case(case: Path, compose_affine: bool = False, grad=None) -> None:
    """Forward and backward of the case's ``comp`` against Kaldi's arrays."""
    request, arrays, _ = load_case(case)
    comps = dict(parse_model_bytes((case / "model.txt").read_bytes(),
                                   str(case)).components) if not compose_affine else None
    if comps is None:
        data = (case / "model.txt").read_bytes()
        (start, body, _), = [s for t in model_types(case) if t != "AffineComponent"
                             for s in component_spans(data, t)]
        type_name = data[start + 1:body - 2].decode()
        comp = component_class(type_name).read(TextReader(data, str(case), pos=body))
    else:
        comp = comps["comp"]
    x = arrays["input:input"]
    y_ref = arrays["output:output"]
    dy = arrays["output_deriv:output"]
    dx_ref = arrays["input_deriv:input"]
    in_idx = np.array(request["inputs"][0]["indexes"], dtype=np.int64)
    out_idx = np.array(request["outputs"][0]["indexes"], dtype=np.int64)
    if compose_affine:
        w, b = affine_params(case)
        x = (x.astype(np.float64) @ w.T + b).astype(np.float32)
    indexes = None
    if not comp.is_simple():
        indexes = comp.precompute_indexes(in_idx, out_idx, True)
    y = forward(comp, x, indexes)
    assert rel_err(y, y_ref) < 1e-4
    dx = backward(comp, x, y, dy, indexes, grad)
    if compose_affine:
        dx = dx.astype(np.float64) @ w
    assert rel_err(dx, dx_ref) < 1e-3


def truncation_and_garbage(comp) -> None:
    """Every strict prefix of the written component, and a garbage token in place of
    each token, raise FormatError (text and binary)."""
    cls = type(comp)
    for binary in (False, True):
        w = make_writer(binary)
        comp.write(w)
        data = w.getvalue()
        head = len(f"<{comp.type_name}> ")
        # The whole thing reads back.
        r = (BinaryReader if binary else TextReader)(data, "<t>", pos=head)
        cls.read(r)
        for cut in range(head, len(data) - 1):
            r = (BinaryReader if binary else TextReader)(data[:cut], "<t>", pos=head)
            with pytest.raises(FormatError):
                cls.read(r)
        for m in re.finditer(rb"<[A-Za-z/]+> ", data[head:]):
            bad = data[:head + m.start()] + b"<Garbage> " + data[head + m.end():]
            r = (BinaryReader if binary else TextReader)(bad, "<t>", pos=head)
            with pytest.raises(FormatError):
                cls.read(r)


# ----------------------------------------------------------------------------------
TYPES = ["SigmoidComponent", "TanhComponent", "RectifiedLinearComponent",
         "SoftmaxComponent", "LogSoftmaxComponent", "NormalizeComponent", "PnormComponent"]
SHORT = [t[:-len("Component")] for t in TYPES]


@needs_reference
def test_roundtrip_every_reference_component():
    # nnet3-train's outputs (train-cli/) keep the count-normalized stats that Kaldi
    # turned into sums (avg * count, double) and back (float(sum) / count): reading and
    # writing them again moves a <ValueAvg> by a float step, so they are compared
    # token by token; every other file is a fixed point of the round trip.
    files = reference_files(TYPES, ALL_NNET_FILES)
    trained = [p for p in files if "train-cli" in p.relative_to(REF).parts]
    count = sum(roundtrip_spans(p, TYPES) for p in files if p not in trained)
    assert count > 100
    assert trained and sum(roundtrip_spans(p, TYPES, exact=False) for p in trained) > 0


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


@pytest.mark.parametrize("case", ref_params([c for s in SHORT for c in affine_cases(s)], "cases"),
                         ids=lambda c: c.name)
def test_reference_case_after_affine(case):
    run_reference_case(case, compose_affine=True)


def test_reference_cases_found():
    require_reference()
    assert len([c for s in SHORT for c in direct_cases(s)]) == 9
    assert len([c for s in SHORT for c in affine_cases(s)]) == 5


# -- gradients --------------------------------------------------------------------
GRAD_CONFIGS = [
    "type=SigmoidComponent dim=5",
    "type=TanhComponent dim=5",
    "type=SoftmaxComponent dim=5",
    "type=LogSoftmaxComponent dim=5",
    "type=NormalizeComponent dim=6",
    "type=NormalizeComponent dim=6 block-dim=3 target-rms=0.5 add-log-stddev=true",
    "type=NormalizeComponent input-dim=6 block-dim=2 add-log-stddev=false",
    "type=PnormComponent input-dim=6 output-dim=2",
    "type=PnormComponent input-dim=6 output-dim=6",
]


@pytest.mark.parametrize("config", GRAD_CONFIGS)
def test_finite_difference_gradient(config):
    comp = make(config)
    x = np.random.default_rng(1).standard_normal((4, comp.input_dim))
    finite_difference_check(comp, x, params=False)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_forward_and_backprop_bits(dtype):
    """ReLU's NumPy fast forms (np_kernels.relu; the mask written as floats, then
    multiplied) give the bits of ``max(x, 0)`` and ``dy * (y > 0)``: NaN, inf and
    signed zeros in x, y and dy, a column view, in place."""
    comp = make("type=RectifiedLinearComponent dim=7")
    rng = np.random.default_rng(5)
    specials = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-40, -1e-40], dtype)
    x = rng.standard_normal((300, 7)).astype(dtype)
    x.reshape(-1)[::3] = rng.choice(specials, size=x.size // 3 + 1)[:len(x.reshape(-1)[::3])]
    dy = rng.standard_normal((300, 7)).astype(dtype)
    dy.reshape(-1)[1::4] = rng.choice(specials, size=len(dy.reshape(-1)[1::4]))

    def bits(a):
        return a.view(np.int32 if dtype == np.float32 else np.int64)

    y = np.empty_like(x)
    comp.propagate(None, x, y)
    assert np.array_equal(bits(y), bits(np.maximum(x, 0.0)))
    big = np.zeros((300, 10), dtype)
    big[:, 2:9] = x
    comp.propagate(None, big[:, 2:9], big[:, 2:9])  # a column view, in place
    assert np.array_equal(bits(np.ascontiguousarray(big[:, 2:9])), bits(y))
    for y_in in (y, (y > 0).astype(dtype)):  # (a decompressed ReLU output is 0/1)
        dx = np.full_like(x, 7.0)
        comp.backprop(None, None, y_in, dy, None, None, dx)
        assert np.array_equal(bits(dx), bits(dy * (y_in > 0)))


def test_relu_finite_difference_away_from_kink():
    comp = make("type=RectifiedLinearComponent dim=6")
    x = np.random.default_rng(2).standard_normal((4, 6))
    x[np.abs(x) < 0.1] = 0.5
    finite_difference_check(comp, x, params=False)


@pytest.mark.parametrize("config", GRAD_CONFIGS + ["type=RectifiedLinearComponent dim=6"])
def test_float32_and_in_place(config):
    comp = make(config)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, comp.input_dim))
    y64 = forward(comp, x)
    x32 = x.astype(np.float32)
    y32 = forward(comp, x32)
    assert y32.dtype == np.float32
    assert rel_err(y32, y64) < 1e-5
    flags = comp.properties()
    if flags & Flags.PROPAGATE_IN_PLACE:
        buf = x32.copy()
        comp.propagate(None, buf, buf)
        np.testing.assert_allclose(buf, y32, rtol=1e-6, atol=1e-7)
    dy = rng.standard_normal(y32.shape).astype(np.float32)
    dx = backward(comp, x32, y32, dy)
    if flags & Flags.BACKPROP_IN_PLACE:
        buf = dy.copy()
        comp.backprop(None, x32, y32, buf, None, None, buf)
        np.testing.assert_allclose(buf, dx, rtol=1e-5, atol=1e-6)


def test_normalize_backprop_adds():
    comp = make("type=NormalizeComponent dim=4")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4))
    y = forward(comp, x)
    dy = rng.standard_normal((3, 4))
    base = rng.standard_normal((3, 4))
    dx = base.copy()
    comp.backprop(None, x, y, dy, None, None, dx)
    np.testing.assert_allclose(dx - base, backward(comp, x, y, dy))


def test_normalize_zero_input_is_floored():
    comp = make("type=NormalizeComponent dim=4 add-log-stddev=true")
    x = np.zeros((2, 4))
    y = forward(comp, x)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y[:, 4], 0.5 * np.log(2.0 ** -66))
    dx = backward(comp, x, y, np.ones_like(y))
    assert np.all(np.isfinite(dx))


def test_softmax_floor_and_values():
    comp = make("type=SoftmaxComponent dim=3")
    y = forward(comp, np.array([[0.0, 0.0, -200.0], [1.0, 2.0, 3.0]], dtype=np.float32))
    assert y[0, 2] == np.float32(1e-20)
    np.testing.assert_allclose(y[1], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum(), rtol=1e-6)
    comp = make("type=LogSoftmaxComponent dim=3")
    y = forward(comp, np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(np.exp(y).sum(), 1.0)


def test_sigmoid_extreme_inputs():
    comp = make("type=SigmoidComponent dim=3")
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = forward(comp, np.array([[-1000.0, 0.0, 1000.0]], dtype=np.float32))
    np.testing.assert_array_equal(y, [[0.0, 0.5, 1.0]])


# -- properties -------------------------------------------------------------------
S, NO, NI = Flags.SIMPLE, Flags.BACKPROP_NEEDS_OUTPUT, Flags.BACKPROP_NEEDS_INPUT
PIP, BIP, SS = Flags.PROPAGATE_IN_PLACE, Flags.BACKPROP_IN_PLACE, Flags.STORES_STATS


@pytest.mark.parametrize("config,flags", [
    ("type=SigmoidComponent dim=4", S | NO | PIP | SS),
    ("type=TanhComponent dim=4", S | NO | PIP | SS),
    ("type=RectifiedLinearComponent dim=4", S | NO | PIP | SS),
    ("type=RectifiedLinearComponent dim=4 block-dim=2", S | NO | PIP | SS
     | Flags.INPUT_CONTIGUOUS),
    ("type=SoftmaxComponent dim=4", S | PIP | BIP | NO | SS),
    ("type=LogSoftmaxComponent dim=4", S | NO | SS),
    ("type=NormalizeComponent dim=4", S | NI | Flags.BACKPROP_ADDS | PIP | BIP),
    ("type=NormalizeComponent dim=4 add-log-stddev=true", S | NI | Flags.BACKPROP_ADDS),
    ("type=NormalizeComponent dim=4 block-dim=2", S | NI | Flags.BACKPROP_ADDS | PIP | BIP
     | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS),
    ("type=PnormComponent input-dim=4 output-dim=2", S | NI | NO),
])
def test_properties(config, flags):
    assert make(config).properties() == flags


# -- config -----------------------------------------------------------------------
def test_config_dims_and_defaults():
    c = make("type=SigmoidComponent dim=6")
    assert (c.input_dim, c.output_dim, c.block_dim) == (6, 6, 6)
    assert c.self_repair_scale == 0.0 and c.self_repair_lower_threshold == -1000.0
    c = make("type=RectifiedLinearComponent dim=6 block-dim=3 self-repair-scale=1e-5 "
             "self-repair-lower-threshold=0.1 self-repair-upper-threshold=0.9")
    assert c.block_dim == 3 and c.self_repair_scale == np.float32(1e-5)
    assert c.self_repair_upper_threshold == np.float32(0.9)
    c = make("type=NormalizeComponent dim=12 block-dim=4 add-log-stddev=true")
    assert (c.input_dim, c.output_dim, c.target_rms) == (12, 15, 1.0)
    c = make("type=NormalizeComponent input-dim=5")
    assert (c.input_dim, c.output_dim, c.block_dim, c.add_log_stddev) == (5, 5, 5, False)
    c = make("type=PnormComponent input-dim=6 output-dim=3")
    assert (c.input_dim, c.output_dim) == (6, 3)


@pytest.mark.parametrize("config", [
    "type=SigmoidComponent",
    "type=SigmoidComponent dim=0",
    "type=SigmoidComponent dim=6 block-dim=4",
    "type=TanhComponent dim=6 foo=1",
    "type=SoftmaxComponent dim=x",
    "type=NormalizeComponent dim=6 target-rms=0",
    "type=NormalizeComponent dim=6 block-dim=4",
    "type=NormalizeComponent",
    "type=PnormComponent input-dim=6",
    "type=PnormComponent input-dim=6 output-dim=4",
    "type=PnormComponent input-dim=6 output-dim=0",
])
def test_bad_config(config):
    with pytest.raises(ConfigError):
        make(config)


def test_bad_config_names_option():
    with pytest.raises(ConfigError, match="bogus"):
        make("type=TanhComponent dim=3 bogus=2")
    with pytest.raises(ConfigError, match="dim"):
        make("type=TanhComponent")


# -- malformed files ---------------------------------------------------------------
@pytest.mark.parametrize("config", [
    "type=SigmoidComponent dim=3",
    "type=RectifiedLinearComponent dim=4 block-dim=2 self-repair-scale=1e-5 "
    "self-repair-lower-threshold=0.1 self-repair-upper-threshold=0.9",
    "type=SoftmaxComponent dim=3",
    "type=NormalizeComponent dim=4 block-dim=2 add-log-stddev=true",
    "type=PnormComponent input-dim=4 output-dim=2",
])
def test_malformed(config):
    comp = make(config)
    comp.store_stats(None, forward(comp, np.ones((2, comp.input_dim), np.float32)), None)
    truncation_and_garbage(comp)


def test_malformed_values():
    text = b"<Dim> 3 <ValueAvg> [ 1 2 ]\n<DerivAvg> [ ]\n<Count> 0 </SigmoidComponent> "
    with pytest.raises(FormatError, match="ValueAvg"):
        component_class("SigmoidComponent").read(TextReader(text))
    text = b"<Dim> -3 <ValueAvg> [ ]\n"
    with pytest.raises(FormatError):
        component_class("SigmoidComponent").read(TextReader(text))
    text = b"<Dim> 3 <ValueAvg> [ 1 x 2 ]\n"
    with pytest.raises(FormatError):
        component_class("TanhComponent").read(TextReader(text))
    text = b"<InputDim> 6 <OutputDim> 4 </PnormComponent> "
    with pytest.raises(FormatError):
        component_class("PnormComponent").read(TextReader(text))


def test_normalize_old_format_reads():
    text = (b"<Dim> 4 <ValueAvg> [ 0 0 0 0 ]\n<DerivAvg> [ 0 0 0 0 ]\n<Count> 0 "
            b"</NormalizeComponent> ")
    c = component_class("NormalizeComponent").read(TextReader(text))
    assert (c.input_dim, c.target_rms, c.add_log_stddev) == (4, 1.0, False)


# -- statistics and self-repair ------------------------------------------------------
def written_text(comp) -> str:
    w = make_writer(False)
    comp.write(w)
    return w.getvalue().decode()


def test_store_stats_and_file_averages():
    comp = make("type=SigmoidComponent dim=3")
    x = np.random.default_rng(5).standard_normal((10, 3)).astype(np.float32)
    y = forward(comp, x)
    comp.store_stats(x, y, None)
    comp.store_stats(x, y, None)
    assert comp.count == 20
    np.testing.assert_allclose(comp.value_sum, 2 * y.sum(0), rtol=1e-6)
    np.testing.assert_allclose(comp.deriv_sum, 2 * (y * (1 - y)).sum(0), rtol=1e-6)
    text = written_text(comp)
    avg = np.array(re.search(r"<ValueAvg>  \[ ([^\]]*)\]", text).group(1).split(), float)
    np.testing.assert_allclose(avg, y.mean(0), rtol=1e-5)
    assert "<Count> 20 " in text
    back = component_class("SigmoidComponent").read(
        TextReader(text.encode(), pos=len("<SigmoidComponent> ")))
    assert written_text(back) == text
    comp.zero_stats()
    assert comp.count == 0 and not comp.value_sum.any()


def test_softmax_stats_values_only_and_logsoftmax_none():
    comp = make("type=SoftmaxComponent dim=3")
    y = forward(comp, np.zeros((4, 3)))
    comp.store_stats(None, y, None)
    assert comp.count == 4 and comp.deriv_sum.size == 0
    assert "<DerivAvg>  [ ]" in written_text(comp)
    comp = make("type=LogSoftmaxComponent dim=3")
    comp.store_stats(None, forward(comp, np.zeros((4, 3))), None)
    assert comp.count == 0


def test_backprop_stats_only_in_training():
    comp = make("type=TanhComponent dim=2")
    x = np.array([[0.5, -1.0], [2.0, 0.1]])
    y = forward(comp, x)
    dy = np.array([[1.0, 2.0], [3.0, 4.0]])
    backward(comp, x, y, dy)
    assert comp.oderiv_count == 0
    backward(comp, x, y, dy, grad={})
    assert comp.oderiv_count == 2
    np.testing.assert_allclose(comp.oderiv_sumsq, [10.0, 20.0])
    assert comp.num_dims_processed == 2
    assert "<OderivRms>  [ 2.236068 3.162278 ]" in written_text(comp)


def _with_stats(config, x):
    comp = make(config)
    comp.store_stats(x, forward(comp, x), None)
    return comp


def test_sigmoid_self_repair():
    x = np.array([[-8.0, 0.0], [-9.0, 0.5], [-7.5, -0.5]])
    comp = _with_stats("type=SigmoidComponent dim=2 self-repair-scale=0.01", x)
    y = forward(comp, x)
    dy = np.ones_like(y)
    plain = backward(comp, x, y, dy)
    repaired = backward(comp, x, y, dy, grad={})
    # dimension 0 is saturated (avg deriv < 0.05): add 0.01/0.5 * (1 - 2y)
    expected = plain.copy()
    expected[:, 0] += 0.02 * (1 - 2 * y[:, 0])
    np.testing.assert_allclose(repaired, expected, rtol=1e-6)
    assert comp.num_dims_self_repaired == 1 and comp.num_dims_processed == 2


def test_tanh_self_repair():
    x = np.array([[4.0, 0.0], [5.0, 0.5], [-4.5, -0.5]])
    comp = _with_stats("type=TanhComponent dim=2 self-repair-scale=0.01", x)
    y = forward(comp, x)
    dy = np.zeros_like(y)
    repaired = backward(comp, x, y, dy, grad={})
    expected = np.zeros_like(y)
    expected[:, 0] = -0.02 * y[:, 0]
    np.testing.assert_allclose(repaired, expected, rtol=1e-6)


def test_relu_self_repair_blocks():
    # dims 0,2 never active (deriv 0 <= 0.05), dim 1 always active (> 0.95), dim 3 half.
    x = np.array([[-1.0, 1.0, -1.0, 1.0], [-1.0, 2.0, -2.0, -1.0]])
    comp = _with_stats("type=RectifiedLinearComponent dim=4 self-repair-scale=1e-3", x)
    y = forward(comp, x)
    dy = np.zeros_like(y)
    np.testing.assert_allclose(backward(comp, x, y, dy, grad={}),
                               np.tile([0.002, -0.002, 0.002, 0.0], (2, 1)), atol=1e-9)
    # block-dim=2: stats averaged over blocks -> [0, 0.75]: +, 0
    comp = _with_stats("type=RectifiedLinearComponent dim=4 block-dim=2 "
                       "self-repair-scale=1e-3", x)
    np.testing.assert_allclose(backward(comp, x, y, dy, grad={}),
                               np.tile([0.002, 0.0, 0.002, 0.0], (2, 1)), atol=1e-9)
    assert comp.num_dims_processed == 2 and comp.num_dims_self_repaired == 1


def test_self_repair_off_without_stats_or_scale():
    x = np.array([[-8.0, 0.0]])
    comp = make("type=SigmoidComponent dim=2 self-repair-scale=0.01")
    y = forward(comp, x)
    np.testing.assert_array_equal(backward(comp, x, y, np.ones_like(y), grad={}),
                                  backward(comp, x, y, np.ones_like(y)))
    comp = _with_stats("type=SigmoidComponent dim=2", x)
    np.testing.assert_array_equal(backward(comp, x, y, np.ones_like(y), grad={}),
                                  backward(comp, x, y, np.ones_like(y)))


def test_random_self_repair_is_kaldi_like():
    x = np.array([[-8.0, 0.0], [-9.0, 0.5]])
    comp = _with_stats("type=SigmoidComponent dim=2 self-repair-scale=0.01", x)
    comp.rng = np.random.default_rng(0)
    y = forward(comp, x)
    dy = np.ones_like(y)
    plain = backward(comp, x, y, dy)
    repaired = 0
    for _ in range(200):
        d = backward(comp, x, y, dy, grad={})
        repaired += not np.array_equal(d, plain)
    assert 60 < repaired < 140  # about half the minibatches


def test_stats_json_reference_is_zero():
    """The reference cases ran with zero stats: self-repair had no effect there."""
    for case in direct_cases("RectifiedLinear"):
        assert "<Count> 0 " in (case / "model.txt").read_text()
        assert json.loads((case / "request.json").read_text())["need_model_derivative"]


@pytest.mark.parametrize("shape", [(1, 7), (300, 200), (5000, 9), (3, 40000)])
def test_log_softmax_blocked_is_the_whole_matrix_formula(shape):
    """LogSoftmax's NumPy propagate runs a block of rows at a time, its row sums
    one BLAS product: the float64 math within float32 rounding, rows of
    non-finite inputs as the whole-matrix formula has them."""
    from pynnet3.components.nonlinear import LogSoftmaxComponent

    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x[0, 0] = 80.0  # (an exp that overflows without the max shift)
    out = np.full_like(x, np.nan)
    assert LogSoftmaxComponent().propagate(None, x, out) is None
    x64 = x.astype(np.float64)
    ref = x64 - (np.log(np.exp(x64 - x64.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True))
                 + x64.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    if shape[0] > 2:  # a NaN row, a +inf row and a row with a -inf entry
        x[0, -1], x[1, 0], x[2, 0] = np.nan, np.inf, -np.inf
        with np.errstate(invalid="ignore"):
            LogSoftmaxComponent().propagate(None, x, out)
            s = x - x.max(axis=1, keepdims=True)
            whole = s - np.log(np.sum(np.exp(s), axis=1, keepdims=True))
        np.testing.assert_array_equal(np.isnan(out[:2]), np.isnan(whole[:2]))
        assert np.isnan(out[:2]).all()
        assert out[2, 0] == -np.inf and np.isfinite(out[2, 1:]).all()
        np.testing.assert_allclose(out[2, 1:], whole[2, 1:], rtol=1e-5, atol=1e-5)
