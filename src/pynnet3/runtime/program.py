"""A computation's commands prepared once for whole runs on the NumPy backend.

:class:`Program` turns each command into a call ``op(matrices, backend, computer)``
with its submatrices resolved to a matrix id and the slices of a view, its tables
and precomputed object looked up, and a few forward-only peepholes applied (a
repeated-row input block's product taken once per source row, the zeroing a
``propagate_overwrite`` makes needless, statistics pooled straight from an
extraction's input). A program holds nothing of a run (matrices, components,
memos): those come from the computer at each call, so every computer of one
computation shares it. :mod:`pynnet3.runtime.arena` binds a program to matrices
kept between runs.
"""

from __future__ import annotations

import sys
import weakref

from ..components.affine import near_zero_refinement
from ..components.blas import scale_add
from ..computation import SUBMATRIX_FIELDS, Command, NnetComputation
from ..computation import CommandType as CT
from .numpy_backend import NumpyBackend
from .value_uses import MULTI_ROW_OPS as _MULTI
from .value_uses import NOOPS as _NOOPS
from .value_uses import read_only_inputs
from .value_uses import whole as _whole


class Program:
    """A computation's commands prepared for :meth:`NnetComputer.run` on the NumPy
    backend: one call per command (no-ops dropped) with its submatrices resolved to
    a matrix id and the slices of a view, its tables and precomputed object looked
    up, and the ACCEPT_INPUT commands listed. It holds nothing of a run (matrices,
    components, memos): those come from the computer each call, so computers of one
    computation share it."""

    __slots__ = ("ops", "recipe", "arenas", "accepts", "has_backward", "looped", "steps",
                 "read_only", "__weakref__")

    def __init__(self, c: NnetComputation):
        cmds = c.commands
        self.accepts = [cmd for cmd in cmds if cmd.type is CT.ACCEPT_INPUT]
        self.has_backward = any(cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
                                for cmd in cmds)
        self.looped = any(cmd.type is CT.GOTO_LABEL for cmd in cmds)
        self.recipe, self.arenas, self.steps = [], {}, None
        # input matrices a run may take from the caller without a copy
        self.read_only = frozenset() if self.looped else read_only_inputs(c)
        if self.looped:
            self.ops = []
            return
        plans = {} if self.has_backward else row_block_plans(c)
        skip = {j for copy, moved in plans.values() for j in (copy, *moved)}
        zeroings = zeroing_skips(c)
        stats = {} if self.has_backward else {
            p2: (p1, zeroings.get(p1), moved) for p2, (p1, moved) in stats_plans(c).items()
            if p2 not in plans and p1 not in plans and p1 not in skip
            and not skip.intersection(moved)}
        for p1, z, moved in stats.values():
            skip.update((p1, *moved))
            if z is not None:
                skip.add(z)
        zeroed = {p: z for p, z in zeroings.items()
                  if p not in plans and z not in skip and p not in skip}
        skip.update(zeroed.values())
        scaled = {a: s for a, s in scale_add_plans(c).items()
                  if a not in skip and s not in skip}
        skip.update(scaled.values())
        # each op as (prepare function, the indexes of its commands in its argument
        # order): what runtime/arena.py binds again to matrices kept between runs
        recipe: list[tuple] = []
        for i in range(len(cmds)):
            if i in skip:
                continue
            if i in plans:
                copy, moved = plans[i]
                recipe.append((_prepare_row_block, (copy, i)))
                recipe.extend((_prepare, (j,)) for j in moved)
            elif i in stats:
                p1, z, moved = stats[i]
                recipe.append((_prepare_stats, (z, p1, i)))
                recipe.extend((_prepare, (j,)) for j in moved)
            elif i in zeroed:
                recipe.append((_prepare_overwrite, (zeroed[i], i)))
            elif i in scaled:
                recipe.append((_prepare_scale_add, (scaled[i], i)))
            else:
                recipe.append((_prepare, (i,)))
        self.recipe = recipe
        self.ops = [op for prepare, idx in recipe
                    if (op := prepare(c, *(None if j is None else cmds[j] for j in idx)))
                    is not None]
        # dtype -> its Arena (runtime/arena.py), True (run once: bind at the next
        # run) or False (not bindable); ("rebinds", dtype) -> times bound again
        self.arenas = {}

    def step_ops(self, c: NnetComputation) -> list:
        """:func:`step_ops` of ``c`` (this program's computation), made once."""
        if self.steps is None:
            self.steps = step_ops(c)
        return self.steps


