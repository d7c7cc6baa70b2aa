"""Averaging networks, as Kaldi's nnet3-average (ScaleNnet + AddNnet).

:func:`average_nnets` returns ``sum_i w_i * nnet_i`` component by component, with
Kaldi's ``Component::Scale`` / ``Component::Add`` semantics:

- parameters of updatable components: the weighted sum (float32, as Kaldi's
  ``Scale`` then ``AddMat``); everything else (learning rates, options, fixed
  components) is the first network's;
- statistics that are sums (nonlinearity value/derivative sums and counts,
  BatchNorm count and sums, clipping counters, attention stats): the weighted sum,
  so BatchNorm's mean and variance become the count-weighted averages;
- statistics stored as averages (LSTM / GRU ``<ValueAvg>``, ``<DerivAvg>``,
  ``<SelfRepairProb>``): averaged weighted by ``w_i * count_i``, which is what the
  weighted sum of Kaldi's in-memory sums gives.

:func:`kaldi_weights` is nnet3-average's ``--weights`` handling (colon-separated,
normalized to sum to one in float32). Networks must have the same components
(names, types, parameter shapes); anything else is a :class:`DimensionError`
naming the component. A first weight of 0 gives the plain weighted sum of the
others (Kaldi would mark the first network as a gradient instead).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..components.batchnorm import BatchNormComponent
from ..errors import ConfigError, DimensionError

# Statistics that are sums, by component type name (Kaldi's Scale/Add scale them).
_SUM_STATS = {
    "NonlinearComponent": ("value_sum", "deriv_sum", "oderiv_sumsq", "count", "oderiv_count",
                           "num_dims_self_repaired", "num_dims_processed"),
    "BackpropTruncationComponent": ("num_clipped", "num_zeroed", "count",
                                    "count_zeroing_boundaries"),
    "RestrictedAttentionComponent": ("entropy_stats", "posterior_stats", "stats_count"),
    "_GruStatsMixin": ("self_repair_total",),
}
# Integer counters (Kaldi's int32 fields: the scaled value is truncated toward zero).
_INT_STATS = {"ClipGradientComponent": ("count", "num_clipped", "num_self_repaired",
                                        "num_backpropped")}
# Averages weighted by the component's count.
_AVG_STATS = {"LstmNonlinearityComponent": ("value_avg", "deriv_avg", "self_repair_prob"),
              "_GruStatsMixin": ("value_avg", "deriv_avg")}


def kaldi_weights(weights: str | Sequence[float] | None, num_inputs: int
                  ) -> tuple[np.ndarray, float | None]:
    """nnet3-average's GetWeights: ``(weights normalized to sum to one (float32),
    the sum before normalizing when it was not 1.0 else None)``. ``weights`` is a
    colon-separated string, a sequence, or None/"" for ``1/num_inputs`` each."""
    if num_inputs < 1:
        raise ConfigError("averaging needs at least one network")
    if weights is None or (isinstance(weights, str) and not weights.strip()):
        w = np.full(num_inputs, np.float32(1.0) / np.float32(num_inputs), np.float32)
    else:
        text = weights if isinstance(weights, str) else None
        try:
            values = ([float(v) for v in text.split(":") if v.strip()] if text is not None
                      else [float(v) for v in weights])
        except ValueError:
            raise ConfigError(f"--weights must be a colon-separated list of numbers, got "
                              f"{weights!r}") from None
        if len(values) != num_inputs:
            raise ConfigError(f"--weights option must be a colon-separated list with "
                              f"{num_inputs} elements, got: {weights!r}")
        w = np.array(values, dtype=np.float32)
    total = np.float32(0.0)
    for v in w:  # (float32 accumulation, in order, as Kaldi)
        total = np.float32(total + v)
    if total == 0.0 or not np.isfinite(total):
        raise ConfigError(f"--weights must not sum to {float(total)}")
    return (w / total).astype(np.float32), (None if total == 1.0 else float(total))


def _stat_names(comp, table: dict) -> tuple[str, ...]:
    names = [table[k.__name__] for k in type(comp).__mro__ if k.__name__ in table]
    return tuple(n for group in names for n in group if hasattr(comp, n))


def _check_compatible(name: str, a, b) -> None:
    if type(a) is not type(b):
        raise DimensionError(f"component {name!r}: cannot average a {a.type_name} with a "
                             f"{b.type_name}")
    pa, pb = a.params(), b.params()
    if pa.keys() != pb.keys() or any(pa[k].shape != pb[k].shape for k in pa):
        raise DimensionError(f"component {name!r}: parameter shapes differ "
                             f"({ {k: v.shape for k, v in pa.items()} } vs "
                             f"{ {k: v.shape for k, v in pb.items()} })")


def _as_array_like(value, like):
    """``value`` (possibly an empty vector Kaldi never resized) shaped like ``like``."""
    value = np.asarray(value, dtype=np.float64)
    if value.size == 0 and np.size(like):
        return np.zeros(np.shape(like), np.float64)
    return value


def scale_component(comp, scale: float) -> None:
    """Kaldi's ``Component::Scale`` (see the module doc), in place."""
    s = np.float32(scale)
    for p in comp.params().values():
        if s == 0.0:
            p[...] = 0.0
        else:
            p *= s
    for sub in getattr(comp, "components", None) or ():  # CompositeComponent's stats
        _scale_stats(sub, float(s))
    _scale_stats(comp, float(s))


