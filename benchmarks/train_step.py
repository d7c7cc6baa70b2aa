#!/usr/bin/env python
"""Training-step speed (forward + backward + model gradients) next to the GEMMs
alone and Kaldi.

For the four realistic networks at the train shapes of ``scaling.json`` (N
sequences of 20 output frames with model derivative; x-vector: one output per
sequence), networks in training mode as read (BatchNorm and dropout as the model
file says; no ``set_test_mode``), one BLAS thread, prints per (network, N):

* ``ours``: one ``NnetComputer(nnet, comp).run(inputs, output_derivs)`` of the
  computation compiled through ``pynnet3.CachingCompiler(nnet)``;
* ``gemm``: the same computation's GEMMs alone, same shapes, NumPy matmuls into
  preallocated buffers: for each affine / linear / TDNN layer, its forward product
  (a TDNN layer: one per time offset), and when its BACKPROP runs, the input
  derivative (a TDNN layer: one per time offset) and the weight gradient (only for
  BACKPROP with model update);
* ``kaldi``: ``forward_backward_ms`` from ``scaling.json`` (another machine: compare
  the ratios, not the milliseconds);

and the ratios ours/kaldi, ours/gemm and gemm/kaldi. Times are the minimum over
``--reps`` runs (the host is shared; the minimum is the least disturbed). No
assertions. ``--profile NET:N`` prints a cProfile summary of that case instead, with
the time per command type and per component type.

    python benchmarks/train_step.py [--nets tdnnf_chain,xvector] [--ns 1,8,32,128]
                                    [--reps 5] [--clock cpu] [--profile xvector:128]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
from gemm import best_ms, gemm_runner, gemm_shapes
from realistic import NETS, kaldi_ms, make_data, print_head, reference_dir, scaling_request

import pynnet3
from pynnet3.computation import CommandType
from pynnet3.runtime.computer import NnetComputer

_BACKPROPS = (CommandType.BACKPROP, CommandType.BACKPROP_NO_MODEL_UPDATE)


def profile(nnet, comp, inputs, derivs) -> None:
    """cProfile of one run, plus wall time per command type / component type."""
    import cProfile
    import pstats

    computer = NnetComputer(nnet, comp)
    per_kind: dict[str, float] = defaultdict(float)
    orig = computer._execute

    def timed_execute(cmd):
        t0 = time.perf_counter()
        orig(cmd)
        dt = time.perf_counter() - t0
        kind = cmd.type.name
        if cmd.type is CommandType.PROPAGATE or cmd.type in _BACKPROPS:
            kind += ":" + nnet.components[nnet.node(cmd.node).component].type_name
        per_kind[kind] += dt

    NnetComputer(nnet, comp).run(dict(inputs), dict(derivs))  # warm-up
    computer._execute = timed_execute
    t0 = time.perf_counter()
    computer.run(dict(inputs), dict(derivs))
    total = time.perf_counter() - t0
    print(f"one run: {total * 1e3:.2f} ms; per command kind (ms):")
    for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {v * 1e3:8.2f}  {k}")
    prof = cProfile.Profile()
    prof.enable()
    NnetComputer(nnet, comp).run(dict(inputs), dict(derivs))
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--ns", default="1,8,32,128")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", default=None, metavar="NET:N")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time.process_time (this process's CPU time, steadier on a "
                         "shared host; one BLAS thread, so it is the step's time)")
    args = ap.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ref = reference_dir()
    kaldi = kaldi_ms(ref, "train")
    rng = np.random.default_rng(0)
    if args.profile:
        net, n = args.profile.split(":")
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        req = scaling_request(nnet, net, "train", int(n))
        comp = pynnet3.CachingCompiler(nnet).compile(req)
        profile(nnet, comp, *make_data(nnet, req, rng))
        return 0
    head = (f"{'network':<13} {'N':>4} {'ours':>8} {'gemm':>8} {'kaldi':>8} "
            f"{'ours/kaldi':>10} {'ours/gemm':>9} {'gemm/kaldi':>10}")
    print_head(f"train step ms (forward + backward + model gradients; min of {args.reps}, "
               f"{args.clock} clock), "
               f"train shapes, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}",
               head)
    for net in args.nets.split(","):
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        cc = pynnet3.CachingCompiler(nnet)
        for n in map(int, args.ns.split(",")):
            req = scaling_request(nnet, net, "train", n)
            inputs, derivs = make_data(nnet, req, rng)
            comp = cc.compile(req)
            ours = best_ms(lambda m=nnet, c=comp, x=inputs, d=derivs:
                           NnetComputer(m, c).run(dict(x), dict(d)), args.reps, clock)
            gemm = best_ms(gemm_runner(gemm_shapes(nnet, comp), rng), args.reps, clock)
            k = kaldi.get((net, n))
            kr = f"{ours / k:>10.2f}" if k else f"{'-':>10}"
            gk = f"{gemm / k:>10.2f}" if k else f"{'-':>10}"
            print(f"{net:<13} {n:>4} {ours:8.2f} {gemm:8.2f} {k if k else '-':>8.2f} "
                  f"{kr} {ours / gemm:>9.2f} {gk}", flush=True)
    print("\nours: NnetComputer.run of the CachingCompiler computation (training mode as "
          "read); gemm: its linear layers' GEMMs alone; kaldi: forward_backward_ms.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
