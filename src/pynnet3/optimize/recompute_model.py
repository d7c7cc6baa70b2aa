"""The memory arithmetic of the recompute pass (:mod:`pynnet3.optimize.recompute`):
the live floats a set of recomputed values would leave, modelled without building
the program (:class:`MemoryModel`), and measured on a built one
(:func:`live_floats_compressed`)."""

from __future__ import annotations

import copy

import numpy as np

from ..analysis.memory import live_floats
from ..computation import CommandType as CT
from ..computation import NnetComputation, bytes_per_element
from .recompute_candidates import Candidate


class MemoryModel:
    """The score of a candidate set without building it: live floats after each
    command of ``c`` (memory compression at level 1 applied as intervals), minus
    each chosen value over the commands where it is no longer alive, plus the
    compression lost by an input that a recompute now reads in the backward pass
    (level 1 compresses a ReLU output only when its ReLU backprop is its only
    backward reader), plus each source whose life a recompute extends. Positions
    are ``c``'s commands; a command inserted before
    command ``k`` is counted as after ``k - 1`` with its value at its largest."""

    def __init__(self, c: NnetComputation, nnet, cands: list[Candidate], options):
        live, _ = live_floats(c)
        self.n = n = len(live)
        self.compressed: dict[int, tuple[int, int, float]] = {}  # matrix -> lo, hi, saving
        measured = live
        if options is not None:
            from .compression import optimize_memory_compression

            t = copy.copy(c)
            optimize_memory_compression(t, nnet, options)
            self.compressed = _compression_intervals(c, t)
            measured, _ = live_floats(t)
        #: (peak, sum) of ``c`` as measured (after compression): what a set must beat
        self.measured = (float(measured.max()), float(measured.sum())) if n else (0.0, 0.0)
        diff = np.zeros(n + 1)
        for lo, hi, saving in self.compressed.values():
            diff[lo] -= saving
            diff[hi] += saving
        self.base = live + np.cumsum(diff)[:n]
        mats = {x.matrix for x in cands} | {m for x in cands for m, _ in x.extend}
        self.size = {m: c.matrices[m].rows * c.matrices[m].cols for m in mats}

    def __call__(self, chosen: list[Candidate]) -> tuple[float, float]:
        diff = np.zeros(self.n + 1)
        for x in chosen:
            lo, hi = x.last_forward + 1, x.backward[0] - 1
            if lo < hi:
                diff[lo] -= self.size[x.matrix]
                diff[hi] += self.size[x.matrix]
        until: dict[int, tuple[int, int]] = {}  # extended source -> (freed at, until)
        for x in chosen:
            for m, e in x.extend:
                until[m] = (e, max(until.get(m, (e, 0))[1], x.backward[0]))
        for m, (e, r) in until.items():
            diff[e] += self.size[m]
            diff[r] -= self.size[m]
        for m in {s for x in chosen for s in x.sources} & self.compressed.keys():
            lo, hi, saving = self.compressed[m]
            diff[lo] += saving
            diff[hi] -= saving
        prof = self.base + np.cumsum(diff)[:self.n]
        return (float(prof.max()), float(prof.sum())) if self.n else (0.0, 0.0)


def _compression_intervals(c: NnetComputation, t: NnetComputation
                           ) -> dict[int, tuple[int, int, float]]:
    """Per matrix that ``t`` (``c`` after the compression pass, which only inserts
    commands) compresses: the positions of ``c`` after which it is compressed,
    ``[lo, hi)`` (the command before its decompression counted full, where the
    decompression brings it back), and the floats compression saves."""
    out = {}
    opened: dict[int, tuple[int, float]] = {}
    k = 0  # commands of c passed
    originals = c.commands
    for cmd in t.commands:
        if k < len(originals) and cmd is originals[k]:
            k += 1
            continue
        sm = t.submatrices[cmd.dst]
        if cmd.type is CT.COMPRESS_MATRIX:
            n_el = sm.num_rows * sm.num_cols
            opened[sm.matrix] = (k, n_el * (1 - bytes_per_element(cmd.compress_kind) / 4))
        elif cmd.type is CT.DECOMPRESS_MATRIX and sm.matrix in opened:
            lo, saving = opened.pop(sm.matrix)
            out[sm.matrix] = (lo, max(lo, k - 1), saving)
    return out


def live_floats_compressed(c: NnetComputation, nnet, options) -> np.ndarray:
    """Live floats after each command; with ``options``, of the computation as the
    memory-compression pass (which runs after this one) would leave it."""
    if options is not None:
        from .compression import optimize_memory_compression

        c = copy.copy(c)
        optimize_memory_compression(c, nnet, options)  # (only rebinds c.commands)
    live, _ = live_floats(c)
    return live
