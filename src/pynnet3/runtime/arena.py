"""A forward program bound to matrices kept from one run to the next.

Decoding runs the same small computation thousands of times (one chunk at a
time, as nnet3-compute does). Each run of a :class:`~pynnet3.runtime.program.Program`
allocates and frees every matrix, swaps some, and finds each submatrix's view
again; for a chunk of a few dozen rows that bookkeeping costs as much as the
arithmetic. :func:`bind` replays the program's allocation commands once, ahead
of time: every matrix gets a buffer (one per matrix alive at a time; a freed
buffer is taken again by the next matrix of its shape), swaps become a change of
which buffer a later command reads, and every command is prepared again with
its views made once. A run of the :class:`Arena` then calls the ops with nothing
else to do.

What an arena keeps, and why it is safe:

* Only forward-only, straight-line programs (no backward pass, no compression,
  no jump) whose matrices total at most :data:`ARENA_FLOATS` entries are bound:
  the buffers live as long as the computation (a cache's entry), so big ones
  would hold memory the optimizer's plan frees. The kernels' work buffers (a
  gathered TDNN input, an LSTM step's blocks) come on top, of the same order, and a
  float64 arena is twice the size: a CachingCompiler of 64 entries keeps a few
  hundred MiB at the very most, a decoding run's few computations a few MiB. Only a
  computation run a second time is bound: one run once keeps nothing.
* ALLOC_MATRIX leaves a matrix's contents undefined (the compiler zeroes what is
  read before it is written), so a buffer's values from the last run are never
  read.
* Inputs are copied into their buffers and outputs copied out: nothing the user
  holds aliases a buffer.
* One run at a time per arena (a lock taken without waiting; a second thread
  meanwhile takes the ordinary path).
"""

from __future__ import annotations

import threading

import numpy as np

from ..computation import SUBMATRIX_FIELDS, NnetComputation
from ..computation import CommandType as CT
from .numpy_backend import _all_rows, _grid_views
from .program import Program, _prepare, _prepare_overwrite, _prepare_row_block
from .value_uses import MULTI_ROW_OPS as _MULTI
from .value_uses import NOOPS as _NOOPS
from .value_uses import whole as _whole

#: times a program is bound again for one dtype after its kernels went stale
REBINDS = 8

#: the most matrix entries an arena holds (2 MiB of float32): a decoding chunk's
#: computation is far below it, a training minibatch's far above.
ARENA_FLOATS = 1 << 19

# commands a bound program cannot hold: they replace matrices at run time
# (compression), run backward, or jump
_UNBOUND = frozenset((CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE, CT.COMPRESS_MATRIX,
                      CT.DECOMPRESS_MATRIX, CT.GOTO_LABEL))


class Arena:
    """A program's ops, each with the matrices it reads and writes bound to
    buffers made once: ``ops`` is a list of ``(op, matrices)``, run in order as
    ``op(matrices, backend, computer)``. ``floats``: entries held by the buffers."""

    __slots__ = ("ops", "floats", "lock", "stale")

    def __init__(self, ops: list, floats: int):
        self.ops = ops
        self.floats = floats
        self.lock = threading.Lock()
        # set by an op whose kernel could not run (its component, or the component's
        # parameter arrays, replaced since binding): the computer binds the program
        # again at its next run, up to REBINDS times per program and dtype (two
        # networks taking turns on one computation would otherwise rebind every run)
        self.stale = False


def _view_key(c: NnetComputation, s: int):
    """The ``view_of`` of a bound op: submatrix ``s`` is the entry ``("s", s)`` of
    its matrices, a view made at binding time."""
    return ("s", s), None


def _submatrices(c: NnetComputation, cmd) -> list[int]:
    """Every submatrix ``cmd`` reads or writes (fields, and tables of submatrices)."""
    subs = [s for f in SUBMATRIX_FIELDS if (s := getattr(cmd, f))]
    t = cmd.type
    if t is CT.PROPAGATE and cmd.in_value == 0 and cmd.table >= 0:
        subs += c.indexes_blocks[cmd.table].tolist()
    elif t in _MULTI:
        subs += [s for s in np.unique(c.indexes_multi[cmd.table][:, 0]).tolist() if s > 0]
    return subs


