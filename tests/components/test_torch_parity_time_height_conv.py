"""TimeHeightConvolutionComponent on the torch backend equals the NumPy backend
(issue 17): height padding, height subsampling, optional time offsets whose input
rows are absent (time padding), shuffled row orders; Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.time_height_conv import TimeHeightConvolutionComponent
from tests.compiler import nets as N
from tests.components.common import cfg
from tests.components.torch_parity import (
    check_component,
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")

CONV = ("type=TimeHeightConvolutionComponent num-filters-in=2 num-filters-out=3 height-in=6 "
        "height-out=3 height-subsample-out=2 time-offsets=-1,0,1 height-offsets=-1,0,1 "
        "bias-stddev=0.5")

NET = f"""
input-node name=input dim=12
component name=conv {CONV}
component-node name=conv component=conv input=input
output-node name=output input=conv
"""


@pytest.mark.parametrize("optimize", [False, True])
def test_conv_network_matches_numpy(optimize):
    check_network(NET, {"input": N.frames(-1, 9, n=2)}, {"output": N.frames(0, 8, n=2)},
                  optimize=optimize)


def test_conv_forward_only_matches_numpy():
    check_network(NET, {"input": N.frames(-1, 9, n=2)}, {"output": N.frames(0, 8, n=2)},
                  model_deriv=False, input_deriv=False)


def test_conv_with_absent_optional_inputs_matches_numpy():
    """Offsets -2 and 2 are optional; at the edges their rows are absent (time
    padding), and the input rows come in a shuffled order."""
    comp = TimeHeightConvolutionComponent.from_config(
        cfg("component name=c type=TimeHeightConvolutionComponent num-filters-in=3 "
            "num-filters-out=2 height-in=4 height-out=4 time-offsets=-2,0,2 "
            "height-offsets=-1,0,1 required-time-offsets=0 bias-stddev=1"),
        np.random.default_rng(5))
    inp = N.frames(0, 7, n=2)
    inp = inp[np.random.default_rng(2).permutation(len(inp))]
    out = N.frames(0, 7, n=2)
    pre = comp.precompute_indexes(inp, out, True)
    assert (pre.src < 0).any()  # some absent inputs
    check_component(comp, inp, out)


@pytest.mark.parametrize("case", reference_params("TimeHeightConvolution"))
def test_conv_reference_cases_on_torch(case):
    check_reference_case(case)
