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
# The (n, t, x) values an index may hold: [-limit, limit) per column, half each
# field's range (see check_range).
INDEX_LIMITS = np.array([1 << (_N_BITS - 2), 1 << (_T_BITS - 2), 1 << (_X_BITS - 2)],
                        dtype=np.int64)


def check_range(arr: np.ndarray) -> None:
    """Raise ValueError unless every (n, t, x) of ``arr`` fits its field of a packed
    key with room to spare (half the field each way): key arithmetic (time
    offsets, ReplaceIndex/Round masks, (t, x, n) ordering) is only exact there."""
    if not len(arr):
        return
    for col, name in ((N_COL, "n"), (T_COL, "t"), (X_COL, "x")):
        # per column: a reduction over axis 0 of the whole array buffers copies
        values = arr[:, col]
        lo, hi = int(values.min()), int(values.max())
        limit = int(INDEX_LIMITS[col])
        if lo < -limit or hi >= limit:
            raise ValueError(f"{name} values must lie in [{-limit}, {limit}); got [{lo}, {hi}]")


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


_UNPACK_SHIFTS = np.array([[_T_BITS + _X_BITS], [_X_BITS], [0]], dtype=np.int64)
_UNPACK_MASKS = np.array([[(1 << _N_BITS) - 1], [(1 << _T_BITS) - 1], [(1 << _X_BITS) - 1]],
                         dtype=np.int64)
_UNPACK_OFFSETS = np.array([[_N_OFF], [_T_OFF], [_X_OFF]], dtype=np.int64)
_SMALL_UNPACK = 512


def unpack(keys: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack`."""
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys) <= _SMALL_UNPACK:
        # All three columns in three operations (as rows of a (3, k) array, then
        # transposed): compile time is dominated by many short arrays, where this
        # beats column by column; on long ones the transposing copy costs more.
        out = keys >> _UNPACK_SHIFTS
        out &= _UNPACK_MASKS
        out -= _UNPACK_OFFSETS
        return out.T.copy()
    out = np.empty((len(keys), 3), dtype=np.int64)
    out[:, 0] = (keys >> (_T_BITS + _X_BITS)) - _N_OFF
    out[:, 1] = ((keys >> _X_BITS) & ((1 << _T_BITS) - 1)) - _T_OFF
    out[:, 2] = (keys & ((1 << _X_BITS) - 1)) - _X_OFF
    return out


_T_FIELD = ((1 << _T_BITS) - 1) << _X_BITS  # the bits of t in a key
_X_FIELD = (1 << _X_BITS) - 1


def key_offset(t_offset, x_offset=0):
    """What adding ``t_offset`` to t and ``x_offset`` to x adds to a key (ints or
    arrays; within the bit budget the fields never carry into each other)."""
    return (t_offset << _X_BITS) + x_offset


def key_t(keys: np.ndarray) -> np.ndarray:
    """The t of each key."""
    return ((keys >> _X_BITS) & ((1 << _T_BITS) - 1)) - _T_OFF


def key_with_t(keys: np.ndarray, t: int) -> np.ndarray:
    """The keys with t replaced by ``t``."""
    return (keys & ~_T_FIELD) | ((t + _T_OFF) << _X_BITS)


def key_with_x(keys: np.ndarray, x: int) -> np.ndarray:
    """The keys with x replaced by ``x``."""
    return (keys & ~_X_FIELD) | (x + _X_OFF)


def sort_order_txn(indexes: np.ndarray) -> np.ndarray:
    """Permutation sorting indexes by (t, x, n): Kaldi's ``Index::operator<``."""
    idx = np.asarray(indexes)
    return np.lexsort((idx[:, 0], idx[:, 2], idx[:, 1]))


def txn_keys(keys: np.ndarray) -> np.ndarray:
    """Keys (of another packing) whose order is the (t, x, n) order of the
    indexes that packed ``keys`` stand for: one stable argsort of them does what
    :func:`sort_order_txn` does with a three-column lexsort."""
    return ((keys & ((1 << (_T_BITS + _X_BITS)) - 1)) << _N_BITS) | (keys >> (_T_BITS + _X_BITS))


def unique_keys(keys: np.ndarray) -> np.ndarray:
    """Sorted unique values of an int64 array (packed keys, row or submatrix ids).
    Sort-based: numpy 2's hash-based ``np.unique`` is 5-50x slower on int64."""
    k = np.sort(np.asarray(keys, dtype=np.int64))
    if len(k) < 2:
        return k
    keep = np.empty(len(k), dtype=bool)
    keep[0] = True
    np.not_equal(k[1:], k[:-1], out=keep[1:])
    return k[keep]


def unique_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique keys, inverse) like ``np.unique(..., return_inverse=True)``."""
    keys = np.asarray(keys, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    first = np.empty(len(k), dtype=bool)
    if len(k):
        first[0] = True
        np.not_equal(k[1:], k[:-1], out=first[1:])
    inv = np.empty(len(k), dtype=np.int64)
    inv[order] = np.cumsum(first) - 1
    return k[first], inv


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
