"""Differential checks of the optimizer: every optimized variant of a computation
must give what the unoptimized computation gives.

:func:`run_differential` compiles a :class:`~.random_nets.RandomCase` once,
runs the unoptimized computation as the reference, then optimizes a copy with
each :class:`Variant`'s options (with the checker after every pass when
:mod:`pynnet3.analysis.checker` exists), runs it and compares outputs, input
derivatives, model gradients and the component statistics left in the model.
Optimized variants run where a new matrix holds garbage rather than zeros
(:class:`UndefinedMemoryBackend`), so reading a matrix before writing it (say,
after a pass dropped a needed zeroing) shows as a mismatch; the unoptimized
computation must give the same results with and without garbage. Each mismatch
or exception is a :class:`Finding`; a finding is then *blamed* on the first pass
of the variant's pipeline after which the mismatch appears.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..compiler import compile_computation
from ..optimize import PIPELINE, OptimizeOptions, OptimizeReport, run_pipeline
from ..optimize import optimize as optimize_computation
from ..runtime.backend import register_backend
from ..runtime.computer import RunResult, run
from ..runtime.numpy_backend import NumpyBackend

if TYPE_CHECKING:
    from .random_nets import RandomCase


class UndefinedMemoryBackend(NumpyBackend):
    """The NumPy backend, except that ALLOC_MATRIX gives garbage (a different
    finite constant per allocation) instead of zeros: the contents of a new matrix
    are undefined, so a computation that reads them before writing them gives
    different results here. Registered as ``numpy-undefined``."""

    name = "numpy-undefined"

    def __init__(self):
        self._count = 0

    def zeros(self, rows, cols, dtype):
        self._count += 1
        return np.full((rows, cols), 0.5 + 0.125 * (self._count % 11), dtype=dtype)

    alloc = zeros


register_backend(UndefinedMemoryBackend.name, UndefinedMemoryBackend)

# Relative tolerances (max |diff| / max |reference|) per dtype.
_TOL = {np.dtype(np.float64): {"value": 1e-10, "grad": 1e-8},
        np.dtype(np.float32): {"value": 1e-5, "grad": 1e-4}}
_STATS_TOL = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-5}
_FLOOR = 1e-6  # below this magnitude, errors are measured absolutely


@dataclass(frozen=True)
class Variant:
    """Named optimizer options. ``compare_derivs`` False: only outputs must match
    (derivative-time limits change derivatives on purpose)."""

    name: str
    options: OptimizeOptions
    compare_derivs: bool = True


@dataclass
class Finding:
    """One disagreement (or exception) between a variant and the reference."""

    seed: int | None
    variant: str
    array: str  # "output:NAME", "input_deriv:NAME", "grad:COMP:PARAM", "stats:COMP.ATTR",
    #             or the failing stage: "compile", "checker", "optimize", "run"
    error: str
    pass_name: str | None = None  # first pass after which it appears (None: unknown)

    def __str__(self) -> str:
        blame = f" [first bad pass: {self.pass_name}]" if self.pass_name else ""
        return f"seed={self.seed} variant={self.variant} array={self.array}: {self.error}{blame}"


def default_variants(case: RandomCase | None = None) -> list[Variant]:
    """Default options; each bool option switched off in turn; no memory
    compression; the recompute pass on; and, given a case, derivative-time
    limits: a window wider than every time in the request (derivatives must not
    change) and narrow ones (only outputs compared)."""
    base = OptimizeOptions()
    out = [Variant("default", base)]
    for name in OptimizeOptions.field_names():
        value = getattr(base, name)
        if isinstance(value, bool) or name == "memory_compression_level":
            opts = base.without(name)
            if opts != base:
                label = ("memory_compression_level=0" if name == "memory_compression_level"
                         else f"without:{name}")
                out.append(Variant(label, opts))
    # beyond Kaldi and off by default: switched on
    out.append(Variant("with:recompute_cheap_values", replace(base, recompute_cheap_values=True)))
    if case is not None:
        ts = np.concatenate([s.indexes[:, 1] for s in case.request.inputs + case.request.outputs])
        lo, hi = int(ts.min()), int(ts.max())
        out.append(Variant("deriv_time_wide",
                           replace(base, min_deriv_time=lo - 1000, max_deriv_time=hi + 1000)))
        mid = (lo + hi) // 2
        out.append(Variant("deriv_time_narrow", replace(base, min_deriv_time=mid,
                                                       max_deriv_time=max(mid, hi - 1)), False))
        out.append(Variant("max_deriv_time_relative=-1",
                           replace(base, max_deriv_time_relative=-1), False))
    return out


def checker_available() -> bool:
    """Whether the computation checker exists (it is being written alongside)."""
    try:
        return importlib.util.find_spec("pynnet3.analysis.checker") is not None
    except ImportError:
        return False


def run_differential(case: RandomCase, options_list: list | None = None, *,
                     dtype=np.float64, check: bool | Collection[str] | None = None,
                     blame: bool = True, reports: dict | None = None) -> list[Finding]:
    """Compare each variant of ``options_list`` (:class:`Variant`,
    ``OptimizeOptions`` or ``(name, options)``; default :func:`default_variants`)
    against the unoptimized run of ``case``.

    ``check``: True runs the checker on the unoptimized computation and after every
    pass of every variant; a collection of variant names limits the per-pass checks
    to those variants (the checker costs more than the rest); None means True when
    the checker exists. ``blame`` names the first bad pass of each failing variant.
    ``reports`` (a dict) receives each variant's :class:`OptimizeReport` by name."""
    dtype = np.dtype(dtype)
    variants = [_as_variant(o) for o in (default_variants(case) if options_list is None
                                         else options_list)]
    if check is None:
        check = checker_available()
    if isinstance(check, bool):
        checked = {v.name for v in variants} if check else set()
    else:
        checked, check = set(check), True
    nnet = case.build_nnet()
    try:
        base = compile_computation(nnet, case.request)
    except Exception as e:  # noqa: BLE001 - any failure is a finding
        return [Finding(case.seed, "unoptimized", "compile", _exc(e))]
    findings = []
    if check:
        from ..analysis.checker import check_computation

        try:
            check_computation(base, nnet, context="unoptimized computation")
        except Exception as e:  # noqa: BLE001
            findings.append(Finding(case.seed, "unoptimized", "checker", _exc(e)))
    try:
        ref = _run(nnet, base, case, dtype, "numpy")
        garbage = _run(nnet, base, case, dtype)
    except Exception as e:  # noqa: BLE001
        return findings + [Finding(case.seed, "unoptimized", "run", _exc(e))]
    # Variants run where new matrices hold garbage; so must the reference agree.
    for array, err in compare_results(ref, garbage, dtype):
        findings.append(Finding(case.seed, "unoptimized", array,
                                f"reads a matrix before writing it ({err})"))
    for kind, arrays in (("output", ref[0].outputs), ("input_deriv", ref[0].input_derivs)):
        for name, a in arrays.items():
            if not np.isfinite(a).all():  # a bad case: comparisons would be vacuous
                findings.append(Finding(case.seed, "unoptimized", f"{kind}:{name}",
                                        "non-finite values in the reference run"))
    for v in variants:
        report = OptimizeReport()
        found = _check_variant(case, nnet, base, ref, v, dtype, v.name in checked, report)
        if reports is not None:
            reports[v.name] = report
        if found and blame:
            name = blame_pass(case, nnet, base, ref, v, dtype)
            for f in found:
                f.pass_name = name
        findings += found
    return findings


