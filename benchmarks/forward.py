#!/usr/bin/env python
"""Forward-pass speed with and without the network optimizer, next to the GEMMs
alone and Kaldi.

For the four realistic networks at the decode shapes of ``scaling.json``
(N sequences of 150 output frames; x-vector: 157 input frames, one output per
sequence), one BLAS thread, in one process, prints per (network, N):

* ``plain``: our forward time (compiled through a CachingCompiler, run with the
  NumPy backend as ``pynnet3.run`` and ``pynnet3 compute`` run it: the commands
  prepared once per computation, ``NnetComputer(cache_program=True)``) on the
  network as read, in test mode;
* ``netopt``: the same on ``optimize_network(nnet)``, with the rules
  ``pynnet3.run(..., network_optimize=True)`` adds for a request of at most
  ``FEW_SEQUENCES`` sequences (``split-recurrent-affine``: an LSTM's input product
  taken out of its steps) where they change the network;
* ``gemm``: the time of the network-optimized computation's GEMMs alone, same
  shapes (each propagate of an affine / linear / TDNN layer replayed as NumPy
  matmuls into preallocated buffers; a TDNN layer as one matmul per time offset,
  as it runs);
* ``torch``: PyTorch eager for the network-optimized computation's GEMMs (only
  when torch is installed);
* ``kaldi``: ``forward_ms`` from ``scaling.json``;

and the ratios netopt/kaldi, netopt/gemm, plain/netopt. Times are the minimum
over ``--reps`` runs (the host is shared; the minimum is the least disturbed).
No assertions.

    python benchmarks/forward.py [--nets tdnnf_chain,xvector] [--ns 1,8,32,128] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import sys

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
from gemm import best_ms, gemm_runner, gemm_shapes
from realistic import NETS, kaldi_ms, print_head, reference_dir, scaling_request

import pynnet3
from pynnet3.cache.caching_compiler import FEW_SEQUENCES, FEW_SEQUENCES_RULES
from pynnet3.runtime.computer import NnetComputer


def torch_runner(shapes, rng):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    bufs = [(torch.from_numpy(rng.standard_normal((k, m)).astype(np.float32)).T if trans
             else torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)),
             torch.from_numpy(rng.standard_normal((k, n)).astype(np.float32)),
             torch.empty((m, n))) for m, k, n, trans in shapes]

    def run():
        for a, b, y in bufs:
            torch.matmul(a, b, out=y)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--ns", default="1,8,32,128")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    ref = reference_dir()
    kaldi = kaldi_ms(ref, "decode")
    rng = np.random.default_rng(0)
    head = (f"{'network':<13} {'N':>4} {'plain':>8} {'netopt':>8} {'gemm':>8} {'torch':>8} "
            f"{'kaldi':>8} {'opt/kaldi':>9} {'opt/gemm':>8} {'plain/opt':>9} "
            f"{'cmds':>9} {'peak MF':>11}")
    print_head(f"forward ms (min of {args.reps}), decode shapes, "
               f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}", head)
    for net in args.nets.split(","):
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        nnet.set_test_mode(True)
        fast_default = pynnet3.optimize_network(nnet)
        fast_few = pynnet3.optimize_network(nnet, pynnet3.NetworkOptions(
            enable_rules=FEW_SEQUENCES_RULES))
        if [x.name for x in fast_few.nodes] == [x.name for x in fast_default.nodes]:
            fast_few = fast_default  # (the rules change nothing here)
        for n in map(int, args.ns.split(",")):
            # (as pynnet3.run(..., network_optimize=True) chooses for the request)
            fast = fast_few if n <= FEW_SEQUENCES else fast_default
            req = scaling_request(nnet, net, "decode", n)
            inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
                      .astype(np.float32) for s in req.inputs}
            times, stats = {}, {}
            for tag, model in (("plain", nnet), ("netopt", fast)):
                comp = pynnet3.CachingCompiler(model).compile(req)
                stats[tag] = comp.stats()
                times[tag] = best_ms(
                    lambda m=model, c=comp, x=inputs: NnetComputer(
                        m, c, cache_program=True).run(dict(x)), args.reps)
                if tag == "netopt":
                    shapes = gemm_shapes(model, comp)
            times["gemm"] = best_ms(gemm_runner(shapes, rng), args.reps)
            tr = torch_runner(shapes, rng)
            times["torch"] = best_ms(tr, args.reps) if tr is not None else None
            k = kaldi.get((net, n))

            def f(v):
                return f"{v:8.2f}" if v is not None else f"{'-':>8}"
            print(f"{net:<13} {n:>4} {f(times['plain'])} {f(times['netopt'])} "
                  f"{f(times['gemm'])} {f(times['torch'])} {f(k)} "
                  f"{times['netopt'] / k if k else float('nan'):>9.2f} "
                  f"{times['netopt'] / times['gemm']:>8.2f} "
                  f"{times['plain'] / times['netopt']:>9.2f} "
                  f"{stats['plain']['num_commands']:>4}/{stats['netopt']['num_commands']:<4} "
                  f"{stats['plain']['peak_memory_floats'] / 1e6:>5.2f}/"
                  f"{stats['netopt']['peak_memory_floats'] / 1e6:<5.2f}", flush=True)
    print("\nplain: network as read (test mode); netopt: pynnet3.optimize_network (with "
          f"{', '.join(FEW_SEQUENCES_RULES)} at N <= {FEW_SEQUENCES}, as pynnet3.run); gemm: the "
          "netopt computation's GEMMs alone; cmds and peak (millions of floats): plain/netopt.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
