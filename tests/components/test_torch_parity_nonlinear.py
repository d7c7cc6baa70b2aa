"""The nonlinearities (nonlinear.py) on the torch backend equal the NumPy backend
(issue 17): forward, backward, the activation statistics they store, self-repair
(with statistics that trigger it), Kaldi's random repair / storage draws, block-dim
views; Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import check_reference_case, reference_params
from tests.components.torch_state import check_copies

torch = pytest.importorskip("torch")

IO = ({"input": N.frames(0, 7, n=2)}, {"output": N.frames(0, 7, n=2)})


def _net(line: str, dim: int = 8, out_dim: int | None = None) -> str:
    return (f"input-node name=input dim={dim}\n"
            f"component name=c {line}\n"
            "component-node name=c component=c input=input\n"
            "output-node name=output input=c\n")


@pytest.mark.parametrize("line", [
    "type=SigmoidComponent dim=8",
    "type=TanhComponent dim=8",
    "type=RectifiedLinearComponent dim=8",
    "type=SoftmaxComponent dim=8",
    "type=LogSoftmaxComponent dim=8",
    "type=NormalizeComponent dim=8 target-rms=0.5",
    "type=NormalizeComponent dim=8 block-dim=4 add-log-stddev=true",
    "type=PnormComponent input-dim=8 output-dim=4",
], ids=lambda s: s.split()[0][5:] + ("-blocks" if "block" in s else ""))
def test_nonlinearity_matches_numpy(line):
    check_copies(_net(line), *IO)


def _with_stats(deriv_avg: list[float], count: float = 10.0):
    """Give component ``c`` statistics (average derivatives per dimension)."""
    def prepare(nnet):
        c = nnet.components["c"]
        c.count = count
        c.value_sum = np.linspace(-1, 1, c.dim) * count
        c.deriv_sum = np.asarray(deriv_avg, np.float64) * count
    return prepare


# averages below the lower thresholds (0.05 / 0.2), between, and above 0.95
AVGS = [0.01, 0.5, 0.97, 0.1, 0.03, 0.99, 0.6, 0.15]


@pytest.mark.parametrize("line", [
    "type=SigmoidComponent dim=8 self-repair-scale=0.1",
    "type=TanhComponent dim=8 self-repair-scale=0.1",
    "type=RectifiedLinearComponent dim=8 self-repair-scale=0.1",
    "type=RectifiedLinearComponent dim=8 block-dim=4 self-repair-scale=0.1",
], ids=["sigmoid", "tanh", "relu", "relu-blocks"])
def test_self_repair_and_statistics_match_numpy(line):
    """Self-repair changes the input derivative of the dimensions the statistics
    flag; both backends repair the same dimensions and store the same sums."""
    check_copies(_net(line), *IO, prepare=_with_stats(AVGS))


def test_random_repair_and_storage_draws_match_numpy():
    """With a generator, Kaldi's coin flips (repair on about half the minibatches,
    storing stats on about half) come from the same draws on both backends."""
    def prepare(nnet):
        _with_stats(AVGS)(nnet)
        nnet.components["c"].rng = np.random.default_rng(7)
    check_copies(_net("type=RectifiedLinearComponent dim=8 self-repair-scale=0.1"), *IO,
                 prepare=prepare, runs=4)


@pytest.mark.parametrize("case", reference_params(
    "Sigmoid", "Tanh", "RectifiedLinear", "Softmax", "LogSoftmax", "Normalize", "Pnorm"))
def test_reference_cases_on_torch(case):
    check_reference_case(case)


@pytest.fixture
def stats_stay_on_cpu_tensors(monkeypatch):
    """Treat CPU tensors as a GPU's: their statistics sums stay pending on the
    device and self-repair reads them there (what runs on CUDA)."""
    from pynnet3.components import device_stats

    monkeypatch.setattr(device_stats, "_defer",
                        lambda v: not isinstance(v, (np.ndarray, np.generic)))


@pytest.mark.parametrize("line", [
    "type=SigmoidComponent dim=8 self-repair-scale=0.1",
    "type=TanhComponent dim=8 self-repair-scale=0.1",
    "type=RectifiedLinearComponent dim=8 block-dim=4 self-repair-scale=0.1",
    "type=SoftmaxComponent dim=8",
], ids=["sigmoid", "tanh", "relu-blocks", "softmax"])
def test_statistics_pending_on_the_device_match_numpy(line, stats_stay_on_cpu_tensors):
    """Sums kept on the device across three runs (self-repair reading host value
    plus pending sums) give NumPy's derivatives and, folded in, NumPy's statistics."""
    check_copies(_net(line), *IO, prepare=_with_stats(AVGS), runs=3)


def test_pending_statistics_fold_in_when_read(stats_stay_on_cpu_tensors):
    from pynnet3.components.nonlinear import RectifiedLinearComponent

    c = RectifiedLinearComponent(3)
    y = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    c.store_stats(None, y, None)
    assert c.__dict__["_pending_stats"].keys() == {"value_sum", "deriv_sum"}
    assert c.count == 2.0
    np.testing.assert_array_equal(c.value_sum, [4.0, 0.0, 2.0])  # folded on reading
    assert "value_sum" not in c.__dict__["_pending_stats"]
    np.testing.assert_array_equal(c.deriv_sum, [2.0, 0.0, 1.0])
    c.store_stats(None, y, None)
    c.zero_stats()  # drops what is pending too
    np.testing.assert_array_equal(c.value_sum, [0.0, 0.0, 0.0])
    assert not c.__dict__["_pending_stats"]
