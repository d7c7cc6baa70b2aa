"""torch.compile of an exported module works on CPU (a small network: compiling is
the slow part) and gives the eager module's values."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pynnet3  # noqa: E402
from pynnet3.export import to_torch  # noqa: E402

from .common import max_rel, random_inputs, reference_outputs  # noqa: E402

SMALL = """input-node name=input dim=5
input-node name=ivector dim=3
component name=a1 type=AffineComponent input-dim=13 output-dim=8
component-node name=a1 component=a1 input=Append(Offset(input, -1), Offset(input, 1), \
ReplaceIndex(ivector, t, 0))
component name=r1 type=RectifiedLinearComponent dim=8
component-node name=r1 component=r1 input=a1
component name=t2 type=TdnnComponent input-dim=8 output-dim=4 time-offsets=-2,0,2
component-node name=t2 component=t2 input=r1
component name=ls type=LogSoftmaxComponent dim=4
component-node name=ls component=ls input=t2
output-node name=output input=ls
"""


def test_torch_compile_cpu():
    nnet = pynnet3.Nnet.from_config(SMALL.replace("\\\n", ""), seed=1)
    module = to_torch(nnet, frames=3)
    compiled = torch.compile(module)
    inputs = random_inputs(module, 2)
    with torch.no_grad():
        got = compiled(*[torch.from_numpy(inputs[n]) for n in module.input_names])
    want = reference_outputs(nnet, module, inputs)
    assert got["output"].shape == (2, 3, 4)
    assert max_rel(got["output"].numpy(), want["output"]) < 1e-4
    assert np.isfinite(got["output"].numpy()).all()
