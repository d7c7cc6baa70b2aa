"""The set-up every benchmark script does before it imports numpy or pynnet3.

Import it first (``from bench_setup import REPO``, then ``# isort: split``): it

* sets one BLAS thread (``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` /
  ``MKL_NUM_THREADS``): Kaldi's figures used one, and on a shared machine several
  threads make timings erratic. A setting already in the environment wins. BLAS
  reads these when numpy loads, hence first;
* makes ``pynnet3`` importable from a checkout without an installed package;
* puts ``benchmarks/`` on ``sys.path``, for the sibling modules (realistic, gemm).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

REPO = Path(__file__).resolve().parents[1]
"""The repository's root (``benchmarks/..``)."""

if importlib.util.find_spec("pynnet3") is None:  # a checkout without an installed package
    sys.path.insert(0, str(REPO / "src"))
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))
