"""The one-sequence request an exported graph is compiled from.

Interface of every exported graph (``pynnet3.export``):

* a frame input node gets rows t = -left .. F-1+right of sequence n = 0
  (``left``, ``right`` = the network's context, Kaldi's ComputeSimpleNnetContext);
* the input node ``ivector`` gets one row, t = 0 (or, for networks that read it
  at other times, e.g. ``Round(ivector, m)``, one row per frame time, all the
  same vector, as a decoder with one iVector per utterance feeds it);
* every output node is wanted at t = 0 .. F-1, or only at t = 0 for networks that
  pool statistics over whole utterances (x-vector extractors).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .. import limits
from ..compiler import ComputationRequest, IoSpecification
from ..errors import ComputeError, ExportError

IVECTOR = "ivector"
#: a StatisticsPoolingComponent whose window spans at least this many frames pools
#: whole utterances (x-vector extractors use 0 .. 10000)
WHOLE_UTTERANCE_FRAMES = 1000
MAX_WINDOW = 1000  # the widest input window export_context tries


@dataclass
class ExportShape:
    """Frames, context and the rows of each input/output of an exported graph."""

    frames: int
    left: int
    right: int
    output_first_only: bool
    ivector_times: tuple[int, ...] = (0,)  # the times the one iVector is given at

    @property
    def ivector_rows(self) -> int:
        return len(self.ivector_times)

    @property
    def input_frames(self) -> int:
        return self.left + self.frames + self.right

    @property
    def output_frames(self) -> int:
        return 1 if self.output_first_only else self.frames


def pools_whole_utterances(nnet) -> bool:
    """Whether the network's outputs are per utterance (module doc)."""
    for comp in nnet.components.values():
        if comp.type_name == "StatisticsPoolingComponent" and \
                comp.left_context + comp.right_context >= WHOLE_UTTERANCE_FRAMES:
            return True
    return False


def export_context(nnet) -> tuple[int, int]:
    """(left, right) context that makes EVERY output node computable (Kaldi's
    ComputeSimpleNnetContext looks at ``output`` only; an ``output-xent`` may need
    more): for each output and each time shift modulo the network's modulus, the
    first and last computable output of a window of input frames, the window
    doubling from 40 frames until the context fits, as
    :mod:`pynnet3.compiler.context` does for ``output``."""
    from ..compiler.computable import Computability

    frame_inputs = [n for n in nnet.input_names() if n != IVECTOR]
    modulus = nnet.modulus()
    window = 40
    while True:
        left = right = 0
        fits = True
        for shift in range(modulus + 1):
            frames = _rows(range(shift, shift + window))
            inputs = {n: frames for n in frame_inputs}
            if IVECTOR in nnet.input_names():
                inputs[IVECTOR] = _rows(range(shift - modulus, shift + window))
            comp = Computability(nnet, inputs)
            for name in nnet.output_names():
                ok = comp.computable(name, frames)
                if not ok.any():
                    fits = False
                    break
                first = int(np.argmax(ok))
                rest = ok[first:]
                first_not = first + (int(np.argmin(rest)) if not rest.all() else len(rest))
                left, right = max(left, first), max(right, window - first_not)
            if not fits:
                break
        if fits and left + right < window - 1:
            return left, right
        if window >= MAX_WINDOW:
            raise ExportError(f"no output frames are computable from a window of {MAX_WINDOW}"
                              " input frames: the network's context is too wide (or infinite)"
                              " to export for fixed blocks of frames")
        window = min(2 * window, MAX_WINDOW)


def _rows(times) -> np.ndarray:
    t = np.asarray(times, dtype=np.int64)
    z = np.zeros_like(t)
    return np.stack([z, t, z], axis=1)


