#!/usr/bin/env python
"""Benchmark pynnet3 on the four realistic networks, next to Kaldi's figures.

Prints two kinds of tables (no assertions on time):

(a) the reference cases ``realistic/<net>/{decode,train}/request.json``: our
    compile time (unoptimized compile, optimize pass on a copy, median of a few
    reps), run time (forward; forward+backward for train), input frames/s,
    num_commands, num_matrices and peak_memory_floats, next to Kaldi's figures from
    the case's ``stats.json`` with ratios ours/Kaldi;
(b) scaling: the request shapes of ``scaling.json`` (N sequences; decode 150
    frames, train 20 frames with model derivative) with our compile and forward
    times next to Kaldi's ``compile_ms``(+``optimize_ms``), ``cache_shortcut_ms`` and
    ``forward_ms``/``forward_backward_ms``.

Kaldi's figures come from an -O1 build on a shared 2-core machine with one
OpenBLAS thread; treat ratios as orders of magnitude. For a like-for-like
comparison the script sets ``OPENBLAS_NUM_THREADS=1`` (and OMP/MKL) unless the
environment already sets them.

The reference data is found through ``$PYNNET3_REFERENCE`` or at
``../shared/kaldi-reference`` relative to the repository.

    python benchmarks/realistic.py [--nets tdnnf_chain,xvector] [--reps 3]
                                   [--max-n 128] [--timeout 30] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from bench_setup import REPO  # first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np

import pynnet3
from pynnet3.computation import CommandType
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize import optimize as optimize_computation

NETS = ("tdnnf_chain", "tdnn_lstm", "tdnn_relu_bn", "xvector")
SCALING_NS = (1, 8, 32, 128)


def reference_dir() -> Path:
    env = os.environ.get("PYNNET3_REFERENCE")
    path = Path(env) if env else REPO.parent / "shared" / "kaldi-reference"
    if not (path / "realistic").is_dir():
        sys.exit(f"kaldi-reference not found at {path} (set PYNNET3_REFERENCE)")
    return path


def scaling_records(ref: Path) -> dict[tuple[str, str, int], dict]:
    """scaling.json's records (Kaldi's figures per request shape) by (network, shape, N)."""
    return {(r["network"], r["shape"], r["N"]): r
            for r in json.loads((ref / "scaling.json").read_text())}


def kaldi_ms(ref: Path, shape: str) -> dict[tuple[str, int], float]:
    """Kaldi's run time per (network, N) at ``shape`` from scaling.json: ``forward_ms``
    for decode, ``forward_backward_ms`` for train."""
    field = "forward_ms" if shape == "decode" else "forward_backward_ms"
    return {(net, n): r[field] for (net, s, n), r in scaling_records(ref).items() if s == shape}


# -- timing helpers ---------------------------------------------------------------------

class CompileTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise CompileTimeout after ``seconds`` (SIGALRM; a no-op where unavailable)."""
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def handler(signum, frame):
        raise CompileTimeout()

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def timed(fn, *fargs, reps: int, budget_s: float, timeout: float | None = None,
          warmup: bool = False):
    """Run ``fn(*fargs)`` up to ``reps`` times (at least once; stop early once the total
    passes ``budget_s``). Returns (median ms, last result). The first call is under
    ``timeout``. ``warmup``: one untimed call first (lazy imports, allocator, BLAS threads)."""
    times, result = [], None
    if warmup:
        fn(*fargs)
    for i in range(max(1, reps)):
        t0 = time.perf_counter()
        with time_limit(timeout if i == 0 else None):
            result = fn(*fargs)
        times.append((time.perf_counter() - t0) * 1e3)
        if sum(times) > budget_s * 1e3:
            break
    return statistics.median(times), result


def forward_part(comp):
    """The commands before the first NO_OPERATION_MARKER (the forward pass)."""
    for k, c in enumerate(comp.commands):
        if c.type is CommandType.NO_OPERATION_MARKER:
            return dataclasses.replace(comp, commands=comp.commands[:k])
    return comp


