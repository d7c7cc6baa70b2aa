"""What folding needs to know about components: linear maps and per-element maps.

* A *linear* component computes ``y = x W^T + b`` on its (spliced) input:
  Affine, NaturalGradientAffine, FixedAffine, Linear (no bias) and Tdnn (W's
  column blocks belong to its time offsets, bias optional).
* An *elementwise* component computes ``y = x * s + o`` per column in the
  component's current mode: test-mode BatchNorm, FixedScale, FixedBias,
  ScaleAndOffset, PerElementScale, PerElementOffset, test-mode Dropout (forward
  only: its backprop passes derivatives unscaled where the input is 0).

Folding works in float64 and stores float32, as the components do. A folded
component keeps the consumer's type and settings (a Linear that gains a bias
becomes a NaturalGradientAffine with its settings; see :func:`with_linear_params`
for the orthonormal constraint and for merged layers).
"""

from __future__ import annotations

import copy

import numpy as np

from ..components.affine import AffineComponent, LinearComponent, NaturalGradientAffineComponent
from ..components.base import Component

LINEAR_TYPES = ("AffineComponent", "NaturalGradientAffineComponent", "FixedAffineComponent",
                "LinearComponent", "TdnnComponent")
AFFINE_TYPES = ("AffineComponent", "NaturalGradientAffineComponent", "FixedAffineComponent",
                "LinearComponent")
ELEMENTWISE_TYPES = ("BatchNormComponent", "FixedScaleComponent", "FixedBiasComponent",
                     "ScaleAndOffsetComponent", "PerElementScaleComponent",
                     "NaturalGradientPerElementScaleComponent", "PerElementOffsetComponent",
                     "DropoutComponent")


def linear_params(comp: Component) -> tuple[np.ndarray, np.ndarray]:
    """``(W, b)`` in float64: W [output-dim, spliced input-dim], b [output-dim]
    (zeros when the component has no bias)."""
    if isinstance(comp, LinearComponent):
        w = comp.params_
        return w.astype(np.float64), np.zeros(w.shape[0])
    w = comp.linear_params.astype(np.float64)
    b = comp.bias_params.astype(np.float64)
    if b.size == 0:
        b = np.zeros(w.shape[0])
    return w, b


def has_bias(comp: Component) -> bool:
    return not isinstance(comp, LinearComponent) and comp.bias_params.size > 0


def with_linear_params(comp: Component, w: np.ndarray, b: np.ndarray | None,
                       scaled_by: float | np.ndarray | None = 1.0) -> Component:
    """A copy of linear component ``comp`` with parameters ``(W, b)``; ``b`` None
    keeps a bias-free component bias-free.

    The copy keeps ``comp``'s settings (learning rate and factor, max-change, L2,
    natural-gradient ranks, orthonormal constraint), as Kaldi's CollapseModel keeps
    those of the affine component a map folds into: a network written after
    :func:`~pynnet3.optimize_network` trains on as its surviving layers did. A
    Linear given a bias becomes a NaturalGradientAffine with the Linear's settings
    (a plain Affine when it had ``use-natural-gradient=false``).

    ``scaled_by``: the factor(s) (one number, or one per row or per column) by which
    ``W`` is ``comp``'s own weights scaled (a folded map, a descriptor ``Scale``);
    None: ``W`` is no scaled copy of them (two layers merged into one). An
    orthonormal constraint (``M M^T = c^2 I``, floating when ``c < 0``) stays on
    the scaled weights, as Kaldi's CollapseModel keeps it on a copy of the affine
    component (and as a fused kernel trains its scaled weights): under a uniform
    factor ``f`` a fixed ``c`` becomes ``c |f|``, so the folded layer's constraint
    holds exactly where the original one held; under per-row/per-column factors it
    is kept as it was. A merge of two layers drops it: it described one factor, not
    their product (Kaldi's collapse-affine merge drops every setting)."""
    w32 = np.ascontiguousarray(w, dtype=np.float32)
    if isinstance(comp, LinearComponent):
        if b is None:
            out = copy.copy(comp)
            out.params_ = w32
        else:
            natural = comp.use_natural_gradient
            cls = NaturalGradientAffineComponent if natural else AffineComponent
            out = cls(w32, np.asarray(b, np.float32))
            for attr in ("learning_rate", "learning_rate_factor", "max_change", "l2_regularize",
                         "is_gradient", "orthonormal_constraint"):
                setattr(out, attr, getattr(comp, attr))
            if natural:
                for attr in ("rank_in", "rank_out", "update_period", "num_samples_history",
                             "alpha"):
                    setattr(out, attr, getattr(comp, attr))
            if hasattr(comp, "folded_test_mode"):  # (graphopt/folding.py's record)
                out.folded_test_mode = comp.folded_test_mode
    else:
        out = copy.copy(comp)
        out.linear_params = w32
        if b is not None:
            out.bias_params = np.asarray(b, np.float32)
        elif comp.type_name == "TdnnComponent" and comp.bias_params.size == 0:
            out.bias_params = np.zeros(0, np.float32)
    c = float(getattr(comp, "orthonormal_constraint", 0.0))
    if c != 0.0:
        f = None if scaled_by is None else np.abs(np.asarray(scaled_by, np.float64)).ravel()
        if f is None:
            c = 0.0
        elif c > 0.0 and f.size and np.all(f == f[0]) and f[0] != 0.0:
            c *= float(f[0])
        out.orthonormal_constraint = float(np.float32(c))
    return out


