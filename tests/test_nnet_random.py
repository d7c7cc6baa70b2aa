"""Random components read from a model get distinct generators."""

import numpy as np

import pynnet3

CONFIG = """input-node name=input dim=20
component name=d1 type=DropoutComponent dim=20 dropout-proportion=0.5
component name=d2 type=DropoutComponent dim=20 dropout-proportion=0.5
component-node name=d1 component=d1 input=input
component-node name=d2 component=d2 input=input
output-node name=output input=Append(d1, d2)
"""


def test_two_dropout_layers_draw_different_masks(tmp_path):
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=1)
    path = tmp_path / "m.txt"
    nnet.write(path, binary=False)
    nnet = pynnet3.read_nnet(path)
    nnet.set_test_mode(False)
    idx = np.stack([np.zeros(50, int), np.arange(50), np.zeros(50, int)], axis=1)
    req = pynnet3.ComputationRequest([pynnet3.IoSpecification("input", idx)],
                                     [pynnet3.IoSpecification("output", idx)])
    comp = pynnet3.compile(nnet, req)
    out = pynnet3.run(nnet, comp, {"input": np.ones((50, 20), np.float32)}).outputs["output"]
    assert not np.array_equal(out[:, :20] == 0, out[:, 20:] == 0)
