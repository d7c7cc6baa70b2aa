#!/usr/bin/env python
"""Forward and training-step time per backend, next to Kaldi (issue 17, item 5).

For the four realistic networks at the shapes of ``scaling.json`` (decode: N
sequences of 150 output frames, the network in test mode and network-optimized as
in forward.py; train: N sequences of 20 output frames with output and model
derivatives, the network as read, as in train_step.py), one thread on the CPU
(BLAS and torch), prints per (network, shape, N) the best time of:

* ``numpy``: ``NnetComputer(..., backend="numpy").run``;
* ``torch``: ``NnetComputer(..., backend="torch", device="cpu").run`` with torch
  tensors as inputs;
* ``cuda``: the same on ``device="cuda"`` (synchronized after each run), when a
  GPU is present;
* ``fx`` / ``compiled`` / ``onnxrt`` (decode only, ``--export``, the default): the
  network exported by ``pynnet3.export`` run eager, ``torch.compile``d (dynamic N;
  not for the networks in ``--no-compile-nets``: the unrolled LSTM takes minutes to
  compile) and in onnxruntime (one thread) -- benchmarks/export.py's runners;
* ``kaldi``: ``forward_ms`` / ``forward_backward_ms`` from ``scaling.json`` (another
  machine: compare ratios);

and torch/numpy and torch/kaldi. Times are minima over ``--reps`` runs (the host
may be shared); ``--clock=cpu`` measures the process's CPU time instead of the wall
clock (on a host shared with other work; never for CUDA, which is timed on the
wall clock). No assertions.

    python benchmarks/backends.py [--nets tdnnf_chain,xvector] [--ns 1,8,32,128]
                                  [--shapes decode,train] [--reps 5] [--clock wall|cpu]
                                  [--export true|false] [--no-compile-nets tdnn_lstm]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
from gemm import best_ms
from realistic import NETS, kaldi_ms, print_head, reference_dir, scaling_request

import pynnet3
from pynnet3.runtime.computer import NnetComputer


def runners(model, comp, inputs: dict, derivs: dict) -> dict:
    """name -> a no-argument function running the computation once."""
    out = {"numpy": lambda: NnetComputer(model, comp).run(dict(inputs), dict(derivs))}
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(1)
    t_in = {k: torch.from_numpy(v) for k, v in inputs.items()}
    t_d = {k: torch.from_numpy(v) for k, v in derivs.items()}
    out["torch"] = lambda: NnetComputer(model, comp, backend="torch", device="cpu").run(
        dict(t_in), dict(t_d))
    if torch.cuda.is_available():
        c_in = {k: v.cuda() for k, v in t_in.items()}
        c_d = {k: v.cuda() for k, v in t_d.items()}

        def cuda():
            NnetComputer(model, comp, backend="torch", device="cuda").run(dict(c_in), dict(c_d))
            torch.cuda.synchronize()
        out["cuda"] = cuda
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--ns", default="1,8,32,128")
    ap.add_argument("--shapes", default="decode,train")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--export", choices=("true", "false"), default="true",
                    help="add the exported module's columns (decode)")
    ap.add_argument("--no-compile-nets", default="tdnn_lstm",
                    help="networks whose exported module is not torch.compile'd")
    args = ap.parse_args(argv)
    cpu_clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ref = reference_dir()
    kaldi = {(net, shape, n): ms for shape in ("decode", "train")
             for (net, n), ms in kaldi_ms(ref, shape).items()}
    rng = np.random.default_rng(0)
    cols = ("numpy", "torch", "cuda", "fx", "compiled", "onnxrt", "kaldi")
    head = (f"{'network':<13} {'shape':<6} {'N':>4} " + " ".join(f"{c:>8}" for c in cols)
            + f" {'torch/np':>8} {'torch/kaldi':>11}")
    print_head(f"ms (min of {args.reps}, {args.clock} clock), one CPU thread "
               f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')})", head)
    for net in args.nets.split(","):
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        for shape in args.shapes.split(","):
            exported = None
            if shape == "decode":
                model = nnet.copy() if hasattr(nnet, "copy") else nnet
                model.set_test_mode(True)
                model = pynnet3.optimize_network(model)
                if args.export == "true" and importlib.util.find_spec("torch") is not None:
                    from export import Exported

                    exported = Exported(model, compile_module=net not in
                                        args.no_compile_nets.split(","))
            else:
                model = nnet
            for n in map(int, args.ns.split(",")):
                req = scaling_request(model, net, shape, n)
                inputs = {s.name: rng.standard_normal(
                    (len(s.indexes), model.input_dim(s.name))).astype(np.float32)
                    for s in req.inputs}
                derivs = {s.name: rng.standard_normal(
                    (len(s.indexes), model.output_dim(s.name))).astype(np.float32)
                    for s in req.outputs if s.has_deriv}
                comp = pynnet3.CachingCompiler(model).compile(req)
                run = runners(model, comp, inputs, derivs)
                if exported is not None:
                    from export import module_inputs

                    run.update(exported.runners(module_inputs(exported.module, inputs, n)))
                times = {name: best_ms(fn, args.reps,
                                       time.perf_counter if name == "cuda" else cpu_clock)
                         for name, fn in run.items()}
                times["kaldi"] = kaldi.get((net, shape, n))

                def f(v):
                    return f"{v:8.2f}" if v is not None else f"{'-':>8}"

                def ratio(a, b):
                    return f"{a / b:.2f}" if a is not None and b else "-"
                print(f"{net:<13} {shape:<6} {n:>4} "
                      + " ".join(f(times.get(c)) for c in cols)
                      + f" {ratio(times.get('torch'), times['numpy']):>8}"
                      f" {ratio(times.get('torch'), times['kaldi']):>11}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
