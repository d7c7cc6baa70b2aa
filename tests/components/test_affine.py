"""Affine-family components: file round trips, gradients, Kaldi reference cases.

The helpers at the top (reference files with training dumps, component walks,
gradient and in-place checks, direct reference cases) are shared by
test_scale_offset, test_batchnorm and test_composite; the generic ones are in
common.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pynnet3.components  # noqa: F401  (registers every family)
from pynnet3.components import Flags
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader, make_writer
from pynnet3.io.model_file import read_component
from tests.components.common import (
    MODEL_FILES,
    finite_difference_check,
    from_config,
    nnet_bytes,
    reference_files,
    rel_err,
    roundtrip_spans,
)
from tests.reference import (
    REF,
    component_cases,
    load_case,
    load_components,
    ref_params,
    require_reference,
)

# -- shared helpers ---------------------------------------------------------------------

_WS = re.compile(rb"\s*")


def files_with_types(types) -> list[Path]:
    """Reference model files, training dumps (gzipped text) included, holding ``types``."""
    return reference_files(types, MODEL_FILES + ("training/*/*.txt.gz",))


def component_spans(path: Path):
    """Yield (name, type, component, data, start) for each component of a model file;
    every component must read (a reader error fails the caller)."""
    data = nnet_bytes(path)
    r = make_reader(data, str(path))
    r.expect_token("<Nnet3>")
    r.read_line()
    while r.read_line().strip():
        pass
    for _ in range(r.read_tagged("<NumComponents>", "int")):
        r.expect_token("<ComponentName>")
        name = r.read_token()
        start = _WS.match(data, r.pos).end()
        type_name = r.peek_token()[1:-1]
        yield name, type_name, read_component(r), data, start


def _forward(comp, x):
    out = np.zeros((len(x), comp.output_dim), x.dtype)
    memo = comp.propagate(None, x, out)
    return out, memo


def _backward(comp, x, out, dy, memo):
    flags = comp.properties()
    dx = np.zeros_like(x) if flags & Flags.BACKPROP_ADDS else np.full_like(x, np.nan)
    grad = {k: np.zeros_like(v) for k, v in comp.params().items()}
    comp.backprop(None, x, out, dy, memo, grad, dx)
    return dx, grad


def gradient_check(comp, num_rows: int = 7, seed: int = 0, eps: float = 1e-6,
                   tol: float = 1e-6) -> None:
    """Central differences in float64 of f = sum(out * R) w.r.t. input and params."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_rows, comp.input_dim))
    dy = rng.standard_normal((num_rows, comp.output_dim))
    finite_difference_check(comp, x, eps=eps, tol=tol, dy=dy)


def check_in_place(comp, num_rows: int = 5, seed: int = 1) -> None:
    """Propagate/backprop with aliased buffers give the same results, when the
    component declares it supports that."""
    rng = np.random.default_rng(seed)
    flags = comp.properties()
    x = rng.standard_normal((num_rows, comp.input_dim)).astype(np.float32)
    dy = rng.standard_normal((num_rows, comp.output_dim)).astype(np.float32)
    out, memo = _forward(comp, x.copy())
    dx, _ = _backward(comp, x, out, dy.copy(), memo)
    if flags & Flags.PROPAGATE_IN_PLACE:
        buf = x.copy()
        comp.propagate(None, buf, buf)
        np.testing.assert_allclose(buf, out, rtol=1e-6, atol=1e-6)
    if flags & Flags.BACKPROP_IN_PLACE:
        buf = dy.copy()
        comp.backprop(None, x, out, buf, memo, None, buf)
        np.testing.assert_allclose(buf, dx, rtol=1e-6, atol=1e-6)


def direct_cases(prefixes) -> list[Path]:
    """Reference cases whose network is just input -> comp -> output, input=input."""
    out = []
    for case in component_cases():
        if case.name.rsplit("_", 1)[0] not in prefixes:
            continue
        lines = [ln for ln in (case / "nnet.config").read_text().splitlines() if ln.strip()]
        if len(lines) == 4 and lines[2].rstrip().endswith("input=input"):
            out.append(case)
    return out


