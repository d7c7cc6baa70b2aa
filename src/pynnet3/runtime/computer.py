"""NnetComputer: executes an NnetComputation's commands through a backend.

The computer does exactly what the command list says; it never re-derives what
the compiler decided. Two ways to drive it:

* :meth:`NnetComputer.run` executes the whole command list in one go. Inputs and
  output derivatives are checked (names, shapes, finiteness) before anything runs.
* :meth:`~NnetComputer.accept_input`, :meth:`~NnetComputer.run_until_io` and
  :meth:`~NnetComputer.get_output` step through it as Kaldi's ``NnetComputer``
  does (AcceptInput / Run / GetOutput). The computer keeps a program counter and
  its matrices between calls, and follows ``GOTO_LABEL``: this is how a looped
  computation runs one chunk at a time, carrying its state across the jump.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..components.affine import near_zero_refinement
from ..computation import Command, NnetComputation
from ..computation import CommandType as CT
from ..errors import PynnetError, RuntimeInputError
from ..index import unique_keys
from .arena import after_run, bind
from .backend import get_backend
from .numpy_backend import NumpyBackend
from .program import Program, program_for, step_ops
from .value_uses import NOOPS as _NOOPS
from .value_uses import relu_mask_plans, sign_free_propagates

_IO = (CT.ACCEPT_INPUT, CT.PROVIDE_OUTPUT)
_LOOPED = object()  # (run(): a computation without a program that has a GOTO_LABEL)


@dataclass
class RunResult:
    """What a run produced: ``outputs[name]``, ``input_derivs[name]`` and
    ``gradients[component][param]`` (composite sub-components as ``name#i``).
    NumPy arrays from the NumPy backend; torch tensors on the run's device from
    the torch backend."""

    outputs: dict = field(default_factory=dict)
    input_derivs: dict = field(default_factory=dict)
    gradients: dict = field(default_factory=dict)


def _drop(matrices: dict, key) -> None:
    matrices.pop(key, None)


def _zero_gradient(comp, dtype, backend=None) -> dict:
    """A gradient dict shaped like ``comp.params()``, all zeros (what BACKPROP
    commands add into, and what an updatable component no command reached has),
    as arrays of ``backend`` (NumPy when it has no ``zeros_shaped``)."""
    zeros = getattr(backend, "zeros_shaped", None)
    if zeros is not None:
        return {k: zeros(v.shape, dtype) for k, v in comp.params().items()}
    return {k: np.zeros(v.shape, dtype=dtype) for k, v in comp.params().items()}


def _is_tensor(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "device")


def _check_tensor(what: str, name: str, value, rows: int, cols: int):
    """:meth:`NnetComputer._check` for a torch tensor (checked where it lives)."""
    import torch

    if value.is_complex() or not (value.is_floating_point() or value.dtype in (
            torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)):
        raise RuntimeInputError(f"{what} {name!r}: expected a real-valued matrix, got "
                                f"dtype {value.dtype}")
    if value.dim() != 2 or tuple(value.shape) != (rows, cols):
        raise RuntimeInputError(f"{what} {name!r}: expected shape ({rows}, {cols}), "
                                f"got {tuple(value.shape)}")
    if value.is_floating_point():
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            bad = torch.nonzero(~finite)[0].tolist()
            raise RuntimeInputError(f"{what} {name!r}: non-finite value at row {bad[0]}, "
                                    f"column {bad[1]}")
    return value


def run_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a run: a NumPy dtype (or its name), or a torch float dtype
    (``torch.float64``: what a torch user hands the torch backend). Runs compute in
    floating point; anything else is named here, not deep inside a component."""
    try:
        return _RUN_DTYPES[dtype]  # (np.dtype() costs microseconds; runs are small too)
    except (KeyError, TypeError):
        pass
    given = dtype
    if type(dtype).__module__ == "torch":  # (torch.float32 -> "float32"; no torch import)
        dtype = str(dtype).removeprefix("torch.")
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise RuntimeInputError(f"dtype {given!r}: not a dtype NumPy knows ({e})") from None
    if dt.kind != "f":
        raise RuntimeInputError(f"dtype {dt}: runs compute in floating point "
                                "(float32 or float64)")
    try:
        if len(_RUN_DTYPES) < 64:
            _RUN_DTYPES[given] = dt
    except TypeError:  # (unhashable)
        pass
    return dt


_RUN_DTYPES: dict = {}


def host_array(value) -> np.ndarray:
    """``value`` as a NumPy array on the host, for the decodables that read their
    features there: a torch tensor (on any device, requiring grad or not) is
    detached and copied to the CPU; anything else goes through ``np.asarray``."""
    if _is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class NnetComputer:
    """Runs one computation; holds its matrices, memos and gradients.

    Stepping state (Kaldi's semantics): ``pc`` is the next command; ``pending`` the
    I/O commands already passed whose input has not been given yet (accept) or
    whose value may be fetched (provide). An I/O call first advances ``pc`` over
    the I/O and no-op commands at the current position into ``pending``.

    ``cache_program=True``: the caller promises never to modify ``computation`` (as
    for a CachingCompiler's computations); :meth:`run` on the NumPy backend then goes
    through its commands prepared once and kept while the computation lives (shared
    by every computer of it), with the same results."""

    def __init__(self, nnet, computation: NnetComputation, backend: str = "numpy",
                 dtype=np.float32, device=None, cache_program: bool = False):
        self.nnet = nnet
        self.c = computation
        if device is None:
            self.backend = get_backend(backend)
        elif backend == "numpy":
            if str(device) != "cpu":
                raise RuntimeInputError(f"the numpy backend runs on the CPU only, not on "
                                        f"device {device!r} (use backend='torch')")
            self.backend = get_backend(backend)
        else:
            self.backend = get_backend(backend, device=device)
        self.dtype = run_dtype(dtype)
        self.matrices: dict[int, object] = {}
        self.memos: dict[int, object] = {}
        self.grads: dict[str, dict] = {}
        self.pc = 0
        self.pending: list[int] = []
        self._goto_target: int | None = None
        # run(): the commands prepared once (Program), kept with the computation when
        # ``cache_program`` (the caller promises never to modify it: computations from
        # a CachingCompiler are shared and never modified), else made on first run
        self._program: Program | None = None
        self._cache_program = cache_program
        # forward-only computations skip the affine near-zero refinement (no
        # ReLU derivative depends on those signs)
        if cache_program:
            self._program = program_for(computation)
            self._has_backward = self._program.has_backward
        else:
            self._has_backward = any(cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)
                                     for cmd in computation.commands)
        # Backends that reuse freed matrices (NumPy: runtime/matrix_pool) take them
        # back here; the others just drop them.
        self._release = getattr(self.backend, "release_matrix", None) or _drop
        # ALLOC_MATRIX: contents undefined where the backend can skip the zeroing
        self._alloc = getattr(self.backend, "alloc", None) or self.backend.zeros

    @property
    def _components(self) -> dict:
        """Component of each component node (made when first needed)."""
        comps = self.__dict__.get("_components_")
        if comps is None:
            nnet = self.nnet
            comps = self._components_ = {n.name: nnet.components[n.component]
                                         for n in nnet.nodes if n.kind == "component-node"}
        return comps

    @property
    def _unrefined(self) -> frozenset:
        """``id`` of each PROPAGATE command that runs without the affine near-zero
        refinement although a backward pass follows: no use of its output gates a
        derivative on the sign of an entry (:func:`sign_free_propagates`), so the
        float32 product's rounding is all the difference, as in a forward-only run
        (made when first needed; empty without a backward pass)."""
        ids = self.__dict__.get("_unrefined_")
        if ids is None:
            cmds = self.c.commands
            ids = self._unrefined_ = frozenset(
                id(cmds[i]) for i in sign_free_propagates(self.c, self._components)
            ) if self._has_backward else frozenset()
        return ids

    @property
    def _masked(self) -> frozenset:
        """``id`` of each DECOMPRESS_MATRIX that is skipped and of the ReLU
        BACKPROP that then reads the compressed codes as its output's ``> 0``
        mask (:func:`relu_mask_plans`; NumPy backend only, made when first
        needed)."""
        ids = self.__dict__.get("_masked_")
        if ids is None:
            cmds = self.c.commands
            plans = relu_mask_plans(self.c, self._components) \
                if isinstance(self.backend, NumpyBackend) else {}
            ids = self._masked_ = frozenset(id(cmds[i]) for p in plans.items() for i in p)
        return ids

    def _mask(self, s: int) -> np.ndarray:
        """Submatrix ``s`` of a sign-only compressed matrix as the bool mask of its
        positive entries (what its decompression's ``> 0`` would be)."""
        from .compression import positive_mask

        sm = self.c.submatrices[s]
        mask = positive_mask(self.matrices[sm.matrix])
        return mask[sm.row_offset:sm.row_offset + sm.num_rows,
                    sm.col_offset:sm.col_offset + sm.num_cols]

    # -- validation -------------------------------------------------------------
    def _check(self, what: str, name: str, value, rows: int, cols: int):
        if _is_tensor(value):
            return _check_tensor(what, name, value, rows, cols)
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise RuntimeInputError(f"{what} {name!r}: not a matrix ({e})") from None
        if arr.dtype.kind not in "biuf":
            raise RuntimeInputError(f"{what} {name!r}: expected a real-valued matrix, got "
                                    f"dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape != (rows, cols):
            raise RuntimeInputError(f"{what} {name!r}: expected shape ({rows}, {cols}), "
                                    f"got {arr.shape}")
        if not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise RuntimeInputError(f"{what} {name!r}: non-finite value at row {bad[0]}, "
                                    f"column {bad[1]}")
        return arr

    def _validate(self, inputs: dict, output_derivs: dict) -> dict:
        """Check every user matrix the commands will accept, before anything runs
        (a failure must not leave a half-run forward pass, e.g. stored stats).
        Returns ``(is_deriv, node) -> checked array``."""
        req = self.c.request
        if req is not None:
            known = {s.name for s in req.inputs}
            extra = set(inputs) - known
            if extra:
                raise RuntimeInputError(f"inputs given for nodes not in the request: "
                                        f"{sorted(extra)}")
            known = {s.name for s in req.outputs if s.has_deriv}
            extra = set(output_derivs) - known
            if extra:
                raise RuntimeInputError(f"output derivatives given for nodes that are not "
                                        f"outputs with has_deriv in the request: "
                                        f"{sorted(extra)}")
        checked = {}
        accepts = self._program.accepts if self._program is not None else (
            cmd for cmd in self.c.commands if cmd.type is CT.ACCEPT_INPUT)
        for cmd in accepts:
            key = (cmd.is_deriv, cmd.node)
            if key in checked:
                continue
            sm = self.c.submatrices[cmd.dst]
            source = output_derivs if cmd.is_deriv else inputs
            what = "output derivative" if cmd.is_deriv else "input"
            if cmd.node not in source:
                raise RuntimeInputError(f"missing {what} for node {cmd.node!r}")
            checked[key] = self._check(what, cmd.node, source[cmd.node], sm.num_rows,
                                       sm.num_cols)
        return checked

    def _store_input(self, dst: int, arr, borrow: bool = False) -> None:
        """Put a checked user matrix into submatrix ``dst`` (a whole matrix takes the
        data over, as Kaldi's AcceptInput swaps it in). ``borrow``: within one
        whole run (the caller cannot change ``arr`` before the run ends), a matrix
        the program only reads holds ``arr`` itself."""
        sm = self.c.submatrices[dst]
        info = self.c.matrices[sm.matrix]
        if sm.num_rows == info.rows and sm.num_cols == info.cols:
            program = self._program
            if (borrow and program is not None and sm.matrix in program.read_only
                    and type(arr) is np.ndarray and arr.dtype == self.dtype
                    and arr.flags.c_contiguous and arr.flags.aligned
                    and type(self.backend) is NumpyBackend):
                # only read until freed: the caller's data, as a read-only view (no
                # copy; the pool never takes a view)
                view = arr.view()
                view.flags.writeable = False
                self.matrices[sm.matrix] = view
                return
            self.matrices[sm.matrix] = self.backend.from_numpy(arr, self.dtype)
        else:
            self.backend.copy(self._sub(dst), self.backend.from_numpy(arr, self.dtype), 1.0)

    def _sub(self, s: int):
        if s == 0:
            return None
        sm = self.c.submatrices[s]
        mat = self.matrices.get(sm.matrix)
        if mat is None:
            raise PynnetError(f"internal: a command uses matrix m{sm.matrix}, which is not "
                              "allocated at this point")
        info = self.c.matrices[sm.matrix]
        if sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows \
                and sm.num_cols == info.cols:
            return mat
        return self.backend.view(mat, sm.row_offset, sm.num_rows, sm.col_offset, sm.num_cols)

    # -- one command --------------------------------------------------------------
    def _execute(self, cmd: Command) -> None:
        """Execute one command other than ACCEPT_INPUT / PROVIDE_OUTPUT. A
        GOTO_LABEL sets ``pc`` to its label (the caller then steps past it)."""
        t = cmd.type
        be = self.backend
        if t is CT.PROPAGATE:
            if id(cmd) in self._unrefined:
                with near_zero_refinement(False):
                    self._propagate(cmd)
            else:
                self._propagate(cmd)
        elif t is CT.ALLOC_MATRIX:
            info = self.c.matrices[cmd.matrix]
            self.matrices[cmd.matrix] = self._alloc(info.rows, info.cols, self.dtype)
        elif t is CT.DEALLOC_MATRIX:
            self._release(self.matrices, cmd.matrix)
        elif t is CT.SWAP_MATRIX:
            a = self.matrices.pop(cmd.matrix, None)
            b = self.matrices.pop(cmd.src_matrix, None)
            if b is not None:
                self.matrices[cmd.matrix] = b
            if a is not None:
                self.matrices[cmd.src_matrix] = a
        elif t is CT.SET_CONST:
            be.set_const(self._sub(cmd.dst), cmd.alpha)
        elif t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
            name = self.nnet.node_map[cmd.node].component
            comp = self._components[cmd.node]
            grad = None
            if t is CT.BACKPROP:
                # A non-updatable component gets an empty dict: "training", which
                # turns on self-repair and stats as Kaldi's to-update pointer does.
                grad = self.grads.get(name)
                if grad is None:
                    grad = self.grads[name] = _zero_gradient(comp, self.dtype, be)
            out_value = self._mask(cmd.out_value) if id(cmd) in self._masked \
                else self._sub(cmd.out_value)
            args = (self.c.precomputed[cmd.precomputed], self._sub(cmd.in_value),
                    out_value, self._sub(cmd.out_deriv),
                    self.memos.pop(cmd.memo, None) if cmd.memo else None, grad,
                    self._sub(cmd.in_deriv) if cmd.deriv_table < 0 else
                    [self._sub(s) for s in self.c.indexes_blocks[cmd.deriv_table].tolist()])
            if cmd.in_value == 0 and cmd.table >= 0:  # input value read as column blocks
                blocks = [self._sub(s) for s in self.c.indexes_blocks[cmd.table].tolist()]
                comp.backprop_blocks(args[0], blocks, *args[2:])
            else:
                comp.backprop(*args)
        elif t is CT.MATRIX_COPY:
            be.copy(self._sub(cmd.dst), self._sub(cmd.src), cmd.alpha)
        elif t is CT.MATRIX_ADD:
            be.add(self._sub(cmd.dst), self._sub(cmd.src), cmd.alpha)
        elif t is CT.COPY_ROWS:
            be.copy_rows(self._sub(cmd.dst), self._sub(cmd.src), self.c.indexes[cmd.table],
                         cmd.alpha)
        elif t is CT.ADD_ROWS:
            be.add_rows(self._sub(cmd.dst), self._sub(cmd.src), self.c.indexes[cmd.table],
                        cmd.alpha)
        elif t in (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI):
            table = self.c.indexes_multi[cmd.table]
            sources = {s: self._sub(s) for s in unique_keys(table[:, 0]).tolist() if s > 0}
            op = be.copy_rows_multi if t is CT.COPY_ROWS_MULTI else be.add_rows_multi
            op(self._sub(cmd.dst), sources, table, cmd.alpha)
        elif t is CT.ADD_ROW_RANGES:
            be.add_row_ranges(self._sub(cmd.dst), self._sub(cmd.src),
                              self.c.indexes_ranges[cmd.table], cmd.alpha)
        elif t is CT.COMPRESS_MATRIX:  # range in alpha (see optimize/compression)
            from .compression import compress
            m = self.c.submatrices[cmd.dst].matrix
            # (on the matrix's backend and device: nothing goes through the host)
            old = {m: self.matrices[m]}
            self.matrices[m] = compress(old[m], cmd.compress_kind, cmd.alpha)
            self._release(old, m)  # (NumPy: its buffer to the pool, for the decompression)
        elif t is CT.DECOMPRESS_MATRIX:
            if id(cmd) in self._masked:
                return  # (its only reader takes the codes as a mask: relu_mask_plans)
            from .compression import decompress
            m = self.c.submatrices[cmd.dst].matrix
            shape = self.matrices[m].shape
            # (NumPy: a pooled buffer with warm pages, not zeroed; decompress writes all)
            out = self._alloc(shape[0], shape[1], self.dtype) if isinstance(be, NumpyBackend) \
                else be.zeros(shape[0], shape[1], self.dtype)
            decompress(self.matrices[m], out)
            self.matrices[m] = out
        elif t is CT.GOTO_LABEL:
            self.pc = self._label_of(cmd)
        elif t in _NOOPS:
            pass
        else:
            raise NotImplementedError(f"command {t.value} is not supported by the runtime")

    def _propagate(self, cmd: Command) -> None:
        comp = self._components[cmd.node]
        pre = self.c.precomputed[cmd.precomputed]
        iv, ov = self._sub(cmd.in_value), self._sub(cmd.out_value)
        if cmd.in_value == 0 and cmd.table >= 0:  # input read as column blocks
            blocks = [self._sub(s) for s in self.c.indexes_blocks[cmd.table].tolist()]
            memo = comp.propagate_blocks(pre, blocks, ov)
        else:
            memo = comp.propagate(pre, iv, ov)
        if cmd.memo:
            self.memos[cmd.memo] = memo
        if cmd.alpha == 2.0:  # store-stats flag
            comp.store_stats(iv, ov, memo)

    def _label_of(self, cmd: Command) -> int:
        """Index of the goto's NO_OPERATION_LABEL (its ``label`` field, or the only
        label in the computation when passes have moved commands since). The
        computation is not written to: cached computations share their commands."""
        cmds = self.c.commands
        if 0 <= cmd.label < len(cmds) and cmds[cmd.label].type is CT.NO_OPERATION_LABEL:
            return cmd.label
        if self._goto_target is None:
            labels = [i for i, x in enumerate(cmds) if x.type is CT.NO_OPERATION_LABEL]
            if len(labels) != 1:
                raise RuntimeInputError(f"GOTO_LABEL needs exactly one NO_OPERATION_LABEL, "
                                        f"the computation has {len(labels)}")
            self._goto_target = labels[0]
        return self._goto_target

    # -- whole run ------------------------------------------------------------------
    def run(self, inputs: dict, output_derivs: dict | None = None) -> RunResult:
        """Execute every command once, in order (not for looped computations, which
        never end: step through those with accept_input / run_until_io / get_output)."""
        output_derivs = output_derivs or {}
        program = self._program
        if program is None:
            if any(cmd.type is CT.GOTO_LABEL for cmd in self.c.commands):
                program = _LOOPED
            elif type(self.backend) is NumpyBackend and self._cache_program:
                program = self._program = program_for(self.c)
        if program is _LOOPED or (program is not None and program.looped):
            raise RuntimeInputError("this is a looped computation (it has a GOTO_LABEL); run "
                                    "it chunk by chunk with accept_input / run_until_io / "
                                    "get_output")
        checked = self._validate(inputs, output_derivs)
        self._new_run()
        result = RunResult()
        with near_zero_refinement(self._has_backward):
            if program is not None and type(self.backend) is NumpyBackend:
                arena = self._arena(program)
                if arena is not None and arena.lock.acquire(blocking=False):
                    try:
                        self._run_arena(arena, checked, result)
                    finally:
                        arena.lock.release()
                else:
                    self._run_program(program, checked, result)
            else:
                self._run_all(checked, result)
        self.pc = len(self.c.commands)
        result.gradients = self.gradients()
        return result

    def _run_all(self, checked: dict, result: RunResult) -> None:
        for cmd in self.c.commands:
            t = cmd.type
            if t is CT.ACCEPT_INPUT:
                self._store_input(cmd.dst, checked[(cmd.is_deriv, cmd.node)], True)
            elif t is CT.PROVIDE_OUTPUT:
                self._provide(cmd, result)
            else:
                self._execute(cmd)

    def _provide(self, cmd: Command, result: RunResult) -> None:
        """PROVIDE_OUTPUT in a whole run: the value into ``result``."""
        value = self._hand_over(cmd) if cmd.release else None
        if value is None:
            value = self.backend.copy_out(self._sub(cmd.src))
            if cmd.release:
                self._release(self.matrices, self.c.submatrices[cmd.src].matrix)
        (result.input_derivs if cmd.is_deriv else result.outputs)[cmd.node] = value

    def _run_program(self, program: Program, checked: dict, result: RunResult) -> None:
        """:meth:`_run_all` through the prepared commands (NumPy backend)."""
        matrices, be = self.matrices, self.backend
        self._checked, self._result = checked, result
        try:
            for op in program.ops:
                op(matrices, be, self)
        except KeyError as e:
            self._report_unallocated(e, matrices)
            raise
        finally:
            self._checked = self._result = None

    def _report_unallocated(self, e: KeyError, matrices: dict) -> None:
        """A prepared op's KeyError for a matrix id that is not allocated as the
        PynnetError :meth:`_sub` raises (what _execute would have reported); other
        KeyErrors are the caller's to re-raise."""
        m = e.args[0] if e.args else None
        if type(m) is int and m not in matrices and 0 < m < len(self.c.matrices):
            raise PynnetError(f"internal: a command uses matrix m{m}, which is not "
                              "allocated at this point") from None

    def _arena(self, program: Program):
        """The program bound to kept buffers (runtime/arena.py) for this run's dtype,
        made at the second run of a shared computation (a computation run once
        keeps nothing); None where there is none."""
        entry = program.arenas.get(self.dtype)
        if entry is None or entry is True:
            if entry is None:
                program.arenas[self.dtype] = True
                return None
            entry = program.arenas[self.dtype] = bind(
                self.c, program, self.dtype, components=self._components) or False
        return entry or None

    def _run_arena(self, arena, checked: dict, result: RunResult) -> None:
        """:meth:`_run_program` through the arena's bound ops."""
        be = self.backend
        self._checked, self._result = checked, result
        try:
            for op, matrices in arena.ops:
                self.matrices = matrices  # (what an op's fallback reads)
                op(matrices, be, self)
        finally:
            self.matrices = {}
            self._checked = self._result = None
            after_run(self._program, self.dtype, arena)

    def _hand_over(self, cmd: Command):
        """The output matrix itself, taken out of the computer, when a PROVIDE_OUTPUT
        that releases it covers all of it (NumPy: nothing else refers to a matrix
        the computation releases, so no copy is needed); else None."""
        if not isinstance(self.backend, NumpyBackend):
            return None
        sm = self.c.submatrices[cmd.src]
        info = self.c.matrices[sm.matrix]
        if sm.row_offset or sm.col_offset or sm.num_rows != info.rows \
                or sm.num_cols != info.cols:
            return None
        mat = self.matrices.get(sm.matrix)
        if type(mat) is not np.ndarray or mat.base is not None:
            return None
        del self.matrices[sm.matrix]
        return mat

    def gradients(self) -> dict:
        """Model gradients accumulated by BACKPROP commands so far, per updatable
        component (composite sub-components as ``name#i``). When the computation
        wants model derivatives, every updatable component of the network has an
        entry, as in Kaldi's delta network: all zeros where no command reached it
        (e.g. an IfDefined recurrence the request never feeds)."""
        out = {}
        comps = self.nnet.components
        names = list(self.grads)
        if self.c.need_model_derivative:
            names += [n for n, comp in comps.items()
                      if comp.is_updatable() and n not in self.grads]
        for name in names:
            comp = comps[name]
            if not comp.is_updatable():
                continue
            grad = self.grads.get(name)
            if grad is None:
                grad = _zero_gradient(comp, self.dtype, self.backend)
            if hasattr(comp, "sub_gradients"):  # composite: sub-component i is "name#i"
                for i, g in comp.sub_gradients(grad).items():
                    out[f"{name}#{i}"] = g
            else:
                out[name] = comp.export_gradient(grad)
        return out

    # -- stepping (Kaldi's AcceptInput / Run / GetOutput) -----------------------------
    def _collect_io(self) -> None:
        """Move ``pc`` past the I/O and no-op commands at the current position,
        remembering the I/O ones as pending."""
        cmds = self.c.commands
        while self.pc < len(cmds) and (cmds[self.pc].type in _IO
                                       or cmds[self.pc].type in _NOOPS):
            if cmds[self.pc].type in _IO:
                self.pending.append(self.pc)
            self.pc += 1

    def _pending_io(self, name: str, kind: CT, is_deriv: bool) -> int:
        """Position in ``pending`` of the expected I/O command for ``name``."""
        self._collect_io()
        cmds = self.c.commands
        for k, i in enumerate(self.pending):
            cmd = cmds[i]
            if cmd.type is kind and cmd.node == name and cmd.is_deriv == is_deriv:
                return k
        what = ("output derivative" if is_deriv else "input") if kind is CT.ACCEPT_INPUT \
            else ("input derivative" if is_deriv else "output")
        raise RuntimeInputError(f"the computation does not expect {what} {name!r} at this "
                                f"point (command {self.pc})")

    def accept_input(self, name: str, value, is_deriv: bool = False) -> None:
        """Give the input (or, with ``is_deriv``, the output derivative) for node
        ``name`` that the computation expects next (Kaldi's AcceptInput). A value
        that is rejected (shape, non-finite) leaves the input still expected."""
        k = self._pending_io(name, CT.ACCEPT_INPUT, is_deriv)
        cmd = self.c.commands[self.pending[k]]
        sm = self.c.submatrices[cmd.dst]
        arr = self._check("output derivative" if is_deriv else "input", name, value,
                          sm.num_rows, sm.num_cols)
        self._store_input(cmd.dst, arr)
        del self.pending[k]  # an input is taken once; an output may be read again

    def run_until_io(self) -> None:
        """Execute commands from the current position until the computation needs
        the user: an input to accept or an output to hand over (Kaldi's Run).
        Every input the computation expected before this point must have been
        given."""
        cmds = self.c.commands
        self._collect_io()
        missing = [cmds[i].node for i in self.pending if cmds[i].type is CT.ACCEPT_INPUT]
        if missing:
            raise RuntimeInputError(f"cannot run: no input given for node(s) {missing}")
        for i in self.pending:  # outputs handed over: released once the user moves on
            if cmds[i].type is CT.PROVIDE_OUTPUT and cmds[i].release:
                self._release(self.matrices, self.c.submatrices[cmds[i].src].matrix)
        self.pending.clear()
        if self.pc >= len(cmds):
            raise RuntimeInputError("the computation has already finished")
        self._new_run()
        steps = self._step_ops()
        matrices, be = self.matrices, self.backend
        with near_zero_refinement(self._has_backward):  # (as run() does)
            while self.pc < len(cmds):
                cmd = cmds[self.pc]
                if cmd.type in _IO:
                    break
                op = steps[self.pc] if steps is not None else None
                if op is None:
                    self._execute(cmd)
                else:
                    try:
                        op(matrices, be, self)
                    except KeyError as e:
                        self._report_unallocated(e, matrices)
                        raise
                self.pc += 1

    def _step_ops(self) -> list | None:
        """Per command, the prepared call :meth:`run_until_io` makes instead of
        :meth:`_execute` (program.step_ops; None for a command _execute keeps: a
        jump, an I/O or a no-op); None off the NumPy backend. Kept with the
        computation when it is shared (``cache_program``); otherwise made for a
        looped computation only (its commands run again and again: preparing them
        pays), with this computer."""
        steps = self.__dict__.get("_steps")
        if steps is None:
            if type(self.backend) is not NumpyBackend:
                steps = False
            elif self._cache_program:
                steps = program_for(self.c).step_ops(self.c)
            elif any(cmd.type is CT.GOTO_LABEL for cmd in self.c.commands):
                steps = step_ops(self.c)
            else:
                steps = False
            self._steps = steps
        return steps or None

    def get_output(self, name: str, is_deriv: bool = False):
        """A copy of the output (or, with ``is_deriv``, the input derivative) of node
        ``name`` that the computation has just provided (Kaldi's GetOutput); a
        NumPy array, or a tensor on the device from the torch backend."""
        cmd = self.c.commands[self.pending[self._pending_io(name, CT.PROVIDE_OUTPUT, is_deriv)]]
        return self.backend.copy_out(self._sub(cmd.src))

    def _new_run(self) -> None:
        """Tell the backend parameters may have changed since it last ran."""
        hook = getattr(self.backend, "new_run", None)
        if hook is not None:
            hook()

    @property
    def finished(self) -> bool:
        """Whether every command has run (a looped computation never finishes)."""
        return self.pc >= len(self.c.commands)


def run(nnet, computation, inputs: dict, output_derivs: dict | None = None,
        backend: str = "numpy", dtype=np.float32, device=None, *,
        shared: bool = False) -> RunResult:
    """Run a compiled computation; see :class:`RunResult`. Component statistics
    (when the computation stores them) accumulate in ``nnet``'s components, in place.
    (``pynnet3.run`` also takes a ComputationRequest: it compiles it through the
    network's cache, ``pynnet3.cache.running``, and then comes here.)

    ``backend="torch"`` runs on ``device`` (``"cpu"``, ``"cuda"``, a
    ``torch.device``; default the CPU); inputs may then be torch tensors (used where
    they are, without a copy through NumPy) and the result holds torch tensors on
    the device.

    ``shared``: the computation is one nobody modifies (a cache's): its commands are
    prepared once and kept with it (:class:`Program`)."""
    if not isinstance(computation, NnetComputation):
        raise RuntimeInputError(
            f"runtime.computer.run takes a compiled NnetComputation, not "
            f"{type(computation).__name__}: pynnet3.run compiles a request first")
    return NnetComputer(nnet, computation, backend, run_dtype(dtype), device,
                        cache_program=shared).run(inputs, output_derivs)
