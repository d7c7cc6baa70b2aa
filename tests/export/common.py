"""Shared helpers of the export tests: random inputs in the exported interface and
the reference outputs, computed by pynnet3.run (NumPy backend) one sequence at a
time on a request built here from the module's declared interface."""

from __future__ import annotations

from importlib import resources

import numpy as np

import pynnet3
from pynnet3.compiler import ComputationRequest, IoSpecification


def rows(times) -> np.ndarray:
    t = np.asarray(list(times), dtype=np.int64)
    return np.stack([np.zeros_like(t), t, np.zeros_like(t)], axis=1)


def example_nnet() -> pynnet3.Nnet:
    """The bundled TDNN-F example (with iVector), in test mode."""
    text = resources.files("pynnet3").joinpath("examples/tdnnf.config").read_text()
    nnet = pynnet3.Nnet.from_config(text, seed=0)
    nnet.set_test_mode(True)
    return nnet


def random_inputs(module, n: int, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in module.input_names:
        dim = module.input_dims[name]
        shape = (n, dim) if name == "ivector" else (n, module.input_frames, dim)
        out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def reference_request(module, with_derivs: bool = False) -> ComputationRequest:
    """Sequence n = 0: frame inputs at t = -left .. F-1+right, the iVector at the
    module's iVector times, outputs at t = 0 .. output_frames-1."""
    frames = range(-module.left_context, module.frames + module.right_context)
    inputs = [IoSpecification(name, rows(module.ivector_times if name == "ivector" else frames))
              for name in module.input_names]
    outputs = [IoSpecification(name, rows(range(module.output_frames)), with_derivs)
               for name in module.output_names]
    return ComputationRequest(inputs, outputs, need_model_derivative=with_derivs)


def reference_outputs(nnet, module, inputs: dict, dtype=np.float32) -> dict[str, np.ndarray]:
    """pynnet3.run of every sequence of ``inputs``: name -> [N, rows, dim]."""
    comp = pynnet3.compile(nnet, reference_request(module))
    n = len(next(iter(inputs.values())))
    outs: dict[str, list] = {name: [] for name in module.output_names}
    for i in range(n):
        seq = {}
        for name, value in inputs.items():
            if name == "ivector":
                seq[name] = np.repeat(value[i:i + 1], len(module.ivector_times), axis=0)
            else:
                seq[name] = value[i]
        res = pynnet3.run(nnet, comp, seq, dtype=dtype)
        for name in module.output_names:
            outs[name].append(res.outputs[name])
    return {name: np.stack(v) for name, v in outs.items()}


def run_module(module, inputs: dict) -> dict[str, np.ndarray]:
    import torch

    with torch.no_grad():
        y = module(*[torch.from_numpy(inputs[name]) for name in module.input_names])
    return {name: v.numpy() for name, v in y.items()}


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to max |b| (Kaldi-reference style)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))