def make_data(nnet, req, rng):
    inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
              .astype(np.float32) for s in req.inputs}
    derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
              .astype(np.float32) for s in req.outputs if s.has_deriv}
    return inputs, derivs


# -- requests -----------------------------------------------------------------------------

def _frames(n_seqs: int, t0: int, t1: int) -> np.ndarray:
    """(n, t, 0) for n in 0..n_seqs-1 (outer), t in t0..t1-1 (inner): Kaldi's row order."""
    n, t = np.meshgrid(np.arange(n_seqs), np.arange(t0, t1), indexing="ij")
    return np.stack([n.ravel(), t.ravel(), np.zeros(n.size, dtype=np.int64)], axis=1)


def scaling_request(nnet, net: str, shape: str, n_seqs: int):
    """The request of scaling.json for (net, shape, N), built as its README says."""
    from pynnet3 import ComputationRequest, IoSpecification

    train = shape == "train"
    frames = 20 if train else 150
    left, right = nnet.context()
    inputs, outputs = [], []
    if net == "xvector":  # one output per sequence at t=0; inputs t=0..frames-1+7
        inputs.append(IoSpecification("input", _frames(n_seqs, 0, frames + 7)))
        out_idx = _frames(n_seqs, 0, 1)
    else:
        inputs.append(IoSpecification("input", _frames(n_seqs, -left, frames + right)))
        out_idx = _frames(n_seqs, 0, frames)
    if "ivector" in nnet.input_names():
        inputs.append(IoSpecification("ivector", _frames(n_seqs, 0, 1)))
    for name in nnet.output_names():
        outputs.append(IoSpecification(name, out_idx.copy(), has_deriv=train))
    return ComputationRequest(inputs=inputs, outputs=outputs, need_model_derivative=train,
                              store_component_stats=False)


# -- formatting ---------------------------------------------------------------------------

def progress(msg: str) -> None:
    if sys.stderr.isatty():
        print(f"  [{msg}]", file=sys.stderr, flush=True)


def fmt(v, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "-"
    r = a / b
    return f"{r:.2f}" if r < 10 else f"{r:.0f}"


def pair(a, b) -> str:
    return f"{fmt(a, 'd')}/{fmt(b, 'd')}"


def print_head(title: str, head: str) -> None:
    """The start of a table printed row by row: its title, column heads, a rule."""
    print(title)
    print(head)
    print("-" * len(head))


def print_table(title: str, header: list[str], rows: list[list[str]], notes: list[str]):
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in
                     enumerate(zip(header, widths, strict=True)))
    print(f"\n{title}")
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths, strict=True))), flush=True)
    for n in notes:
        print(f"  note: {n}")
    sys.stdout.flush()


# -- (a) reference cases -------------------------------------------------------------------

