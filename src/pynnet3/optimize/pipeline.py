"""The ordered registry of command-level passes and the driver that runs them.

A pass is a function ``fn(computation, nnet, options) -> str`` that rewrites the
computation **in place** and returns a short description of what it changed
("" only when the computation is exactly as the pass found it: reports and
renumbering rely on that). A pass edits the commands it changes in place and keeps
each Command object in one slot. A pass may leave commands as ``NO_OPERATION`` and
leave matrices/submatrices/index tables unreferenced; the driver drops no-ops and
renumbers afterwards (:func:`pynnet3.optimize.renumber.renumber`), so passes need
not. Every pass must preserve the computation's meaning: optimized and
unoptimized runs agree to float rounding, and the checker
(:func:`pynnet3.analysis.check`) passes after it.

A pass that knows its edits leave the commands naming the same objects may say
so by returning its description as :class:`KeptReferences`; the driver then only
drops the no-ops instead of renumbering. Built-in passes that work the same on a
computation not yet renumbered (``TOLERATES_PENDING``) run before the pending
renumbering, so one renumbering serves several passes (until no-ops pile up);
a user's pass always gets a renumbered computation, and so does every pass when
a report or the checker looks at each pass's result.

Users add passes with :func:`register_pass`; each pass names the predicate on
:class:`OptimizeOptions` that enables it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..analysis.accesses import command_types
from ..analysis.session import analysis_session
from ..computation import CommandType, NnetComputation
from ..errors import PynnetError
from ..gcpause import gc_paused
from .options import OptimizeOptions

PassFn = Callable[[NnetComputation, object, OptimizeOptions], str]


@dataclass
class OptimizationPass:
    """One registered pass: ``name``, its function, and ``enabled(options)``."""

    name: str
    fn: PassFn
    enabled: Callable[[OptimizeOptions], bool]
    doc: str = ""


@dataclass
class PassReport:
    """What one pass did: its description and the computation's size after it."""

    name: str
    changed: str
    num_commands: int
    num_matrices: int
    num_submatrices: int
    peak_memory_floats: int
    seconds: float


@dataclass
class OptimizeReport:
    """Per-pass report of one :func:`optimize` run; ``str()`` prints a table."""

    initial: PassReport | None = None
    passes: list[PassReport] = field(default_factory=list)

    def __str__(self) -> str:
        rows = ([self.initial] if self.initial else []) + self.passes
        lines = [f"{'pass':<28} {'commands':>8} {'matrices':>8} {'submats':>8} "
                 f"{'peak floats':>12} {'ms':>8}  changed"]
        for r in rows:
            lines.append(f"{r.name:<28} {r.num_commands:>8} {r.num_matrices:>8} "
                         f"{r.num_submatrices:>8} {r.peak_memory_floats:>12} "
                         f"{r.seconds * 1e3:>8.2f}  {r.changed}")
        return "\n".join(lines)


class KeptReferences(str):
    """A pass's description that also tells the driver: the commands that are not
    NO_OPERATION name exactly the matrices, submatrices, index tables (of each
    kind) and precomputed indexes they named before the pass (the pass may have
    reordered commands, turned some into NO_OPERATION or added some, as long as
    each object the new ones name was named before and each object the removed
    ones named is still named by another). On a computation as renumbering left
    it, renumbering would then only drop the no-ops, so the driver does just that.
    A wrong claim leaves unreferenced objects in place: the computation still
    runs, but is not numbered as renumbering would number it."""

    __slots__ = ()


PIPELINE: list[OptimizationPass] = []


def register_pass(name: str, fn: PassFn, enabled: Callable[[OptimizeOptions], bool],
                  *, before: str | None = None, after: str | None = None,
                  doc: str = "") -> OptimizationPass:
    """Add a pass to the pipeline (at the end, or ``before``/``after`` a named pass).
    Registering an existing name replaces that pass in place."""
    p = OptimizationPass(name, fn, enabled, doc or (fn.__doc__ or "").strip().split("\n")[0])
    names = [q.name for q in PIPELINE]
    if name in names:
        PIPELINE[names.index(name)] = p
        return p
    if before is not None or after is not None:
        anchor = before if before is not None else after
        if anchor not in names:
            raise PynnetError(f"register_pass: no pass named {anchor!r} "
                              f"(registered: {names})")
        i = names.index(anchor) + (0 if before is not None else 1)
        PIPELINE.insert(i, p)
    else:
        PIPELINE.append(p)
    return p


def _snapshot(name: str, c: NnetComputation, changed: str, seconds: float) -> PassReport:
    return PassReport(name, changed, len(c.commands), c.num_matrices(),
                      len(c.submatrices) - 1, c.peak_memory_floats(), seconds)


# Built-in passes, by their lazy wrappers' qualified names (optimize/__init__.py),
# whose edits renumbering mostly need not look at. Renumbering depends on neither
# command order nor command flags, and it is idempotent, so on a computation it
# has already processed:
# * after a pass that only reorders commands or sets flags (no command dropped, no
#   matrix, submatrix, index table or precomputed index newly (un)referenced) it
#   would change nothing;
# * after a pass that also turns commands into NO_OPERATION, but leaves every
#   object it referenced still referenced by a surviving command, it would only
#   drop those commands.
# tests/optimize/test_renumber.py checks both claims on real pipelines, and the
# KeptReferences results of passes that decide the second one per computation.
# (convert_addition only changes command types, each to one naming the same kind of
# index table, which is all renumbering looks at in a type.)
KEEPS_REFERENCES = frozenset({"sizing.move_sizing_commands", "io_ops.consolidate_io_operations",
                              "outputs.free_provided_outputs", "looped.fix_goto_label",
                              "addition.convert_addition_to_assignment"})