def elementwise(comp: Component, keep_derivatives: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """``(s, o)`` float64 vectors of the component's dim when it computes
    ``y = x * s + o`` (and, with ``keep_derivatives``, ``dx = dy * s``) in its
    current mode; else None."""
    t = comp.type_name
    dim = comp.input_dim
    if t == "BatchNormComponent":
        if not comp.test_mode:
            return None
        scale, offset = comp.test_transform()
        reps = dim // scale.shape[0]
        return np.tile(scale.astype(np.float64), reps), np.tile(offset.astype(np.float64), reps)
    if t == "FixedScaleComponent":
        return comp.scales.astype(np.float64), np.zeros(dim)
    if t == "FixedBiasComponent":
        return np.ones(dim), comp.bias.astype(np.float64)
    if t in ("PerElementScaleComponent", "NaturalGradientPerElementScaleComponent"):
        return comp.scales.astype(np.float64), np.zeros(dim)
    if t == "PerElementOffsetComponent":
        reps = dim // comp.offsets.shape[0]
        return np.ones(dim), np.tile(comp.offsets.astype(np.float64), reps)
    if t == "ScaleAndOffsetComponent":
        s = comp._nonzero_scales(comp.scales)
        if keep_derivatives and not np.array_equal(s, comp.scales):
            return None  # Kaldi's backprop uses the raw scales
        reps = dim // s.shape[0]
        return (np.tile(s.astype(np.float64), reps),
                np.tile(comp.offsets.astype(np.float64), reps))
    if t == "DropoutComponent":
        if not comp.test_mode or keep_derivatives:
            return None
        return np.full(dim, float(np.float32(1.0 - comp.dropout_proportion))), np.zeros(dim)
    return None


def identity_scale(comp: Component, keep_derivatives: bool) -> float | None:
    """The scale ``c`` when the component computes ``y = c * x`` row by row (with
    ``keep_derivatives``: and ``dx = c * dy``) in its current mode; else None.
    Such a node can be replaced by ``Scale(c, its input)``."""
    t = comp.type_name
    if t == "NoOpComponent":
        return 1.0 if (comp.backprop_scale == 1.0 or not keep_derivatives) else None
    if t == "GeneralDropoutComponent":
        return 1.0 if comp._is_identity() else None
    if t == "SpecAugmentTimeMaskComponent":
        return 1.0 if comp._is_identity() else None
    if t == "BackpropTruncationComponent":
        return None if keep_derivatives else float(comp.scale)
    ew = elementwise(comp, keep_derivatives)
    if ew is not None:
        s, o = ew
        if not o.any() and s.size and np.all(s == s[0]):
            return float(s[0])
    return None