def _scale_stats(comp, s: float) -> None:
    if isinstance(comp, BatchNormComponent):
        comp.count = comp.count * s
        comp.stats_sum = comp.stats_sum * s
        comp.stats_sumsq = comp.stats_sumsq * s
        comp._written_stats = None  # (the file's mean/variance no longer describe them)
        return
    for n in _stat_names(comp, _SUM_STATS):
        v = getattr(comp, n)
        setattr(comp, n, v * s if isinstance(v, np.ndarray) else float(v) * s)
    for n in _stat_names(comp, _INT_STATS):
        setattr(comp, n, int(float(getattr(comp, n)) * s))
    # Averages stay (sum and count both scale); only the count changes, done above
    # for the sum-stats types; LSTM keeps its count here.
    if _stat_names(comp, _AVG_STATS) and "count" not in _stat_names(comp, _SUM_STATS):
        comp.count = float(comp.count) * s


def add_component(comp, alpha: float, other) -> None:
    """Kaldi's ``Component::Add(alpha, other)``: ``comp += alpha * other``, in place."""
    a = np.float32(alpha)
    theirs = other.params()
    for key, p in comp.params().items():
        p += a * theirs[key]
    for mine, sub in zip(getattr(comp, "components", None) or (),
                         getattr(other, "components", None) or (), strict=True):
        _add_stats(mine, float(a), sub)
    _add_stats(comp, float(a), other)


def _add_stats(comp, a: float, other) -> None:
    if isinstance(comp, BatchNormComponent):
        comp.count = comp.count + a * other.count
        comp.stats_sum = comp.stats_sum + a * other.stats_sum
        comp.stats_sumsq = comp.stats_sumsq + a * other.stats_sumsq
        comp._written_stats = None
        if comp.count > 0:
            comp._compute_derived(None)  # (Kaldi's Add recomputes offset and scale)
        return
    avg_names = _stat_names(comp, _AVG_STATS)
    count_before = float(getattr(comp, "count", 0.0)) if avg_names else 0.0
    for n in _stat_names(comp, _SUM_STATS):
        mine, theirs = getattr(comp, n), getattr(other, n)
        if isinstance(mine, np.ndarray) or isinstance(theirs, np.ndarray):
            mine, theirs = _as_array_like(mine, theirs), _as_array_like(theirs, mine)
            setattr(comp, n, mine + a * theirs)
        else:
            setattr(comp, n, float(mine) + a * float(theirs))
    for n in _stat_names(comp, _INT_STATS):
        setattr(comp, n, int(float(getattr(comp, n)) + a * float(getattr(other, n))))
    if avg_names:
        c1, c2 = count_before, a * float(other.count)
        total = c1 + c2
        for n in avg_names:
            x1 = np.asarray(getattr(comp, n), np.float64)
            x2 = np.asarray(getattr(other, n), np.float64)
            avg = (x1 * c1 + x2 * c2) / total if total != 0.0 else np.zeros_like(x1)
            setattr(comp, n, avg.astype(np.asarray(getattr(comp, n)).dtype))
        if "count" not in _stat_names(comp, _SUM_STATS):
            comp.count = total


def average_nnets(nnets: Sequence, weights: str | Sequence[float] | None = None):
    """``sum_i w_i * nnets[i]`` as nnet3-average computes it (a new network; the
    inputs are unchanged). ``weights``: see :func:`kaldi_weights`."""
    if not nnets:
        raise ConfigError("averaging needs at least one network")
    w, _ = kaldi_weights(weights, len(nnets))
    first = nnets[0]
    out = first.copy()
    for other in nnets[1:]:
        if list(other.components) != list(first.components):
            raise DimensionError("cannot average networks with different components: "
                                 f"{list(first.components)} vs {list(other.components)}")
        for name, comp in first.components.items():
            _check_compatible(name, comp, other.components[name])
    if len(nnets) > 1 or w[0] != 1.0:
        for comp in out.components.values():
            scale_component(comp, float(w[0]))
    for weight, other in zip(w[1:], nnets[1:], strict=True):
        for name, comp in out.components.items():
            add_component(comp, float(weight), other.components[name])
    return out


__all__ = ["add_component", "average_nnets", "kaldi_weights", "scale_component"]