def search_context(nnet, frames: int, output_frames: int) -> tuple[int, int]:
    """The smallest left context, then the smallest right context, that make every
    output computable at t = 0 .. output_frames-1 from frame inputs at t = -left ..
    frames-1+right (computability only grows with the inputs, so both are binary
    searches). For networks whose Kaldi-style context does not describe them, e.g. an
    output that reads ``Round(x, 3)`` on some frames and ``x`` on others."""
    from ..compiler.computable import Computability

    frame_inputs = [n for n in nnet.input_names() if n != IVECTOR]
    want = _rows(range(output_frames))
    pad = 2 * nnet.modulus() + 8

    def computable(left: int, right: int) -> bool:
        inputs = {n: _rows(range(-left, frames + right)) for n in frame_inputs}
        if IVECTOR in nnet.input_names():
            inputs[IVECTOR] = _rows(range(-left - pad, frames + right + pad))
        comp = Computability(nnet, inputs)
        return all(comp.computable(o, want).all() for o in nnet.output_names())

    if not computable(MAX_WINDOW, MAX_WINDOW):
        raise ExportError(f"the network's outputs at t = 0..{output_frames - 1} are not "
                          f"computable even with {MAX_WINDOW} frames of context on each "
                          "side: the context is too wide (or infinite) to export for fixed "
                          "blocks of frames")

    def smallest(ok) -> int:
        lo, hi = 0, MAX_WINDOW  # ok(hi) holds
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    left = smallest(lambda v: computable(v, MAX_WINDOW))
    return left, smallest(lambda v: computable(left, v))


def export_request(nnet, frames: int, output_times: str = "auto",
                   ivector_rows: str = "auto") -> tuple[ComputationRequest, ExportShape]:
    """The request (n = 0) and the shape of the exported interface (module doc).
    ``output_times``: "auto", "all" (t = 0 .. F-1) or "first" (t = 0);
    ``ivector_rows``: "auto" (t = 0, else every frame time), "first" or "all".
    The context is Kaldi's (:func:`export_context`, over every output) when the
    outputs are computable with it, else the smallest that works
    (:func:`search_context`)."""
    frames = _frames(frames)
    if output_times not in ("auto", "all", "first"):
        raise ExportError(f"output_times must be auto, all or first, got {output_times!r}")
    if ivector_rows not in ("auto", "first", "all"):
        raise ExportError(f"ivector_rows must be auto, first or all, got {ivector_rows!r}")
    first = output_times == "first" or (output_times == "auto"
                                        and pools_whole_utterances(nnet))
    error = None
    try:
        found, error = _request_for(nnet, frames, *export_context(nnet), first, ivector_rows)
        if found is not None:
            return found
    except ExportError:
        pass
    left, right = search_context(nnet, frames, 1 if first else frames)
    found, error = _request_for(nnet, frames, left, right, first, ivector_rows)
    if found is not None:
        return found
    raise ExportError(f"the network's outputs at t = 0..{(1 if first else frames) - 1} are "
                      f"not computable from inputs at t = {-left}..{frames + right - 1}: "
                      f"{error}")


def _frames(frames) -> int:
    """``frames`` as a count of output frames: an integer >= 1 within the request
    limit (checked before the request's index arrays are made: a huge F used to
    allocate them, and the unrolled graph, until the machine ran out of memory)."""
    if isinstance(frames, bool) or not isinstance(frames, numbers.Integral) and not (
            isinstance(frames, numbers.Real) and float(frames).is_integer()):
        raise ExportError(f"frames must be a whole number of output frames, got {frames!r}")
    frames = int(frames)
    if frames < 1:
        raise ExportError(f"frames must be >= 1, got {frames}")
    problem = limits.exceeded("max_rows", frames, "frames")
    if problem:
        raise ExportError(problem)
    return frames


def _request_for(nnet, frames: int, left: int, right: int, first: bool, ivector_rows: str):
    """((request, shape), None) for this context, or (None, the compiler's error)."""
    from ..compiler import compile_computation

    shape = ExportShape(int(frames), int(left), int(right), first)
    frame_times = np.arange(-shape.left, shape.frames + shape.right)
    outputs = [IoSpecification(name, _rows(range(shape.output_frames)))
               for name in nnet.output_names()]
    # (Round(ivector, m) and offsets may read it a little outside the frame range)
    pad = 2 * nnet.modulus() + 8
    wide_times = np.arange(-shape.left - pad, shape.frames + shape.right + pad)
    choices = {"auto": ([0], frame_times, wide_times), "first": ([0],),
               "all": (frame_times, wide_times)}
    error = None
    for iv_times in choices[ivector_rows] if IVECTOR in nnet.input_names() else ([0],):
        inputs = [IoSpecification(name, _rows(iv_times if name == IVECTOR else frame_times))
                  for name in nnet.input_names()]
        req = ComputationRequest(inputs, outputs)
        try:
            compile_computation(nnet, req)  # (cheap check of computability)
        except ComputeError as e:
            error = e
            continue
        shape.ivector_times = tuple(int(t) for t in iv_times)
        return (req, shape), None
    return None, error
