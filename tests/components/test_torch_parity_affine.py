"""The affine family (affine.py) on the torch backend equals the NumPy backend
(issue 17): every type, spliced inputs read as column blocks (training: one GEMM
per block into the weight gradient; decoding: one GEMM per block into the output),
float32 parameters in a float64 run; Kaldi's reference cases."""

from __future__ import annotations

import pytest

from tests.compiler import nets as N
from tests.components.torch_parity import (
    check_network,
    check_reference_case,
    reference_params,
)

torch = pytest.importorskip("torch")


def _net(line: str, in_dim: int, spliced: bool = False) -> str:
    src = "Append(Offset(input,-1),input,Offset(input,1))" if spliced else "input"
    dim = in_dim // 3 if spliced else in_dim
    return (f"input-node name=input dim={dim}\n"
            f"component name=c {line}\n"
            f"component-node name=c component=c input={src}\n"
            "output-node name=output input=c\n")


LINES = [
    "type=AffineComponent input-dim=12 output-dim=5",
    "type=NaturalGradientAffineComponent input-dim=12 output-dim=5",
    "type=LinearComponent input-dim=12 output-dim=5",
    "type=FixedAffineComponent input-dim=12 output-dim=5",
    "type=RepeatedAffineComponent input-dim=12 output-dim=6 num-repeats=3",
    "type=NaturalGradientRepeatedAffineComponent input-dim=12 output-dim=6 num-repeats=3",
    "type=BlockAffineComponent input-dim=12 output-dim=6 num-blocks=3",
]
IDS = [s.split()[0][5:] for s in LINES]


@pytest.mark.parametrize("line", LINES, ids=IDS)
def test_affine_type_matches_numpy(line):
    check_network(_net(line, 12), {"input": N.frames(0, 6, n=2)},
                  {"output": N.frames(0, 6, n=2)})


@pytest.mark.parametrize("line", LINES[:3], ids=IDS[:3])
@pytest.mark.parametrize("train", [True, False], ids=["train", "decode"])
def test_spliced_input_blocks_match_numpy(line, train):
    check_network(_net(line, 12, spliced=True), {"input": N.frames(-1, 7, n=2)},
                  {"output": N.frames(0, 6, n=2)}, model_deriv=train, input_deriv=train)


@pytest.mark.parametrize("case", reference_params(
    "Affine", "NaturalGradientAffine", "Linear", "FixedAffine", "RepeatedAffine",
    "NaturalGradientRepeatedAffine", "BlockAffine"))
def test_reference_cases_on_torch(case):
    check_reference_case(case)