def bench_case(nnet, net: str, shape: str, ref: Path, args, rng):
    case = ref / "realistic" / net / shape
    kst = json.loads((case / "stats.json").read_text())
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    label = f"{net}/{shape}"
    opts = OptimizeOptions()
    kw = {"reps": args.reps, "budget_s": args.rep_budget}
    try:
        c_ms, unopt = timed(pynnet3.compile, nnet, req, False, **kw, timeout=args.timeout)
        # optimize may work in place: each rep gets its own copy, made outside the timing
        copies = iter([copy.deepcopy(unopt) for _ in range(max(1, args.reps))])
        o_ms, opt = timed(lambda: optimize_computation(next(copies), nnet, opts), **kw,
                          timeout=args.timeout)
    except CompileTimeout:
        return None, f"{label}: compile/optimize exceeded --timeout {args.timeout:g}s; skipped"
    except Exception as e:  # noqa: BLE001 - report and go on
        return None, f"{label}: compile failed: {type(e).__name__}: {str(e)[:160]}"
    su, so = unopt.stats(), opt.stats()
    inputs, derivs = make_data(nnet, req, rng)
    train = bool(derivs) or req.need_model_derivative
    try:
        fwd_ms, _ = timed(pynnet3.run, nnet, forward_part(opt), inputs, **kw, warmup=True)
        fb_ms = None
        if train:
            fb_ms, _ = timed(pynnet3.run, nnet, opt, inputs, derivs, **kw, warmup=True)
    except Exception as e:  # noqa: BLE001
        return None, f"{label}: run failed: {type(e).__name__}: {str(e)[:160]}"
    in_frames = sum(len(s.indexes) for s in req.inputs if s.name == "input")
    run_ms = fb_ms if train else fwd_ms
    ku, ko = kst["unoptimized"], kst["optimized"]
    k_opt_ms = kst.get("optimize_ms")
    row = {
        "case": label,
        "compile": [fmt(c_ms), fmt(kst.get("compile_ms")), ratio(c_ms, kst.get("compile_ms")),
                    fmt(o_ms, ".2f"), fmt(k_opt_ms, ".2f"), ratio(o_ms, k_opt_ms),
                    pair(su["num_commands"], ku["num_commands"]),
                    pair(so["num_commands"], ko["num_commands"]),
                    pair(su["num_matrices"], ku["num_matrices"]),
                    pair(so["num_matrices"], ko["num_matrices"]),
                    pair(su["peak_memory_floats"], ku["peak_memory_floats"]),
                    pair(so["peak_memory_floats"], ko["peak_memory_floats"]),
                    ratio(so["peak_memory_floats"], ko["peak_memory_floats"])],
        "run": [fmt(fwd_ms, ".2f"), fmt(fb_ms, ".2f"), fmt(kst.get("run_opt_ms"), ".2f"),
                ratio(run_ms, kst.get("run_opt_ms")), str(in_frames),
                f"{in_frames / (run_ms / 1e3):.0f}"],
    }
    return row, None


def table_a(nets, ref: Path, args, rng, nnets):
    rows_c, rows_r, notes = [], [], []
    for net in nets:
        for shape in ("decode", "train"):
            row, note = bench_case(nnets[net], net, shape, ref, args, rng)
            if note:
                notes.append(note)
                progress(note)
                continue
            rows_c.append([row["case"], *row["compile"]])
            rows_r.append([row["case"], *row["run"]])
            progress(f"{row['case']} done")
    print_table(
        "(a1) reference cases: compile (ms, median) and computation size, ours/Kaldi",
        ["case", "compile", "K compile", "x", "optimize", "K optimize", "x",
         "cmds unopt", "cmds opt", "mats unopt", "mats opt", "peak unopt", "peak opt",
         "peak x"], rows_c, notes)
    print_table(
        "(a2) reference cases: run (ms, median; optimized computation, numpy backend)",
        ["case", "fwd", "fwd+bwd", "K run_opt", "x", "in frames", "in frames/s"],
        rows_r, [])


# -- (b) scaling ----------------------------------------------------------------------------