ONLY_DROPS_COMMANDS = frozenset({"sizing.remove_unnecessary_allocation",
                                 "noops.remove_needless_noops"})
#: passes that make no no-ops and only leave some objects unreferenced (matrix
#: extension: the submatrices its copies no longer use); a later renumber drops
#: them, so none runs right after such a pass
ONLY_LEAVES_UNUSED = frozenset({"extend.extend_matrices"})
#: passes whose result, once renumbered, is the same whether or not the computation
#: they got had been renumbered after the previous passes (they skip no-ops and
#: take no decision from the numbering or from unreferenced objects): the driver
#: runs them on a computation that still has the no-ops and unreferenced objects
#: of earlier passes and renumbers once for several passes. Not
#: remove_dead_input_derivatives: its analysis adds whole-matrix submatrices in
#: an order that renumbering would have fixed first. (tests/optimize/
#: test_renumber.py compares with renumbering after every pass.)
TOLERATES_PENDING = frozenset({
    "deriv_time.limit_derivative_times", "model_update.consolidate_model_update",
    "addition.convert_addition_to_assignment", "row_ops.snip_row_ops",
    "row_ops.split_row_ops", "row_ops.replace_row_with_matrix_ops",
    "splice.splice_free_affine", "permute.hoist_output_permutations",
    "extend.extend_matrices", "gathers.share_identical_gathers", "merging.variable_merging",
    "zeroing.remove_unnecessary_zeroing", "sizing.move_sizing_commands",
    "looped.optimize_looped_computation", "sizing.remove_unnecessary_allocation",
    "io_ops.consolidate_io_operations", "looped.fix_goto_label",
    "outputs.free_provided_outputs", "noops.remove_needless_noops",
    "compression.optimize_memory_compression"})


def _builtin(p: OptimizationPass) -> str | None:
    """The qualified name of a built-in pass's function, None for any other."""
    fn = p.fn
    if getattr(fn, "__module__", None) != __package__:
        return None
    return getattr(fn, "__qualname__", None)


def run_pipeline(computation: NnetComputation, nnet, options: OptimizeOptions, *,
                 report: OptimizeReport | None = None, check: bool = False,
                 passes: list[OptimizationPass] | None = None) -> NnetComputation:
    """Run every enabled pass in order, in place. With ``check`` the checker runs
    after each pass and a failure names the pass. With ``report`` the per-pass
    table is filled (the sizes cost a scan per pass, so only then)."""
    if report is not None:
        report.initial = _snapshot("(unoptimized)", computation, "", 0.0)
    # cyclic GC runs would walk the whole heap several times per optimization
    # (about 15% of its time): paused meanwhile (pynnet3.gcpause)
    with gc_paused(), analysis_session(computation, nnet):
        _run(computation, nnet, options, report, check,
             PIPELINE if passes is None else passes)
    return computation


def _run(computation: NnetComputation, nnet, options: OptimizeOptions,
         report: OptimizeReport | None, check: bool, passes: list[OptimizationPass]) -> None:
    from .renumber import drop_noops, renumber

    cleanups = (None, drop_noops, renumber)  # indexed by the pending state below
    # a report or the checker looks at each pass's result: clean it up right away
    eager = report is not None or check
    pending = _CLEAN
    fresh = True  # not renumbered since compiled (or since an ONLY_LEAVES_UNUSED pass)
    for p in passes:
        if not p.enabled(options):
            continue
        t0 = time.perf_counter()
        kind = _builtin(p)
        if pending and (kind not in TOLERATES_PENDING or _mostly_noops(computation)):
            cleanups[pending](computation)
            pending = _CLEAN
        changed = p.fn(computation, nnet, options) or ""
        if changed:
            if kind in ONLY_LEAVES_UNUSED:
                fresh = True
            elif fresh:
                pending, fresh = _RENUMBER, False
            elif kind in ONLY_DROPS_COMMANDS or isinstance(changed, KeptReferences):
                pending = max(pending, _DROP)
            elif kind not in KEEPS_REFERENCES:
                pending = _RENUMBER
            if eager and pending:
                cleanups[pending](computation)
                pending = _CLEAN
        dt = time.perf_counter() - t0
        if check:
            from ..analysis.checker import check_computation

            check_computation(computation, nnet, context=f"after pass {p.name!r}")
        if report is not None:
            report.passes.append(_snapshot(p.name, computation, changed, dt))
    if pending:
        cleanups[pending](computation)


# what the computation needs before a pass that wants it as renumbering leaves it
_CLEAN, _DROP, _RENUMBER = range(3)
_NOOP = CommandType.NO_OPERATION
#: a pending cleanup runs before a tolerant pass too once this share of the
#: commands are no-ops: every pass scans the commands, and renumbering costs
#: about as much as one scan
_NOOP_SHARE = 8


def _mostly_noops(c: NnetComputation) -> bool:
    """At least 1/_NOOP_SHARE of the commands are NO_OPERATION."""
    return command_types(c).count(_NOOP) * _NOOP_SHARE >= len(c.commands)