def compare_case_grads(arrays, exported: dict, comp_name: str) -> int:
    """Compare ``grad:<comp_name>[#i]:<param>`` arrays with an exported gradient dict
    (``{param: array}``, or ``{"i:param": array}`` for composites)."""
    n = 0
    for key, want in arrays.items():
        parts = key.split(":")
        if parts[0] != "grad" or parts[1].split("#")[0] != comp_name:
            continue
        sub = parts[1].split("#")
        got = exported[f"{sub[1]}:{parts[2]}" if len(sub) > 1 else parts[2]]
        assert rel_err(got.reshape(want.shape), want) < 1e-3, key
        n += 1
    return n


def run_direct_case(case: Path) -> None:
    """Run the component of a direct case on the reference input and compare."""
    comps = load_components(case / "model.txt")
    comp = comps["comp"]
    _, arrays, _ = load_case(case)
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    out, memo = _forward(comp, x)
    assert out.dtype == np.float32
    assert rel_err(out, arrays["output:output"]) < 1e-4
    dx, grad = _backward(comp, x, out, dy, memo)
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3
    n = compare_case_grads(arrays, comp.export_gradient(grad), "comp")
    assert n == sum(k.startswith("grad:") for k in arrays)
    assert bool(n) == comp.is_updatable() or not comp.params()


