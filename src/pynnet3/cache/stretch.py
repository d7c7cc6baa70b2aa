"""Index arrays along n, for shortcut expansion (:mod:`pynnet3.cache.expand`).

An index array of the two-sequence computation reads ``(O, 2, S)``: O outer
blocks, each with S rows of n = 0 then the same S (t, x) with n = 1. Here many
such arrays are checked at once (:func:`n_strides`), equal ones found
(:func:`distinct_arrays`), and all expanded to ``(O, N, S)`` with a few numpy
calls per distinct S (:class:`Stretcher`).
"""

from __future__ import annotations

import numpy as np


class ExpansionError(Exception):
    """The mini computation does not have the structure expansion needs (internal:
    the caching compiler then compiles the full request)."""


def require(cond, message: str) -> None:
    """Raise :class:`ExpansionError` with ``message`` unless ``cond``."""
    if not cond:
        raise ExpansionError(message)


def n_strides(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Layouts of many small index arrays at once: for each, its n stride S, with
    the check that it reads ``(O, 2, S)`` with n = 0 then 1 and equal (t, x) in
    both halves. Returns ``(stride, outer)``; raises ExpansionError otherwise."""
    lens = np.array([len(a) for a in arrays], dtype=np.int64)
    require(bool((lens > 0).all()), "an empty matrix")
    big = np.concatenate(arrays) if arrays else np.zeros((0, 3), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    ncol = big[:, 0]
    require(bool(((ncol == 0) | (ncol == 1)).all()), "n outside {0, 1}")
    ones = np.flatnonzero(ncol == 1)
    first_one = np.searchsorted(ones, starts)
    require(bool((first_one < len(ones)).all()), "a matrix without n = 1 rows")
    stride = ones[first_one] - starts
    require(bool((stride > 0).all() and (lens % (2 * stride) == 0).all()),
             "rows are not (O, 2, S) blocks")
    seg = np.repeat(np.arange(len(arrays)), lens)
    s_row = stride[seg]
    local = np.arange(len(big), dtype=np.int64) - starts[seg]
    require(np.array_equal((local // s_row) % 2, ncol), "n is not in (O, 2, S) blocks")
    one_rows = np.flatnonzero(ncol == 1)
    require(np.array_equal(big[one_rows, 1:], big[one_rows - s_row[one_rows], 1:]),
             "the two sequences differ in (t, x)")
    return stride, lens // (2 * stride)


def distinct_arrays(arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[int]]:
    """The distinct arrays among ``arrays`` (by shape and bytes: index arrays are
    int64) and, for each array, the position of its equal in that list. Matrices
    of one node often share a row order (an LSTM's per-frame matrices, the input
    and output of a component), so each distinct one is checked and expanded once."""
    by_id: dict[int, int] = {}
    by_content: dict[tuple, int] = {}
    unique: list[np.ndarray] = []
    which: list[int] = []
    for a in arrays:
        u = by_id.get(id(a))  # (every array stays alive in ``arrays``)
        if u is None:
            u = by_content.setdefault((a.shape, a.tobytes()), len(unique))  # (all int64)
            if u == len(unique):
                unique.append(a)
            by_id[id(a)] = u
        which.append(u)
    return unique, which


class Stretcher:
    """Expands a fixed list of ``(O*2*S, 3)`` index arrays (n in {0, 1}) to their
    ``(O*N*S, 3)`` forms for any N.

    Arrays of one stride S are expanded together: their n = 0 blocks are stacked
    once (``(sum O, S, 3)``), and an expansion is one stretch of the stack, each
    result a contiguous view of it. A handful of numpy calls per distinct S,
    however many arrays."""

    def __init__(self, arrays: list[np.ndarray], stride: np.ndarray):
        by_stride: dict[int, list[int]] = {}
        for k, s in enumerate(stride.tolist()):
            by_stride.setdefault(s, []).append(k)
        self.num = len(arrays)
        self.groups = []  # (stacked n = 0 blocks, [(array, first block, end block)])
        for s, ks in by_stride.items():
            blocks = [arrays[k].reshape(-1, 2, s, 3)[:, 0] for k in ks]
            ends = np.cumsum([len(b) for b in blocks]).tolist()
            members = list(zip(ks, [0, *ends[:-1]], ends, strict=True))
            self.groups.append((np.concatenate(blocks).astype(np.int64, copy=False),
                                members))

    def expand(self, num_n: int) -> list[np.ndarray]:
        """The expansions to ``num_n`` sequences, in the order of construction."""
        out: list = [None] * self.num
        for src, members in self.groups:
            new = _stretch(src, num_n)
            for k, a, b in members:
                out[k] = new[a:b].reshape(-1, 3)
        return out


def _stretch(src: np.ndarray, num_n: int) -> np.ndarray:
    """``(T, S, 3)`` n = 0 blocks -> ``(T, N, S, 3)`` with n = 0 .. N-1."""
    num_t, s, _ = src.shape
    if s == 1:
        # n innermost (Kaldi's usual order): a column at a time; repeating 3-wide
        # rows is several times slower
        new = np.empty((num_t, num_n, 1, 3), dtype=np.int64)
        new[:, :, 0, 1] = src[:, :, 1]
        new[:, :, 0, 2] = src[:, :, 2]
        new[:, :, 0, 0] = np.arange(num_n, dtype=np.int64)
        return new
    # blocks of S rows repeated N times (contiguous chunks), then the n column as
    # one (N * S)-long pattern per block
    new = np.repeat(src[:, None], num_n, axis=1)
    new.reshape(num_t, num_n * s, 3)[:, :, 0] = np.repeat(np.arange(num_n, dtype=np.int64), s)
    return new
