"""Scales, offsets and constants (scale_offset.py) on the torch backend equal the
NumPy backend (issue 17); Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import (
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


def _net(line: str, dim: int = 8) -> str:
    return (f"input-node name=input dim={dim}\n"
            f"component name=c {line}\n"
            "component-node name=c component=c input=input\n"
            "output-node name=output input=c\n")


LINES = [
    "type=FixedScaleComponent dim=8 scale=0.75",
    "type=FixedBiasComponent dim=8",
    "type=PerElementScaleComponent dim=8 param-stddev=0.5",
    "type=NaturalGradientPerElementScaleComponent dim=8 param-stddev=0.5",
    "type=PerElementOffsetComponent dim=8 block-dim=4 param-stddev=0.5",
    "type=ScaleAndOffsetComponent dim=8 block-dim=4",
    "type=ConstantFunctionComponent input-dim=8 output-dim=5 output-stddev=1",
]


@pytest.mark.parametrize("line", LINES, ids=lambda s: s.split()[0][5:])
def test_component_matches_numpy(line):
    def prepare(nnet):
        c = nnet.components["c"]
        if hasattr(c, "scales"):  # away from 1, one of them near 0 (ScaleAndOffset floors)
            c.scales = np.linspace(-1.5, 1.5, c.scales.size).astype(np.float32)
            c.scales[1] = 1e-7
        if hasattr(c, "bias") and not np.any(c.bias):
            c.bias = np.linspace(-1, 1, c.bias.size).astype(np.float32)
    check_network(_net(line), {"input": N.frames(0, 6, n=2)},
                  {"output": N.frames(0, 6, n=2)}, prepare=prepare)


def test_constant_component_matches_numpy():
    """ConstantComponent has no input at all."""
    net = ("input-node name=input dim=5\n"
           "component name=c type=ConstantComponent output-dim=5 output-stddev=1\n"
           "component-node name=c component=c input=c\n"
           "output-node name=output input=Sum(input, c)\n")
    check_network(net, {"input": N.frames(0, 6, n=2)}, {"output": N.frames(0, 6, n=2)})


@pytest.mark.parametrize("case", reference_params(
    "FixedScale", "FixedBias", "PerElementScale", "NaturalGradientPerElementScale",
    "PerElementOffset", "ScaleAndOffset", "Constant", "ConstantFunction"))
def test_reference_cases_on_torch(case):
    check_reference_case(case)
