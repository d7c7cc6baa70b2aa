"""What the speed benchmarks share: the best-of-N timer and the GEMMs alone of a
computation (the shapes its linear layers' propagates and backprops run, replayed
as NumPy matmuls into preallocated buffers: the bound the other figures compare to)."""

from __future__ import annotations

import time

import numpy as np

from pynnet3.components.fused import linear_part
from pynnet3.computation import CommandType

LINEAR = {"AffineComponent", "NaturalGradientAffineComponent", "FixedAffineComponent",
          "LinearComponent", "TdnnComponent"}
_BACKPROPS = (CommandType.BACKPROP, CommandType.BACKPROP_NO_MODEL_UPDATE)


def best_ms(fn, reps: int, clock=time.perf_counter) -> float:
    """The fastest of ``reps`` runs of ``fn`` after a warm-up, in ms (``clock``:
    e.g. time.process_time for CPU time on a shared host)."""
    fn()  # warm-up: allocator, BLAS, lazy imports
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best * 1e3


def gemm_shapes(nnet, comp) -> list[tuple[int, int, int, bool]]:
    """(m, k, n, a_transposed) of every GEMM (an [m, k] by [k, n] product) the
    computation's propagates and backprops of linear layers run (a weight gradient's
    [m, k] factor is the transpose of the output derivative, as the layers pass it)."""
    shapes = []
    for cmd in comp.commands:
        if cmd.type is not CommandType.PROPAGATE and cmd.type not in _BACKPROPS:
            continue
        c = nnet.components[nnet.node(cmd.node).component]
        c = linear_part(c)  # a fused kernel's product (components/fused.py)
        if c.type_name not in LINEAR:
            continue
        rows = comp.submatrices[cmd.out_value if cmd.type is CommandType.PROPAGATE
                                else cmd.out_deriv][2]
        offsets = len(c.time_offsets) if c.type_name == "TdnnComponent" else 1
        din, dout = c.input_dim, c.output_dim  # a TDNN's weight is [out, offsets * din]
        if cmd.type is CommandType.PROPAGATE:
            shapes += [(rows, din, dout, False)] * offsets
            continue
        if cmd.in_deriv or cmd.deriv_table >= 0:  # (added to blocks: the same product)
            shapes += [(rows, dout, din, False)] * offsets
        if cmd.type is CommandType.BACKPROP:
            shapes.append((dout, rows, din * offsets, True))
    return shapes


def gemm_runner(shapes, rng):
    bufs = [(rng.standard_normal((k, m)).astype(np.float32).T if trans
             else rng.standard_normal((m, k)).astype(np.float32),
             rng.standard_normal((k, n)).astype(np.float32),
             np.empty((m, n), np.float32)) for m, k, n, trans in shapes]

    def run():
        for a, b, y in bufs:
            np.matmul(a, b, out=y)
    return run