def step_ops(c: NnetComputation) -> list:
    """Per command of ``c``, the call ``op(matrices, backend, computer)`` that
    executes it alone (no peephole joins commands here), for stepping through a
    computation (NnetComputer.run_until_io: a looped one, chunk by chunk); None
    for what the computer's ``_execute`` keeps (I/O, a jump, a no-op)."""
    keep = (CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT, CT.GOTO_LABEL, *_NOOPS)
    return [None if cmd.type in keep else _prepare(c, cmd) for cmd in c.commands]


# id(computation) -> (weak reference to it, its Program)
_PROGRAMS: dict[int, tuple] = {}


def program_for(c: NnetComputation) -> Program:
    """The :class:`Program` of ``c``, made once while ``c`` lives."""
    key = id(c)
    entry = _PROGRAMS.get(key)
    if entry is not None and entry[0]() is c:
        return entry[1]
    program = Program(c)

    def forget(ref, key=key):
        if _PROGRAMS.get(key, (None,))[0] is ref:
            del _PROGRAMS[key]

    try:
        _PROGRAMS[key] = (weakref.ref(c, forget), program)
    except TypeError:  # (an object that takes no weak reference: not kept)
        pass
    return program


_WRITES = frozenset(("dst", "out_value", "out_deriv", "in_deriv"))  # (fields written)
_FILLS = (CT.MATRIX_COPY, CT.MATRIX_ADD, CT.COPY_ROWS, CT.ADD_ROWS, CT.SET_CONST)


def row_block_plans(c: NnetComputation) -> dict[int, tuple]:
    """Forward-only peephole of the NumPy program: ``{propagate: (copy, (deallocs
    moved after the propagate...))}`` for each COPY_ROWS that fills a column
    block of a matrix ``S`` with a few rows repeated (``len(table) >= 4 * rows``:
    an iVector appended to every frame) where ``S`` is then read only by one
    PROPAGATE, over exactly those rows, and freed. That propagate may then take the
    block's product once per source row (``propagate_row_block``); ``S``'s block is
    never filled. The source's deallocation, if it comes between, waits for the
    propagate. The computation itself is unchanged."""
    subs, cmds = c.submatrices, c.commands
    plans: dict[int, tuple] = {}
    claimed: set[int] = set()
    for i, cmd in enumerate(cmds):
        if cmd.type is not CT.COPY_ROWS or not cmd.dst or not cmd.src:
            continue
        d, src = subs[cmd.dst], subs[cmd.src]
        table = c.indexes[cmd.table]
        if (d.matrix == src.matrix or not len(table) or len(table) < 4 * src.num_rows
                or int(table.min()) < 0):
            continue
        plan = _row_block_plan(c, i, d, src.matrix)
        # (a deallocation moved for one plan cannot wait for another's propagate too)
        if plan is not None and plan[0] not in plans and not claimed.intersection(plan[1]):
            plans[plan[0]] = (i, plan[1])
            claimed.update(plan[1])
    return plans


