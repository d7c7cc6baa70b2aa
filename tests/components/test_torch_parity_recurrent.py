"""The LSTM / GRU / output-GRU nonlinearities on the torch backend equal the NumPy
backend (issue 17): values, input derivatives and parameter gradients, with LSTM
self-repair active on some cells and not others; Kaldi's reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import (
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


def _net(component_line: str, input_dim: int) -> str:
    return f"""
input-node name=input dim={input_dim}
component name=rnn {component_line}
component-node name=rnn component=rnn input=input
output-node name=output input=rnn
"""


def _some_lstm_stats(nnet) -> None:
    """Statistics that leave self-repair on for some cells and off for others."""
    comp = nnet.components["rnn"]
    rng = np.random.default_rng(7)
    comp.deriv_avg[...] = rng.uniform(0.0, 0.4, comp.deriv_avg.shape)
    comp.value_avg[...] = rng.uniform(0.0, 1.0, comp.value_avg.shape)
    comp.count = 20.0


@pytest.mark.parametrize("use_dropout", [False, True])
@pytest.mark.parametrize("with_stats", [False, True])
def test_lstm_nonlinearity_matches_numpy(use_dropout, with_stats):
    line = (f"type=LstmNonlinearityComponent cell-dim=6 use-dropout={str(use_dropout).lower()} "
            "self-repair-scale=0.01")
    net = _net(line, 30 + (3 if use_dropout else 0))
    check_network(net, {"input": N.frames(0, 9, n=2)}, {"output": N.frames(0, 9, n=2)},
                  prepare=_some_lstm_stats if with_stats else None)


@pytest.mark.parametrize("recurrent_dim", [5, 3])
def test_gru_nonlinearity_matches_numpy(recurrent_dim):
    input_dim = 4 * 5 if recurrent_dim == 5 else 3 * 5 + 2 * recurrent_dim
    net = _net(f"type=GruNonlinearityComponent cell-dim=5 recurrent-dim={recurrent_dim}",
               input_dim)
    check_network(net, {"input": N.frames(0, 9, n=2)}, {"output": N.frames(0, 9, n=2)})


def test_output_gru_nonlinearity_matches_numpy():
    net = _net("type=OutputGruNonlinearityComponent cell-dim=4", 12)
    check_network(net, {"input": N.frames(0, 9, n=2)}, {"output": N.frames(0, 9, n=2)})


@pytest.mark.parametrize("case", reference_params("LstmNonlinearity", "GruNonlinearity",
                                                  "OutputGruNonlinearity"))
def test_recurrent_reference_cases_on_torch(case):
    check_reference_case(case)
