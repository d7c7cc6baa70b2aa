"""Access to ../shared/kaldi-reference (or $PYNNET3_REFERENCE) for tests.

Without the folder every test that needs it is reported as skipped, with the one
reason :data:`REASON`: in-test through :func:`require_reference`, whole tests
through the :data:`needs_reference` mark, and tests parametrized by reference
files through :func:`ref_params` (one skipped parameter instead of none, so the
test does not vanish). With the folder present, a listing that finds nothing
fails (``tests/conftest.py``): a partly missing folder must not pass quietly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

REF = Path(os.environ.get("PYNNET3_REFERENCE",
                          Path(__file__).resolve().parents[2] / "shared" / "kaldi-reference"))
REASON = (f"Kaldi reference data not found at {REF} (put shared/kaldi-reference beside "
          "the repository, or set PYNNET3_REFERENCE)")
HAVE_REFERENCE = REF.is_dir()

# For a whole test that reads reference files.
needs_reference = pytest.mark.skipif(not HAVE_REFERENCE, reason=REASON)


def require_reference() -> Path:
    """REF, or skip the calling test with :data:`REASON`."""
    if not HAVE_REFERENCE:
        pytest.skip(REASON)
    return REF


def ref_params(items: Iterable, what: str = "reference files", nargs: int = 1) -> list:
    """Values for ``pytest.mark.parametrize`` over reference files or cases: ``items``
    as they are when the reference is present; one skipped parameter (``nargs``
    Nones) when it is absent; one failing parameter when it is present but
    ``items`` is empty (``what`` names what was looked for)."""
    if not HAVE_REFERENCE:
        return [pytest.param(*[None] * nargs, id="no-reference",
                             marks=pytest.mark.skip(reason=REASON))]
    items = list(items)
    if not items:
        return [pytest.param(*[None] * nargs, id="nothing-found",
                             marks=pytest.mark.reference_missing(
                                 reason=f"no {what} found under {REF}"))]
    return items


def component_cases(prefix: str = "") -> list[Path]:
    root = REF / "components"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))


def all_model_files() -> list[Path]:
    if not REF.is_dir():
        return []
    return sorted(REF.rglob("model.txt"))


def load_case(case: Path):
    """(request dict, arrays dict, stats dict) of a reference case folder."""
    request = json.loads((case / "request.json").read_text())
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    stats = json.loads((case / "stats.json").read_text())
    return request, arrays, stats


def realistic_decode(net: str):
    """(network in test mode, ComputationRequest, inputs, Kaldi's outputs) of
    ``realistic/<net>/decode``; inputs and outputs by node name."""
    import pynnet3

    case = REF / "realistic" / net / "decode"
    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    nnet.set_test_mode(True)
    request = pynnet3.ComputationRequest.from_json_text((case / "request.json").read_text())
    with np.load(case / "arrays.npz") as z:
        inputs = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("input:")}
        outputs = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("output:")}
    return nnet, request, inputs, outputs


def load_components(model_path: Path) -> dict:
    """name -> Component, read from a model file with pynnet3's component readers."""
    from pynnet3.io.model_file import parse_model_bytes

    parts = parse_model_bytes(Path(model_path).read_bytes(), str(model_path))
    return dict(parts.components)
