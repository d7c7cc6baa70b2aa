"""Objective functions of output nodes (Kaldi's ComputeObjectiveFunction).

``linear`` (the default ``objective=linear``, cross-entropy when the output is a
log-softmax): ``objf = sum(y * out)``, weight ``sum(y)``, derivative ``y``.
``quadratic``: ``objf = -0.5 * ||out - y||^2``, weight = rows, derivative
``y - out``. Chain (LF-MMI) objectives are not here (see pynnet3.train).
"""

from __future__ import annotations

import numpy as np

from ..errors import RuntimeInputError


def compute_objective(objective_type: str, output: np.ndarray, supervision,
                      name: str) -> tuple[float, float, np.ndarray]:
    """``(total objective, total weight, derivative w.r.t. the output)`` for one output
    node; ``supervision`` dense with one row per output row."""
    try:
        y = np.asarray(supervision, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise RuntimeInputError(f"supervision for output {name!r}: not a matrix ({e})") from None
    if y.shape != output.shape:
        raise RuntimeInputError(f"supervision for output {name!r}: expected shape "
                                f"{tuple(output.shape)} (one row per output index of the "
                                f"request, output-dim columns), got {y.shape}")
    if not np.isfinite(y).all():
        raise RuntimeInputError(f"supervision for output {name!r}: non-finite value")
    if objective_type == "linear":
        weight = float(y.sum(dtype=np.float64))
        objf = float(np.einsum("ij,ij->", y, output, dtype=np.float64))
        return objf, weight, y
    if objective_type == "quadratic":
        diff = y - output
        objf = -0.5 * float(np.einsum("ij,ij->", diff, diff, dtype=np.float64))
        return objf, float(y.shape[0]), diff
    raise RuntimeInputError(f"output {name!r}: objective type {objective_type!r} is not "
                            f"supported (linear and quadratic are)")
