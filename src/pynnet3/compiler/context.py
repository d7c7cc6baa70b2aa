"""Left and right context of a "simple" network (Kaldi's ComputeSimpleNnetContext).

Give the ``input`` node a window of frames (and ``ivector``, when present, a wider
one), see which ``output`` frames are computable, and read the context off the
first and last computable frame. Repeat for every time shift modulo the network's
modulus and take the maximum. A window narrower than the total context leaves no
output computable (or too few to trust), so the window doubles, from 40 frames
up to ``MAX_WINDOW``, until the context fits in it for every shift.
"""

from __future__ import annotations

import numpy as np

from ..errors import ComputeError
from .computable import Computability

FIRST_WINDOW = 40
# The widest window tried; like Kaldi's, whose doubling search stops near here.
# A network with a total context this wide is taken as not simple.
MAX_WINDOW = 1000


def _frames(start: int, stop: int) -> np.ndarray:
    t = np.arange(start, stop, dtype=np.int64)
    return np.stack([np.zeros_like(t), t, np.zeros_like(t)], axis=1)


def _context_for_shift(nnet, start: int, window: int) -> tuple[int, int] | None:
    """(left, right) seen through the input window ``[start, start + window)``,
    or None when no output frame in it is computable (the window is too narrow)."""
    frames = _frames(start, start + window)
    inputs = {"input": frames}
    if nnet.has_node("ivector") and nnet.node("ivector").kind == "input-node":
        inputs["ivector"] = _frames(start - nnet.modulus(), start + window)
    ok = Computability(nnet, inputs).computable("output", frames)
    if not ok.any():
        return None
    first = int(np.argmax(ok))
    rest = ok[first:]
    first_not = first + (int(np.argmin(rest)) if not rest.all() else len(rest))
    return first, window - first_not


def compute_simple_context(nnet) -> tuple[int, int]:
    """(left, right) context of ``nnet``; ComputeError if its ``output`` is not
    computable from a window of ``MAX_WINDOW`` ``input`` frames."""
    if not nnet.has_node("input") or not nnet.has_node("output"):
        raise ComputeError("context is defined for networks with 'input' and 'output' nodes")
    modulus = nnet.modulus()
    window = FIRST_WINDOW
    while True:
        spans = [_context_for_shift(nnet, shift, window) for shift in range(modulus + 1)]
        if all(s is not None for s in spans):
            left = max(s[0] for s in spans)
            right = max(s[1] for s in spans)
            if left + right < window - 1:
                return left, right
        if window >= MAX_WINDOW:
            raise ComputeError(
                f"no output frames are computable from a window of {MAX_WINDOW} input "
                "frames: not a simple network (needs nodes 'input' and 'output'), or "
                "its context is wider than that")
        window = min(2 * window, MAX_WINDOW)