def table_b(nets, ref: Path, args, rng, nnets):
    records = scaling_records(ref)
    ns = [n for n in SCALING_NS if n <= args.max_n]
    rows, notes = [], []
    opts = OptimizeOptions()
    kw = {"reps": args.scaling_reps, "budget_s": args.rep_budget}
    for net in nets:
        nnet = nnets[net]
        for shape in ("decode", "train"):
            skip_rest = None
            for n_seqs in ns:
                k = records.get((net, shape, n_seqs), {})
                label = [net, shape, str(n_seqs)]
                if skip_rest:
                    rows.append([*label, "skipped", *["-"] * 11])
                    continue
                req = scaling_request(nnet, net, shape, n_seqs)
                in_frames = len(req.inputs[0].indexes)
                if k and k.get("input_frames_per_seq") is not None:
                    expect = k["input_frames_per_seq"] * n_seqs
                    if expect != in_frames:
                        notes.append(f"{net}/{shape}/N={n_seqs}: {in_frames} input frames, "
                                     f"scaling.json says {expect}")
                try:
                    c_ms, comp = timed(pynnet3.compile, nnet, req, opts, **kw,
                                       timeout=args.timeout)
                except CompileTimeout:
                    rows.append([*label, f">{args.timeout:g}s", *["-"] * 11])
                    notes.append(f"{net}/{shape}/N={n_seqs}: compile exceeded --timeout "
                                 f"{args.timeout:g}s; larger N skipped")
                    skip_rest = True
                    continue
                except Exception as e:  # noqa: BLE001
                    rows.append([*label, "error", *["-"] * 11])
                    notes.append(f"{net}/{shape}/N={n_seqs}: {type(e).__name__}: "
                                 f"{str(e)[:160]}")
                    skip_rest = True
                    continue
                inputs, derivs = make_data(nnet, req, rng)
                try:
                    fwd_ms, _ = timed(pynnet3.run, nnet, forward_part(comp), inputs, **kw,
                                      warmup=True)
                    fb_ms = None
                    if shape == "train":
                        fb_ms, _ = timed(pynnet3.run, nnet, comp, inputs, derivs, **kw,
                                         warmup=True)
                except Exception as e:  # noqa: BLE001
                    fwd_ms = fb_ms = None
                    notes.append(f"{net}/{shape}/N={n_seqs}: run failed: "
                                 f"{type(e).__name__}: {str(e)[:160]}")
                k_c = k.get("compile_ms")
                k_co = (k_c + k["optimize_ms"]) if k_c is not None and \
                    k.get("optimize_ms") is not None else None
                k_sc = k.get("cache_shortcut_ms")
                k_opt = k.get("optimized") or k.get("shortcut") or {}
                st = comp.stats()
                rows.append([*label, fmt(c_ms), fmt(k_co), ratio(c_ms, k_co), fmt(k_sc),
                             ratio(c_ms, k_sc), fmt(fwd_ms, ".2f"),
                             fmt(k.get("forward_ms"), ".2f"),
                             ratio(fwd_ms, k.get("forward_ms")), fmt(fb_ms, ".2f"),
                             fmt(k.get("forward_backward_ms"), ".2f"),
                             pair(st["num_commands"], k_opt.get("num_commands")),
                             pair(st["peak_memory_floats"], k_opt.get("peak_memory_floats"))])
                progress(f"{net}/{shape}/N={n_seqs} done")
    print_table(
        "(b) scaling (scaling.json shapes): ours = compile+optimize; K c+o = Kaldi compile_ms"
        "+optimize_ms; K cache = cache_shortcut_ms (ms, median)",
        ["net", "shape", "N", "compile", "K c+o", "x", "K cache", "x", "fwd", "K fwd", "x",
         "fwd+bwd", "K fwd+bwd", "cmds ours/K", "peak ours/K"], rows, notes)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default=",".join(NETS),
                   help="comma-separated subset of " + ",".join(NETS))
    p.add_argument("--reps", type=int, default=5, help="max repetitions per timing (median)")
    p.add_argument("--max-n", type=int, default=32,
                   help="largest scaling N (1, 8, 32, 128); default 32")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds; a compile that takes longer is skipped (and larger N)")
    p.add_argument("--rep-budget", type=float, default=2.0,
                   help="stop repeating a timing once its total passes this many seconds")
    p.add_argument("--quick", action="store_true",
                   help="1 rep, scaling N up to 8")
    p.add_argument("--skip", default="", help="comma-separated tables to skip: a,b")
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 1
        args.max_n = min(args.max_n, 8)
    args.scaling_reps = args.reps
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    bad = [n for n in nets if n not in NETS]
    if bad:
        p.error(f"unknown nets {bad}; choose from {','.join(NETS)}")
    ref = reference_dir()
    skip = set(args.skip.split(","))
    rng = np.random.default_rng(0)

    t_start = time.perf_counter()
    nnets = {}
    for net in nets:
        t0 = time.perf_counter()
        nnets[net] = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        left, right = nnets[net].context()
        print(f"{net}: read {(time.perf_counter() - t0) * 1e3:.0f} ms, "
              f"{nnets[net].num_params()} params, context -{left}/+{right}")
    print(f"pynnet3 {pynnet3.__version__}, numpy {np.__version__}, reps {args.reps}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; "
          f"'x' columns are ours/Kaldi; a/b columns are ours/Kaldi")
    if "a" not in skip:
        table_a(nets, ref, args, rng, nnets)
    if "b" not in skip:
        table_b(nets, ref, args, rng, nnets)
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
