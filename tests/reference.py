"""Access to ../shared/kaldi-reference for tests (skips cleanly when it is absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

REF = Path(os.environ.get("PYNNET3_REFERENCE",
                          Path(__file__).resolve().parents[2] / "shared" / "kaldi-reference"))


def require_reference() -> Path:
    if not REF.is_dir():
        pytest.skip(f"reference data not found at {REF}")
    return REF


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


def load_components(model_path: Path) -> dict:
    """name -> Component, read from a model file with pynnet3's component readers."""
    from pynnet3.io.model_file import parse_model_bytes

    parts = parse_model_bytes(Path(model_path).read_bytes(), str(model_path))
    return dict(parts.components)
