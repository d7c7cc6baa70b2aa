#!/usr/bin/env python
"""Training peak memory and step time with and without the recompute pass
(``OptimizeOptions.recompute_cheap_values``, optimize/recompute.py; issue 15's
"memory" pass).

For the four realistic networks at the train shapes of ``scaling.json`` (N = 1,
8, 32, 128 sequences of 20 frames, model derivative wanted) prints the optimized
computation's ``peak_memory_floats`` without and with the pass, with memory
compression at its default level 1 (ReLU outputs kept as their sign between the
passes) and at level 0; how many values the pass recomputes; and the time of one
training step (forward + backward + gradients, NumPy backend, one BLAS thread)
without and with it, the minimum of ``--reps`` runs, alternating the two so that
machine load hits both alike. The run's results are compared bit for bit.

    python benchmarks/recompute.py [--nets tdnnf_chain,xvector] [--max-n 128]
                                   [--reps 3] [--no-time]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
import realistic  # (requests, reference dir, tables)
from realistic import NETS, SCALING_NS, print_table, ratio

import pynnet3
from pynnet3.cache import CachingCompiler
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import OptimizeOptions

_COPIES = (CT.SET_CONST, CT.MATRIX_COPY, CT.COPY_ROWS, CT.COPY_ROWS_MULTI)


def _recomputed(comp) -> int:
    """Values recomputed: matrices (not derivatives) written after the first
    backprop by a propagate or a row copy."""
    seen = False
    out = set()
    for cmd in comp.commands:
        seen = seen or cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
        s = cmd.out_value if cmd.type is CT.PROPAGATE else (
            cmd.dst if cmd.type in _COPIES else 0)
        if seen and s and not comp.matrices[comp.submatrices[s].matrix].is_deriv:
            out.add(comp.submatrices[s].matrix)
    return len(out)


def _step(nnet, comp, inputs, derivs):
    t0 = time.perf_counter()
    res = pynnet3.run(nnet, comp, inputs, derivs)
    return time.perf_counter() - t0, res


def _same(a, b) -> bool:
    return (all(np.array_equal(a.outputs[k], b.outputs[k]) for k in b.outputs)
            and all(np.array_equal(a.gradients[c][p], b.gradients[c][p])
                    for c in b.gradients for p in b.gradients[c]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--max-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-time", action="store_true", help="peak memory only")
    args = ap.parse_args(argv)
    ref = realistic.reference_dir()
    rows, gains = [], []
    for net in args.nets.split(","):
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        cc = {(lvl, on): CachingCompiler(nnet, optimize=OptimizeOptions(
            memory_compression_level=lvl, recompute_cheap_values=on))
            for lvl in (1, 0) for on in (False, True)}
        for n in (n for n in SCALING_NS if n <= args.max_n):
            req = realistic.scaling_request(nnet, net, "train", n)
            comps = {k: c.compile(req) for k, c in cc.items()}
            peak = {k: c.peak_memory_floats() for k, c in comps.items()}
            gains.append(peak[1, True] / peak[1, False])
            row = [net, str(n), str(peak[1, False]), str(peak[1, True]),
                   ratio(peak[1, True], peak[1, False]), str(_recomputed(comps[1, True])),
                   str(peak[0, False]), str(peak[0, True]),
                   ratio(peak[0, True], peak[0, False])]
            if not args.no_time:
                inputs, derivs = realistic.make_data(nnet, req, np.random.default_rng(0))
                model = copy.deepcopy(nnet)  # (no stats are stored; parameters unchanged)
                best = {False: float("inf"), True: float("inf")}
                res = {}
                for _ in range(max(1, args.reps)):
                    for on in (False, True):
                        dt, res[on] = _step(model, comps[1, on], inputs, derivs)
                        best[on] = min(best[on], dt)
                row += [f"{best[False] * 1e3:.1f}", f"{best[True] * 1e3:.1f}",
                        ratio(best[True], best[False]),
                        "yes" if _same(res[True], res[False]) else "NO"]
            rows.append(row)
            realistic.progress(f"{net}/train/N={n}")
    header = ["net", "N", "peak", "peak+rc", "x", "#rc", "peak(c0)", "peak(c0)+rc", "x"]
    if not args.no_time:
        header += ["step ms", "step+rc ms", "x", "bitwise"]
    notes = [f"peak with/without the pass (compression level 1): min {min(gains):.3f}, "
             f"max {max(gains):.3f}"] if gains else []
    print_table("training requests (scaling.json train shapes): peak memory in floats and "
                "step time, without / with recompute_cheap_values ('c0': memory "
                "compression off; '#rc': values recomputed)", header, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
