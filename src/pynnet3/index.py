"""Indexes ``(n, t, x)`` and cindexes ``(node, Index)`` as numpy arrays.

An index set is an int64 array of shape ``(k, 3)``: columns n (sequence in the
minibatch), t (time), x (extra index). For set operations each index is packed
into one int64 *key* (order-preserving in (n, t, x)), so membership tests and
lookups are ``searchsorted`` over sorted key arrays instead of Python dicts.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Bit budget of a packed key: n 20 bits, t 27 bits, x 16 bits (all offset to be >= 0).
_N_BITS, _T_BITS, _X_BITS = 20, 27, 16
_N_OFF, _T_OFF, _X_OFF = 1 << (_N_BITS - 1), 1 << (_T_BITS - 1), 1 << (_X_BITS - 1)
N_COL, T_COL, X_COL = 0, 1, 2


class Index(NamedTuple):
    """One index; for single values only — sets are ``(k, 3)`` arrays."""

    n: int = 0
    t: int = 0
    x: int = 0


def as_indexes(obj) -> np.ndarray:
    """Anything index-like (list of triples, array) as a ``(k, 3)`` int64 array."""
    arr = np.asarray(obj, dtype=np.int64)
    if arr.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"indexes must have shape (k, 3), got {arr.shape}")
    return arr


# Within the bit budget the offset fields do not overlap, so the key is also
# n * 2^43 + t * 2^16 + x + _KEY_BASE: one small matrix product for short arrays
# (compile time is dominated by many small ones), in-place adds for long ones.
_KEY_BASE = (_N_OFF << (_T_BITS + _X_BITS)) + (_T_OFF << _X_BITS) + _X_OFF
_KEY_WEIGHTS = np.array([1 << (_T_BITS + _X_BITS), 1 << _X_BITS, 1], dtype=np.int64)
_SMALL = 1024


def pack(indexes: np.ndarray) -> np.ndarray:
    """Pack ``(k, 3)`` indexes into sortable int64 keys (order = (n, t, x) order)."""
    idx = np.asarray(indexes, dtype=np.int64)
    if len(idx) <= _SMALL:
        return idx @ _KEY_WEIGHTS + _KEY_BASE
    out = idx[:, 0] << (_T_BITS + _X_BITS)
    out += idx[:, 1] << _X_BITS
    out += idx[:, 2]
    out += _KEY_BASE
    return out


def unpack(keys: np.ndarray) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.int64)
    out = np.empty((len(keys), 3), dtype=np.int64)
    out[:, 0] = (keys >> (_T_BITS + _X_BITS)) - _N_OFF
    out[:, 1] = ((keys >> _X_BITS) & ((1 << _T_BITS) - 1)) - _T_OFF
    out[:, 2] = (keys & ((1 << _X_BITS) - 1)) - _X_OFF
    return out


def sort_order_txn(indexes: np.ndarray) -> np.ndarray:
    """Permutation sorting indexes by (t, x, n): Kaldi's ``Index::operator<``."""
    idx = np.asarray(indexes)
    return np.lexsort((idx[:, 0], idx[:, 2], idx[:, 1]))


class KeySet:
    """An immutable set of packed keys with fast vectorized membership and position.

    ``position(keys)`` gives, for each key, its row in the original (unsorted)
    order given at construction, or -1 when absent.
    """

    __slots__ = ("sorted_keys", "order", "size")

    def __init__(self, keys: np.ndarray):
        keys = np.asarray(keys, dtype=np.int64)
        self.order = np.argsort(keys, kind="stable")
        self.sorted_keys = keys[self.order]
        self.size = len(keys)

    @classmethod
    def from_indexes(cls, indexes: np.ndarray) -> KeySet:
        return cls(pack(indexes))

    def position(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        if self.size == 0:
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.searchsorted(self.sorted_keys, keys)
        pos_c = np.minimum(pos, self.size - 1)
        found = self.sorted_keys[pos_c] == keys
        return np.where(found, self.order[pos_c], -1)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.position(keys) >= 0

    def __len__(self) -> int:
        return self.size


def describe(indexes: np.ndarray, limit: int = 5) -> str:
    """Short human-readable listing for error messages: ``(n=0, t=3, x=0), ...``."""
    idx = np.asarray(indexes)
    shown = ", ".join(f"(n={a}, t={b}, x={c})" for a, b, c in idx[:limit].tolist())
    if len(idx) > limit:
        shown += f", ... ({len(idx)} in all)"
    return shown