def malformed_checks(text: bytes, binary: bytes) -> None:
    """Truncated bodies and garbage tokens raise FormatError (text and binary)."""
    for data in (text, binary):
        for cut in (len(data) // 3, len(data) // 2, len(data) - 3):
            with pytest.raises(FormatError):
                read_component(make_reader(data[:cut], "<test>"))
    # Replace the second token (the first after the type) with garbage.
    parts = text.split(b" ", 2)
    bad = parts[0] + b" <Garbage> " + parts[2]
    with pytest.raises(FormatError):
        read_component(make_reader(bad, "<test>"))
    with pytest.raises(FormatError):
        read_component(make_reader(text.rsplit(b"</", 1)[0] + b"</Wrong> ", "<test>"))


def serialize(comp) -> tuple[bytes, bytes]:
    tw, bw = make_writer(False), make_writer(True)
    comp.write(tw)
    bw.raw(b"\0B")
    comp.write(bw)
    return tw.getvalue(), bw.getvalue()


def reread(comp, binary: bool):
    text, binary_bytes = serialize(comp)
    return read_component(make_reader(binary_bytes if binary else text, "<test>"))


# -- this file's types --------------------------------------------------------------------

TYPES = ("AffineComponent", "NaturalGradientAffineComponent", "LinearComponent",
         "FixedAffineComponent", "RepeatedAffineComponent",
         "NaturalGradientRepeatedAffineComponent", "BlockAffineComponent")

CONFIGS = {
    "AffineComponent": "component name=a type=AffineComponent input-dim=6 output-dim=4",
    "NaturalGradientAffineComponent":
        "component name=a type=NaturalGradientAffineComponent input-dim=6 output-dim=4",
    "LinearComponent": "component name=a type=LinearComponent input-dim=6 output-dim=4",
    "FixedAffineComponent": "component name=a type=FixedAffineComponent input-dim=6 output-dim=4",
    "RepeatedAffineComponent":
        "component name=a type=RepeatedAffineComponent input-dim=6 output-dim=9 num-repeats=3 "
        "bias-stddev=1",
    "NaturalGradientRepeatedAffineComponent":
        "component name=a type=NaturalGradientRepeatedAffineComponent input-dim=8 output-dim=4 "
        "num-repeats=2 bias-stddev=1",
    "BlockAffineComponent":
        "component name=a type=BlockAffineComponent input-dim=6 output-dim=4 num-blocks=2",
}

B = Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_ADDS
EXPECTED_FLAGS = {
    "AffineComponent": B,
    "NaturalGradientAffineComponent": B,
    "LinearComponent": B | Flags.PROPAGATE_ADDS,
    "FixedAffineComponent": Flags.SIMPLE | Flags.BACKPROP_ADDS,
    "RepeatedAffineComponent": B | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS,
    "NaturalGradientRepeatedAffineComponent":
        B | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS,
    "BlockAffineComponent": B,
}


@pytest.mark.parametrize("path", ref_params(files_with_types(TYPES)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_reference_roundtrip(path):
    assert roundtrip_spans(path, TYPES) > 0


def test_reference_roundtrip_covers_every_type():
    require_reference()
    found = {t for f in files_with_types(TYPES) for _, t, _, _, _ in component_spans(f)}
    assert set(TYPES) <= found


@pytest.mark.parametrize("type_name", TYPES)
def test_gradients(type_name):
    gradient_check(from_config(CONFIGS[type_name]))


@pytest.mark.parametrize("type_name", TYPES)
def test_properties(type_name):
    assert from_config(CONFIGS[type_name]).properties() == EXPECTED_FLAGS[type_name]


@pytest.mark.parametrize("type_name", TYPES)
def test_config_roundtrip_and_malformed(type_name):
    comp = from_config(CONFIGS[type_name])
    for binary in (False, True):
        again = reread(comp, binary)
        assert type(again) is type(comp)
        assert serialize(again)[binary] == serialize(comp)[binary]
    malformed_checks(*serialize(comp))


@pytest.mark.parametrize("case", ref_params(direct_cases({t[:-len("Component")] for t in TYPES}),
                                    "component cases"),
                         ids=lambda p: p.name)
def test_reference_case(case):
    run_direct_case(case)


@pytest.mark.parametrize("case_name", ["Affine_2", "NaturalGradientAffine_2"])
def test_reference_case_append(case_name):
    """input=Append(Offset(input,-1), input, Offset(input,2)), composed by hand."""
    case = REF / "components" / case_name
    require_reference()
    request, arrays, _ = load_case(case)
    comp = load_components(case / "model.txt")["comp"]
    in_rows = {tuple(ix): i for i, ix in enumerate(request["inputs"][0]["indexes"])}
    outs = request["outputs"][0]["indexes"]
    rows = np.array([[in_rows[(n, t + o, x)] for o in (-1, 0, 2)] for n, t, x in outs])
    x_in = arrays["input:input"]
    x = x_in[rows].reshape(len(outs), -1)
    out, memo = _forward(comp, x)
    assert rel_err(out, arrays["output:output"]) < 1e-4
    dx, grad = _backward(comp, x, out, arrays["output_deriv:output"], memo)
    dx_in = np.zeros_like(x_in)
    np.add.at(dx_in, rows.reshape(-1), dx.reshape(-1, x_in.shape[1]))
    assert rel_err(dx_in, arrays["input_deriv:input"]) < 1e-3
    assert compare_case_grads(arrays, comp.export_gradient(grad), "comp") == 2


def test_affine_config_defaults_and_errors():
    comp = from_config(CONFIGS["AffineComponent"])
    assert (comp.input_dim, comp.output_dim) == (6, 4)
    assert comp.learning_rate == pytest.approx(0.001) and comp.orthonormal_constraint == 0
    comp = from_config("component name=a type=AffineComponent input-dim=400 output-dim=300 "
                       "bias-stddev=0 learning-rate-factor=0.5 max-change=0.75")
    assert np.all(comp.bias_params == 0)
    assert np.std(comp.linear_params) == pytest.approx(1 / 20, rel=0.05)
    text = serialize(comp)[0]
    assert text.startswith(b"<AffineComponent> <LearningRateFactor> 0.5 <MaxChange> 0.75 "
                           b"<LearningRate> 0.001 <LinearParams>")
    for bad in ("input-dim=6", "input-dim=6 output-dim=4 bias-mean=1",
                "input-dim=6 output-dim=x", "input-dim=6 output-dim=4 learning-rate=-1",
                "input-dim=0 output-dim=4"):
        with pytest.raises(ConfigError):
            from_config(f"component name=a type=AffineComponent {bad}")


def test_natural_gradient_affine_options():
    comp = from_config(CONFIGS["NaturalGradientAffineComponent"])
    assert (comp.rank_in, comp.rank_out, comp.update_period) == (3, 2, 4)
    comp = from_config("component name=a type=NaturalGradientAffineComponent input-dim=100 "
                       "output-dim=300 bias-mean=2 bias-stddev=0 rank-in=7 alpha=2 "
                       "orthonormal-constraint=1")
    assert (comp.rank_in, comp.rank_out, comp.alpha) == (7, 80, 2.0)
    assert np.all(comp.bias_params == 2)
    text = serialize(comp)[0]
    assert b"<RankIn> 7 <RankOut> 80 <OrthonormalConstraint> 1 <UpdatePeriod> 4 " \
           b"<NumSamplesHistory> 2000 <Alpha> 2 </NaturalGradientAffineComponent> " in text


def test_natural_gradient_affine_legacy_tokens():
    comp = from_config(CONFIGS["NaturalGradientAffineComponent"])
    text = serialize(comp)[0]
    legacy = text.replace(b"</NaturalGradientAffineComponent>",
                          b"<MaxChangePerSample> 0.1 <IsGradient> T <UpdateCount> 3 "
                          b"<ActiveScalingCount> 0 <MaxChangeScaleStats> 0 "
                          b"<NaturalGradientAffineComponent>")
    again = read_component(make_reader(legacy))
    assert again.is_gradient
    np.testing.assert_allclose(again.linear_params, comp.linear_params, rtol=1e-6)


def test_linear_propagate_adds_and_dtypes():
    comp = from_config(CONFIGS["LinearComponent"])
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    out = np.ones((3, 4), np.float32)
    comp.propagate(None, x, out)
    np.testing.assert_allclose(out, 1 + x @ comp.params_.T, rtol=1e-5)
    out64 = np.zeros((3, 4))
    comp.propagate(None, x.astype(np.float64), out64)
    assert out64.dtype == np.float64
    np.testing.assert_allclose(out64, out - 1, rtol=1e-5)


def test_repeated_and_block_config_errors():
    for bad in ("input-dim=7 output-dim=9 num-repeats=3", "input-dim=6 output-dim=9"):
        with pytest.raises(ConfigError):
            from_config(f"component name=a type=RepeatedAffineComponent {bad}")
    with pytest.raises(ConfigError):
        from_config("component name=a type=BlockAffineComponent input-dim=6 output-dim=5 "
                    "num-blocks=2")
    comp = from_config(CONFIGS["BlockAffineComponent"])
    assert comp.linear_params.shape == (4, 3) and comp.input_dim == 6


def test_non_finite_parameters_rejected():
    comp = from_config(CONFIGS["AffineComponent"])
    comp.linear_params[1, 2] = np.nan
    text, binary = serialize(comp)
    for data in (text, binary):
        with pytest.raises(FormatError, match="non-finite"):
            read_component(make_reader(data, "<test>"))


def test_fixed_affine_matrix_file(tmp_path):
    mat = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = make_writer(False)
    w.write_matrix(mat)
    (tmp_path / "m.txt").write_bytes(w.getvalue())
    comp = from_config(f"component name=a type=FixedAffineComponent matrix={tmp_path}/m.txt")
    np.testing.assert_array_equal(comp.linear_params, mat[:, :3])
    np.testing.assert_array_equal(comp.bias_params, mat[:, 3])
    with pytest.raises(ConfigError):
        from_config(f"component name=a type=FixedAffineComponent matrix={tmp_path}/none")