def _as_variant(o) -> Variant:
    if isinstance(o, Variant):
        return o
    if isinstance(o, tuple):
        return Variant(o[0], o[1])
    limited = (o.min_deriv_time is not None or o.max_deriv_time is not None
               or o.max_deriv_time_relative is not None)
    return Variant(describe_options(o), o, not limited)


def describe_options(o: OptimizeOptions) -> str:
    """The fields of ``o`` that differ from the defaults ("default" if none)."""
    base = OptimizeOptions()
    diff = [f"{n}={getattr(o, n)}" for n in o.field_names() if getattr(o, n) != getattr(base, n)]
    return ",".join(diff) or "default"


def _exc(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 600 else text[:600] + "..."


def _run(nnet, comp, case: RandomCase, dtype, backend: str = UndefinedMemoryBackend.name
         ) -> tuple[RunResult, dict]:
    """Run on a fresh copy of the model; returns the result and the model's state
    afterwards (stored statistics live in the components)."""
    model = copy.deepcopy(nnet)
    res = run(model, comp, case.inputs, case.output_derivs, backend=backend, dtype=dtype)
    return res, component_state(model)


def component_state(nnet) -> dict[str, np.ndarray]:
    """Every float array / float attribute of every component (and sub-component of
    a composite): parameters and accumulated statistics."""
    out: dict[str, np.ndarray] = {}

    def visit(prefix: str, comp) -> None:
        for attr, val in vars(comp).items():
            if isinstance(val, np.ndarray) and val.dtype.kind == "f":
                out[f"{prefix}.{attr}"] = val
            elif isinstance(val, float):
                out[f"{prefix}.{attr}"] = np.array([val])
        for i, sub in enumerate(getattr(comp, "components", None) or []):
            visit(f"{prefix}#{i}", sub)

    for name, comp in nnet.components.items():
        visit(name, comp)
    return out


_SHALLOW_LISTS = ("commands",)
_ARRAY_LISTS = ("indexes", "indexes_multi", "indexes_ranges")
_SHARED = ("submatrices", "request")  # immutable entries / read-only


def clone_computation(c):
    """A copy of ``c`` that no pass can change ``c`` through, much cheaper than
    ``copy.deepcopy`` (commands and matrix infos are copied one level, index
    tables copied, frozen submatrices shared; unknown attributes deep-copied)."""
    new = copy.copy(c)
    for name, val in vars(c).items():
        if name == "matrices":
            setattr(new, name, [replace(m, indexes=None if m.indexes is None else m.indexes.copy())
                                for m in val])
        elif name in _SHALLOW_LISTS:
            setattr(new, name, [copy.copy(x) for x in val])
        elif name in _ARRAY_LISTS:
            setattr(new, name, [a.copy() for a in val])
        elif name in _SHARED:
            setattr(new, name, list(val) if isinstance(val, list) else val)
        else:
            setattr(new, name, copy.deepcopy(val))
    return new


def _check_variant(case, nnet, base, ref, v: Variant, dtype, check: bool,
                   report: OptimizeReport | None = None) -> list[Finding]:
    comp = clone_computation(base)
    try:
        optimize_computation(comp, nnet, v.options, check=check, report=report)
    except Exception as e:  # noqa: BLE001
        stage = "checker" if type(e).__name__.endswith("CheckError") else "optimize"
        return [Finding(case.seed, v.name, stage, _exc(e))]
    try:
        res = _run(nnet, comp, case, dtype)
    except Exception as e:  # noqa: BLE001
        return [Finding(case.seed, v.name, "run", _exc(e))]
    return [Finding(case.seed, v.name, array, err)
            for array, err in compare_results(ref, res, dtype, v.compare_derivs)]


def blame_pass(case, nnet, base, ref, v: Variant, dtype) -> str | None:
    """The first pass of ``v``'s pipeline after which optimizing (without the
    checker), running or comparing fails; None if no prefix fails."""
    enabled = [p for p in PIPELINE if p.enabled(v.options)]
    for k in range(1, len(enabled) + 1):
        comp = clone_computation(base)
        try:
            run_pipeline(comp, nnet, v.options, passes=enabled[:k])
            res = _run(nnet, comp, case, dtype)
        except Exception:  # noqa: BLE001
            return enabled[k - 1].name
        if compare_results(ref, res, dtype, v.compare_derivs):
            return enabled[k - 1].name
    return None


def compare_results(ref: tuple[RunResult, dict], got: tuple[RunResult, dict], dtype,
                    derivs: bool = True) -> list[tuple[str, str]]:
    """(array, error) for each array of ``got`` that disagrees with ``ref``."""
    tol = _TOL[np.dtype(dtype)]
    (r, rstate), (g, gstate) = ref, got
    out = _compare_dicts("output", r.outputs, g.outputs, tol["value"])
    if not derivs:
        return out
    out += _compare_dicts("input_deriv", r.input_derivs, g.input_derivs, tol["value"])
    flat_r = {f"{c}:{p}": a for c, d in r.gradients.items() for p, a in d.items()}
    flat_g = {f"{c}:{p}": a for c, d in g.gradients.items() for p, a in d.items()}
    out += _compare_dicts("grad", flat_r, flat_g, tol["grad"])
    for key in sorted(rstate):
        a = rstate[key]
        t = max(_STATS_TOL[np.dtype(dtype)], _STATS_TOL[np.dtype(a.dtype)]
                if a.dtype in _STATS_TOL else 1e-5)
        err = _mismatch(a, gstate.get(key), t)
        if err:
            out.append((f"stats:{key}", err))
    return out


def _compare_dicts(kind: str, ref: dict, got: dict, tol: float) -> list[tuple[str, str]]:
    out = []
    for key in sorted(set(ref) | set(got)):
        err = _mismatch(ref.get(key), got.get(key), tol)
        if err:
            out.append((f"{kind}:{key}", err))
    return out


def _mismatch(ref, got, tol: float) -> str | None:
    """Why ``got`` is not ``ref`` within relative tolerance ``tol`` (None if it is)."""
    if ref is None or got is None:
        return "missing" if got is None else "unexpected (not in the reference)"
    ref, got = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        return f"shape {got.shape} != reference {ref.shape}"
    if not ref.size:
        return None
    bad_nan = np.isnan(ref) != np.isnan(got)
    if bad_nan.any():
        return f"NaN pattern differs ({int(bad_nan.sum())} entries)"
    fin = np.isfinite(ref) & np.isfinite(got)
    other = ~fin & ~np.isnan(ref)  # an infinity on either side must be on both
    if (ref[other] != got[other]).any():
        return "infinite values differ"
    if not fin.any():
        return None
    diff = np.abs(ref[fin] - got[fin])
    scale = max(float(np.abs(ref[fin]).max()), _FLOOR)
    err = float(diff.max()) / scale
    if err <= tol:
        return None
    where = np.unravel_index(int(np.argmax(np.where(fin, np.abs(ref - got), -1))), ref.shape)
    return (f"rel err {err:.3g} > {tol:g} (max |diff| {diff.max():.3g} at {tuple(map(int, where))}"
            f", max |ref| {scale:.3g})")
