"""A growable map from packed index keys to small integer values, vectorized.

Used for per-node state during graph building (computability states, row
positions). Keys live in a few sorted blocks; lookups are ``searchsorted`` per
block, inserts add a block, and blocks are merged when there are too many.
"""

from __future__ import annotations

import numpy as np

from ..index import unique_keys

_MAX_BLOCKS = 12


class KeyMap:
    __slots__ = ("blocks",)

    def __init__(self):
        self.blocks: list[tuple[np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return sum(len(k) for k, _ in self.blocks)

    def lookup(self, keys: np.ndarray, default: int = -1) -> np.ndarray:
        """Values for ``keys`` (``default`` where absent)."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(self.blocks) == 1 and len(self.blocks[0][0]):  # the common case, fewer ops
            bk, bv = self.blocks[0]
            pos = bk.searchsorted(keys)
            np.minimum(pos, len(bk) - 1, out=pos)
            return np.where(bk[pos] == keys, bv[pos], default)
        out = np.full(len(keys), default, dtype=np.int64)
        for bk, bv in self.blocks:
            if not len(bk):
                continue
            pos = np.searchsorted(bk, keys)
            pos_c = np.minimum(pos, len(bk) - 1)
            hit = bk[pos_c] == keys
            out[hit] = bv[pos_c[hit]]
        return out

    def set(self, keys: np.ndarray, values) -> None:
        """Set values; keys may be new or present (need not be unique: last wins).
        ``values``: one per key, or one for all (the common case, done without a
        per-key array)."""
        keys = np.asarray(keys, dtype=np.int64)
        if not len(keys):
            return
        one = np.ndim(values) == 0
        if not one:
            values = np.broadcast_to(np.asarray(values, dtype=np.int64), keys.shape).copy()
        present = None
        for bk, bv in self.blocks:
            if not len(bk):
                continue
            pos = bk.searchsorted(keys)
            np.minimum(pos, len(bk) - 1, out=pos)
            hit = bk[pos] == keys
            bv[pos[hit]] = values if one else values[hit]
            present = hit if present is None else present | hit
        if present is None or not present.all():
            nk = keys if present is None else keys[~present]
            if one:
                nk = unique_keys(nk)
                self.blocks.append((nk, np.full(len(nk), values, dtype=np.int64)))
            else:
                nv = values if present is None else values[~present]
                # Keep the last value for duplicate new keys.
                order = np.argsort(nk, kind="stable")
                nk, nv = nk[order], nv[order]  # stable: equal keys keep their order
                last = np.ones(len(nk), dtype=bool)
                last[:-1] = nk[1:] != nk[:-1]
                self.blocks.append((nk[last], nv[last]))
            if len(self.blocks) > _MAX_BLOCKS:
                self._merge()

    def add_new(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add keys known to be absent; ``keys`` sorted and unique."""
        if not len(keys):
            return
        self.blocks.append((np.asarray(keys, dtype=np.int64),
                            np.asarray(values, dtype=np.int64)))
        if len(self.blocks) > _MAX_BLOCKS:
            self._merge()

    def _merge(self) -> None:
        keys = np.concatenate([k for k, _ in self.blocks])
        vals = np.concatenate([v for _, v in self.blocks])
        order = np.argsort(keys, kind="stable")
        self.blocks = [(keys[order], vals[order])]

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values), the keys sorted (and unique)."""
        if not self.blocks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(self.blocks) > 1:  # (each block is sorted, and no key is in two)
            self._merge()
        return self.blocks[0]
