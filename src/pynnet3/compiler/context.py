"""Left and right context of a "simple" network (Kaldi's ComputeSimpleNnetContext).

Give the ``input`` node a window of frames (and ``ivector``, when present, a wider
one), see which ``output`` frames are computable, and read the context off the
first and last computable frame. Repeat for every time shift modulo the network's
modulus and take the maximum; double the window until it exceeds the context.
"""

from __future__ import annotations

import numpy as np

from ..errors import ComputeError
from .computable import Computability


def _context_for_shift(nnet, start: int, window: int) -> tuple[int, int]:
    t = np.arange(start, start + window, dtype=np.int64)
    frames = np.stack([np.zeros_like(t), t, np.zeros_like(t)], axis=1)
    inputs = {"input": frames}
    if nnet.has_node("ivector") and nnet.node("ivector").kind == "input-node":
        tv = np.arange(start - nnet.modulus(), start + window, dtype=np.int64)
        inputs["ivector"] = np.stack([np.zeros_like(tv), tv, np.zeros_like(tv)], axis=1)
    ok = Computability(nnet, inputs).computable("output", frames)
    if not ok.any():
        raise ComputeError("no output frames are computable: not a simple network "
                           "(needs nodes 'input' and 'output')")
    first = int(np.argmax(ok))
    rest = ok[first:]
    first_not = first + (int(np.argmin(rest)) if not rest.all() else len(rest))
    return first, window - first_not


def compute_simple_context(nnet) -> tuple[int, int]:
    if not nnet.has_node("input") or not nnet.has_node("output"):
        raise ComputeError("context is defined for networks with 'input' and 'output' nodes")
    modulus = nnet.modulus()
    window, max_window = 40, 800
    while True:
        lefts, rights = [], []
        for shift in range(modulus + 1):
            left, right = _context_for_shift(nnet, shift, window)
            lefts.append(left)
            rights.append(right)
        left, right = max(lefts), max(rights)
        if left + right < window - 1 or window >= max_window:
            return left, right
        window *= 2
