"""Kaldi's network-level update rules (nnet-utils.cc), on an Nnet and a delta.

A *delta* is ``{component name: {param name: float32 array}}`` shaped like each
updatable component's ``params()`` (Kaldi's ``delta_nnet``: a copy of the network
whose parameters hold the step). The functions here are the pieces
``NnetTrainer::Train`` calls after the backward pass, with Kaldi's names:

* :func:`apply_l2_regularization` (ApplyL2Regularization)
* :func:`update_with_max_change` (UpdateNnetWithMaxChange): per-component
  max-change, then the global max-param-change, then ``params += factor * delta``
* :func:`scale_batchnorm_stats` (ScaleBatchnormStats)
* :func:`constrain_orthonormal` (ConstrainOrthonormal)

(SetLearningRate, SetBatchnormTestMode and SetDropoutTestMode are methods of
:class:`~pynnet3.Nnet`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..components.affine import AffineComponent, FixedAffineComponent, LinearComponent
from ..components.batchnorm import BatchNormComponent
from ..components.composite import CompositeComponent
from ..components.fused import linear_part
from ..components.tdnn import TdnnComponent
from ..errors import RuntimeInputError, TrainingError


def updatable_components(nnet) -> list[tuple[str, object]]:
    """``(name, component)`` of every updatable component, in the network's order
    (the order of Kaldi's per-component max-change factors)."""
    return [(name, c) for name, c in nnet.components.items() if c.is_updatable()]


def learning_rates(comp) -> dict[str, float]:
    """The learning rate Kaldi's Update uses for each parameter array of ``comp``:
    its ``learning_rate`` (the actual rate; the factor was applied when it was set),
    or the sub-component's for a CompositeComponent's ``"i:param"`` arrays."""
    if isinstance(comp, CompositeComponent):
        return {key: float(comp.components[int(key.split(":", 1)[0])].learning_rate)
                for key in comp.params()}
    return {key: float(comp.learning_rate) for key in comp.params()}


def apply_l2_regularization(nnet, l2_scale: float, delta: dict, comps=None,
                            delta_stats: dict | None = None) -> None:
    """Kaldi's ApplyL2Regularization: ``delta += -2 * l2_scale * lr * l2-regularize *
    params`` for each updatable component with ``l2-regularize`` set. Kaldi calls it
    with ``l2_scale = num sequences * l2-regularize-factor``. (``comps``: the network's
    :func:`updatable_components`, where the caller has them.)

    Kaldi does it with ``Component::Add``, and LstmNonlinearityComponent::Add adds the
    statistics too: its delta's value/derivative sums, self-repair totals and count
    (``delta_stats[name]``, as :func:`add_backprop_stats` takes them) gain the same
    multiple of the model's, when ``delta_stats`` is given."""
    if l2_scale == 0.0:
        return
    for name, comp in comps if comps is not None else updatable_components(nnet):
        l2 = float(getattr(comp, "l2_regularize", 0.0))
        if not (float(comp.learning_rate) >= 0.0 and l2 >= 0.0):  # (Kaldi's assertion)
            raise TrainingError(f"component {name!r} has learning rate "
                                f"{float(comp.learning_rate):g} and l2-regularize {l2:g}: "
                                f"both must be >= 0 for L2 regularization")
        if l2 == 0.0:
            continue
        # (Kaldi: the component's own LearningRate(), a CompositeComponent's too)
        scale = np.float32(-2.0 * l2_scale * float(comp.learning_rate) * l2)
        for key, p in comp.params().items():
            if scale != 0.0:
                delta[name][key] += scale * p.astype(np.float32, copy=False)
        if (delta_stats is not None and scale != 0.0
                and comp.type_name == "LstmNonlinearityComponent"):
            _add_lstm_model_stats(delta_stats.setdefault(name, {}), float(scale), comp)


def _add_lstm_model_stats(stats: dict, alpha: float, comp) -> None:
    """``stats += alpha * comp's statistics`` as sums (the component keeps averages)."""
    count = float(comp.count)
    cells = comp.value_avg.shape[1]
    mine = {"value_sum": comp.value_avg.astype(np.float64) * count,
            "deriv_sum": comp.deriv_avg.astype(np.float64) * count,
            "self_repair_total": comp.self_repair_prob.astype(np.float64) * count * cells,
            "count": count}
    for key, value in mine.items():
        stats[key] = stats.get(key, 0.0 * value) + alpha * value


@dataclass
class MaxChangeResult:
    """What UpdateNnetWithMaxChange decided: ``scales[name]`` the per-component
    max-change factor (1.0 where not active), ``global_scale`` the max-param-change
    factor (1.0 where not active), ``applied`` False when the change was not finite
    (then nothing was added, as Kaldi), ``message`` Kaldi's log line ('' if none),
    ``verbose_lines`` its VLOG(2) line for each component scaled down."""

    scales: dict[str, float] = field(default_factory=dict)
    global_scale: float = 1.0
    factors: dict[str, float] = field(default_factory=dict)  # what multiplied each delta
    applied: bool = True
    message: str = ""
    verbose_lines: list[str] = field(default_factory=list)


def update_with_max_change(nnet, delta: dict, max_param_change: float,
                           max_change_scale: float = 1.0, scale: float = 1.0,
                           comps=None) -> MaxChangeResult:
    """Kaldi's UpdateNnetWithMaxChange: per updatable component, the factor
    ``min(1, max-change * max_change_scale / (||delta|| * |scale|))`` (components
    with max-change 0 are not limited); then the global factor
    ``min(1, max_param_change * max_change_scale / ||scaled delta||)``; then
    ``params += scale * global * factor * delta``, in place. (``comps``: the network's
    :func:`updatable_components`, where the caller has them.)"""
    if comps is None:
        comps = updatable_components(nnet)
    result = MaxChangeResult()
    sq = {name: _float_range(sum(_sumsq(a) for a in delta[name].values()))
          for name, _ in comps}
    param_delta_sq = 0.0
    num_applied = 0
    min_scale, min_name, min_max_change = 1.0, "", 0.0
    for i, (name, comp) in enumerate(comps):
        max_change = float(comp.max_change)
        if not max_change >= 0.0:  # (Kaldi's assertion; a file can hold one)
            raise TrainingError(f"component {name!r} has max-change {max_change:g}: "
                                f"it must be >= 0")
        norm = math.sqrt(sq[name])
        factor = 1.0
        if max_change != 0.0 and norm * abs(scale) > max_change * max_change_scale:
            factor = max_change * max_change_scale / (norm * abs(scale))
            num_applied += 1
            result.verbose_lines.append(
                f"Parameters in {name} change too big: {norm:.6g} * {scale:.6g} > "
                f"max-change * max-change-scale={max_change:.6g} * {max_change_scale:.6g}, "
                f"scaling by {factor:.6g}")
        result.scales[name] = factor
        if i == 0 or factor < min_scale:
            min_scale, min_name, min_max_change = factor, name, max_change
        param_delta_sq = _float_range(param_delta_sq + factor * factor * sq[name])
    param_delta = math.sqrt(param_delta_sq) * abs(scale)
    limit = max_param_change * max_change_scale
    global_active = max_param_change != 0.0 and param_delta > limit
    if global_active:
        if not math.isfinite(param_delta):
            result.applied = False
            result.message = "Infinite parameter change, will not apply."
            return result
        result.global_scale = limit / param_delta
        scale *= result.global_scale
    result.message = _max_change_message(num_applied, len(comps), min_scale, min_name,
                                         min_max_change, global_active, param_delta, limit,
                                         max_param_change)
    for name, comp in comps:
        alpha = np.float32(result.scales[name] * scale)
        result.factors[name] = float(alpha)
        params = comp.params()
        for key, d in delta[name].items():
            p = params[key]
            p += (alpha * d).astype(p.dtype, copy=False)
    return result


def _max_change_message(num_applied: int, num_updatable: int, min_scale: float,
                        min_name: str, min_max_change: float, global_active: bool,
                        param_delta: float, limit: float, max_param_change: float) -> str:
    """UpdateNnetWithMaxChange's log line ('' when it logs none). Kaldi logs when the
    global max-change was applied or a per-component one was; its global part is
    written whenever ``param_delta > max-param-change * max-change-scale``, so with
    ``--max-param-change=0`` (global max-change off) and a per-component max-change
    active the line ends in "Global max-change factor was 0 with max-change=0."."""
    if not (global_active or min_scale < 1.0):
        return ""
    parts = []
    if min_scale < 1.0:
        parts.append(f"Per-component max-change active on {num_applied} / {num_updatable} "
                     f"Updatable Components. (Smallest factor={min_scale:.6g} on {min_name} "
                     f"with max-change={min_max_change:.6g}). ")
    if param_delta > limit:
        parts.append(f"Global max-change factor was {limit / param_delta:.6g} with "
                     f"max-change={max_param_change:.6g}.")
    return "".join(parts)


def add_backprop_stats(comp, alpha: float, stats: dict) -> None:
    """Kaldi's LstmNonlinearityComponent::Add for the statistics its Backprop put in
    the delta network: sums, self-repair counts and count added times ``alpha`` (the
    factor its parameter delta got). The component keeps averages (as its file
    does), so they are rebuilt from sums."""
    if not stats:
        return
    old = float(comp.count)
    new = old + alpha * float(stats["count"])
    cells = comp.value_avg.shape[1]
    for attr, key in (("value_avg", "value_sum"), ("deriv_avg", "deriv_sum")):
        total = getattr(comp, attr).astype(np.float64) * old + alpha * stats[key]
        setattr(comp, attr, (total / new if new != 0.0 else total * 0.0).astype(np.float32))
    repair = comp.self_repair_prob.astype(np.float64) * old * cells + \
        alpha * stats["self_repair_total"]
    comp.self_repair_prob = (repair / (new * cells) if new != 0.0 else repair * 0.0).astype(
        np.float32)
    comp.count = new


def scale_batchnorm_stats(nnet, batchnorm_stats_scale: float) -> None:
    """Kaldi's ScaleBatchnormStats: each BatchNormComponent's count and sums times
    the scale (mean and variance unchanged); 1.0 does nothing."""
    if not 0.0 <= batchnorm_stats_scale <= 1.0:
        raise ValueError(f"batchnorm-stats-scale must be in [0, 1], got {batchnorm_stats_scale}")
    if batchnorm_stats_scale == 1.0:
        return
    for comp in nnet.components.values():
        if isinstance(comp, BatchNormComponent):
            s = float(batchnorm_stats_scale)
            comp.count = comp.count * s
            comp.stats_sum = comp.stats_sum * s
            comp.stats_sumsq = comp.stats_sumsq * s
            comp._written_stats = None  # the file's mean/variance no longer describe them
            if s == 0.0:
                comp.count = 0.0


def orthonormal_constrained(nnet) -> list[tuple[str, object, np.ndarray]]:
    """``(name, component, matrix)`` for every component Kaldi's ConstrainOrthonormal
    looks at (Linear, Affine and its subclasses, Tdnn) whose orthonormal-constraint
    is nonzero, in network order; ``matrix`` is the live parameter array. A fused
    kernel (components/fused.py, from ``optimize_network``) counts as its linear
    layer: the constraint goes to the weights it trains, which are the linear
    layer's scaled by the folded map's (a BatchNorm's) per-row scale, as any folded
    layer's are."""
    out = []
    for name, comp in nnet.components.items():
        lin = linear_part(comp)
        if isinstance(lin, FixedAffineComponent):
            continue
        if isinstance(lin, LinearComponent):
            m = lin.params()["params"]
        elif isinstance(lin, (AffineComponent, TdnnComponent)):
            m = lin.params()["linear_params"]
        else:
            continue
        if float(getattr(lin, "orthonormal_constraint", 0.0)) != 0.0:
            out.append((name, comp, m))
    return out


def constrain_orthonormal_matrix(m: np.ndarray, scale: float, name: str = "") -> list[str]:
    """Kaldi's ConstrainOrthonormalInternal on the rows of ``m`` (its transpose when
    it has more rows than columns), in place: one step
    ``M -= 4 nu / scale^2 (M M^T - scale^2 I) M`` (nu = 1/8) towards
    ``M M^T = scale^2 I``; a negative scale floats (``scale^2 = tr(P^2)/tr(P)``,
    with nu halved once or twice when far from convergence, see
    :func:`_floating_scale`). Returns Kaldi's warnings for this matrix (``name``: the
    component, for them); raises :class:`~pynnet3.errors.TrainingError` where
    Kaldi's assertion stops training (a floating scale on a matrix that is not
    finite)."""
    if scale == 0.0:
        raise ValueError("orthonormal constraint scale must be nonzero")
    transpose = m.shape[0] > m.shape[1]
    x = (m.T if transpose else m).astype(np.float64)
    p = x @ x.T
    update_speed, warnings = 0.125, []
    if scale < 0.0:
        floating = _floating_scale(p, name)
        if floating is None:
            return warnings  # an unused component: almost zero
        scale, update_speed, warnings = floating
    p[np.diag_indices(p.shape[0])] -= scale * scale
    alpha = update_speed / (scale * scale)
    x += -4.0 * alpha * (p @ x)
    m[...] = (x.T if transpose else x).astype(m.dtype)
    return warnings


def _floating_scale(p: np.ndarray, name: str) -> tuple[float, float, list[str]] | None:
    """The floating scale of ConstrainOrthonormalInternal for ``P = M M^T``: ``(scale,
    update speed, warnings)``, or None when ``tr(P) < 1e-15`` (Kaldi leaves the
    matrix alone). ``ratio = tr(P^2) rows / tr(P)^2`` (>= 1; how far the eigenvalues
    are apart) halves the speed 1/8 above 1.02 and again above 1.1, with Kaldi's
    warning; below 0.99 Kaldi warns, and below 0.9 (or NaN: a matrix that is not
    finite) it asserts, which ends training."""
    trace_p = float(np.trace(p))
    trace_pp = float(np.sum(p * p))
    if trace_p < 1.0e-15:
        return None
    scale = math.sqrt(trace_pp / trace_p)  # (NaN when the matrix is not finite)
    ratio = trace_pp * p.shape[0] / (trace_p * trace_p)
    speed, warnings = 0.125, []
    if not ratio > 0.99:
        warnings.append(f"Ratio is {ratio:.6g} (should be >= 1.0); component is {name}")
        if not ratio > 0.9:
            raise TrainingError(f"ConstrainOrthonormal: assertion ratio > 0.9 failed "
                                f"(ratio {ratio:.6g}) for component {name!r}: its "
                                f"parameters are not finite")
    if ratio > 1.02:
        warnings.append(f"Ratio is {ratio:.6g}, multiplying update speed (currently "
                        f"{speed:.6g}) by 0.5; component is {name}")
        speed *= 0.5
        if ratio > 1.1:
            speed *= 0.5
    return scale, speed, warnings


def constrain_orthonormal(nnet, rng: np.random.Generator, applied_to=None,
                          warnings: list[str] | None = None) -> list[str]:
    """Kaldi's ConstrainOrthonormal: each constrained component (see
    :func:`orthonormal_constrained`) gets one constraint step with probability 1/4
    (``RandInt(0, 3) == 0``, one draw per constrained component in network order,
    from ``rng``). With ``applied_to`` (component names) exactly those get it and
    nothing is drawn. Returns the names constrained; Kaldi's warnings (the floating
    scale's eigenvalue ratio) are appended to ``warnings`` when given."""
    done = []
    constrained = orthonormal_constrained(nnet)
    if applied_to is not None:
        wanted = set(applied_to)
        unknown = wanted - set(nnet.components)
        if unknown:
            raise RuntimeInputError(f"orthonormal_constraint_applied_to names unknown "
                                    f"components: {sorted(unknown)}")
    for name, comp, m in constrained:
        if applied_to is None:
            if int(rng.integers(0, 4)) != 0:
                continue
        elif name not in wanted:
            continue
        said = constrain_orthonormal_matrix(m, float(comp.orthonormal_constraint), name)
        if warnings is not None:
            warnings += said
        done.append(name)
    return done


def _sumsq(a: np.ndarray) -> float:
    """Sum of squares in float64 (Kaldi's DotProduct of a component with itself)."""
    flat = a.astype(np.float64).reshape(-1)
    return float(np.dot(flat, flat))


_FLOAT_MAX = float(np.finfo(np.float32).max)


def _float_range(x: float) -> float:
    """``x`` as Kaldi's BaseFloat holds it: beyond float32's range it is infinite.
    (UpdateNnetWithMaxChange sums squares in float: a delta whose sum of squares
    overflows gets the per-component factor max-change / inf = 0, and then the
    global norm is 0 * inf = NaN, which compares false: that component does not
    move, the others take their step; without a per-component max-change the
    global norm is infinite and nothing is applied.)"""
    return math.inf if x > _FLOAT_MAX else x
