"""RestrictedAttentionComponent on the torch backend equals the NumPy backend
(issue 17): several heads, optional context inputs absent at the edges (zero rows),
with and without the context output, shuffled rows, attention statistics; Kaldi's
reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.attention import RestrictedAttentionComponent
from tests.compiler import nets as N
from tests.components.torch_parity import (
    check_component,
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


def _net(output_context: bool) -> str:
    # per head: key 3 + value 4 + query (3 + context 4) = 14 columns
    return f"""
input-node name=input dim=28
component name=att type=RestrictedAttentionComponent num-heads=2 key-dim=3 value-dim=4 num-left-inputs=2 num-right-inputs=1 num-left-inputs-required=1 num-right-inputs-required=0 time-stride=2 output-context={str(output_context).lower()}
component-node name=att component=att input=input
output-node name=output input=att
"""  # noqa: E501


@pytest.mark.parametrize("output_context", [True, False])
def test_attention_network_matches_numpy(output_context):
    check_network(_net(output_context), {"input": N.frames(0, 12, n=2)},
                  {"output": N.frames(2, 12, n=2)})


def test_attention_shuffled_rows_match_numpy():
    comp = RestrictedAttentionComponent(3, 2, 3, 1, 2, 1, num_left_inputs_required=0,
                                        num_right_inputs_required=1)
    rng = np.random.default_rng(8)
    inp = N.frames(0, 10, n=2)
    out = N.frames(0, 9, n=2)
    check_component(comp, inp[rng.permutation(len(inp))], out[rng.permutation(len(out))])


def test_attention_statistics_match_numpy():
    comp = RestrictedAttentionComponent(2, 3, 2, 2, 1)
    inp, out = N.frames(0, 9), N.frames(2, 8)
    pre = comp.precompute_indexes(inp, out, False)
    x = np.random.default_rng(1).standard_normal((len(inp), comp.input_dim))
    stats = []
    for to in (np.array, torch.from_numpy):
        comp.zero_stats()
        y = to(np.zeros((len(out), comp.output_dim)))
        memo = comp.propagate(pre, to(x.copy()), y)
        comp.store_stats(None, y, memo)
        stats.append((comp.entropy_stats.copy(), comp.posterior_stats.copy(), comp.stats_count))
    np.testing.assert_allclose(stats[1][0], stats[0][0], rtol=1e-12)
    np.testing.assert_allclose(stats[1][1], stats[0][1], rtol=1e-12)
    assert stats[1][2] == stats[0][2] == len(out)
    # the posteriors of every output sum to one per head
    np.testing.assert_allclose(stats[0][1].sum(axis=1), [len(out)] * 2, rtol=1e-12)


@pytest.mark.parametrize("case", reference_params("RestrictedAttention"))
def test_attention_reference_cases_on_torch(case):
    check_reference_case(case)


def test_attention_statistics_stay_on_the_device_until_read(monkeypatch):
    """On a GPU the sums wait on the device (components/device_stats.py), here forced
    for CPU tensors: nothing reaches the host values until they are read, and what is
    read then equals the NumPy backend's statistics; on the meta device (no data)
    storing statistics reads nothing."""
    from pynnet3.components import device_stats

    comp = RestrictedAttentionComponent(2, 3, 2, 2, 1)
    inp, out = N.frames(0, 9), N.frames(2, 8)
    pre = comp.precompute_indexes(inp, out, False)
    x = np.random.default_rng(3).standard_normal((len(inp), comp.input_dim))

    def stats_of(to, runs=2):
        comp.zero_stats()
        for _ in range(runs):
            y = to(np.zeros((len(out), comp.output_dim)))
            comp.store_stats(None, y, comp.propagate(pre, to(x.copy()), y))
        return comp

    want = stats_of(np.array)
    want = (want.entropy_stats.copy(), want.posterior_stats.copy(), want.stats_count)
    monkeypatch.setattr(device_stats, "_defer", lambda value: True)
    got = stats_of(torch.from_numpy)
    assert set(got.__dict__["_pending_stats"]) == {"entropy_stats", "posterior_stats"}
    assert not got.__dict__["_entropy_stats"].any()  # nothing folded in yet
    np.testing.assert_allclose(got.entropy_stats, want[0], rtol=1e-12)
    np.testing.assert_allclose(got.posterior_stats, want[1], rtol=1e-12)
    assert got.stats_count == want[2] and not got.__dict__["_pending_stats"]
    monkeypatch.undo()
    comp.zero_stats()
    meta = torch.device("meta")
    y = torch.empty(len(out), comp.output_dim, device=meta, dtype=torch.float64)
    memo = comp.propagate(pre, torch.empty(len(inp), comp.input_dim, device=meta,
                                           dtype=torch.float64), y)
    comp.store_stats(None, y, memo)  # no host read of a meta tensor
    assert comp.stats_count == len(out)