def bind(c: NnetComputation, program: Program, dtype, limit: int = ARENA_FLOATS,
         components: dict | None = None) -> Arena | None:
    """``program`` (of ``c``) bound to buffers of ``dtype``, or None where it cannot
    be: a command of :data:`_UNBOUND`, a matrix used where it is not allocated (the
    ordinary path then reports it), or more than ``limit`` entries in all.
    ``components`` (node name -> component): the propagates of these components
    get kernels bound to their views (runtime/kernels.py), used while a run's
    computer has the same component at that node."""
    if program.looped or program.has_backward:
        return None
    cmds, subs, infos = c.commands, c.submatrices, c.matrices
    buffers: list[np.ndarray] = []
    free: dict[tuple[int, int], list[int]] = {}
    bound: dict[int, int] = {}  # matrix id -> its buffer now
    floats = 0

    def take(m: int) -> bool:
        nonlocal floats
        shape = (infos[m].rows, infos[m].cols)
        spare = free.get(shape)
        if spare:
            bound[m] = spare.pop()
            return True
        floats += shape[0] * shape[1]
        if floats > limit:
            return False
        bound[m] = len(buffers)
        buffers.append(np.empty(shape, dtype=dtype))
        return True

    def drop(m: int) -> bool:
        k = bound.pop(m, None)
        if k is None:
            return False
        free.setdefault(buffers[k].shape, []).append(k)
        return True

    def matrices_of(step) -> dict | None:
        mats: dict = {}
        for cmd in step:
            for s in _submatrices(c, cmd):
                sm = subs[s]
                k = bound.get(sm.matrix)
                if k is None:
                    return None
                buf = mats[sm.matrix] = buffers[k]
                mats[("s", s)] = buf[sm.row_offset:sm.row_offset + sm.num_rows,
                                     sm.col_offset:sm.col_offset + sm.num_cols]
        return mats

    arena = Arena([], 0)  # (made first: its ops mark it stale)
    ops = arena.ops
    for prepare, idx in program.recipe:
        step = [cmds[j] for j in idx if j is not None]
        if any(cmd.type in _UNBOUND for cmd in step):
            return None
        cmd = step[-1]
        t = cmd.type
        if prepare is _prepare:
            if t in _NOOPS:
                continue
            if t is CT.ALLOC_MATRIX:
                if cmd.matrix in bound or not take(cmd.matrix):
                    return None
                continue
            if t is CT.DEALLOC_MATRIX:
                if not drop(cmd.matrix):
                    return None
                continue
            if t is CT.SWAP_MATRIX:  # (as the computer's: either side may be absent)
                a, b = bound.pop(cmd.matrix, None), bound.pop(cmd.src_matrix, None)
                if b is not None:
                    bound[cmd.matrix] = b
                if a is not None:
                    bound[cmd.src_matrix] = a
                continue
            if t is CT.ACCEPT_INPUT:
                sm = subs[cmd.dst]
                if (sm.matrix not in bound and _whole(c, cmd.dst)
                        and not take(sm.matrix)):
                    return None
                mats = matrices_of(step)
                if mats is None:
                    return None
                ops.append((_accept(mats[("s", cmd.dst)], (cmd.is_deriv, cmd.node)), mats))
                continue
            if t is CT.PROVIDE_OUTPUT:
                mats = matrices_of(step)
                if mats is None:
                    return None
                ops.append((_provide(mats[("s", cmd.src)], cmd.is_deriv, cmd.node), mats))
                if cmd.release and not drop(subs[cmd.src].matrix):
                    return None
                continue
        mats = matrices_of(step)
        if mats is None:
            return None
        op = prepare(c, *(None if j is None else cmds[j] for j in idx), view_of=_view_key)
        if op is None:
            continue
        fast = None
        if prepare is _prepare:
            fast = _plain_op(c, cmd, mats, components, op, arena)
        elif prepare is _prepare_overwrite:
            fast = _propagate_op(c, cmd, mats, components, op, arena, overwrite=True)
        elif prepare is _prepare_row_block:
            fast = _row_block_op(c, step[0], cmd, mats, components, op, arena)
        ops.append((fast or op, mats))
    arena.floats = floats
    return arena


def _plain_op(c: NnetComputation, cmd, mats: dict, components: dict | None, op,
              arena: Arena):
    """A leaner op for a command on fixed views (the NumPy backend's arithmetic,
    called straight), or None."""
    t = cmd.type
    if t is CT.PROPAGATE:
        return _propagate_op(c, cmd, mats, components, op, arena, overwrite=False)
    if t in (CT.MATRIX_COPY, CT.MATRIX_ADD) and cmd.dst and cmd.src:
        d, s, alpha = mats[("s", cmd.dst)], mats[("s", cmd.src)], cmd.alpha
        if t is CT.MATRIX_COPY:  # (NumpyBackend.copy)
            if alpha == 1.0:
                return lambda M, be, x: np.copyto(d, s)
            return lambda M, be, x: np.multiply(s, alpha, out=d, casting="unsafe")
        if alpha == 1.0:  # (NumpyBackend.add)
            return lambda M, be, x: np.add(d, s, out=d)
        return lambda M, be, x: np.add(d, alpha * s, out=d)
    if t in (CT.COPY_ROWS, CT.ADD_ROWS) and cmd.dst and cmd.src:
        d, s, alpha = mats[("s", cmd.dst)], mats[("s", cmd.src)], cmd.alpha
        table = c.indexes[cmd.table]
        grid = _grid_views(d, s, table) if _all_rows(table, s) else None
        if grid is None:
            return None
        dv, sv = grid  # (NumpyBackend.copy_rows / add_rows on a grid table)
        if t is CT.COPY_ROWS:
            if alpha == 1.0:
                return lambda M, be, x: np.copyto(dv, sv)
            return lambda M, be, x: np.multiply(sv, alpha, out=dv)
        if alpha == 1.0:
            return lambda M, be, x: np.add(dv, sv, out=dv)
        return lambda M, be, x: np.add(dv, alpha * sv, out=dv)
    if t is CT.SET_CONST and cmd.dst:
        d, alpha = mats[("s", cmd.dst)], cmd.alpha
        return lambda M, be, x: d.fill(alpha)
    return None


