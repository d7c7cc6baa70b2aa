#!/usr/bin/env python
"""Commands and peak memory of our optimized computations next to Kaldi's.

For the realistic networks at the request shapes of ``scaling.json`` (N = 1, 8,
32, 128 sequences; decode 150 frames, train 20 frames with model derivative)
prints num_commands and peak_memory_floats of our optimized computation, Kaldi's
(``optimized``, or ``shortcut`` where Kaldi did not run the plain compile) and the
ratio ours/Kaldi; a second table does the same for the looped runs
(``looped/*/run_info.json``). Our computations come from the CachingCompiler
(shortcut compilation; its computations equal full compilation, which the tests
check), so N = 128 takes seconds, not minutes. Also printed: the same figures
with the beyond-Kaldi passes switched off, to show what they add.

    python benchmarks/optimizer_memory.py [--nets tdnnf_chain,xvector] [--max-n 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realistic  # noqa: E402  (requests, reference dir, table printing)
from realistic import NETS, SCALING_NS, print_table, ratio  # noqa: E402

import pynnet3  # noqa: E402
from pynnet3.cache import CachingCompiler  # noqa: E402
from pynnet3.optimize import OptimizeOptions  # noqa: E402

KALDI_ONLY = OptimizeOptions(allocate_from_other_peak_aware=False, remove_needless_noops=False,
                             free_provided_outputs=False, splice_free_affine=False,
                             remove_dead_input_derivatives=False)


def scaling_table(nets, ref: Path, max_n: int):
    records = realistic.scaling_records(ref)
    rows, cmd_r, peak_r = [], [], []
    for net in nets:
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        ours_cc = CachingCompiler(nnet, optimize=True)
        kaldi_cc = CachingCompiler(nnet, optimize=KALDI_ONLY)
        for shape in ("decode", "train"):
            for n in (n for n in SCALING_NS if n <= max_n):
                k = records.get((net, shape, n), {})
                kst = k.get("optimized") or k.get("shortcut") or {}
                req = realistic.scaling_request(nnet, net, shape, n)
                ours = ours_cc.compile(req).stats()
                plain = kaldi_cc.compile(req).stats()
                kc, kp = kst.get("num_commands"), kst.get("peak_memory_floats")
                if kc and kp:
                    cmd_r.append(ours["num_commands"] / kc)
                    peak_r.append(ours["peak_memory_floats"] / kp)
                rows.append([net, shape, str(n), str(ours["num_commands"]), str(kc or "-"),
                             ratio(ours["num_commands"], kc),
                             str(ours["peak_memory_floats"]), str(kp or "-"),
                             ratio(ours["peak_memory_floats"], kp),
                             str(plain["num_commands"]), str(plain["peak_memory_floats"]),
                             ratio(plain["peak_memory_floats"], kp)])
                realistic.progress(f"{net}/{shape}/N={n}")
    notes = []
    if cmd_r:
        notes.append(f"median ours/Kaldi: commands {statistics.median(cmd_r):.3f}, "
                     f"peak {statistics.median(peak_r):.3f} over {len(cmd_r)} shapes; "
                     f"max peak {max(peak_r):.3f}")
    print_table("optimized computations at scaling.json shapes (ours vs Kaldi; 'Kaldi "
                "passes' = our pipeline with the beyond-Kaldi passes off)",
                ["net", "shape", "N", "cmds", "K cmds", "x", "peak", "K peak", "x",
                 "Kaldi passes cmds", "Kaldi passes peak", "x"], rows, notes)


def looped_table(ref: Path):
    from pynnet3.runtime.looped import LoopedDecodingInfo, LoopedOptions

    rows = []
    for run in sorted((ref / "looped").iterdir()):
        info = json.loads((run / "run_info.json").read_text())
        opts = LoopedOptions.from_flags(json.loads((run / "options.json").read_text()))
        nnet = pynnet3.read_nnet(run / info["model"])
        st = LoopedDecodingInfo(nnet, opts).computation.stats()
        rows.append([run.name, str(st["num_commands"]), str(info["num_commands"]),
                     ratio(st["num_commands"], info["num_commands"]),
                     str(st["peak_memory_floats"]), str(info["peak_memory_floats"]),
                     ratio(st["peak_memory_floats"], info["peak_memory_floats"])])
    print_table("looped computations (Kaldi's count includes its no-ops)",
                ["run", "cmds", "K cmds", "x", "peak", "K peak", "x"], rows, [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--max-n", type=int, default=128)
    args = ap.parse_args(argv)
    ref = realistic.reference_dir()
    scaling_table(args.nets.split(","), ref, args.max_n)
    looped_table(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
