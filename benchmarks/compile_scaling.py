#!/usr/bin/env python
"""Compile-time scaling: full compilation vs shortcut compilation vs cache hits.

For the four realistic networks and N = 1, 8, 32, 128 sequences (decode: 150
output frames; train: 20 frames, model derivative, every output with a
derivative; the request shapes of ``scaling.json``) it prints (ms, medians):

* ``full``: compile + optimize of the whole request (``pynnet3.compile``), next
  to Kaldi's ``compile_ms + optimize_ms`` and the ratio ours/Kaldi;
* ``shortcut``: a fresh ``CachingCompiler`` and its first ``compile`` (compile and
  optimize two sequences, expand to N; what Kaldi's ``cache_shortcut_ms`` times),
  next to Kaldi's figure and the ratio, and ``full/sc`` = full / shortcut;
* ``warm sc``: the same compile by a ``CachingCompiler`` that already holds the
  two-sequence computation (it compiled N+1 sequences before): key + expansion,
  the part of a shortcut that no faster mini compilation can remove; ``full/warm``
  is therefore the most ``full/sc`` could reach with this design;
* ``hit us``: a cache hit for a fresh-but-equal request object (key + lookup +
  exact comparison of the indexes), in microseconds, and ``key us`` the key alone;
* per-phase milliseconds of the shortcut compile (graph, schedule, commands,
  optimize, expand), and the growth exponent of the full compile time in N (slope of
  log time vs log N from N = 8 to the largest N measured; 1.0 = linear).

Kaldi's figures come from an -O1 build on a shared 2-core machine (one BLAS
thread); use the ratios as orders of magnitude. Reference data: ``$PYNNET3_REFERENCE``
or ``../shared/kaldi-reference``.

    python benchmarks/compile_scaling.py [--nets tdnnf_chain,xvector] [--max-n 128]
        [--reps 3] [--timeout 60] [--verify]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
import realistic  # (benchmarks/realistic.py: requests, timing, tables)
from realistic import CompileTimeout, fmt, ratio

import pynnet3
from pynnet3.cache import CachingCompiler
from pynnet3.cache.key import request_key

PHASES = ("graph", "schedule", "commands", "optimize", "expand")


def hit_times(nnet, net: str, shape: str, n_seqs: int, reps: int) -> tuple[float, float]:
    """Median microseconds of a cache hit and of the key alone, each on a freshly
    built (so: new arrays, warm in the CPU cache as they would be) equal request."""
    cc = CachingCompiler(nnet)
    cc.compile(realistic.scaling_request(nnet, net, shape, n_seqs))
    policy = cc.policy()
    hits, keys = [], []
    for _ in range(reps):
        req = realistic.scaling_request(nnet, net, shape, n_seqs)
        t0 = time.perf_counter()
        cc.compile(req)
        t1 = time.perf_counter()
        req = realistic.scaling_request(nnet, net, shape, n_seqs)
        t2 = time.perf_counter()
        request_key(req, policy, ("float32", "numpy"))
        t3 = time.perf_counter()
        hits.append(t1 - t0)
        keys.append(t3 - t2)
    assert cc.info()["misses"] <= 2, "a fresh-but-equal request missed the cache"
    return statistics.median(hits) * 1e6, statistics.median(keys) * 1e6


def warm_shortcut_ms(nnet, net: str, shape: str, n_seqs: int, req, reps: int) -> float:
    """Median ms of a shortcut compile of ``req`` by a compiler that already holds
    its two-sequence computation (from an untimed compile of N+1 sequences)."""
    times = []
    for _ in range(max(1, reps)):
        cc = CachingCompiler(nnet)
        cc.compile(realistic.scaling_request(nnet, net, shape, n_seqs + 1))
        t0 = time.perf_counter()
        cc.compile(req)
        times.append((time.perf_counter() - t0) * 1e3)
        info = cc.info()
        if info["shortcut"] != 2 or info["hits"] != 1:  # the mini entry must be reused
            raise RuntimeError(f"warm shortcut of {net}/{shape}/N={n_seqs}: {info}")
    return statistics.median(times)


def verify(nnet, req, full, shortcut, rng) -> float:
    """Max relative difference between the outputs/gradients of two computations."""
    inputs, derivs = realistic.make_data(nnet, req, rng)
    a = pynnet3.run(nnet, full, inputs, derivs)
    b = pynnet3.run(nnet, shortcut, inputs, derivs)
    worst = 0.0
    for name, v in a.outputs.items():
        worst = max(worst, float(np.abs(v - b.outputs[name]).max() / max(np.abs(v).max(), 1e-6)))
    for comp, g in a.gradients.items():
        for p, v in g.items():
            d = np.abs(v - b.gradients[comp][p]).max() / max(np.abs(v).max(), 1e-6)
            worst = max(worst, float(d))
    return worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default=",".join(realistic.NETS))
    p.add_argument("--shapes", default="decode,train")
    p.add_argument("--max-n", type=int, default=128)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each compile timing")
    p.add_argument("--hit-reps", type=int, default=200)
    p.add_argument("--rep-budget", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds; a full compile that takes longer is skipped (and larger N)")
    p.add_argument("--verify", action="store_true",
                   help="also run full and shortcut computations and compare results")
    p.add_argument("--tune-malloc", action="store_true",
                   help="raise glibc's mmap/trim thresholds first (pynnet3.runtime.allocator"
                        ".tune_malloc, as the pynnet3 command line does)")
    args = p.parse_args(argv)
    if args.tune_malloc:
        from pynnet3.runtime.allocator import tune_malloc
        if not tune_malloc():
            print("note: --tune-malloc has no effect here (not Linux/glibc)")
    ref = realistic.reference_dir()
    records = realistic.scaling_records(ref)
    nets = [n for n in args.nets.split(",") if n]
    shapes = [s for s in args.shapes.split(",") if s]
    ns = [n for n in realistic.SCALING_NS if n <= args.max_n]
    rng = np.random.default_rng(0)
    rows, phase_rows, notes, growth = [], [], [], []
    kw = {"reps": args.reps, "budget_s": args.rep_budget}
    t_start = time.perf_counter()
    for net in nets:
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        nnet.context()
        for shape in shapes:
            full_skip = False
            full_times = {}
            for n_seqs in ns:
                k = records.get((net, shape, n_seqs), {})
                req = realistic.scaling_request(nnet, net, shape, n_seqs)
                full_ms = full = None
                if not full_skip:
                    try:
                        full_ms, full = realistic.timed(pynnet3.compile, nnet, req, True, **kw,
                                              timeout=args.timeout)
                        full_times[n_seqs] = full_ms
                    except CompileTimeout:
                        full_skip = True
                        notes.append(f"{net}/{shape}/N={n_seqs}: full compile > "
                                     f"{args.timeout:g}s; skipped for larger N")
                caches = []

                def shortcut_compile(req=req, caches=caches, nnet=nnet):
                    cc = CachingCompiler(nnet)
                    caches.append(cc)
                    return cc.compile(req)

                sc_ms, sc = realistic.timed(shortcut_compile, **kw)
                info = caches[-1].info()
                warm_ms = None
                if info["shortcut"]:
                    warm_ms = warm_shortcut_ms(nnet, net, shape, n_seqs, req, args.reps)
                used = "yes" if info["shortcut"] else (
                    "fallback" if info["shortcut_fallbacks"] else "no")
                hit_us, key_us = hit_times(nnet, net, shape, n_seqs, args.hit_reps)
                k_full = (k["compile_ms"] + k["optimize_ms"]
                          if k.get("compile_ms") is not None and k.get("optimize_ms") is not None
                          else None)
                k_sc = k.get("cache_shortcut_ms")
                same = "-"
                if full is not None:
                    same = "yes" if {x: full.stats()[x] for x in
                                     ("num_commands", "num_matrices", "peak_memory_floats")} \
                        == {x: sc.stats()[x] for x in
                            ("num_commands", "num_matrices", "peak_memory_floats")} else "NO"
                    if args.verify:
                        same += f" ({verify(nnet, req, full, sc, rng):.1e})"
                rows.append([net, shape, str(n_seqs), fmt(full_ms), fmt(k_full),
                             ratio(full_ms, k_full), fmt(sc_ms), fmt(k_sc), ratio(sc_ms, k_sc),
                             ratio(full_ms, sc_ms), fmt(warm_ms), ratio(full_ms, warm_ms),
                             used, fmt(hit_us, ".0f"),
                             fmt(key_us, ".0f"), same])
                secs = info["seconds"]
                phase_rows.append([net, shape, str(n_seqs)]
                                  + [fmt(secs[ph] * 1e3) for ph in PHASES])
                realistic.progress(f"{net}/{shape}/N={n_seqs} done")
            pts = sorted((n, t) for n, t in full_times.items() if n >= 8)
            if len(pts) >= 2:
                (n0, t0), (n1, t1) = pts[0], pts[-1]
                growth.append(f"{net}/{shape}: full compile time grows as N^"
                              f"{math.log(t1 / t0) / math.log(n1 / n0):.2f} "
                              f"(N = {n0} -> {n1})")
    realistic.print_table(
        "compile scaling (ms, median): full = compile+optimize; shortcut = fresh "
        "CachingCompiler + first compile; K = Kaldi (scaling.json); x = ours/Kaldi",
        ["net", "shape", "N", "full", "K full", "x", "shortcut", "K shortcut", "x",
         "full/sc", "warm sc", "full/warm", "sc used", "hit us", "key us", "same size"],
        rows, notes)
    realistic.print_table("shortcut compile, time per phase (ms)", ["net", "shape", "N", *PHASES],
                phase_rows, [])
    for line in growth:
        print(f"  {line}")
    print(f"\npynnet3 {pynnet3.__version__}, numpy {np.__version__}; "
          f"total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
