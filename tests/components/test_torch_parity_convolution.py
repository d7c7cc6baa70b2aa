"""The old 3-D ConvolutionComponent and MaxpoolingComponent on the torch backend equal
the NumPy backend (issue 17): overlapping patches (several scatter layers), both
input vectorizations, overlapping pools with ties; Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.convolution import MaxpoolingComponent
from tests.compiler import nets as N
from tests.components.common import cfg
from tests.components.torch_parity import (
    check_component,
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("order", ["zyx", "yzx"])
def test_convolution_network_matches_numpy(order):
    net = f"""
input-node name=input dim=60
component name=conv type=ConvolutionComponent input-x-dim=3 input-y-dim=5 input-z-dim=4 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 filt-y-step=1 num-filters=3 input-vectorization-order={order}
component-node name=conv component=conv input=input
output-node name=output input=conv
"""  # noqa: E501
    check_network(net, {"input": N.frames(0, 7, n=2)}, {"output": N.frames(0, 7, n=2)})


def test_maxpooling_network_matches_numpy():
    net = """
input-node name=input dim=84
component name=pool type=MaxpoolingComponent input-x-dim=2 input-y-dim=7 input-z-dim=6 pool-x-size=2 pool-y-size=3 pool-z-size=2 pool-x-step=1 pool-y-step=2 pool-z-step=2
component-node name=pool component=pool input=input
output-node name=output input=pool
"""  # noqa: E501
    check_network(net, {"input": N.frames(0, 7, n=2)}, {"output": N.frames(0, 7, n=2)})


def test_maxpooling_ties_match_numpy():
    """Rounded inputs give ties: every tied member gets the pool's derivative."""
    comp = MaxpoolingComponent.from_config(cfg(
        "component name=p type=MaxpoolingComponent input-x-dim=1 input-y-dim=4 "
        "input-z-dim=3 pool-x-size=1 pool-y-size=2 pool-z-size=3 pool-x-step=1 "
        "pool-y-step=1 pool-z-step=3"))
    rows = N.frames(0, 10)
    x = np.round(np.random.default_rng(2).standard_normal((10, 12)))
    check_component(comp, rows, rows, in_value=x)


@pytest.mark.parametrize("case", reference_params("Convolution", "Maxpooling"))
def test_convolution_reference_cases_on_torch(case):
    check_reference_case(case)
