"""DistributeComponent on the torch backend equals the NumPy backend (issue 17):
every block requested, only some blocks (the input derivative is zeroed where no
output reads), shuffled rows; Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.distribute import DistributeComponent
from tests.components.torch_parity import (
    check_component,
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")

NET = """
input-node name=input dim=6
component name=dist type=DistributeComponent input-dim=6 output-dim=2
component-node name=dist component=dist input=input
output-node name=output input=dist
"""


def _rows(ts, xs, n=2) -> np.ndarray:
    return np.array([[s, t, x] for s in range(n) for t in ts for x in xs], dtype=np.int64)


@pytest.mark.parametrize("blocks", [[0, 1, 2], [0, 2]], ids=["all", "gaps"])
def test_distribute_network_matches_numpy(blocks):
    check_network(NET, {"input": _rows(range(5), [0])}, {"output": _rows(range(5), blocks)})


def test_distribute_shuffled_rows_match_numpy():
    comp = DistributeComponent(6, 3)
    rng = np.random.default_rng(3)
    inp = _rows(range(4), [0, 1])
    out = _rows(range(4), [0, 1, 2, 3])
    check_component(comp, inp[rng.permutation(len(inp))], out[rng.permutation(len(out))])


@pytest.mark.parametrize("case", reference_params("Distribute"))
def test_distribute_reference_cases_on_torch(case):
    check_reference_case(case)