def _sole_reader(c: NnetComputation, start: int, target: int, source: int, judge):
    """``(reader, (deallocs to move...))`` when, after command ``start``, matrix
    ``target`` is read by exactly one command before it is freed, or None. ``judge(j,
    cmd, on_target)`` rules on each command before the reader that touches
    ``target`` (``on_target``: its (field, submatrix) pairs there): "reader", "skip"
    (allowed, e.g. a fill of another column block) or None (refused); nothing may
    touch it after the reader. Matrix ``source`` must stay as it is until the
    reader: its deallocation before it is to move after it; a write, resize, swap
    or hand-over refuses."""
    subs, cmds = c.submatrices, c.commands
    moved: list[int] = []
    reader = None
    for j in range(start + 1, len(cmds)):
        cmd = cmds[j]
        t = cmd.type
        if t in _NOOPS:
            continue
        if t is CT.DEALLOC_MATRIX and cmd.matrix == source:
            if reader is None:
                moved.append(j)
            continue
        if t is CT.DEALLOC_MATRIX and cmd.matrix == target:
            return None if reader is None else (reader, tuple(moved))
        if cmd.matrix in (target, source) or cmd.src_matrix in (target, source):
            return None  # (resized, swapped, compressed, ...)
        if t in _MULTI or (cmd.table >= 0 and t in (CT.PROPAGATE, CT.BACKPROP,
                                                     CT.BACKPROP_NO_MODEL_UPDATE)):
            return None  # (tables of submatrices: not looked into)
        fields = [(f, subs[s]) for f in SUBMATRIX_FIELDS if (s := getattr(cmd, f))]
        if t is CT.PROVIDE_OUTPUT and cmd.release and subs[cmd.src].matrix == source:
            return None  # (the source handed over: gone before the reader)
        if any(f in _WRITES and sm.matrix == source for f, sm in fields):
            return None  # (the source overwritten)
        on_target = [(f, sm) for f, sm in fields if sm.matrix == target]
        if not on_target:
            continue
        verdict = None if reader is not None else judge(j, cmd, on_target)
        if verdict == "reader":
            reader = j
        elif verdict != "skip":
            return None
    return None


def _row_block_plan(c: NnetComputation, i: int, d, src_matrix: int):
    """(propagate index, (deallocs to move...)) for the copy at ``i`` (see
    :func:`row_block_plans`), or None."""
    lo, hi = d.col_offset, d.col_offset + d.num_cols

    def judge(j, cmd, on_s):
        if cmd.type in _FILLS and len(on_s) == 1 and on_s[0][0] == "dst":
            w = on_s[0][1]  # (another column block of S filled)
            return "skip" if w.col_offset >= hi or w.col_offset + w.num_cols <= lo else None
        if (cmd.type is CT.PROPAGATE and len(on_s) == 1 and on_s[0][0] == "in_value"
                and cmd.alpha != 2.0 and not cmd.memo):
            v = on_s[0][1]
            if (v.row_offset == d.row_offset and v.num_rows == d.num_rows
                    and v.col_offset <= lo and hi <= v.col_offset + v.num_cols):
                return "reader"
        return None

    return _sole_reader(c, i, d.matrix, src_matrix, judge)


def _prepare_row_block(c: NnetComputation, copy: Command, cmd: Command,
                       view_of=None):
    """The op of a PROPAGATE planned by :func:`row_block_plans`: the component's
    ``propagate_row_block`` where it has one, else the copy then the propagate."""
    view_of = view_of or _view_of
    fallback_copy, fallback = _prepare(c, copy, view_of), _prepare(c, cmd, view_of)
    (im, ik), (om, ok) = view_of(c, cmd.in_value), view_of(c, cmd.out_value)
    sm, sk = view_of(c, copy.src)
    v = c.submatrices[cmd.in_value]
    d = c.submatrices[copy.dst]
    block = (d.col_offset - v.col_offset, d.col_offset - v.col_offset + d.num_cols)
    table, alpha, node = c.indexes[copy.table], copy.alpha, cmd.node

    def add_rows(dst, m, rows):
        NumpyBackend.add_rows(None, dst, m, rows, 1.0)

    def propagate_row_block(M, be, x):
        fn = getattr(x._components[node], "propagate_row_block", None)
        if fn is None or not fn(_get(M, im, ik), block, _get(M, sm, sk), table, alpha,
                                _get(M, om, ok), add_rows):
            fallback_copy(M, be, x)
            fallback(M, be, x)
    return propagate_row_block


