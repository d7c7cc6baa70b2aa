"""TdnnComponent on the torch backend equals the NumPy backend (issue 17): through
pynnet3.run on small networks (contiguous offset runs), called directly on row
orders where the offsets' rows must be gathered, and Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.tdnn import TdnnComponent
from tests.compiler import nets as N
from tests.components.common import cfg
from tests.components.torch_parity import (
    check_component,
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")

NET = """
input-node name=input dim=4
component name=t1 type=TdnnComponent input-dim=4 output-dim=5 time-offsets=-1,0,2
component-node name=tdnn1 component=t1 input=input
component name=t2 type=TdnnComponent input-dim=5 output-dim=3 time-offsets=0,3 use-bias=false
component-node name=tdnn2 component=t2 input=tdnn1
component name=t3 type=TdnnComponent input-dim=3 output-dim=2 time-offsets=0
component-node name=tdnn3 component=t3 input=tdnn2
output-node name=output input=tdnn3
"""


@pytest.mark.parametrize("optimize", [False, True])
def test_tdnn_network_matches_numpy(optimize):
    check_network(NET, {"input": N.frames(-1, 12, n=3)}, {"output": N.frames(0, 7, n=3)},
                  optimize=optimize)


# A wide input and a narrow output: a forward-only run multiplies the offsets' blocks
# one by one (affine.matmul_blocks_into) instead of splicing them.
NARROW = """
input-node name=input dim=8
component name=t type=TdnnComponent input-dim=8 output-dim=2 time-offsets=-1,0,1
component-node name=tdnn component=t input=input
output-node name=output input=tdnn
"""


@pytest.mark.parametrize("config", [NET, NARROW], ids=["deep", "narrow"])
def test_tdnn_forward_only_matches_numpy(config):
    check_network(config, {"input": N.frames(-1, 12, n=2)}, {"output": N.frames(0, 7, n=2)},
                  model_deriv=False, input_deriv=False)


@pytest.mark.parametrize("use_bias", ["true", "false"])
def test_tdnn_gathered_rows_match_numpy(use_bias):
    """Input rows in a shuffled order: the offsets' rows are gathered (no runs)."""
    comp = TdnnComponent.from_config(
        cfg(f"component name=t type=TdnnComponent input-dim=3 output-dim=4 "
            f"time-offsets=-2,0,1 use-bias={use_bias}"), np.random.default_rng(3))
    inp = N.frames(-2, 9, n=2)
    inp = inp[np.random.default_rng(1).permutation(len(inp))]
    pre = comp.precompute_indexes(inp, N.frames(0, 8, n=2), True)
    assert pre.starts is None  # the gather path
    check_component(comp, inp, N.frames(0, 8, n=2))


@pytest.mark.parametrize("case", reference_params("Tdnn"))
def test_tdnn_reference_cases_on_torch(case):
    check_reference_case(case)


def test_offset_gather_and_scatter_with_absent_rows_match_numpy():
    """gather_offset / scatter_add_offset where some output rows have no input row
    for an offset (-1: zero rows in, nothing added back), NumPy against torch, and
    against the definition."""
    from pynnet3.components.tdnn import OffsetGather, gather_offset, scatter_add_offset

    rng = np.random.default_rng(9)
    src = np.array([[3, -1, 0, 5, -1], [1, 2, -1, 4, 0]], dtype=np.int64)
    pre = OffsetGather(src, 6)
    x = rng.standard_normal((6, 4))
    vals = rng.standard_normal((5, 4))
    for k in range(2):
        want = np.where(src[k][:, None] >= 0, x[np.maximum(src[k], 0)], 0.0)
        np.testing.assert_array_equal(gather_offset(pre, k, x), want)
        np.testing.assert_array_equal(gather_offset(pre, k, torch.from_numpy(x)).numpy(), want)
        target = rng.standard_normal((6, 4))
        expect = target.copy()
        for j, row in enumerate(src[k]):
            if row >= 0:
                expect[row] += vals[j]
        t_np, t_torch = target.copy(), torch.from_numpy(target.copy())
        scatter_add_offset(pre, k, t_np, vals)
        scatter_add_offset(pre, k, t_torch, torch.from_numpy(vals))
        np.testing.assert_allclose(t_np, expect, rtol=1e-15)
        np.testing.assert_allclose(t_torch.numpy(), expect, rtol=1e-15)
