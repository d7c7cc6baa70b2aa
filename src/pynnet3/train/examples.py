"""From a (merged) example to what a training step takes (Kaldi's GetComputationRequest).

:func:`example_minibatch` turns an :class:`~pynnet3.io.egs.NnetExample` into a
:class:`Minibatch`: the :class:`~pynnet3.ComputationRequest` (each NnetIo that
names an input node is an input, each that names an output node an output with a
derivative when ``need_model_derivative``; Kaldi's rule), the input matrices
(compressed features decompressed, as Kaldi's ``GeneralMatrix::GetMatrix``) and the
dense supervision of every output (sparse posteriors densified; row ``i`` is the
output index ``i`` of the request). ``Trainer.train_step(mb.request,
inputs=mb.inputs, supervision=mb.supervision)`` trains on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compiler import ComputationRequest, IoSpecification
from ..errors import ComputeError
from ..io.egs import NnetExample


@dataclass
class Minibatch:
    """One example (usually merged) ready for a training or evaluation step."""

    request: ComputationRequest
    inputs: dict[str, np.ndarray]
    supervision: dict[str, np.ndarray]

    @property
    def num_sequences(self) -> int:
        """Distinct ``n`` of the request's outputs (the minibatch size)."""
        return len({int(n) for o in self.request.outputs for n in np.unique(o.indexes[:, 0])})


def example_request(nnet, eg: NnetExample, need_model_derivative: bool = True,
                    store_component_stats: bool = False) -> ComputationRequest:
    """Kaldi's ``GetComputationRequest``: inputs and outputs in the example's order;
    a NnetIo naming no input or output node is a :class:`ComputeError`."""
    inputs, outputs = [], []
    input_names, output_names = set(nnet.input_names()), set(nnet.output_names())
    for io in eg.io:
        if io.name in input_names:
            inputs.append(IoSpecification(io.name, io.indexes, False))
        elif io.name in output_names:
            outputs.append(IoSpecification(io.name, io.indexes, need_model_derivative))
        else:
            raise ComputeError(f"the example has an input or output named {io.name!r}, but "
                               f"the network has no such input or output node (inputs: "
                               f"{sorted(input_names)}, outputs: {sorted(output_names)})")
    if not inputs:
        raise ComputeError("no inputs in the computation request (the example names none "
                           "of the network's input nodes)")
    if not outputs:
        raise ComputeError("no outputs in the computation request (the example names none "
                           "of the network's output nodes)")
    return ComputationRequest(inputs, outputs, need_model_derivative, store_component_stats)


def example_minibatch(nnet, eg: NnetExample, need_model_derivative: bool = True,
                      store_component_stats: bool = False) -> Minibatch:
    """The request, inputs and dense supervision of ``eg`` (see the module doc)."""
    request = example_request(nnet, eg, need_model_derivative, store_component_stats)
    is_input = {spec.name for spec in request.inputs}
    inputs, supervision = {}, {}
    for io in eg.io:
        (inputs if io.name in is_input else supervision)[io.name] = \
            np.ascontiguousarray(io.dense(), dtype=np.float32)
    return Minibatch(request, inputs, supervision)


__all__ = ["Minibatch", "example_minibatch", "example_request"]
