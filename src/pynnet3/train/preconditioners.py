"""Which natural-gradient preconditioners each Kaldi component type keeps.

Kaldi stores them in the component (``preconditioner_in_`` / ``_out_`` /
``preconditioner_`` ...) and configures them from the component's options or
from constants in its code; the trainer here keeps them instead (keyed by
component name, so they persist across minibatches) and hands them to the
component's backprop through the gradient target (components/preconditioning.py
names the slots). The settings below are Kaldi's, type by type:

=============================================  ==========================================
type                                           slots: rank, update period, history, alpha
=============================================  ==========================================
NaturalGradientAffine, Linear (always:         in: rank-in, out: rank-out; update-period,
Kaldi's Backprop ignores use-natural-gradient) num-samples-history, alpha from the options
Tdnn (use-natural-gradient)                    in: rank-in, alpha-in; out: rank-out,
                                               alpha-out; 4; num-samples-history
NaturalGradientPerElementScale                 params: rank, update-period, history, alpha
PerElementOffset (use-natural-gradient)        params: 20, 4
ScaleAndOffset (use-natural-gradient)          scale, offset: rank, 4
Constant, ConstantFunction (use-natural-       params: Kaldi's defaults (40, 1)
gradient; updatable)
NaturalGradientRepeatedAffine                  in: min(40, in/2) (>= 1), 4
LstmNonlinearity                               params: 20, 2, history 1000
TimeHeightConvolution (use-natural-gradient)   in: rank-in, out: rank-out, alpha-in/out,
                                               num-minibatches-history
GruNonlinearity                                in (s_{t-1} * r_t), out (h_t's derivative):
                                               rank-in, rank-out, update-period, alpha
OutputGruNonlinearity                          params (per-frame c_{t-1} * derivative):
                                               rank, update-period, alpha
=============================================  ==========================================

A CompositeComponent gets ``{i: sub-component i's preconditioners}``.
"""

from __future__ import annotations

from ..components.fused import linear_part
from .natural_gradient import OnlineNaturalGradient


def kind_is_composite(comp) -> bool:
    return comp.type_name == "CompositeComponent"


def _pair(comp) -> dict:
    common = dict(update_period=comp.update_period,
                  num_samples_history=comp.num_samples_history, alpha=comp.alpha)
    return {"in": OnlineNaturalGradient(comp.rank_in, **common),
            "out": OnlineNaturalGradient(comp.rank_out, **common)}


def make_preconditioners(comp) -> dict | None:
    """Fresh preconditioners (slot -> :class:`OnlineNaturalGradient`) configured as
    Kaldi configures those of ``comp``'s type, or None when it trains with the plain
    gradient."""
    if kind_is_composite(comp):  # each sub-component its own, by position
        subs = {i: make_preconditioners(c) for i, c in enumerate(comp.components)
                if c.is_updatable()}
        return {i: p for i, p in subs.items() if p is not None} or None
    if getattr(comp, "is_gradient", False):
        return None  # Kaldi's Update on a gradient copy is the plain one
    comp = linear_part(comp)  # (a fused kernel trains as its linear layer)
    kind = comp.type_name
    ng = bool(getattr(comp, "use_natural_gradient", True))
    if kind in ("NaturalGradientAffineComponent", "LinearComponent"):
        return _pair(comp)
    if kind == "TdnnComponent" and ng:
        history = comp.num_samples_history
        return {"in": OnlineNaturalGradient(comp.rank_in, 4, history, comp.alpha_in),
                "out": OnlineNaturalGradient(comp.rank_out, 4, history, comp.alpha_out)}
    if kind == "NaturalGradientPerElementScaleComponent":
        return {"params": OnlineNaturalGradient(
            comp.rank, comp.update_period, comp.num_samples_history, comp.alpha)}
    if kind == "PerElementOffsetComponent" and ng:
        return {"params": OnlineNaturalGradient(20, 4)}
    if kind == "ScaleAndOffsetComponent" and ng:
        return {"scale": OnlineNaturalGradient(comp.rank, 4),
                "offset": OnlineNaturalGradient(comp.rank, 4)}
    if kind in ("ConstantComponent", "ConstantFunctionComponent") and ng:
        return {"params": OnlineNaturalGradient()}
    if kind == "NaturalGradientRepeatedAffineComponent":
        rank_in = max(1, min(40, comp.linear_params.shape[1] // 2))
        return {"in": OnlineNaturalGradient(rank_in, 4)}
    if kind == "LstmNonlinearityComponent":
        return {"params": OnlineNaturalGradient(20, 2, 1000.0)}
    if kind == "GruNonlinearityComponent":
        common = dict(update_period=comp.update_period, alpha=comp.alpha)
        return {"in": OnlineNaturalGradient(comp.rank_in, **common),
                "out": OnlineNaturalGradient(comp.rank_out, **common)}
    if kind == "OutputGruNonlinearityComponent":
        return {"params": OnlineNaturalGradient(comp.rank, comp.update_period,
                                                alpha=comp.alpha)}
    if kind == "TimeHeightConvolutionComponent" and ng:
        history = dict(num_minibatches_history=comp.num_minibatches_history)
        return {"in": OnlineNaturalGradient(comp.rank_in, alpha=comp.alpha_in, **history),
                "out": OnlineNaturalGradient(comp.rank_out, alpha=comp.alpha_out, **history)}
    return None


def skips_update(comp) -> bool:
    """Kaldi's Tdnn and TimeHeightConvolution Backprop return before their Update at
    learning rate 0, so their preconditioners do not see that minibatch."""
    comp = linear_part(comp)
    return comp.type_name in ("TdnnComponent", "TimeHeightConvolutionComponent") and \
        comp.learning_rate == 0.0
