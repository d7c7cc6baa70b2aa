"""The small simple components (simple_misc.py) on the torch backend equal the
NumPy backend (issue 17), counters and self-repair included; Kaldi's reference
cases."""

from __future__ import annotations

import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import check_reference_case, reference_params
from tests.components.torch_state import check_copies

torch = pytest.importorskip("torch")


def _net(line: str, dim: int) -> str:
    return (f"input-node name=input dim={dim}\n"
            f"component name=c {line}\n"
            "component-node name=c component=c input=input\n"
            "output-node name=output input=c\n")


@pytest.mark.parametrize("line,dim", [
    ("type=SumGroupComponent sizes=1,3,2,2", 8),
    ("type=SumBlockComponent input-dim=8 output-dim=4 scale=0.5", 8),
    ("type=NoOpComponent dim=8 backprop-scale=0.25", 8),
    ("type=ClipGradientComponent dim=8 clipping-threshold=0.5", 8),
    ("type=ClipGradientComponent dim=8 clipping-threshold=1.5 norm-based-clipping=true "
     "self-repair-scale=0.5 self-repair-clipped-proportion-threshold=0.01", 8),
    ("type=BackpropTruncationComponent dim=8 clipping-threshold=2 zeroing-threshold=1.5 "
     "zeroing-interval=3 scale=0.9", 8),
    ("type=ElementwiseProductComponent input-dim=12 output-dim=4", 12),
    ("type=PermuteComponent column-map=3,1,0,2,7,5,4,6", 8),
], ids=["SumGroup", "SumBlock", "NoOp", "ClipGradient", "ClipGradient-norm-repair",
        "BackpropTruncation", "ElementwiseProduct", "Permute"])
def test_component_matches_numpy(line, dim):
    # (three runs: ClipGradient's self-repair starts once clipping has been counted)
    check_copies(_net(line, dim), {"input": N.frames(0, 9, n=2)},
                 {"output": N.frames(0, 9, n=2)}, runs=3)


@pytest.mark.parametrize("case", reference_params(
    "SumGroup", "SumBlock", "NoOp", "ClipGradient", "BackpropTruncation",
    "ElementwiseProduct", "Permute"))
def test_reference_cases_on_torch(case):
    check_reference_case(case)


def test_backprop_truncation_counts_pending_on_the_device_match_numpy(monkeypatch):
    """CPU tensors treated as a GPU's: the clipped / zeroed counts stay pending on
    the device across runs and, folded in, equal NumPy's."""
    import numpy as np

    from pynnet3.components import device_stats

    monkeypatch.setattr(device_stats, "_defer",
                        lambda v: not isinstance(v, (np.ndarray, np.generic)))
    check_copies(_net("type=BackpropTruncationComponent dim=8 clipping-threshold=2 "
                      "zeroing-threshold=1.5 zeroing-interval=3", 8),
                 {"input": N.frames(0, 9, n=2)}, {"output": N.frames(0, 9, n=2)}, runs=3)
