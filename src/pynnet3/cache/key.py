"""The specialization key of a ComputationRequest, and the regular-layout test that
shortcut compilation uses.

A key must be cheap on every call (a cache hit for a 128 x 150 request costs
tens of microseconds), so it never loops over indexes in Python. It has two
parts (:func:`request_key`): a hashable *bucket key* built in O(number of
inputs/outputs) from names, flags, sizes and three probe indexes per spec, and
the index arrays themselves, compared exactly (one vectorized ``array_equal``
per array) against the few entries of the bucket. So a key is exact, never a
hash that could collide.

Shortcut compilation needs the *regular layout* of a spec
(:func:`regular_layout`): indexes that, reshaped to ``(O, N, S, 3)``, read
``n = n0 + j`` along axis 1 and the same ``(t, x)`` for every ``j`` (``S = 1``: n
innermost, Kaldi's (t, x, n) order; ``O = 1``: one sequence after another). It is
recognised with O(1) scalar probes plus one vectorized comparison, only on a miss.

Offsets. The key is taken relative to a global ``(n, t)`` offset of the request
only when that is provably harmless (see :func:`shift_policy`): descriptors and
components never look at absolute ``n`` (except BackpropTruncation's staggered
zeroing), and a time shift is harmless when it is a multiple of the network's
time period (Round / Switch moduli, component periods), no descriptor pins
time with ``ReplaceIndex(.., t, c)`` and the optimizer options pin no absolute
time (``min_deriv_time`` / ``max_deriv_time``). Two requests that differ only by such a
shift share one cache entry; that entry's ``MatrixInfo.indexes`` and ``request``
name the times and sequence numbers of the request that compiled it. The runtime
never reads absolute indexes, so running the shared computation is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..components.base import Component
from ..descriptor import FailoverOf, IfDefinedOf, OffsetOf, ReplaceIndexOf, RoundOf, SumOf, SwitchOf

# Non-simple (or index-precomputing) component types whose index handling is only
# relative in t, with the period a time shift must respect, and which never read
# absolute n. A type not listed here that overrides the index methods switches
# both shifts off (safe default).
_T_PERIOD = {
    "TdnnComponent": lambda c: 1,
    "TimeHeightConvolutionComponent": lambda c: 1,
    "DistributeComponent": lambda c: 1,
    "ConstantComponent": lambda c: 1,
    "DropoutMaskComponent": lambda c: 1,
    "RestrictedAttentionComponent": lambda c: 1,
    "SpecAugmentTimeMaskComponent": lambda c: 1,
    "StatisticsExtractionComponent": lambda c: math.lcm(c.input_period, c.output_period),
    "StatisticsPoolingComponent": lambda c: c.input_period,
    "GeneralDropoutComponent": lambda c: max(1, c.time_period),
}
# Types that read absolute n ((t - n) // interval): no n shift.
_N_DEPENDENT = {"BackpropTruncationComponent": lambda c: c.zeroing_interval}
_INDEX_METHODS = ("input_indexes", "precompute_indexes", "reorder_indexes")


@dataclass(frozen=True)
class ShiftPolicy:
    """Which global offsets of a request may be dropped from its key.

    ``n_shift``: requests whose n values differ by a constant share an entry.
    ``t_period``: requests whose t values differ by a multiple of it share an
    entry; 0 = exact times only."""

    n_shift: bool
    t_period: int


def _pins_time(e) -> bool:
    if isinstance(e, ReplaceIndexOf):
        return e.variable == "t" or _pins_time(e.src)
    if isinstance(e, (OffsetOf, RoundOf)):
        return _pins_time(e.src)
    if isinstance(e, SwitchOf):
        return any(_pins_time(s) for s in e.srcs)
    if isinstance(e, (SumOf, FailoverOf)):
        return _pins_time(e.a) or _pins_time(e.b)
    if isinstance(e, IfDefinedOf):
        return _pins_time(e.a)
    return False


def shift_policy(nnet, options=None) -> ShiftPolicy:
    """What offsets are safe to canonicalize away for ``nnet`` compiled with the
    OptimizeOptions ``options`` (see module doc)."""
    n_ok, t_ok, period = True, True, max(1, nnet.modulus())
    for comp in nnet.components.values():
        name = comp.type_name
        if name in _N_DEPENDENT:
            n_ok = False
            period = math.lcm(period, max(1, int(_N_DEPENDENT[name](comp))))
            continue
        custom = any(getattr(type(comp), m, None) is not getattr(Component, m, None)
                     for m in _INDEX_METHODS)
        if not custom:
            continue
        if name in _T_PERIOD:
            period = math.lcm(period, max(1, int(_T_PERIOD[name](comp))))
        else:
            n_ok = t_ok = False
    for node in nnet.nodes:
        if node.descriptor is not None and any(_pins_time(p) for p in node.descriptor.parts):
            t_ok = False
    if options is not None and (options.min_deriv_time is not None
                                or options.max_deriv_time is not None):
        t_ok = False  # absolute times: a shifted request keeps other derivatives
    return ShiftPolicy(n_ok, period if t_ok else 0)


@dataclass(frozen=True)
class Layout:
    """A regular index layout: ``(outer, num_n, stride)`` with ``n = n0 + j``."""

    n0: int
    num_n: int
    outer: int
    stride: int


def regular_layout(idx: np.ndarray) -> Layout | None:
    """The regular layout of a ``(k, 3)`` index array, or None (module doc)."""
    k = len(idx)
    if k == 0:
        return None
    n0 = int(idx[0, 0])
    num_n = int(idx[-1, 0]) - n0 + 1
    if num_n < 1 or k % num_n:
        return None
    if num_n == 1:
        col = idx[:, 0]
        return Layout(n0, 1, 1, k) if (col == n0).all() else None
    if int(idx[1, 0]) == n0 + 1:
        stride = 1
    else:
        s = k // num_n  # one sequence after another: the common case, O(1) probe
        if int(idx[s, 0]) == n0 + 1 and int(idx[s - 1, 0]) == n0:
            stride = s
        else:
            stride = int(np.argmax(idx[:, 0] != n0))
            if stride == 0 or int(idx[stride, 0]) != n0 + 1:
                return None
    if k % (num_n * stride):
        return None
    outer = k // (num_n * stride)
    r = idx.reshape(outer, num_n, stride * 3)
    # Consecutive n blocks differ by exactly (1, 0, 0) per row. Comparing the
    # difference with a cached array of the same shape is several times faster
    # than a broadcast comparison.
    if not np.array_equal(r[:, 1:] - r[:, :-1], _step_pattern(outer, num_n, stride)):
        return None
    if not (r[:, 0, 0::3] == n0).all():
        return None
    return Layout(n0, num_n, outer, stride)


_STEPS: dict[tuple, np.ndarray] = {}


def _step_pattern(outer: int, num_n: int, stride: int) -> np.ndarray:
    """``(outer, num_n - 1, stride * 3)`` array of (1, 0, 0) rows (a few cached)."""
    key = (outer, num_n, stride)
    arr = _STEPS.get(key)
    if arr is None:
        arr = np.zeros((outer, num_n - 1, stride, 3), dtype=np.int64)
        arr[..., 0] = 1
        arr = arr.reshape(outer, num_n - 1, stride * 3)
        arr.flags.writeable = False
        if len(_STEPS) >= 32:
            _STEPS.clear()
        _STEPS[key] = arr
    return arr


@dataclass
class RequestKey:
    """A request's bucket ``key`` (hashable, cheap) plus what exact matching needs:
    the ``arrays`` of index arrays (inputs then outputs) and the ``shift``
    ``(n, t)`` that was dropped from the key."""

    key: tuple
    arrays: list
    shift: tuple

    def matches(self, arrays: list, shift: tuple) -> bool:
        """True when this request's indexes equal ``arrays`` (taken with ``shift``)
        up to the difference of the two shifts. Every element is compared: a hit
        is exact. (Unshifted, one contiguous ``==`` per array, about as fast as
        memcmp; that comparison, not the key, is most of a hit's cost.)"""
        if len(arrays) != len(self.arrays):
            return False
        dn, dt = self.shift[0] - shift[0], self.shift[1] - shift[1]
        for a, b in zip(self.arrays, arrays, strict=True):
            if a.shape != b.shape:
                return False
            if dn == 0 and dt == 0:
                if not (a == b).all():
                    return False
            elif not (np.array_equal(a[:, 0] - b[:, 0], np.full(len(a), dn))
                      and np.array_equal(a[:, 1] - b[:, 1], np.full(len(a), dt))
                      and np.array_equal(a[:, 2], b[:, 2])):
                return False
        return True


def request_key(request, policy: ShiftPolicy, variant: tuple = ()) -> RequestKey:
    """The key of ``request`` under ``policy`` (see module doc).

    The hashable part holds, per input and output (in order), its name,
    derivative flag, row count and its first, middle and last index relative to
    the canonical offset; then the request's flags and ``variant`` (e.g.
    dtype/backend). It costs O(number of specs), a few microseconds: equality of
    whole index arrays is checked only against the entries of the same bucket
    (:meth:`RequestKey.matches`, one vectorized comparison per array)."""
    specs = request.inputs + request.outputs
    sn = st = 0
    if specs and len(specs[0].indexes):
        n_first, t_first = specs[0].indexes[0, :2].tolist()
        if policy.n_shift:
            sn = n_first
        if policy.t_period:
            st = (t_first // policy.t_period) * policy.t_period
    parts = []
    for s in specs:
        idx = s.indexes
        k = len(idx)
        if k:
            # (three row reads: a fancy-index gather of the rows costs more)
            probe = tuple((n - sn, t - st, x) for n, t, x in
                          (idx[0].tolist(), idx[k // 2].tolist(), idx[k - 1].tolist()))
            parts.append((s.name, bool(s.has_deriv), k, probe))
        else:
            parts.append((s.name, bool(s.has_deriv), 0, ()))
    key = (len(request.inputs), tuple(parts), bool(request.need_model_derivative),
           bool(request.store_component_stats), variant)
    return RequestKey(key, [s.indexes for s in specs], (sn, st))


def request_layouts(request) -> list:
    """The regular layout of every spec (inputs then outputs; None if irregular)."""
    return [regular_layout(s.indexes) for s in request.inputs + request.outputs]


def mini_request(request, layouts: list, num_mini: int = 2, *, any_n0: bool = True):
    """The request restricted to ``n = n0 .. n0 + num_mini - 1`` of every spec (all
    regular with one ``num_n`` and ``n0``), renumbered to ``n = 0 ..``: what the
    shortcut compiles. None when the request is not of that form, or when
    ``any_n0`` is False (the network reads absolute n, ``ShiftPolicy.n_shift``) and
    ``n0`` is not 0: expansion numbers the sequences 0 .. N-1."""
    from ..compiler.request import ComputationRequest, IoSpecification

    if not layouts or any(lay is None for lay in layouts):
        return None
    num_n, n0 = layouts[0].num_n, layouts[0].n0
    if any(lay.num_n != num_n or lay.n0 != n0 for lay in layouts) or num_n <= num_mini \
            or (n0 != 0 and not any_n0):
        return None
    specs = request.inputs + request.outputs
    made = []
    for s, lay in zip(specs, layouts, strict=True):
        sub = s.indexes.reshape(lay.outer, num_n, lay.stride, 3)[:, :num_mini].reshape(-1, 3)
        sub = sub.copy()
        sub[:, 0] -= n0
        made.append(IoSpecification(s.name, sub, s.has_deriv))
    k = len(request.inputs)
    return ComputationRequest(made[:k], made[k:], request.need_model_derivative,
                              request.store_component_stats)