def _next_command(cmds: list, i: int) -> int | None:
    """Index of the first command after ``i`` that is not a no-op, or None."""
    j = i + 1
    while j < len(cmds) and cmds[j].type in _NOOPS:
        j += 1
    return j if j < len(cmds) else None


def zeroing_skips(c: NnetComputation) -> dict[int, int]:
    """``{propagate: zeroing}``: each SET_CONST(0) directly followed (no-ops aside)
    by a PROPAGATE (no memo, no stats, no block table) whose output is exactly that
    submatrix and whose input lies in another matrix: the zeroing Kaldi's
    PROPAGATE_ADDS asks for, which a component's ``propagate_overwrite`` makes
    needless (it writes every entry, as if onto zeros)."""
    cmds, subs = c.commands, c.submatrices
    out: dict[int, int] = {}
    for i, cmd in enumerate(cmds):
        if cmd.type is not CT.SET_CONST or cmd.alpha != 0.0 or not cmd.dst:
            continue
        j = _next_command(cmds, i)
        if j is None:
            continue
        p = cmds[j]
        if (p.type is CT.PROPAGATE and p.table == -1 and p.in_value and p.out_value
                and not p.memo and p.alpha != 2.0
                and subs[p.out_value] == subs[cmd.dst]
                and subs[p.in_value].matrix != subs[cmd.dst].matrix):
            out[j] = i
    return out


def _prepare_overwrite(c: NnetComputation, zeroing: Command, cmd: Command,
                       view_of=None):
    """The op of a PROPAGATE planned by :func:`zeroing_skips`: the component's
    ``propagate_overwrite`` where it has one, else the zeroing then the propagate."""
    view_of = view_of or _view_of
    fallback_zero, fallback = _prepare(c, zeroing, view_of), _prepare(c, cmd, view_of)
    (im, ik), (om, ok) = view_of(c, cmd.in_value), view_of(c, cmd.out_value)
    pre, node = c.precomputed[cmd.precomputed], cmd.node

    def propagate_overwrite(M, be, x):
        fn = getattr(x._components[node], "propagate_overwrite", None)
        if fn is None:
            fallback_zero(M, be, x)
            fallback(M, be, x)
        else:
            fn(pre, _get(M, im, ik), _get(M, om, ok))
    return propagate_overwrite


def scale_add_plans(c: NnetComputation) -> dict[int, int]:
    """``{add: scale}``: each MATRIX_COPY that scales a submatrix in place
    (``S = a * S``, a residual connection's ``Scale(a, x)`` term) directly followed
    (no-ops aside) by a MATRIX_ADD of alpha 1 into exactly ``S`` from another
    matrix: the two run as one pass, ``S = a * S + T``
    (:func:`~pynnet3.components.blas.scale_add`, the same floats)."""
    cmds, subs = c.commands, c.submatrices
    out: dict[int, int] = {}
    for i, cmd in enumerate(cmds):
        if cmd.type is not CT.MATRIX_COPY or not cmd.dst or subs[cmd.src] != subs[cmd.dst]:
            continue
        j = _next_command(cmds, i)
        if j is None:
            continue
        a = cmds[j]
        if (a.type is CT.MATRIX_ADD and a.alpha == 1.0 and a.src
                and subs[a.dst] == subs[cmd.dst]
                and subs[a.src].matrix != subs[cmd.dst].matrix):
            out[j] = i
    return out


def _prepare_scale_add(c: NnetComputation, scale: Command, add: Command, view_of=None):
    """The op of a pair planned by :func:`scale_add_plans`: one ``geadd`` pass where
    the views allow it, else the two commands' own ops."""
    view_of = view_of or _view_of
    first, second = _prepare(c, scale, view_of), _prepare(c, add, view_of)
    (dm, dk), (sm, sk), beta = view_of(c, add.dst), view_of(c, add.src), scale.alpha

    def scale_then_add(M, be, x):
        if not scale_add(_get(M, dm, dk), _get(M, sm, sk), beta):
            first(M, be, x)
            second(M, be, x)
    return scale_then_add


