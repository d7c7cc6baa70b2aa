#!/usr/bin/env python
"""Soak pynnet3's input handling with the mutation fuzz (pynnet3.testing.fuzz).

Runs ``--cases`` cases, the four kinds (config, text model, binary model,
request JSON) in turn over the seeds: the bundled TDNN-F example, ``--random``
random networks and, when found, the small ``generated`` cases of the
kaldi-reference data (``--reference``, default ../shared/kaldi-reference).
Prints a table (cases per kind, how they ended by error class, findings), then
each distinct finding (exception class and place) with one case that shows it
and how to rerun that case. Exits 1 when anything was found.

    python benchmarks/fuzz_soak.py [--cases 4000] [--seed 0] [--random 6]
        [--reference DIR|none] [--kinds config,request] [--default-limits]
        [--case-seconds 30] [--memory-gib 4]
    python benchmarks/fuzz_soak.py --seed S --case I --verbose   # one case, traceback

A case ends successfully or with a pynnet3.errors exception; anything else (an
OverflowError, a MemoryError under the address-space cap, a case past its time
limit, ...) is a finding. The run uses tight limits (FUZZ_LIMITS) so cases stay
cheap; --default-limits runs with the limits in force instead.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench_setup import REPO  # first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
from pynnet3.testing import fuzz as fz


def _place(outcome: fz.Outcome) -> str:
    """Where a finding was raised: the innermost pynnet3 frame of its traceback."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', outcome.message)
    ours = [f"{f.split('pynnet3/')[-1]}:{line} {fn}" for f, line, fn in frames
            if "pynnet3" in f and "/testing/" not in f]
    return ours[-1] if ours else "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--case", type=int, default=None, help="run only this case number")
    p.add_argument("--random", type=int, default=6, help="random-network seeds")
    p.add_argument("--reference", default=str(REPO.parent / "shared" / "kaldi-reference"),
                   help="kaldi-reference folder, or 'none'")
    p.add_argument("--kinds", default=",".join(fz.KINDS))
    p.add_argument("--default-limits", action="store_true",
                   help="the limits in force instead of the tight FUZZ_LIMITS")
    p.add_argument("--case-seconds", type=float, default=30.0)
    p.add_argument("--memory-gib", type=float, default=4.0,
                   help="address space a case may add (Linux); 0: no cap")
    p.add_argument("--verbose", action="store_true", help="print every finding in full")
    args = p.parse_args(argv)

    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(fz.KINDS)
    if unknown:
        p.error(f"unknown kinds {sorted(unknown)} (known: {', '.join(fz.KINDS)})")
    reference = None if args.reference == "none" else Path(args.reference)
    if reference is not None and not reference.is_dir():
        print(f"# no kaldi-reference at {reference}: bundled and random seeds only")
        reference = None
    t0 = time.perf_counter()
    seeds = fz.default_seeds(reference, random_cases=args.random)
    options = dict(seed=args.seed, kinds=kinds, seeds=seeds, case_seconds=args.case_seconds,
                   memory_gib=args.memory_gib or None, tight_limits=not args.default_limits)
    if args.case is not None:
        outcomes = fz.fuzz(1, first=args.case, **options)
    else:
        outcomes = fz.fuzz(args.cases, **options)
    seconds = time.perf_counter() - t0

    print(f"# {len(outcomes)} cases, {len(seeds)} seeds, seed {args.seed}, "
          f"{'default' if args.default_limits else 'tight'} limits, {seconds:.1f} s")
    print(fz.summarize(outcomes))
    groups: dict[tuple[str, str], list[fz.Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.finding:
            groups[(o.error, _place(o))].append(o)
    for (error, place), found in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        o = found[0]
        print(f"\n{len(found)} x {error} at {place}\n  e.g. {o.describe().splitlines()[0]}")
        print(f"  rerun: python benchmarks/fuzz_soak.py --seed {args.seed} --case {o.case} "
              f"--kinds {args.kinds} --verbose")
        if args.verbose:
            print("\n".join("    " + line for line in o.message.splitlines()))
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())
