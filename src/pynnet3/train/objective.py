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
    # (float32 values summed in float64 cannot overflow: the sum is finite exactly
    # when every value is)
    with np.errstate(invalid="ignore"):  # (inf - inf)
        weight = float(y.sum(dtype=np.float64))
    if not np.isfinite(weight):
        raise RuntimeInputError(f"supervision for output {name!r}: non-finite value")
    if objective_type == "linear":
        return _sum_of_products(y, output), weight, y
    if objective_type == "quadratic":
        diff = y - output
        return -0.5 * _sum_of_products(diff, diff), float(y.shape[0]), diff
    raise RuntimeInputError(f"output {name!r}: objective type {objective_type!r} is not "
                            f"supported (linear and quadratic are)")


def _sum_of_products(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a * b)`` of two matrices: of float32 ones each row's in float32 (a row of
    one output, as Kaldi's TraceMatMat takes it in float), the rows' totals added in
    float64; otherwise all in float64."""
    if a.dtype == np.float32 and b.dtype == np.float32 and a.ndim == 2:
        return float(np.einsum("ij,ij->i", a, b).sum(dtype=np.float64))
    return float(np.einsum("ij,ij->", a, b, dtype=np.float64))
