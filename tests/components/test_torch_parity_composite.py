"""CompositeComponent on the torch backend equals the NumPy backend (issue 17):
sub-component buffers on the arrays' backend, row chunking (max-rows-process),
sub-component gradients; Kaldi's reference cases."""

from __future__ import annotations

import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import (
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


def _net(max_rows: int) -> str:
    return f"""
input-node name=input dim=5
component name=comp type=CompositeComponent num-components=4 max-rows-process={max_rows} component1='type=AffineComponent input-dim=5 output-dim=4' component2='type=RectifiedLinearComponent dim=4' component3='type=NaturalGradientAffineComponent input-dim=4 output-dim=6' component4='type=TanhComponent dim=6'
component-node name=comp component=comp input=input
output-node name=output input=comp
"""  # noqa: E501


@pytest.mark.parametrize("max_rows", [4096, 5])
def test_composite_network_matches_numpy(max_rows):
    check_network(_net(max_rows), {"input": N.frames(0, 8, n=2)},
                  {"output": N.frames(0, 8, n=2)})


@pytest.mark.parametrize("case", reference_params("Composite"))
def test_composite_reference_cases_on_torch(case):
    check_reference_case(case)