def _propagate_op(c: NnetComputation, cmd, mats: dict, components: dict | None, op,
                  arena: Arena, overwrite: bool):
    """A PROPAGATE (plain: no memo, statistics or column-block table) through its
    component's bound kernel (runtime/kernels.py), the ordinary op when the run's
    computer has another component at the node or the kernel declines; None where
    nothing is bound."""
    if (components is None or cmd.table != -1 or not cmd.in_value or not cmd.out_value
            or cmd.memo or cmd.alpha == 2.0):
        return None
    from .kernels import bind_propagate

    node = cmd.node
    comp = components.get(node)
    kernel = None if comp is None else bind_propagate(
        comp, c.precomputed[cmd.precomputed], mats[("s", cmd.in_value)],
        mats[("s", cmd.out_value)], overwrite)
    return _kernel_op(op, node, comp, kernel, arena)


def _kernel_op(op, node: str, comp, kernel, arena: Arena):
    """The arena's op for a propagate of ``comp`` at ``node``: ``kernel`` while the
    run's computer has that component and its parameter arrays are the bound ones,
    else ``op`` (the ordinary call), the arena then marked stale; ``op`` watched
    (:func:`_watched`) where no kernel was bound."""
    if kernel is None:
        return _watched(op, node, comp, arena)

    def propagate(M, be, x):
        if x._components[node] is not comp or not kernel():
            op(M, be, x)  # (the component or its parameter arrays replaced since)
            arena.stale = True
    return propagate


def _state(comp) -> tuple:
    """What a kernel binder's verdict depends on, as objects compared by identity:
    the parameter arrays and a fused layer's floor and linear layer."""
    return (*comp.params().values(), getattr(comp, "floor", None),
            comp.__dict__.get("linear"))


def _watched(op, node: str, comp, arena: Arena):
    """``op`` for a component whose class has a binder that declined (a parameter
    array of another dtype, say): it marks the arena stale once the component or
    its parameter arrays are replaced, so a later binding may succeed; None for a
    component no binder knows (nothing to watch)."""
    from .kernels import KERNELS

    if comp is None or type(comp) not in KERNELS:
        return None
    before = _state(comp)

    def propagate(M, be, x):
        op(M, be, x)
        if x._components[node] is not comp or any(
                a is not b for a, b in zip(_state(comp), before, strict=True)):
            arena.stale = True
    return propagate


def _accept(view: np.ndarray, key: tuple):
    """ACCEPT_INPUT into a bound buffer: the checked input copied in (the values
    ``from_numpy`` would give)."""
    def accept(M, be, x):
        value = x._checked[key]
        if type(value) is not np.ndarray:
            value = be.from_numpy(value, view.dtype)
        np.copyto(view, value, casting="unsafe")
    return accept


def _provide(view: np.ndarray, is_deriv: bool, node: str):
    """PROVIDE_OUTPUT from a bound buffer: a copy (the buffer is the next run's)."""
    def provide(M, be, x):
        (x._result.input_derivs if is_deriv else x._result.outputs)[node] = view.copy()
    return provide


def _row_block_op(c: NnetComputation, copy, cmd, mats: dict, components: dict | None, op,
                  arena: Arena):
    """A propagate planned by program.row_block_plans (a repeated-row input block)
    through its component's bound row-block kernel; None where nothing is bound."""
    if components is None:
        return None
    from .kernels import bind_row_block

    node = cmd.node
    comp = components.get(node)
    v, d = c.submatrices[cmd.in_value], c.submatrices[copy.dst]
    block = (d.col_offset - v.col_offset, d.col_offset - v.col_offset + d.num_cols)
    kernel = None if comp is None else bind_row_block(
        comp, mats[("s", cmd.in_value)], block, mats[("s", copy.src)],
        c.indexes[copy.table], copy.alpha, mats[("s", cmd.out_value)])
    return _kernel_op(op, node, comp, kernel, arena)


def after_run(program: Program, dtype, arena: Arena) -> None:
    """Once a run of ``arena`` (``program``'s for ``dtype``) is over: when one of
    its kernels could not run, have the program bound anew at the next run, at
    most :data:`REBINDS` times per program and dtype."""
    if not arena.stale:
        return
    key = ("rebinds", dtype)
    done = program.arenas.get(key, 0)
    if done < REBINDS:
        program.arenas[key] = done + 1
        program.arenas[dtype] = True
