#!/usr/bin/env python
"""Forward time of the exported network (pynnet3.export) next to the NumPy backend
and Kaldi (issue 17, item 5: the export rows).

For the realistic networks at the decode shapes of ``scaling.json`` (N sequences of
150 output frames plus context; the network in test mode and network-optimized, as
benchmarks/forward.py and backends.py run it), one CPU thread, prints per (network, N)
the best forward time of:

* ``numpy``: ``NnetComputer(..., backend="numpy").run`` of the N-sequence computation;
* ``fx``: the ``to_torch`` module, eager, on ``[N, T, dim]`` tensors (``no_grad``);
* ``compiled``: ``torch.compile`` of that module (compiled once per network with a
  dynamic N; the compile time is printed on stderr, not counted);
* ``onnxrt``: the ``to_onnx`` model in onnxruntime, one intra-op thread;
* ``kaldi``: ``forward_ms`` from ``scaling.json`` (another machine: compare ratios);

and fx/numpy, best-export/kaldi. ``--shape=train``: a training step instead (forward
and the model gradients of sum(output * deriv): the NumPy backend's backward pass vs
autograd through the exported module, eager and compiled; 20 output frames; the
network in test mode as read; Kaldi's ``forward_backward_ms`` beside it). Times are
minima over ``--reps`` runs (the host may be shared). No assertions.
:class:`Exported` gives the export runners to other tables (backends.py).

    python benchmarks/export.py [--nets tdnnf_chain,xvector] [--ns 1,8,32,128]
                                [--reps 5] [--no-compile] [--shape decode|train]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
from gemm import best_ms
from realistic import NETS, kaldi_ms, print_head, reference_dir, scaling_request

import pynnet3
from pynnet3.runtime.computer import NnetComputer

FRAMES = 150  # scaling.json's decode shape


def module_inputs(module, inputs: dict, n: int) -> tuple:
    """The N-sequence request's input matrices (rows n outer, t inner) as the exported
    module's ``[N, T, dim]`` / ``[N, dim]`` tensors."""
    import torch

    out = []
    for name in module.input_names:
        v = inputs[name]
        shape = (n, -1) if name == "ivector" else (n, module.input_frames, v.shape[1])
        out.append(torch.from_numpy(np.ascontiguousarray(v.reshape(shape))))
    return tuple(out)


class Exported:
    """A network exported once: the ``to_torch`` module, its ``torch.compile``d form
    (dynamic N, compiled on first use) and an onnxruntime session (one thread)."""

    def __init__(self, model, compile_module: bool = True, frames: int = FRAMES,
                 onnx: bool = True):
        import torch

        from pynnet3.export import to_onnx, to_torch

        torch.set_num_threads(1)
        self.module = to_torch(model, frames).eval()
        self.compiled = torch.compile(self.module, dynamic=True) if compile_module else None
        self._compiled_once = False
        self.session = None
        if not onnx:
            return
        try:
            import onnxruntime as ort
        except ImportError:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            to_onnx(model, path, frames, module=self.module)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            self.session = ort.InferenceSession(str(path), opts,
                                                providers=["CPUExecutionProvider"])

    def runners(self, args: tuple) -> dict:
        """name -> a no-argument function running once on ``args``
        (:func:`module_inputs`): ``fx`` (eager), ``compiled``, ``onnxrt``."""
        import torch

        def call(fn):
            def run():
                with torch.no_grad():
                    fn(*args)
            return run

        out = {"fx": call(self.module)}
        if self.compiled is not None:
            if not self._compiled_once:
                t0 = time.perf_counter()
                call(self.compiled)()
                sys.stderr.write(f"  torch.compile: {time.perf_counter() - t0:.1f} s\n")
                self._compiled_once = True
            out["compiled"] = call(self.compiled)
        if self.session is not None:
            feed = {n: a.numpy() for n, a in zip(self.module.input_names, args, strict=True)}
            out["onnxrt"] = lambda: self.session.run(None, feed)
        return out


    def train_runners(self, args: tuple, derivs: dict) -> dict:
        """name -> one training step's gradient computation: forward, then autograd of
        sum(output * deriv) into every parameter (``fx``; ``compiled`` too)."""
        import torch

        d = {k: torch.from_numpy(v) for k, v in derivs.items()}
        params = list(self.module.parameters())

        def step(fn):
            def run():
                for p in params:
                    p.grad = None
                y = fn(*args)
                sum((y[k] * d[k]).sum() for k in d).backward()
            return run

        out = {"fx": step(self.module)}
        if self.compiled is not None:
            if not self._compiled_once:
                t0 = time.perf_counter()
                step(self.compiled)()
                sys.stderr.write(f"  torch.compile (train): {time.perf_counter() - t0:.1f} s\n")
                self._compiled_once = True
            out["compiled"] = step(self.compiled)
        return out


