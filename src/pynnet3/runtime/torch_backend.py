"""The torch backend: torch tensors on a device (``"cpu"``, ``"cuda"``, ...).

Every command runs as torch operations on the device. Index tables of the
computation (NumPy arrays made at compile time) are turned into device tensors
once per table and device and kept while the table lives, so no command makes
the host wait for the GPU: no boolean masks, no ``.item()``. Component math runs
through :mod:`pynnet3.components.xp`, which picks the torch namespace from the
tensors handed over.

The backend's arrays are 2-D tensors of the run's dtype (float32 or float64).
``from_numpy`` also takes torch tensors (moved to the device without a round trip
through NumPy); ``copy_out`` hands results back as tensors on the device.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ..components import xp_torch
from .backend import register_backend


def torch_device(device) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` as a torch.device
    (a plain ``"cuda"`` is the current CUDA device, so cache keys are exact)."""
    dev = torch.device(device if device is not None else "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class _RowPlan:
    """A row table (``dst row i <- src row table[i]``, -1: none) prepared for the
    device: ``rows`` the source rows of the rows that have one, ``pos`` their
    destination rows (None when every row has a source), ``empty`` the rows
    without one (None when none), ``hi`` the largest source row."""

    __slots__ = ("ref", "rows", "pos", "empty", "hi")


class _MultiPlan:
    """A (source, row) table grouped by source: ``groups`` = [(s, pos, rows)],
    ``empty`` the destination rows with no source (None when none)."""

    __slots__ = ("ref", "groups", "empty")


class _RangePlan:
    __slots__ = ("ref", "lo", "hi")


class TorchBackend:
    """Matrices as torch tensors on ``device`` (see the module docstring)."""

    name = "torch"

    def __init__(self, device=None):
        self.device = torch_device(device)
        self._plans: dict[tuple, object] = {}

    def __repr__(self) -> str:
        return f"TorchBackend(device={str(self.device)!r})"

    # -- plans of index tables (made once per table) ----------------------------------
    def _plan(self, kind: str, table: np.ndarray, make):
        key = (kind, id(table))
        plan = self._plans.get(key)
        if plan is not None and plan.ref() is table:
            return plan
        plan = make(table)
        plans = self._plans
        plan.ref = weakref.ref(table, lambda _r, k=key: plans.pop(k, None))
        plans[key] = plan
        return plan

    def _dev(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)

    def _row_plan(self, table: np.ndarray) -> _RowPlan:
        def make(t):
            p = _RowPlan()
            t = np.asarray(t, dtype=np.int64)
            ok = t >= 0
            p.hi = int(t.max()) if len(t) else -1
            if ok.all():
                p.rows, p.pos, p.empty = self._dev(t), None, None
            else:
                p.rows = self._dev(t[ok])
                p.pos = self._dev(np.flatnonzero(ok))
                bad = np.flatnonzero(~ok)
                p.empty = self._dev(bad) if len(bad) else None
            return p
        return self._plan("rows", table, make)

    def _multi_plan(self, table: np.ndarray) -> _MultiPlan:
        def make(t):
            p = _MultiPlan()
            t = np.asarray(t, dtype=np.int64)
            src = t[:, 0]
            order = np.argsort(src, kind="stable")
            keys, starts = np.unique(src[order], return_index=True)
            ends = np.append(starts[1:], len(order))
            p.groups, p.empty = [], None
            for s, a, b in zip(keys.tolist(), starts.tolist(), ends.tolist(), strict=True):
                pos = order[a:b]
                if s < 0:
                    p.empty = self._dev(pos)
                else:
                    p.groups.append((s, self._dev(pos), self._dev(t[pos, 1])))
            return p
        return self._plan("multi", table, make)

    def _range_plan(self, ranges: np.ndarray) -> _RangePlan:
        def make(r):
            p = _RangePlan()
            r = np.asarray(r, dtype=np.int64)
            p.lo, p.hi = self._dev(r[:, 0]), self._dev(r[:, 1])
            return p
        return self._plan("ranges", ranges, make)

    # -- the Backend interface -----------------------------------------------------------
    def zeros(self, rows, cols, dtype):
        return torch.zeros((rows, cols), dtype=xp_torch.dtype_of(dtype), device=self.device)

    def zeros_shaped(self, shape, dtype):
        """Zeros of any shape (gradient arrays shaped like parameters)."""
        return torch.zeros(tuple(shape), dtype=xp_torch.dtype_of(dtype), device=self.device)

    def release_matrix(self, matrices: dict, key) -> None:
        matrices.pop(key, None)  # torch's caching allocator reuses the memory

    def from_numpy(self, array, dtype):
        """A new device tensor of ``dtype`` holding ``array`` (NumPy or torch; a
        tensor already on the device is copied there, never through NumPy)."""
        dt = xp_torch.dtype_of(dtype)
        if isinstance(array, torch.Tensor):
            return array.detach().to(device=self.device, dtype=dt, copy=True)
        return torch.as_tensor(np.asarray(array)).to(device=self.device, dtype=dt, copy=True)

    def to_numpy(self, array):
        return array.detach().cpu().numpy()

    def copy_out(self, array):
        """A result handed to the user: a copy, a tensor on the device."""
        return array.detach().clone()

    def new_run(self) -> None:
        """Parameters may have changed since the last run (see xp_torch.param)."""
        xp_torch.new_run()

    def view(self, mat, row0, nrows, col0, ncols):
        return mat[row0:row0 + nrows, col0:col0 + ncols]

    def is_finite(self, array) -> bool:
        return bool(torch.isfinite(array).all())

    def set_const(self, dst, value):
        dst.fill_(value)

    def copy(self, dst, src, alpha):
        if alpha == 1.0:
            dst.copy_(src)
        else:
            torch.mul(src, alpha, out=dst) if dst.is_contiguous() else dst.copy_(src * alpha)

    def add(self, dst, src, alpha):
        dst.add_(src, alpha=alpha) if alpha != 1.0 else dst.add_(src)

    def copy_rows(self, dst, src, table, alpha):
        p = self._row_plan(table)
        if p.pos is None and p.hi < src.shape[0]:
            xp_torch.take(src, p.rows, out=dst)
            if alpha != 1.0:
                dst.mul_(alpha)
            return
        vals = torch.index_select(src, 0, p.rows)
        if alpha != 1.0:
            vals.mul_(alpha)
        if p.pos is None:
            dst.copy_(vals)
        else:
            dst.index_copy_(0, p.pos, vals)
        if p.empty is not None:
            dst.index_fill_(0, p.empty, 0.0)

    def add_rows(self, dst, src, table, alpha):
        p = self._row_plan(table)
        vals = torch.index_select(src, 0, p.rows)
        if p.pos is None:
            dst.add_(vals, alpha=alpha) if alpha != 1.0 else dst.add_(vals)
        else:
            dst.index_add_(0, p.pos, vals, alpha=alpha)

    def _gather_multi(self, dst, sources, table):
        p = self._multi_plan(table)
        out = torch.zeros_like(dst)
        for s, pos, rows in p.groups:
            out.index_copy_(0, pos, torch.index_select(sources[s], 0, rows))
        return out

    def copy_rows_multi(self, dst, sources, table, alpha):
        vals = self._gather_multi(dst, sources, table)
        dst.copy_(vals if alpha == 1.0 else vals.mul_(alpha))

    def add_rows_multi(self, dst, sources, table, alpha):
        vals = self._gather_multi(dst, sources, table)
        dst.add_(vals, alpha=alpha) if alpha != 1.0 else dst.add_(vals)

    def add_row_ranges(self, dst, src, ranges, alpha):
        # Prefix sums in float64 keep long ranges (pooling over thousands of frames)
        # at float32 accuracy, as the NumPy backend.
        p = self._range_plan(ranges)
        cs = torch.zeros((src.shape[0] + 1, src.shape[1]), dtype=torch.float64,
                         device=src.device)
        torch.cumsum(src, dim=0, dtype=torch.float64, out=cs[1:])
        sums = cs.index_select(0, p.hi) - cs.index_select(0, p.lo)
        dst += (alpha * sums).to(dst.dtype)


register_backend("torch", TorchBackend)
