"""CompositeComponent: nesting, chunked processing, sub-component gradients."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.components.composite import CompositeComponent, sub_component_name
from pynnet3.config import ConfigLine
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader
from pynnet3.io.model_file import read_component
from tests.components.common import cfg, rel_err, roundtrip_spans
from tests.components.test_affine import (
    _backward,
    _forward,
    compare_case_grads,
    files_with_types,
    gradient_check,
    malformed_checks,
    reread,
    serialize,
)
from tests.reference import REF, load_case, load_components, ref_params, require_reference

TYPES = ("CompositeComponent",)


def composite(*subs: str, max_rows: int = 4096, seed: int = 0) -> CompositeComponent:
    """Build from config. The sub-component lines are injected as values directly,
    because they are quoted on a real config line (see test_config_line_quotes)."""
    line = cfg(f"component name=c type=CompositeComponent num-components={len(subs)} "
               f"max-rows-process={max_rows}")
    for i, sub in enumerate(subs, start=1):
        line.values[f"component{i}"] = sub
    return CompositeComponent.from_config(line, np.random.default_rng(seed))


CHAIN = ("type=AffineComponent input-dim=5 output-dim=4",
         "type=PerElementScaleComponent dim=4 param-stddev=0.5",
         "type=BatchNormComponent dim=4 block-dim=2",
         "type=LinearComponent input-dim=4 output-dim=3")


@pytest.mark.parametrize("path", ref_params(files_with_types(TYPES)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_reference_roundtrip(path):
    assert roundtrip_spans(path, TYPES) > 0


@pytest.mark.parametrize("case_name", ["Composite_1", "Composite_2"])
def test_reference_case(case_name):
    case = require_reference() / "components" / case_name
    comp = load_components(case / "model.txt")["comp"]  # a reader error fails the test
    _, arrays, _ = load_case(case)
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    out, memo = _forward(comp, x)
    assert rel_err(out, arrays["output:output"]) < 1e-4
    dx, grad = _backward(comp, x, out, dy, memo)
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3
    assert compare_case_grads(arrays, comp.export_gradient(grad), "comp") == \
        sum(k.startswith("grad:") for k in arrays)


@pytest.mark.parametrize("max_rows", [3, 100])
def test_gradients(max_rows):
    gradient_check(composite(*CHAIN, max_rows=max_rows), num_rows=8)


def test_chunking_matches_whole_batch_without_batch_statistics():
    subs = CHAIN[:2] + CHAIN[3:]
    a, b = composite(*subs, max_rows=2), composite(*subs, max_rows=0)
    x = np.random.default_rng(2).standard_normal((7, 5)).astype(np.float32)
    dy = np.random.default_rng(3).standard_normal((7, 3)).astype(np.float32)
    out_a, memo_a = _forward(a, x)
    out_b, memo_b = _forward(b, x)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-5)
    dx_a, g_a = _backward(a, x, out_a, dy, memo_a)
    dx_b, g_b = _backward(b, x, out_b, dy, memo_b)
    np.testing.assert_allclose(dx_a, dx_b, rtol=1e-5, atol=1e-6)
    for k in g_a:
        np.testing.assert_allclose(g_a[k], g_b[k], rtol=1e-5, atol=1e-6)


def test_propagate_adds_when_last_component_adds():
    comp = composite(CHAIN[0], CHAIN[3])
    x = np.ones((2, 5), np.float32)
    out = np.full((2, 3), 10, np.float32)
    comp.propagate(None, x, out)
    fresh, _ = _forward(comp, x)
    np.testing.assert_allclose(out, fresh + 10, rtol=1e-6)


def test_properties():
    comp = composite(CHAIN[0], CHAIN[3])  # Affine -> Linear
    assert comp.properties() == (Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT | Flags.UPDATABLE
                                 | Flags.PROPAGATE_ADDS | Flags.BACKPROP_ADDS)
    comp = composite("type=FixedScaleComponent dim=4", "type=BatchNormComponent dim=4 "
                     "block-dim=2")
    # last stores stats -> BACKPROP_NEEDS_OUTPUT; never STORES_STATS itself
    assert comp.properties() == (Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT
                                 | Flags.BACKPROP_NEEDS_OUTPUT | Flags.OUTPUT_CONTIGUOUS)
    comp = composite("type=RepeatedAffineComponent input-dim=4 output-dim=4 num-repeats=2",
                     "type=FixedBiasComponent dim=4")
    assert comp.properties() == (Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT | Flags.UPDATABLE
                                 | Flags.BACKPROP_ADDS | Flags.INPUT_CONTIGUOUS)


def test_params_and_gradient_names():
    comp = composite(*CHAIN)
    assert list(comp.params()) == ["0:linear_params", "0:bias_params", "1:scales", "3:params"]
    assert comp.params()["1:scales"] is comp.sub_components()[1].scales
    grad = {k: np.ones_like(v) for k, v in comp.params().items()}
    subs = comp.sub_gradients(grad)
    assert sorted(subs) == [0, 1, 3]
    assert subs[3]["params_vectorized"].shape == (12,)
    assert "3:params_vectorized" in comp.export_gradient(grad)
    assert sub_component_name("comp", 3) == "comp#3"


def test_file_roundtrip_and_malformed():
    comp = composite(*CHAIN, max_rows=7)
    for binary in (False, True):
        again = reread(comp, binary)
        assert [c.type_name for c in again.sub_components()] == \
            [c.type_name for c in comp.sub_components()]
        assert again.max_rows_process == 7
        assert serialize(again)[binary] == serialize(comp)[binary]
    text = serialize(comp)[0]
    assert text.startswith(b"<CompositeComponent> <LearningRate> 0.001 <MaxRowsProcess> 7 "
                           b"<NumComponents> 4 <AffineComponent> ")
    malformed_checks(*serialize(comp))
    with pytest.raises(FormatError):  # dims that do not chain
        read_component(make_reader(text.replace(b"<NumComponents> 4 <AffineComponent>",
                                                b"<NumComponents> 3 <AffineComponent>")
                                   .replace(b"<LinearComponent>", b"<X>")))


def test_config_errors():
    bad_sets = [
        (CHAIN[0], "type=LinearComponent input-dim=5 output-dim=3"),  # dims do not chain
        (CHAIN[0], "type=NoSuchComponent dim=4"),
        (CHAIN[0], "type=ConstantComponent output-dim=4"),  # not simple
        (CHAIN[0], "type=CompositeComponent num-components=1"),
        (CHAIN[0], "type=AffineComponent input-dim=4 output-dim=3 bogus=1"),
        (CHAIN[0], "name=x"),
    ]
    for subs in bad_sets:
        with pytest.raises(ConfigError):
            composite(*subs)
    line = cfg("component name=c type=CompositeComponent num-components=2")
    line.values["component1"] = CHAIN[0]
    with pytest.raises(ConfigError, match="component2"):
        CompositeComponent.from_config(line, np.random.default_rng(0))
    with pytest.raises(ConfigError):
        composite()


def test_defaults():
    comp = composite(CHAIN[0])
    assert comp.max_rows_process == 4096
    assert (comp.input_dim, comp.output_dim) == (5, 4)
    comp = composite(*CHAIN)
    comp.set_test_mode(True)
    assert comp.sub_components()[2].test_mode


def test_config_line_quotes():
    """Kaldi writes sub-component configs as quoted values (component1='type=...')."""
    line = ("component name=c type=CompositeComponent num-components=2 max-rows-process=5 "
            "component1='type=AffineComponent input-dim=6 output-dim=8' "
            "component2='type=PerElementScaleComponent dim=8'")
    cfg = ConfigLine(line)
    assert cfg.values["component1"] == "type=AffineComponent input-dim=6 output-dim=8"
    cfg.get_str("name")
    cfg.get_str("type")
    comp = component_class("CompositeComponent").from_config(cfg, np.random.default_rng(0))
    assert [c.type_name for c in comp.sub_components()] == \
        ["AffineComponent", "PerElementScaleComponent"]