def train_table(args, ref: Path) -> None:
    """Training step (forward + model gradients) at scaling.json's train shape: N
    sequences of 20 output frames, the network in test mode as read (no network
    optimizer: the gradients are the network's own parameters')."""
    kaldi = kaldi_ms(ref, "train")
    rng = np.random.default_rng(0)
    cols = ("numpy", "fx", "compiled", "kaldi")
    head = f"{'network':<13} {'N':>4} " + " ".join(f"{c:>9}" for c in cols) + \
        f" {'fx/numpy':>8}"
    print_head(f"train step ms (min of {args.reps}), one CPU thread; kaldi: "
               "forward_backward_ms (training-mode BatchNorm, another machine)", head)
    for net in args.nets.split(","):
        model = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        model.set_test_mode(True)
        exported = None
        for n in map(int, args.ns.split(",")):
            req = scaling_request(model, net, "train", n)
            inputs = {s.name: rng.standard_normal((len(s.indexes), model.input_dim(s.name)))
                      .astype(np.float32) for s in req.inputs}
            derivs = {s.name: rng.standard_normal((len(s.indexes), model.output_dim(s.name)))
                      .astype(np.float32) for s in req.outputs}
            comp = pynnet3.CachingCompiler(model).compile(req)
            times = {"numpy": best_ms(_numpy_runner(model, comp, inputs, derivs), args.reps)}
            if exported is None:
                exported = Exported(model, compile_module=args.compile, frames=20, onnx=False)
            m = exported.module
            margs = module_inputs(m, inputs, n)
            mderivs = {k: v.reshape(n, m.output_frames, -1) for k, v in derivs.items()}
            for name, fn in exported.train_runners(margs, mderivs).items():
                times[name] = best_ms(fn, args.reps)
            times["kaldi"] = kaldi.get((net, n))
            print(f"{net:<13} {n:>4} " + " ".join(_cell(times.get(c)) for c in cols)
                  + f" {times['fx'] / times['numpy']:8.2f}", flush=True)


def _cell(v) -> str:
    return f"{v:9.2f}" if v is not None else f"{'-':>9}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--ns", default="1,8,32,128")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--shape", choices=("decode", "train"), default="decode")
    args = ap.parse_args(argv)
    ref = reference_dir()
    if args.shape == "train":
        train_table(args, ref)
        return 0
    kaldi = kaldi_ms(ref, "decode")
    rng = np.random.default_rng(0)
    cols = ("numpy", "fx", "compiled", "onnxrt", "kaldi")
    head = (f"{'network':<13} {'N':>4} " + " ".join(f"{c:>9}" for c in cols)
            + f" {'fx/numpy':>8} {'best/kaldi':>10}")
    print_head(f"decode forward ms (min of {args.reps}), one CPU thread "
               f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')})", head)
    for net in args.nets.split(","):
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        nnet.set_test_mode(True)
        model = pynnet3.optimize_network(nnet)
        exported = None
        for n in map(int, args.ns.split(",")):
            req = scaling_request(model, net, "decode", n)
            inputs = {s.name: rng.standard_normal((len(s.indexes), model.input_dim(s.name)))
                      .astype(np.float32) for s in req.inputs}
            comp = pynnet3.CachingCompiler(model).compile(req)
            times = {"numpy": best_ms(_numpy_runner(model, comp, inputs), args.reps)}
            if exported is None:
                exported = Exported(model, compile_module=args.compile)
            margs = module_inputs(exported.module, inputs, n)
            runners = exported.runners(margs)
            for name, fn in runners.items():
                times[name] = best_ms(fn, args.reps)
            times["kaldi"] = kaldi.get((net, n))

            def f(v):
                return f"{v:9.2f}" if v is not None else f"{'-':>9}"

            best = min(times.get(c) or float("inf") for c in ("fx", "compiled", "onnxrt"))
            kal = times["kaldi"]
            print(f"{net:<13} {n:>4} " + " ".join(f(times.get(c)) for c in cols)
                  + f" {times['fx'] / times['numpy']:8.2f}"
                  + f" {best / kal if kal else float('nan'):10.2f}", flush=True)
    return 0


def _numpy_runner(model, comp, inputs: dict, derivs: dict | None = None):
    return lambda: NnetComputer(model, comp).run(dict(inputs), dict(derivs or {}))


if __name__ == "__main__":
    sys.exit(main())
