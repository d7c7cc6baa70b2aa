#!/usr/bin/env python
"""``pynnet3 compute`` as a whole process, next to Kaldi's nnet3-compute.

Over ``kaldi-reference/compute-timing/`` (its README: the real nnet3-compute timed
with ``/usr/bin/time`` on the same archives and flags, one BLAS thread), for the
networks tdnnf_chain, tdnn_lstm and tdnn_relu_bn, runs ``pynnet3 compute`` with
Kaldi's flags in a fresh process (one BLAS/OpenMP thread) and prints per variant:

* ``unbatched``: as nnet3-compute (``--batch-size=1``);
* ``batch=B``: ``--batch-size=B`` (equal chunks of several utterances per request);
* ``jobs=2``: ``--jobs=2`` on a local Ray cluster (cluster start included; two
  single-threaded workers; peak RSS and CPU time not measured: the workers are
  Ray's processes);

with the wall time of the whole process (start, model reading and preparation,
compiles, decoding, writing; Python's bytecode cache warm, as after an install),
its CPU time (user + system, ``wait4``: steadier than the wall time when the host is
busy), frames/s, the peak RSS (``wait4``), Kaldi's frames/s
and peak RSS for the same utterances, and the ratio ours/Kaldi in frames/s (>= 1:
faster than Kaldi). The utterances are the first ones of ``feats_x10.scp`` up to
``--max-frames`` (default 11,913: exactly ``feats.ark``, Kaldi's ``runs``; 0 or
>= 119,130: all of them, Kaldi's ``runs_x10``; other lengths are compared with the
Kaldi run of the nearer size). Wall times are the minimum over ``--reps`` runs (the
host is shared). No assertions.

    python benchmarks/compute.py [--nets tdnnf_chain] [--max-frames 11913] [--batch 32]
                                 [--jobs-nets tdnnf_chain] [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NETS = ("tdnnf_chain", "tdnn_lstm", "tdnn_relu_bn")
ALL_FRAMES = 119130
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CHILD_ENV: dict[str, str] = {}  # (set in main: one thread, bytecode cache)


def reference_dir() -> Path:
    root = Path(os.environ.get("PYNNET3_REFERENCE", REPO.parent / "shared" / "kaldi-reference"))
    return root / "compute-timing"


def kaldi_flags(timing: dict, net: str) -> list[str]:
    """Kaldi's flags for ``net`` (from timing.json), iVectors read from the x10 scp."""
    run = next(r for r in timing["runs_x10"] if r["network"] == net)
    return run["flags"].split()


def kaldi_figures(timing: dict, net: str, frames: int) -> tuple[float, float, int]:
    """(frames/s, peak RSS MB, frames) of Kaldi's run nearer in size to ``frames``."""
    small = next(r for r in timing["runs"] if r["network"] == net)
    large = next(r for r in timing["runs_x10"] if r["network"] == net)
    run = small if abs(frames - small["frames"]) <= abs(frames - large["frames"]) else large
    return run["frames_per_second_at_median"], run["max_rss_kb"] / 1024, run["frames"]


def utterance_frames(folder: Path) -> list[tuple[str, int]]:
    """(scp line, frames) of feats_x10.scp, in order."""
    import kaldiio

    lines = (folder / "feats_x10.scp").read_text().splitlines()
    cwd = os.getcwd()
    os.chdir(folder)  # (the scp names feats.ark relative to its folder)
    try:
        table = kaldiio.load_scp(str(folder / "feats_x10.scp"))
        return [(line, len(table[line.split()[0]])) for line in lines if line.strip()]
    finally:
        os.chdir(cwd)


def run_once(argv: list[str], cwd: Path) -> tuple[float, float, float, str]:
    """(wall seconds, peak RSS MB, CPU seconds, stderr) of one whole ``pynnet3``
    process."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pynnet3.cli.main", *argv], cwd=cwd,
                                env=CHILD_ENV, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"pynnet3 {' '.join(argv)} failed ({proc.returncode}):\n{text}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--max-frames", type=int, default=11913,
                    help="utterances of feats_x10.scp up to this many frames (0: all)")
    ap.add_argument("--batch", type=int, default=32, help="--batch-size of the batched runs")
    ap.add_argument("--jobs-nets", default="tdnnf_chain",
                    help="networks also run with --jobs=2 ('' for none)")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()

    folder = reference_dir()
    if not folder.is_dir():
        raise SystemExit(f"{folder} not found (set PYNNET3_REFERENCE)")
    timing = json.loads((folder / "timing.json").read_text())
    utts = utterance_frames(folder)
    limit = args.max_frames if 0 < args.max_frames < ALL_FRAMES else ALL_FRAMES
    chosen, frames = [], 0
    for line, n in utts:
        if frames >= limit:
            break
        chosen.append(line)
        frames += n
    realistic = folder.parent / "realistic"
    print(f"pynnet3 compute vs nnet3-compute: {len(chosen)} utterances, {frames} frames, one "
          f"BLAS thread, whole process, min of {args.reps}")
    head = (f"{'network':<13} {'variant':<10} {'wall s':>7} {'cpu s':>6} {'frames/s':>9} "
            f"{'RSS MB':>7} "
            f"{'kaldi f/s':>9} {'kaldi MB':>8} {'ours/kaldi':>10}")
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory() as tmp:
        # Python's bytecode cache as an installed package has it (this host may set
        # PYTHONDONTWRITEBYTECODE, which makes every process compile pynnet3's
        # sources, about a second), kept out of the source tree; filled once, untimed
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        CHILD_ENV.update(env, **ONE_THREAD, PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        subprocess.run([sys.executable, "-c", "import pynnet3.cli.main, pynnet3.cli.scaleout"],
                       env=CHILD_ENV, check=True)
        scp = Path(tmp) / "feats.scp"
        scp.write_text("\n".join(chosen) + "\n")
        for net in args.nets.split(","):
            variants = [("unbatched", ["--batch-size=1"]),
                        (f"batch={args.batch}", [f"--batch-size={args.batch}"])]
            if net in args.jobs_nets.split(","):
                variants.append(("jobs=2", ["--jobs=2"]))
            k_fps, k_mb, k_frames = kaldi_figures(timing, net, frames)
            for name, extra in variants:
                out = Path(tmp) / f"{net}.ark"
                argv = ["compute", *kaldi_flags(timing, net), *extra,
                        str(realistic / net / "model.txt"), f"scp:{scp}", f"ark:{out}"]
                runs = [run_once(argv, folder) for _ in range(args.reps)]
                wall, rss, _, err = min(runs)
                cpu = min(r[2] for r in runs)
                if f"done {len(chosen)} utterances, failed 0" not in err:
                    raise SystemExit(f"unexpected summary:\n{err}")
                # (jobs: Ray's worker processes are not ours to measure)
                rss_text = "-" if name.startswith("jobs") else f"{rss:.0f}"
                cpu_text = "-" if name.startswith("jobs") else f"{cpu:.2f}"
                fps = frames / wall
                print(f"{net:<13} {name:<10} {wall:7.2f} {cpu_text:>6} {fps:9.0f} {rss_text:>7} "
                      f"{k_fps:9.0f} {k_mb:8.0f} {fps / k_fps:10.2f}")
    print(f"(Kaldi's figures: its run over {k_frames} frames, the nearer size; "
          "ratio > 1 means faster than Kaldi)")


if __name__ == "__main__":
    main()
