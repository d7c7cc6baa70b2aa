"""The backend interface: the matrix operations the commands need.

The runtime never touches array libraries directly; it asks a backend. A backend
owns the array type (NumPy arrays, torch tensors, ...); components receive the
backend's arrays.
"""

from __future__ import annotations

from typing import Any, Protocol


class Backend(Protocol):
    name: str

    def zeros(self, rows: int, cols: int, dtype: Any) -> Any: ...
    def from_numpy(self, array, dtype: Any) -> Any: ...
    def to_numpy(self, array) -> Any: ...
    def view(self, mat, row0: int, nrows: int, col0: int, ncols: int) -> Any: ...
    def is_finite(self, array) -> bool: ...
    def set_const(self, dst, value: float) -> None: ...
    def copy(self, dst, src, alpha: float) -> None: ...
    def add(self, dst, src, alpha: float) -> None: ...
    def copy_rows(self, dst, src, table, alpha: float) -> None: ...
    def add_rows(self, dst, src, table, alpha: float) -> None: ...
    def copy_rows_multi(self, dst, sources: list, table, alpha: float) -> None: ...
    def add_rows_multi(self, dst, sources: list, table, alpha: float) -> None: ...
    def add_row_ranges(self, dst, src, ranges, alpha: float) -> None: ...
    def copy_out(self, array) -> Any: ...


_BACKENDS: dict[str, Any] = {}


def register_backend(name: str, factory) -> None:
    _BACKENDS[name] = factory


def get_backend(name: str, **options) -> Backend:
    """A new backend by name (``"numpy"``, ``"torch"``); ``options`` go to its
    constructor (the torch backend takes ``device``)."""
    if name not in _BACKENDS:
        if name == "numpy":
            from . import numpy_backend  # noqa: F401
        elif name == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                from ..errors import DependencyError

                raise DependencyError("backend 'torch' needs PyTorch: pip install "
                                      "'pynnet3[torch]'") from None
            from . import torch_backend  # noqa: F401
    try:
        factory = _BACKENDS[name]
    except KeyError:
        from ..errors import PynnetError

        raise PynnetError(f"unknown backend {name!r} (known: {sorted(_BACKENDS)})") from None
    return factory(**options)
