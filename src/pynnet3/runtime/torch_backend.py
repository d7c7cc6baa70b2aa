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

import sys
import threading
import weakref
from collections import OrderedDict

import numpy as np

from ..components import xp_torch
from ..errors import RuntimeInputError
from .backend import register_backend

# (torch as xp_torch imported it: that module sets how torch allocates CPU memory
# before the first import)
torch = xp_torch.torch


def torch_device(device) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` as a torch.device
    (a plain ``"cuda"`` is the current CUDA device, so cache keys are exact)."""
    try:
        dev = torch.device(device if device is not None else "cpu")
    except (RuntimeError, TypeError) as e:
        raise RuntimeInputError(f"device {device!r}: {e}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeInputError(f"device {str(device)!r}: torch sees no CUDA device "
                                    "(or was built without CUDA)")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type not in ("cpu", "meta"):
        # (e.g. "mps" on a torch built without it: torch's RuntimeError would come
        # from the first tensor made there, deep inside a run)
        try:
            torch.empty(0, device=dev)
        except Exception as e:  # noqa: BLE001 - whatever torch raises ("hpu": ImportError)
            raise RuntimeInputError(f"device {str(device)!r}: torch cannot use it here "
                                    f"({e})") from None
    return dev


def _storage_uses(t: torch.Tensor) -> int | None:
    """How many tensors share ``t``'s storage (None where torch cannot say)."""
    try:
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata)
    except (AttributeError, RuntimeError):
        return None


def _count_after_pop(matrices: dict, key) -> int:
    """References to ``matrices[key]`` once popped into a local (the code shape of
    :meth:`_CpuPool.release`: calibrates 'held by nobody else' on this interpreter)."""
    t = matrices.pop(key, None)
    return sys.getrefcount(t)


_SOLE = _count_after_pop({0: torch.empty(2, 2)}, 0)
_SOLE_STORAGE = _storage_uses(torch.empty(2, 2))


class _CpuPool:
    """Freed CPU matrices by ``(rows, cols, dtype)``, reused by later allocations,
    at most ``limit_bytes`` (least recently released shapes evicted first).

    Why: as for the NumPy backend (runtime/matrix_pool.py), a new large tensor is
    fresh ``mmap`` pages that the kernel zeroes on first touch; a kept one costs a
    memset. Only a matrix nobody else holds comes here: no other reference to the
    tensor object and no other tensor (a view, a memo) on its storage. CUDA
    tensors need none of this: torch's caching allocator keeps their memory."""

    def __init__(self, limit_bytes: int = 256 << 20):
        self.limit_bytes = limit_bytes
        self._free: OrderedDict[tuple, list[torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, rows: int, cols: int, dtype) -> torch.Tensor | None:
        key = (rows, cols, dtype)
        with self._lock:
            bufs = self._free.get(key)
            if not bufs:
                return None
            t = bufs.pop()
            if not bufs:
                del self._free[key]
            self._bytes -= t.numel() * t.element_size()
            return t

    def release(self, matrices: dict, key) -> None:
        t = matrices.pop(key, None)
        if sys.getrefcount(t) != _SOLE or type(t) is not torch.Tensor:
            return
        if _SOLE_STORAGE is None or _storage_uses(t) != _SOLE_STORAGE or t.dim() != 2 \
                or not t.is_contiguous() or t.storage_offset() != 0:
            return
        nbytes = t.numel() * t.element_size()
        if nbytes == 0 or nbytes > self.limit_bytes:
            return
        with self._lock:
            k = (t.shape[0], t.shape[1], t.dtype)
            self._free.setdefault(k, []).append(t)
            self._free.move_to_end(k)
            self._bytes += nbytes
            while self._bytes > self.limit_bytes:
                old, bufs = next(iter(self._free.items()))
                gone = bufs.pop(0)
                self._bytes -= gone.numel() * gone.element_size()
                if not bufs:
                    del self._free[old]


CPU_POOL = _CpuPool()


_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64,
              torch.float16: np.float16}


def _cpu_zeros(shape: tuple, dt: torch.dtype) -> torch.Tensor:
    """Zeros on the CPU in memory NumPy allocates. Why: on the development host a
    fresh multi-MB torch CPU tensor cost 10-20 ms of page faults where NumPy's
    allocation (transparent huge pages, heap reuse) cost about 1 ms; the tensor is
    an ordinary one (``torch.from_numpy`` shares the buffer)."""
    np_dt = _NP_DTYPES.get(dt)
    if np_dt is None:
        return torch.zeros(shape, dtype=dt)
    return torch.from_numpy(np.zeros(shape, dtype=np_dt))


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


#: device -> plans of index tables (TorchBackend._plan), forgotten with their table
_PLANS: dict[torch.device, dict[tuple, object]] = {}


class TorchBackend:
    """Matrices as torch tensors on ``device`` (see the module docstring)."""

    name = "torch"

    def __init__(self, device=None):
        self.device = torch_device(device)
        # (shared by the backends of one device: every run makes a new backend, and a
        # per-instance dict re-uploaded each table on every run, a host wait on a GPU)
        self._plans: dict[tuple, object] = _PLANS.setdefault(self.device, {})

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
        dt = xp_torch.dtype_of(dtype)
        if self.device.type == "cpu":
            t = CPU_POOL.take(rows, cols, dt)
            if t is not None:
                return t.zero_()
            return _cpu_zeros((rows, cols), dt)
        return torch.zeros((rows, cols), dtype=dt, device=self.device)

    def zeros_shaped(self, shape, dtype):
        """Zeros of any shape (gradient arrays shaped like parameters)."""
        dt = xp_torch.dtype_of(dtype)
        if self.device.type == "cpu":
            return _cpu_zeros(tuple(shape), dt)
        return torch.zeros(tuple(shape), dtype=dt, device=self.device)

    def release_matrix(self, matrices: dict, key) -> None:
        """DEALLOC_MATRIX: on the CPU the buffer goes to a pool (see _CpuPool); on a
        GPU torch's caching allocator reuses the memory."""
        if self.device.type == "cpu":
            CPU_POOL.release(matrices, key)
        else:
            matrices.pop(key, None)

    def from_numpy(self, array, dtype):
        """A new device tensor of ``dtype`` holding ``array`` (NumPy or torch; a
        tensor already on the device is copied there, never through NumPy)."""
        dt = xp_torch.dtype_of(dtype)
        if isinstance(array, torch.Tensor):
            return array.detach().to(device=self.device, dtype=dt, copy=True)
        array = np.asarray(array)
        if min(array.strides, default=0) < 0 or not array.dtype.isnative:
            # (x[::-1]: torch has no negative strides; nor other byte orders ('>f4'))
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        if not array.flags.writeable:  # (as_tensor would warn about sharing it: copy)
            return torch.tensor(array, dtype=dt, device=self.device)
        return torch.as_tensor(array).to(device=self.device, dtype=dt, copy=True)

    def to_numpy(self, array):
        return array.detach().cpu().numpy()

    def copy_out(self, array):
        """A result handed to the user: a copy, a tensor on the device."""
        if array.device.type == "cpu":  # (NumPy's allocation: see _cpu_zeros)
            return torch.from_numpy(np.array(array.detach().numpy(), copy=True))
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
