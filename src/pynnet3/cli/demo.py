"""``pynnet3 demo``: the main job on the bundled example.

Builds the bundled TDNN-F network, generates features, compiles a decode request
(one 150-frame utterance) and a training request (8 sequences of 20 frames with
model derivatives), runs both and prints what they cost.
"""

from __future__ import annotations

import time
from importlib import resources

import numpy as np


def _frames(n_seqs: int, t0: int, t1: int) -> np.ndarray:
    n, t = np.meshgrid(np.arange(n_seqs), np.arange(t0, t1), indexing="ij")
    return np.stack([n.ravel(), t.ravel(), np.zeros(n.size, dtype=np.int64)], axis=1)


def demo_requests(nnet, decode_frames: int = 150, train_seqs: int = 8, train_frames: int = 20):
    from ..compiler import ComputationRequest, IoSpecification

    left, right = nnet.context()
    out = []
    for name, seqs, frames, train in (("decode", 1, decode_frames, False),
                                      ("train", train_seqs, train_frames, True)):
        ivec = np.stack([np.arange(seqs), np.zeros(seqs, np.int64), np.zeros(seqs, np.int64)], 1)
        req = ComputationRequest(
            inputs=[IoSpecification("input", _frames(seqs, -left, frames + right)),
                    IoSpecification("ivector", ivec)],
            outputs=[IoSpecification("output", _frames(seqs, 0, frames), has_deriv=train)],
            need_model_derivative=train)
        out.append((name, seqs * frames, req))
    return out


def run_demo(seed: int = 0) -> int:
    from .. import Nnet, compile, run

    config = resources.files("pynnet3").joinpath("examples/tdnnf.config").read_text()
    nnet = Nnet.from_config(config, seed=seed)
    rng = np.random.default_rng(seed)
    left, right = nnet.context()
    print(f"bundled TDNN-F: {len(nnet.nodes)} nodes, {len(nnet.components)} components, "
          f"{nnet.num_params()} parameters, context -{left}/+{right}")
    header = (f"{'request':<8} {'frames':>6} {'commands':>8} {'matrices':>8} {'peak MB':>8} "
              f"{'compile ms':>10} {'run ms':>8} {'frames/s':>9}")
    print(header)
    print("-" * len(header))
    for name, frames, req in demo_requests(nnet):
        t0 = time.perf_counter()
        comp = compile(nnet, req, optimize=True)
        t1 = time.perf_counter()
        inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
                  .astype(np.float32) for s in req.inputs}
        derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
                  .astype(np.float32) for s in req.outputs if s.has_deriv}
        t2 = time.perf_counter()
        res = run(nnet, comp, inputs, derivs)
        t3 = time.perf_counter()
        st = comp.stats()
        assert res.outputs["output"].shape == (frames, nnet.output_dim("output"))
        print(f"{name:<8} {frames:>6} {st['num_commands']:>8} {st['num_matrices']:>8} "
              f"{st['peak_memory_floats'] * 4 / 1e6:>8.2f} {(t1 - t0) * 1e3:>10.1f} "
              f"{(t3 - t2) * 1e3:>8.1f} {frames / (t3 - t2):>9.0f}")
    return 0
