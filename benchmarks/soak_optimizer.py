#!/usr/bin/env python
"""Soak the command-level optimizer with random networks.

Draws ``--count`` random cases (``pynnet3.testing.case_for_seed`` for seeds
``--seed``, ``--seed + 1``, ...), and for each compares every optimizer variant
(defaults, each bool option off, no memory compression, derivative-time windows)
with the unoptimized run: outputs, input derivatives, gradients, stored stats
(see ``pynnet3.testing.differential``). Prints a summary table (cases, variants
checked, findings by variant / first bad pass / array kind, time), then each
failing seed with its first findings and how to reproduce it. Exits 1 when
anything was found.

    python benchmarks/soak_optimizer.py [--count 1000] [--seed 0] [--jobs 2]
        [--check auto|default|all|none] [--variants default,without:]
        [--layers ff,rnn] [--time-limit 600]
    python benchmarks/soak_optimizer.py --show SEED   # config, request, findings
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
from pynnet3.testing import LAYERS, Finding, case_for_seed, default_variants
from pynnet3.testing.differential import checker_available, run_differential


def _check_arg(mode: str):
    if mode == "none":
        return False
    if mode == "default":
        return ("default",)
    if mode == "all":
        return True
    return ("default",) if checker_available() else False  # auto


def one_case(seed: int, args) -> tuple[int, int, list[Finding], float, list[str]]:
    """(seed, variants checked, findings, seconds, passes that changed the default
    variant's computation) of one seed; generator and harness crashes are findings
    too."""
    t0 = time.perf_counter()
    layers = tuple(args.layers.split(",")) if args.layers else None
    try:
        case = case_for_seed(seed, layers)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return seed, 0, [Finding(seed, "-", "generate", f"{type(e).__name__}: {e}")], \
            time.perf_counter() - t0, []
    variants = default_variants(case)
    if args.variants:
        keep = args.variants.split(",")
        variants = [v for v in variants if any(v.name.startswith(k) for k in keep)]
    reports: dict = {}
    try:
        findings = run_differential(case, variants, dtype=args.dtype,
                                    check=_check_arg(args.check), reports=reports)
    except Exception as e:  # noqa: BLE001
        findings = [Finding(seed, "-", "harness", f"{type(e).__name__}: {e}")]
    active = [p.name for p in reports["default"].passes if p.changed] \
        if "default" in reports else []
    return seed, len(variants), findings, time.perf_counter() - t0, active


def _worker(item):
    seed, args = item
    return one_case(seed, args)


def _table(title: str, counter: Counter, cases: dict, header: str) -> list[str]:
    if not counter:
        return []
    lines = [f"{title}", f"  {header:<40} {'findings':>9} {'cases':>6}"]
    for key, n in counter.most_common():
        lines.append(f"  {str(key):<40} {n:>9} {len(cases[key]):>6}")
    return lines


def show(seed: int, args) -> int:
    layers = tuple(args.layers.split(",")) if args.layers else None
    case = case_for_seed(seed, layers)
    print(case.describe())
    print(f"# generator features: {sorted(case.features)}")
    _, n, findings, dt, active = one_case(seed, args)
    print(f"# passes that changed the default variant: {', '.join(active) or '-'}")
    print(f"# {n} variants, {len(findings)} findings, {dt:.2f} s")
    for f in findings:
        print(f)
    return 1 if findings else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1000, help="number of random cases")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--check", choices=("auto", "default", "all", "none"), default="auto",
                   help="checker after every pass: of the default variant (auto/default, "
                        "auto only when the checker exists), of every variant, or never")
    p.add_argument("--variants", default="",
                   help="comma-separated variant name prefixes to keep (default: all)")
    p.add_argument("--layers", default="",
                   help=f"comma-separated layer kinds to draw from ({','.join(LAYERS)})")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="stop starting new cases after this many seconds (0: no limit)")
    p.add_argument("--max-print", type=int, default=5, help="findings printed per failing case")
    p.add_argument("--show", type=int, default=None, metavar="SEED",
                   help="print one case (config, request) and its findings")
    args = p.parse_args(argv)
    if args.show is not None:
        return show(args.show, args)

    seeds = list(range(args.seed, args.seed + args.count))
    t0 = time.perf_counter()
    results = []
    items = [(s, args) for s in seeds]
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.Pool(args.jobs) as pool:
            it = pool.imap_unordered(_worker, items, chunksize=2)
            for r in it:
                results.append(r)
                _progress(len(results), len(seeds), r, t0)
                if args.time_limit and time.perf_counter() - t0 > args.time_limit:
                    pool.terminate()
                    break
    else:
        for item in items:
            results.append(_worker(item))
            _progress(len(results), len(seeds), results[-1], t0)
            if args.time_limit and time.perf_counter() - t0 > args.time_limit:
                break
    elapsed = time.perf_counter() - t0
    results.sort(key=lambda r: r[0])
    return summarize(results, elapsed, args)


def _progress(done: int, total: int, result, t0: float) -> None:
    if done % 50 == 0 or result[2]:
        bad = f"  seed {result[0]}: {len(result[2])} findings" if result[2] else ""
        print(f"[{done}/{total}] {time.perf_counter() - t0:.0f} s{bad}", file=sys.stderr,
              flush=True)


def summarize(results, elapsed: float, args) -> int:
    by_variant, by_pass, by_array = Counter(), Counter(), Counter()
    cases_v, cases_p, cases_a = defaultdict(set), defaultdict(set), defaultdict(set)
    failing = {}
    active = Counter(name for r in results for name in r[4])
    for seed, _, findings, _, _ in results:
        if findings:
            failing[seed] = findings
        for f in findings:
            kind = f.array.split(":")[0]
            for counter, cases, key in ((by_variant, cases_v, f.variant),
                                        (by_pass, cases_p, f.pass_name or "(not blamed)"),
                                        (by_array, cases_a, kind)):
                counter[key] += 1
                cases[key].add(seed)
    n_variants = sum(r[1] for r in results)
    total = sum(len(r[2]) for r in results)
    slowest = max(results, key=lambda r: r[3]) if results else None
    early = ", stopped early" if len(results) < args.count else ""
    rate = len(results) / max(elapsed, 1e-9)
    slow = f"; slowest seed {slowest[0]}: {slowest[3]:.2f} s" if slowest else ""
    lines = ["", "optimizer soak summary",
             f"  cases               {len(results)} (seeds {args.seed}.."
             f"{args.seed + args.count - 1}{early})",
             f"  variants checked    {n_variants}",
             f"  checker             {args.check} (available: {checker_available()})",
             f"  findings            {total} in {len(failing)} cases",
             f"  time                {elapsed:.1f} s ({rate:.1f} cases/s{slow})"]
    lines.append("passes that changed something (default variant): " + (", ".join(
        f"{name} {n}" for name, n in active.most_common()) or "none"))
    lines += _table("findings by variant (option switched)", by_variant, cases_v, "variant")
    lines += _table("findings by first bad pass", by_pass, cases_p, "pass")
    lines += _table("findings by array / stage", by_array, cases_a, "array")
    print("\n".join(lines))
    if failing:
        print("\nfailing seeds:")
        for seed, findings in failing.items():
            print(f"  seed {seed}: {len(findings)} findings")
            for f in findings[:args.max_print]:
                print(f"    {f}")
        first = next(iter(failing))
        layers = f" --layers {args.layers}" if args.layers else ""
        layers_py = f", layers={tuple(args.layers.split(','))!r}" if args.layers else ""
        print("\nreproduce one case (config, request and findings):")
        print(f"  python benchmarks/soak_optimizer.py --show {first}{layers}")
        print("or in Python:")
        print("  from pynnet3.testing import case_for_seed, run_differential")
        print(f"  run_differential(case_for_seed({first}{layers_py}))")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