def stats_plans(c: NnetComputation) -> dict[int, tuple[int, tuple]]:
    """Forward-only peephole: ``{pooling: (extraction, (deallocs moved after the
    pooling...))}`` where a statistics extraction with one row per window (x-vector
    decoding) writes a whole matrix ``E`` that only the next statistics pooling
    reads, whole, before ``E`` is freed: the pooling may then take its sums from the
    extraction's input itself (``propagate_extracted``), ``E`` never written. The
    input's deallocation, if it comes between, waits for the pooling."""
    # (the statistics family loads on demand: when it is not loaded, no component of
    # the network is one and no RangeIndexes exists)
    statistics = sys.modules.get(__name__.rsplit(".", 2)[0] + ".components.statistics")
    if statistics is None:
        return {}
    RangeIndexes = statistics.RangeIndexes  # noqa: N806 (the class)

    cmds, subs = c.commands, c.submatrices

    def judge(j, cmd, on_e):  # (the pooling: reading all of E)
        return "reader" if (cmd.type is CT.PROPAGATE and len(on_e) == 1
                            and on_e[0][0] == "in_value" and _whole(c, cmd.in_value)
                            and not cmd.memo and cmd.alpha != 2.0
                            and isinstance(c.precomputed[cmd.precomputed], RangeIndexes)
                            ) else None

    plans: dict[int, tuple[int, tuple]] = {}
    for i, cmd in enumerate(cmds):
        if (cmd.type is not CT.PROPAGATE or cmd.table != -1 or not cmd.in_value
                or not cmd.out_value or cmd.memo or cmd.alpha == 2.0
                or not _whole(c, cmd.out_value)):
            continue
        pre = c.precomputed[cmd.precomputed]
        if not isinstance(pre, RangeIndexes) or not pre.is_identity:
            continue
        E, X = subs[cmd.out_value].matrix, subs[cmd.in_value].matrix
        if E == X:
            continue
        plan = _sole_reader(c, i, E, X, judge)
        if plan is not None:
            plans[plan[0]] = (i, plan[1])
    return plans


def _prepare_stats(c: NnetComputation, zeroing: Command | None, extract: Command,
                   pool: Command, view_of=None):
    """The op of a pooling planned by :func:`stats_plans`: the pooling component's
    ``propagate_extracted`` on the extraction's input where both are the standard
    classes and it applies, else the zeroing, the extraction and the pooling."""
    from ..components.statistics import StatisticsExtractionComponent as Extraction

    view_of = view_of or _view_of
    fallbacks = [_prepare(c, cmd, view_of) for cmd in (zeroing, extract, pool)
                 if cmd is not None]
    (xm, xk), (om, ok) = view_of(c, extract.in_value), view_of(c, pool.out_value)
    ext_pre, pool_pre = c.precomputed[extract.precomputed], c.precomputed[pool.precomputed]
    ext_node, pool_node = extract.node, pool.node

    def pool_extracted(M, be, x):
        comps = x._components
        ext, pooling = comps[ext_node], comps[pool_node]
        fn = getattr(pooling, "propagate_extracted", None)
        if (fn is None or not isinstance(ext, Extraction)
                or type(ext).propagate is not Extraction.propagate  # (a subclass's math)
                or not fn(pool_pre, ext, ext_pre, _get(M, xm, xk), _get(M, om, ok))):
            for op in fallbacks:
                if op is not None:
                    op(M, be, x)
    return pool_extracted


def _get(matrices: dict, m: int, k):
    """Matrix ``m`` or its view at slices ``k`` (from :func:`_view_of`)."""
    mat = matrices[m]
    return mat if k is None else mat[k]


def _view_of(c: NnetComputation, s: int):
    """(matrix id, slices of the view or None for the whole matrix) of submatrix
    ``s`` (what NnetComputer._sub returns, as NumpyBackend.view makes it)."""
    sm = c.submatrices[s]
    info = c.matrices[sm.matrix]
    if sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows \
            and sm.num_cols == info.cols:
        return sm.matrix, None
    return sm.matrix, (slice(sm.row_offset, sm.row_offset + sm.num_rows),
                       slice(sm.col_offset, sm.col_offset + sm.num_cols))


