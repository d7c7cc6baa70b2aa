"""Statistics extraction and pooling on the torch backend equal the NumPy backend
(issue 17), through every summing strategy of RangeIndexes (one row per window,
short windows, per-window sums, prefix sums) and both spreading strategies
(disjoint and overlapping windows), with shuffled row orders; Kaldi's cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.statistics import (
    StatisticsExtractionComponent,
    StatisticsPoolingComponent,
)
from tests.compiler import nets as N
from tests.components.torch_parity import (
    check_component,
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


def _xvector(out_period: int, left: int, right: int, nlc: int, variance: bool) -> str:
    dim = 1 + 2 * 3 if variance else 1 + 3
    stddev = str(variance).lower()
    return f"""
input-node name=input dim=3
component name=ext type=StatisticsExtractionComponent input-dim=3 input-period=1 output-period={out_period} include-variance={stddev}
component-node name=ext component=ext input=input
component name=pool type=StatisticsPoolingComponent input-dim={dim} input-period={out_period} left-context={left} right-context={right} num-log-count-features={nlc} output-stddevs={stddev}
component-node name=pool component=pool input=ext
output-node name=output input=pool
"""  # noqa: E501


def _times(step: int, t0: int, t1: int, n: int) -> np.ndarray:
    return np.array([[s, t, 0] for s in range(n) for t in range(t0, t1, step)], dtype=np.int64)


@pytest.mark.parametrize("variance,nlc", [(True, 0), (True, 2), (False, 1)])
def test_xvector_pooling_at_one_frame_matches_numpy(variance, nlc):
    """One long window per sequence: per-window sums, disjoint spread."""
    check_network(_xvector(1, 0, 40, nlc, variance), {"input": N.frames(0, 30, n=3)},
                  {"output": _times(1, 0, 1, 3)})


def test_pooling_many_overlapping_windows_matches_numpy():
    """Outputs at every period with wide windows: prefix sums, overlapping spread;
    extraction with output-period 3: short windows."""
    check_network(_xvector(3, 12, 9, 1, True), {"input": N.frames(0, 30, n=2)},
                  {"output": _times(3, 0, 30, 2)})


def test_pooling_short_overlapping_windows_matches_numpy():
    check_network(_xvector(1, 2, 3, 0, True), {"input": N.frames(0, 12, n=2)},
                  {"output": N.frames(0, 12, n=2)})


def test_forward_only_matches_numpy():
    check_network(_xvector(1, 0, 40, 0, True), {"input": N.frames(0, 30, n=2)},
                  {"output": _times(1, 0, 1, 2)}, model_deriv=False, input_deriv=False)


@pytest.mark.parametrize("period", [1, 4])
def test_extraction_with_shuffled_rows_matches_numpy(period):
    comp = StatisticsExtractionComponent(3, 1, period, True)
    rng = np.random.default_rng(4)
    inp = N.frames(0, 16, n=2)
    inp = inp[rng.permutation(len(inp))]
    out = _times(period, 0, 16, 2)
    out = out[rng.permutation(len(out))]
    check_component(comp, inp, out)


@pytest.mark.parametrize("left,right", [(0, 40), (6, 6)])
def test_pooling_with_shuffled_rows_matches_numpy(left, right):
    comp = StatisticsPoolingComponent(7, 1, left, right, num_log_count_features=1,
                                      output_stddevs=True)
    rng = np.random.default_rng(6)
    inp = N.frames(0, 20, n=2)
    inp = inp[rng.permutation(len(inp))]
    out = N.frames(0, 20, n=2)[rng.permutation(40)][:25]
    # stats as an extraction makes them: count 1, x, x^2 (a positive variance)
    x = rng.standard_normal((len(inp), 3))
    stats = np.concatenate([np.ones((len(inp), 1)), x, x * x + 0.5], axis=1)
    check_component(comp, inp, out, in_value=stats)


@pytest.mark.parametrize("case", reference_params("StatisticsExtraction", "StatisticsPooling"))
def test_statistics_reference_cases_on_torch(case):
    check_reference_case(case)


@pytest.mark.parametrize("nlc", [0, 1])
def test_accelerator_strategies_match_numpy(monkeypatch, nlc):
    """The strategies taken on a GPU (xp.launch_bound: prefix sums instead of one sum
    per window, a gather instead of one add per window), run on CPU tensors."""
    from pynnet3.components import xp_torch

    monkeypatch.setattr(xp_torch, "launch_bound", lambda x: True)
    check_network(_xvector(1, 0, 40, nlc, True), {"input": N.frames(0, 30, n=3)},
                  {"output": _times(1, 0, 1, 3)})
