"""BatchNorm (batchnorm.py) and the dropout family (dropout.py) on the torch
backend equal the NumPy backend (issue 17): BatchNorm in training mode (statistics
stored, compared after each run) and test mode, with block-dim; the random
components in training mode draw the same masks from the same generator states
(the generators' positions compared after each run) and pass through in test
mode; Kaldi's reference cases."""

from __future__ import annotations

import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import check_reference_case, reference_params
from tests.components.torch_state import check_copies

torch = pytest.importorskip("torch")

IO = ({"input": N.frames(0, 9, n=2)}, {"output": N.frames(0, 9, n=2)})


def _net(line: str, dim: int = 8) -> str:
    return (f"input-node name=input dim={dim}\n"
            f"component name=c {line}\n"
            "component-node name=c component=c input=input\n"
            "output-node name=output input=c\n")


@pytest.mark.parametrize("line", [
    "type=BatchNormComponent dim=8 target-rms=0.5",
    "type=BatchNormComponent dim=8 block-dim=4",
], ids=["whole", "blocks"])
@pytest.mark.parametrize("test_mode", [False, True], ids=["train", "test"])
def test_batchnorm_matches_numpy(line, test_mode):
    def prepare(nnet):  # test mode needs statistics: one training minibatch's worth
        if test_mode:
            c = nnet.components["c"]
            c.count = 18.0
            c.stats_sum = c.stats_sum + 3.0
            c.stats_sumsq = c.stats_sumsq + 40.0
    check_copies(_net(line), *IO, test_mode=test_mode, prepare=prepare)


@pytest.mark.parametrize("line", [
    "type=DropoutComponent dim=8 dropout-proportion=0.3",
    "type=DropoutComponent dim=8 dropout-proportion=0.3 dropout-per-frame=true",
    "type=GeneralDropoutComponent dim=8 block-dim=4 dropout-proportion=0.3",
    "type=GeneralDropoutComponent dim=8 dropout-proportion=0.3 continuous=true",
    "type=GeneralDropoutComponent dim=8 specaugment-max-proportion=0.5 "
    "specaugment-max-regions=2",
    "type=SpecAugmentTimeMaskComponent dim=8 zeroed-proportion=0.3 time-mask-max-frames=3",
], ids=["dropout", "per-frame", "general", "continuous", "specaugment", "time-mask"])
@pytest.mark.parametrize("test_mode", [False, True], ids=["train", "test"])
def test_random_component_matches_numpy(line, test_mode):
    check_copies(_net(line), *IO, test_mode=test_mode, runs=3)


@pytest.mark.parametrize("line", [
    "type=DropoutMaskComponent output-dim=3 dropout-proportion=0.3",
    "type=DropoutMaskComponent output-dim=5 dropout-proportion=0.3 continuous=true",
], ids=["lstm-gates", "continuous"])
@pytest.mark.parametrize("test_mode", [False, True], ids=["train", "test"])
def test_dropout_mask_matches_numpy(line, test_mode):
    """DropoutMask has no input: its mask scales another input here."""
    dim = 3 if "output-dim=3" in line else 5
    net = (f"input-node name=input dim={dim}\n"
           f"component name=c {line}\n"
           "component-node name=c component=c input=c\n"
           f"component name=p type=ElementwiseProductComponent input-dim={2 * dim} "
           f"output-dim={dim}\n"
           "component-node name=p component=p input=Append(input, c)\n"
           "output-node name=output input=p\n")
    check_copies(net, *IO, test_mode=test_mode, runs=3)


@pytest.mark.parametrize("case", reference_params(
    "BatchNorm", "Dropout", "DropoutMask", "GeneralDropout", "SpecAugmentTimeMask"))
def test_reference_cases_on_torch(case):
    check_reference_case(case)


def test_batchnorm_statistics_pending_on_the_device_match_numpy(monkeypatch):
    """CPU tensors treated as a GPU's: the statistics sums stay pending on the
    device across runs and, folded in, equal NumPy's."""
    import numpy as np

    from pynnet3.components import device_stats

    monkeypatch.setattr(device_stats, "_defer",
                        lambda v: not isinstance(v, (np.ndarray, np.generic)))
    check_copies(_net("type=BatchNormComponent dim=8 block-dim=4"), *IO, runs=3)
