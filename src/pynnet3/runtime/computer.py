"""NnetComputer: executes an NnetComputation's commands through a backend.

The computer does exactly what the command list says; it never re-derives what
the compiler decided. Inputs and output derivatives are checked (names, shapes,
finiteness) before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..computation import CommandType as CT
from ..computation import NnetComputation
from ..errors import RuntimeInputError
from .backend import get_backend


@dataclass
class RunResult:
    """What a run produced: ``outputs[name]``, ``input_derivs[name]`` and
    ``gradients[component][param]`` (composite sub-components as ``name#i``)."""

    outputs: dict = field(default_factory=dict)
    input_derivs: dict = field(default_factory=dict)
    gradients: dict = field(default_factory=dict)


class NnetComputer:
    def __init__(self, nnet, computation: NnetComputation, backend: str = "numpy",
                 dtype=np.float32):
        self.nnet = nnet
        self.c = computation
        self.backend = get_backend(backend)
        self.dtype = np.dtype(dtype)
        self.matrices: dict[int, object] = {}
        self.memos: dict[int, object] = {}
        self.grads: dict[str, dict] = {}

    # -- validation -------------------------------------------------------------
    def _check(self, what: str, name: str, value, rows: int, cols: int):
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
        for cmd in self.c.commands:
            if cmd.type is not CT.ACCEPT_INPUT:
                continue
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

    def _accept(self, cmd, checked: dict):
        sm = self.c.submatrices[cmd.dst]
        info = self.c.matrices[sm.matrix]
        arr = checked[(cmd.is_deriv, cmd.node)]
        if sm.num_rows == info.rows and sm.num_cols == info.cols:
            self.matrices[sm.matrix] = self.backend.from_numpy(arr, self.dtype)
        else:
            self.backend.copy(self._sub(cmd.dst), self.backend.from_numpy(arr, self.dtype), 1.0)

    def _sub(self, s: int):
        if s == 0:
            return None
        sm = self.c.submatrices[s]
        mat = self.matrices[sm.matrix]
        info = self.c.matrices[sm.matrix]
        if sm.row_offset == 0 and sm.col_offset == 0 and sm.num_rows == info.rows \
                and sm.num_cols == info.cols:
            return mat
        return self.backend.view(mat, sm.row_offset, sm.num_rows, sm.col_offset, sm.num_cols)

    # -- execution ----------------------------------------------------------------
    def run(self, inputs: dict, output_derivs: dict | None = None) -> RunResult:
        output_derivs = output_derivs or {}
        checked = self._validate(inputs, output_derivs)
        result = RunResult()
        be = self.backend
        comps = self.nnet.components
        nodes = self.nnet.node_map
        for cmd in self.c.commands:
            t = cmd.type
            if t is CT.ALLOC_MATRIX:
                info = self.c.matrices[cmd.matrix]
                self.matrices[cmd.matrix] = be.zeros(info.rows, info.cols, self.dtype)
            elif t is CT.DEALLOC_MATRIX:
                self.matrices.pop(cmd.matrix, None)
            elif t is CT.SWAP_MATRIX:
                a, b = self.matrices.get(cmd.matrix), self.matrices.get(cmd.src_matrix)
                self.matrices[cmd.matrix], self.matrices[cmd.src_matrix] = b, a
            elif t is CT.SET_CONST:
                be.set_const(self._sub(cmd.dst), cmd.alpha)
            elif t is CT.PROPAGATE:
                comp = comps[nodes[cmd.node].component]
                pre = self.c.precomputed[cmd.precomputed]
                iv, ov = self._sub(cmd.in_value), self._sub(cmd.out_value)
                memo = comp.propagate(pre, iv, ov)
                if cmd.memo:
                    self.memos[cmd.memo] = memo
                if cmd.alpha == 2.0:  # store-stats flag
                    comp.store_stats(iv, ov, memo)
            elif t in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
                name = nodes[cmd.node].component
                comp = comps[name]
                grad = None
                if t is CT.BACKPROP:
                    # A non-updatable component gets an empty dict: "training", which
                    # turns on self-repair and stats as Kaldi's to-update pointer does.
                    grad = self.grads.get(name)
                    if grad is None:
                        grad = {k: np.zeros(v.shape, dtype=self.dtype)
                                for k, v in comp.params().items()}
                        self.grads[name] = grad
                comp.backprop(self.c.precomputed[cmd.precomputed], self._sub(cmd.in_value),
                              self._sub(cmd.out_value), self._sub(cmd.out_deriv),
                              self.memos.pop(cmd.memo, None) if cmd.memo else None, grad,
                              self._sub(cmd.in_deriv))
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
                sources = {int(s): self._sub(int(s)) for s in np.unique(table[:, 0]) if s > 0}
                op = be.copy_rows_multi if t is CT.COPY_ROWS_MULTI else be.add_rows_multi
                op(self._sub(cmd.dst), sources, table, cmd.alpha)
            elif t is CT.ADD_ROW_RANGES:
                be.add_row_ranges(self._sub(cmd.dst), self._sub(cmd.src),
                                  self.c.indexes_ranges[cmd.table], cmd.alpha)
            elif t is CT.ACCEPT_INPUT:
                self._accept(cmd, checked)
            elif t is CT.PROVIDE_OUTPUT:
                value = np.array(be.to_numpy(self._sub(cmd.src)), copy=True)
                (result.input_derivs if cmd.is_deriv else result.outputs)[cmd.node] = value
            elif t in (CT.NO_OPERATION, CT.NO_OPERATION_PERMANENT, CT.NO_OPERATION_MARKER,
                       CT.NO_OPERATION_LABEL):
                pass
            else:
                raise NotImplementedError(f"command {t.value} is not supported by the runtime")
        for name, grad in self.grads.items():
            comp = comps[name]
            if not comp.is_updatable():
                continue
            if hasattr(comp, "sub_gradients"):  # composite: sub-component i is "name#i"
                for i, g in comp.sub_gradients(grad).items():
                    result.gradients[f"{name}#{i}"] = g
            else:
                result.gradients[name] = comp.export_gradient(grad)
        return result


def run(nnet, computation: NnetComputation, inputs: dict, output_derivs: dict | None = None,
        backend: str = "numpy", dtype=np.float32) -> RunResult:
    """Run a compiled computation; see :class:`RunResult`. Component statistics
    (when the request stores them) accumulate in ``nnet``'s components, in place."""
    return NnetComputer(nnet, computation, backend, dtype).run(inputs, output_derivs)