def _prepare(c: NnetComputation, cmd: Command, view_of=None):
    """The call ``op(matrices, backend, computer)`` that executes ``cmd`` in a whole
    run on the NumPy backend, as NnetComputer._execute / _run_all do; None for a
    no-op. ``view_of``: how a submatrix is found in ``matrices`` (default
    :func:`_view_of`: a matrix id and the slices of a view)."""
    view_of = view_of or _view_of
    t = cmd.type
    if t in _NOOPS:
        return None
    if t is CT.ACCEPT_INPUT:
        def accept(M, be, x, dst=cmd.dst, key=(cmd.is_deriv, cmd.node)):
            x._store_input(dst, x._checked[key], True)
        return accept
    if t is CT.PROVIDE_OUTPUT:
        def provide(M, be, x, cmd=cmd):
            x._provide(cmd, x._result)
        return provide
    if t is CT.ALLOC_MATRIX:
        info = c.matrices[cmd.matrix]

        def alloc(M, be, x, m=cmd.matrix, rows=info.rows, cols=info.cols):
            M[m] = x._alloc(rows, cols, x.dtype)
        return alloc
    if t is CT.DEALLOC_MATRIX:
        def dealloc(M, be, x, m=cmd.matrix):
            x._release(M, m)
        return dealloc
    if t is CT.PROPAGATE and not (cmd.in_value == 0 and cmd.table >= 0):
        if cmd.in_value == 0 or cmd.out_value == 0:
            return lambda M, be, x, cmd=cmd: x._execute(cmd)
        (im, ik), (om, ok) = view_of(c, cmd.in_value), view_of(c, cmd.out_value)
        pre, node, memo_id, stats = (c.precomputed[cmd.precomputed], cmd.node, cmd.memo,
                                     cmd.alpha == 2.0)

        def plain(M, be, x):
            iv, ov = _get(M, im, ik), _get(M, om, ok)
            comp = x._components[node]
            memo = comp.propagate(pre, iv, ov)
            if memo_id:
                x.memos[memo_id] = memo
            if stats:
                comp.store_stats(iv, ov, memo)

        cid = id(cmd)

        def propagate(M, be, x):
            if cid in x._unrefined:
                with near_zero_refinement(False):
                    plain(M, be, x)
            else:
                plain(M, be, x)
        return propagate
    if t in (CT.MATRIX_COPY, CT.MATRIX_ADD, CT.COPY_ROWS, CT.ADD_ROWS, CT.ADD_ROW_RANGES) \
            and cmd.dst and cmd.src:
        (dm, dk), (sm, sk) = view_of(c, cmd.dst), view_of(c, cmd.src)
        # (the program runs on the NumPy backend only: its functions, looked up once)
        fn, tables = {CT.MATRIX_COPY: (NumpyBackend.copy, ()),
                      CT.MATRIX_ADD: (NumpyBackend.add, ()),
                      CT.COPY_ROWS: (NumpyBackend.copy_rows, (c.indexes,)),
                      CT.ADD_ROWS: (NumpyBackend.add_rows, (c.indexes,)),
                      CT.ADD_ROW_RANGES: (NumpyBackend.add_row_ranges, (c.indexes_ranges,)),
                      }[t]
        extra = tuple(table[cmd.table] for table in tables)

        def binary(M, be, x, alpha=cmd.alpha):
            fn(be, _get(M, dm, dk), _get(M, sm, sk), *extra, alpha)
        return binary
    if t is CT.SET_CONST and cmd.dst:
        dm, dk = view_of(c, cmd.dst)

        def set_const(M, be, x, alpha=cmd.alpha):
            be.set_const(_get(M, dm, dk), alpha)
        return set_const
    # the rest (backprop, swaps, multi-row copies, compression, ...) as _execute does
    return lambda M, be, x, cmd=cmd: x._execute(cmd)
