"""Per-element scale/offset components and constant outputs."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import Flags
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader
from pynnet3.io.model_file import read_component
from tests.components.common import from_config, rel_err, roundtrip_spans
from tests.components.test_affine import (
    _backward,
    _forward,
    check_in_place,
    component_spans,
    direct_cases,
    files_with_types,
    gradient_check,
    malformed_checks,
    reread,
    run_direct_case,
    serialize,
)
from tests.reference import REF, load_case, load_components, ref_params, require_reference

TYPES = ("FixedScaleComponent", "FixedBiasComponent", "PerElementScaleComponent",
         "NaturalGradientPerElementScaleComponent", "PerElementOffsetComponent",
         "ScaleAndOffsetComponent", "ConstantComponent", "ConstantFunctionComponent")

CONFIGS = {
    "FixedScaleComponent": "component name=a type=FixedScaleComponent dim=5",
    "FixedBiasComponent": "component name=a type=FixedBiasComponent dim=5",
    "PerElementScaleComponent":
        "component name=a type=PerElementScaleComponent dim=5 param-stddev=1",
    "NaturalGradientPerElementScaleComponent":
        "component name=a type=NaturalGradientPerElementScaleComponent dim=5 param-stddev=1",
    "PerElementOffsetComponent":
        "component name=a type=PerElementOffsetComponent dim=6 block-dim=2 param-stddev=1",
    "ScaleAndOffsetComponent": "component name=a type=ScaleAndOffsetComponent dim=6 block-dim=3",
    "ConstantComponent": "component name=a type=ConstantComponent output-dim=4 output-stddev=1",
    "ConstantFunctionComponent":
        "component name=a type=ConstantFunctionComponent input-dim=3 output-dim=4 "
        "output-stddev=1",
}

U = Flags.SIMPLE | Flags.UPDATABLE
EXPECTED_FLAGS = {
    "FixedScaleComponent": Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE,
    "FixedBiasComponent": Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE,
    "PerElementScaleComponent":
        U | Flags.BACKPROP_NEEDS_INPUT | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE,
    "NaturalGradientPerElementScaleComponent":
        U | Flags.BACKPROP_NEEDS_INPUT | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_IN_PLACE,
    "PerElementOffsetComponent":
        U | Flags.BACKPROP_IN_PLACE | Flags.PROPAGATE_IN_PLACE | Flags.OUTPUT_CONTIGUOUS,
    "ScaleAndOffsetComponent":
        U | Flags.BACKPROP_IN_PLACE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_NEEDS_OUTPUT
        | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS,
    "ConstantComponent": Flags.UPDATABLE,
    "ConstantFunctionComponent": U | Flags.BACKPROP_ADDS,
}


def _perturbed(type_name):
    """Config-initialized component with non-trivial parameters (Kaldi's tests
    perturb them too)."""
    comp = from_config(CONFIGS[type_name])
    rng = np.random.default_rng(5)
    for arr in comp.params().values():
        arr += 0.3 * rng.standard_normal(arr.shape).astype(arr.dtype)
    return comp


@pytest.mark.parametrize("path", ref_params(files_with_types(TYPES)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_reference_roundtrip(path):
    assert roundtrip_spans(path, TYPES) > 0


def test_reference_roundtrip_covers_every_type():
    require_reference()
    found = set()
    for f in files_with_types(TYPES):
        for _, t, comp, _, _ in component_spans(f):
            found.add(t)
            found.update(c.type_name for c in getattr(comp, "components", []))
    assert set(TYPES) <= found


@pytest.mark.parametrize("type_name", TYPES)
def test_gradients(type_name):
    gradient_check(_perturbed(type_name))


@pytest.mark.parametrize("type_name", TYPES)
def test_in_place(type_name):
    check_in_place(_perturbed(type_name))


@pytest.mark.parametrize("type_name", TYPES)
def test_properties(type_name):
    assert from_config(CONFIGS[type_name]).properties() == EXPECTED_FLAGS[type_name]


def test_properties_depend_on_options():
    assert not from_config("component name=a type=PerElementOffsetComponent dim=4") \
        .properties() & Flags.OUTPUT_CONTIGUOUS
    assert not from_config("component name=a type=ScaleAndOffsetComponent dim=4") \
        .properties() & (Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS)
    fixed = from_config("component name=a type=ConstantFunctionComponent input-dim=4 "
                        "output-dim=4 is-updatable=false")
    assert fixed.properties() == Flags.SIMPLE | Flags.PROPAGATE_IN_PLACE | Flags.BACKPROP_ADDS
    assert fixed.params() == {}
    assert from_config("component name=a type=ConstantComponent output-dim=2 "
                       "is-updatable=false").properties() == Flags.NONE


@pytest.mark.parametrize("type_name", TYPES)
def test_config_roundtrip_and_malformed(type_name):
    comp = _perturbed(type_name)
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


def test_reference_case_constant():
    """output = Sum(input, constant); the constant node needs no input rows."""
    case = REF / "components" / "Constant_1"
    require_reference()
    _, arrays, _ = load_case(case)
    comp = load_components(case / "model.txt")["constant"]
    deps = comp.input_indexes(np.array([[0, 5, 0], [1, 2, 0]]))
    assert len(deps.owner) == 0 and not deps.any_suffices
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    out = np.empty((len(x), comp.output_dim), np.float32)
    comp.propagate(None, np.zeros((0, comp.input_dim), np.float32), out)
    assert rel_err(x + out, arrays["output:output"]) < 1e-4
    grad = {"output": np.zeros_like(comp.output)}
    comp.backprop(None, None, out, dy, None, grad, None)
    assert rel_err(grad["output"], arrays["grad:constant:output"]) < 1e-3


def test_reference_case_constant_function():
    """output = Sum(comp(input), affine(input)) with comp a ConstantFunction."""
    case = REF / "components" / "ConstantFunction_1"
    require_reference()
    _, arrays, _ = load_case(case)
    comps = load_components(case / "model.txt")
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    out = np.zeros((len(x), 5), np.float32)
    dx = np.zeros_like(x)
    grads = {}
    for name in ("comp", "affine"):
        y, memo = _forward(comps[name], x)
        out += y
        d, grads[name] = _backward(comps[name], x, y, dy, memo)
        dx += d
    assert rel_err(out, arrays["output:output"]) < 1e-4
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3
    for key in ("grad:comp:output", "grad:affine:linear_params", "grad:affine:bias_params"):
        _, name, param = key.split(":")
        assert rel_err(grads[name][param], arrays[key]) < 1e-3


def test_config_defaults_and_errors():
    comp = from_config("component name=a type=PerElementScaleComponent dim=3")
    np.testing.assert_array_equal(comp.scales, np.ones(3))
    comp = from_config("component name=a type=NaturalGradientPerElementScaleComponent dim=3")
    assert (comp.rank, comp.update_period, comp.alpha) == (8, 10, 4.0)
    comp = from_config("component name=a type=ScaleAndOffsetComponent dim=6 block-dim=2 rank=5")
    np.testing.assert_array_equal(comp.scales, np.ones(2))
    np.testing.assert_array_equal(comp.offsets, np.zeros(2))
    assert b"<UseNaturalGradient> T <Rank> 5 </ScaleAndOffsetComponent>" in serialize(comp)[0]
    comp = from_config("component name=a type=FixedScaleComponent dim=3 scale=0.5")
    np.testing.assert_array_equal(comp.scales, np.full(3, 0.5))
    comp = from_config("component name=a type=PerElementOffsetComponent dim=4")
    np.testing.assert_array_equal(comp.offsets, np.zeros(4))
    assert serialize(comp)[0].endswith(
        b"<Dim> 4 <UseNaturalGradient> T </PerElementOffsetComponent> ")
    for bad in ("type=PerElementScaleComponent", "type=PerElementScaleComponent dim=3 foo=1",
                "type=PerElementOffsetComponent dim=6 block-dim=4",
                "type=ScaleAndOffsetComponent dim=0", "type=FixedBiasComponent dim=-1",
                "type=ConstantFunctionComponent output-dim=3",
                "type=ConstantComponent output-dim=3 is-updatable=maybe",
                "type=NaturalGradientPerElementScaleComponent dim=3 vector=x"):
        with pytest.raises(ConfigError):
            from_config(f"component name=a {bad}")


def test_scale_and_offset_near_zero_scales():
    """Propagate uses scales pushed out to +-1e-4; the input derivative uses the raw
    scales (a Kaldi quirk we reproduce)."""
    comp = from_config("component name=a type=ScaleAndOffsetComponent dim=3")
    comp.scales[:] = [0.0, -1e-6, 2.0]
    x = np.ones((2, 3), np.float32)
    out, memo = _forward(comp, x)
    np.testing.assert_allclose(out[0], [1e-4, -1e-4, 2.0], rtol=1e-6)
    dx = np.zeros_like(x)
    comp.backprop(None, x, out, np.ones_like(x), memo, None, dx)
    np.testing.assert_allclose(dx[0], [0.0, -1e-6, 2.0], rtol=1e-6)


def test_legacy_and_optional_tokens():
    # PerElementOffset written before <Dim>/<UseNaturalGradient> existed.
    comp = read_component(make_reader(
        b"<PerElementOffsetComponent> <LearningRate> 0.01 <Offsets>  [ 1 2 ]\n"
        b"<IsGradient> T </PerElementOffsetComponent> "))
    assert (comp.dim, comp.use_natural_gradient, comp.is_gradient) == (2, True, True)
    # NaturalGradientPerElementScale with the removed <MaxChangePerMinibatch>.
    comp = read_component(make_reader(
        b"<NaturalGradientPerElementScaleComponent> <LearningRate> 0.001 <Params>  [ 1 2 ]\n"
        b"<IsGradient> F <Rank> 8 <UpdatePeriod> 10 <NumSamplesHistory> 2000 <Alpha> 4 "
        b"<MaxChangePerMinibatch> 0.5 </NaturalGradientPerElementScaleComponent> "))
    assert comp.rank == 8 and serialize(comp)[0].endswith(
        b"<Alpha> 4 </NaturalGradientPerElementScaleComponent> ")
    # ConstantFunction without a learning rate (Kaldi defaults it to 0.001).
    comp = read_component(make_reader(
        b"<ConstantFunctionComponent> <InputDim> 2 <Output>  [ 1 2 3 ]\n"
        b"<IsUpdatable> F <UseNaturalGradient> T </ConstantFunctionComponent> "))
    assert (comp.input_dim, comp.output_dim, comp.learning_rate) == (2, 3, 0.001)
    # FixedScale with the opening tag repeated (Kaldi's ExpectOneOrTwoTokens).
    comp = read_component(make_reader(
        b"<FixedScaleComponent> <FixedScaleComponent> <Scales>  [ 1 2 ]\n"
        b"</FixedScaleComponent> "))
    np.testing.assert_array_equal(comp.scales, [1, 2])


def test_bad_files():
    for data in (b"<ScaleAndOffsetComponent> <LearningRate> 0.001 <Dim> 5 <Scales>  [ 1 2 ]\n"
                 b"<Offsets>  [ 0 0 ]\n<UseNaturalGradient> T <Rank> 2 "
                 b"</ScaleAndOffsetComponent> ",
                 b"<FixedBiasComponent> <Bias>  [ 1 nan ]\n</FixedBiasComponent> ",
                 b"<PerElementScaleComponent> <LearningRate> 0.001 <Params>  [ 1 inf ]\n"
                 b"</PerElementScaleComponent> ",
                 b"<ConstantComponent> <LearningRate> 0.001 <Output>  [ 1 2 ]\n"
                 b"<IsUpdatable> X <UseNaturalGradient> T </ConstantComponent> "):
        with pytest.raises(FormatError):
            read_component(make_reader(data, "<test>"))
