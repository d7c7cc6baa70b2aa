"""Looped (online) computations: Kaldi's nnet-compile-looped.

A looped computation decodes an utterance of any length chunk by chunk while
keeping every activation that later chunks need (recurrent state, TDNN context).
It is compiled from three requests (chunk 0 with the left context, chunks 1 and 2
with only new frames): they are extrapolated to more chunks, compiled as segments
of one computation (:mod:`.multi_segment`), and optimized with
``optimize_looped_computation``, which finds two segments whose live matrices
differ only by a time shift and turns the computation into an infinite loop
(``NO_OPERATION_LABEL`` ... ``GOTO_LABEL``). The runtime then runs it a chunk at a
time (:class:`pynnet3.runtime.computer.NnetComputer`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import numpy as np

from ..computation import CommandType, NnetComputation
from ..descriptor import ReplaceIndexOf, RoundOf
from ..errors import ComputeError
from .multi_segment import compile_segments
from .request import ComputationRequest, IoSpecification


# -- the network ---------------------------------------------------------------------
def _rewrite_replace_index(e, period: int):
    """``e`` with every ``ReplaceIndex(x, t, 0)`` turned into ``Round(x, period)``."""
    if isinstance(e, ReplaceIndexOf) and e.variable == "t" and e.value == 0:
        return RoundOf(_rewrite_replace_index(e.src, period), period)
    if not dataclasses.is_dataclass(e):
        return e
    changes = {}
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if isinstance(v, tuple):
            nv = tuple(_rewrite_replace_index(x, period) for x in v)
        elif dataclasses.is_dataclass(v):
            nv = _rewrite_replace_index(v, period)
        else:
            continue
        if nv != v:
            changes[f.name] = nv
    return dataclasses.replace(e, **changes) if changes else e


def modify_ivector_period(nnet, period: int):
    """Kaldi's ModifyNnetIvectorPeriod, on a copy: in every component-node input,
    ``ReplaceIndex(x, t, 0)`` (the utterance iVector at t=0) becomes
    ``Round(x, period)`` (the iVector of the current ``period``-frame block), so a
    looped computation reads a fresh iVector row per chunk. Nodes are copied;
    components are shared with ``nnet`` (this function does not change them)."""
    if period <= 0:
        raise ComputeError(f"ivector period must be positive, got {period}")
    out = copy.copy(nnet)
    nodes = []
    for node in nnet.nodes:
        node = copy.copy(node)
        if node.kind == "component-node":
            node.descriptor = _rewrite_replace_index(node.descriptor, period)
        nodes.append(node)
    out.nodes = nodes
    out.components = dict(nnet.components)
    if hasattr(out, "_context_cache"):
        object.__delattr__(out, "_context_cache")
    return out


def get_chunk_size(nnet, frame_subsampling_factor: int, advised_chunk_size: int) -> int:
    """Kaldi's GetChunkSize: the smallest size >= ``advised_chunk_size`` that is a
    multiple of the frame-subsampling factor and of the network's modulus."""
    modulus = nnet.modulus()
    if frame_subsampling_factor <= 0 or advised_chunk_size <= 0:
        raise ComputeError("frame_subsampling_factor and frames_per_chunk must be positive")
    lcm = int(np.lcm(modulus, frame_subsampling_factor))
    return -(-advised_chunk_size // lcm) * lcm


def has_ivector_input(nnet) -> bool:
    return nnet.has_node("ivector") and nnet.node("ivector").kind == "input-node"


# -- the requests --------------------------------------------------------------------
def _frames(n_seq: int, t: np.ndarray) -> np.ndarray:
    """Indexes with ``n`` outer and ``t`` inner (the request order Kaldi uses)."""
    n = np.repeat(np.arange(n_seq, dtype=np.int64), len(t))
    tt = np.tile(np.asarray(t, dtype=np.int64), n_seq)
    return np.stack([n, tt, np.zeros_like(tt)], axis=1)


def _chunk_request(input_t: np.ndarray, output_t: np.ndarray, ivector_t: np.ndarray | None,
                   num_sequences: int) -> ComputationRequest:
    inputs = [IoSpecification("input", _frames(num_sequences, input_t))]
    if ivector_t is not None and len(ivector_t):
        inputs.append(IoSpecification("ivector", _frames(num_sequences, ivector_t)))
    return ComputationRequest(inputs, [IoSpecification("output",
                                                       _frames(num_sequences, output_t))])


def create_looped_requests(nnet, chunk_size: int, frame_subsampling_factor: int,
                           ivector_period: int, left_context: int, right_context: int,
                           num_sequences: int = 1
                           ) -> tuple[ComputationRequest, ComputationRequest,
                                      ComputationRequest]:
    """Kaldi's CreateLoopedComputationRequest: the requests of chunks 0, 1, 2.

    Chunk 0 takes input frames ``-left_context .. chunk_size + right_context - 1``;
    chunk k >= 1 takes the ``chunk_size`` frames after those. Outputs of chunk k are
    ``k*chunk_size .. (k+1)*chunk_size - 1`` in steps of the subsampling factor.
    With an ``ivector`` input, each chunk supplies the iVector times
    (``t - t mod ivector_period``) its input frames need that no earlier chunk
    supplied."""
    if chunk_size <= 0 or frame_subsampling_factor <= 0 or num_sequences <= 0:
        raise ComputeError("chunk_size, frame_subsampling_factor and num_sequences must be "
                           "positive")
    if left_context < 0 or right_context < 0:
        raise ComputeError(f"contexts must be >= 0, got {left_context}, {right_context}")
    has_iv = has_ivector_input(nnet)
    if (chunk_size % frame_subsampling_factor or chunk_size % nnet.modulus()
            or (has_iv and (ivector_period <= 0 or chunk_size % ivector_period))):
        raise ComputeError(
            f"chunk_size {chunk_size} must be a multiple of the frame-subsampling factor "
            f"({frame_subsampling_factor}), the network modulus ({nnet.modulus()})"
            + (f" and the ivector period ({ivector_period})" if has_iv else ""))
    begin = [-left_context, chunk_size + right_context, 2 * chunk_size + right_context]
    end = [chunk_size + right_context, 2 * chunk_size + right_context,
           3 * chunk_size + right_context]
    seen: set[int] = set()
    requests = []
    for k in range(3):
        input_t = np.arange(begin[k], end[k])
        ivector_t = None
        if has_iv:
            times = np.unique(input_t - np.mod(input_t, ivector_period))
            ivector_t = np.array([t for t in times.tolist() if t not in seen], dtype=np.int64)
            seen.update(ivector_t.tolist())
        output_t = np.arange(k * chunk_size, (k + 1) * chunk_size, frame_subsampling_factor)
        requests.append(_chunk_request(input_t, output_t, ivector_t, num_sequences))
    return requests[0], requests[1], requests[2]


def _shifted(request: ComputationRequest, dt: int) -> ComputationRequest:
    def shift(specs):
        out = []
        for s in specs:
            idx = s.indexes.copy()
            idx[:, 1] += dt
            out.append(IoSpecification(s.name, idx, s.has_deriv))
        return out

    return ComputationRequest(shift(request.inputs), shift(request.outputs),
                              request.need_model_derivative, request.store_component_stats)


def _same_request(a: ComputationRequest, b: ComputationRequest) -> bool:
    def same(x, y):
        return len(x) == len(y) and all(
            p.name == q.name and p.has_deriv == q.has_deriv
            and np.array_equal(p.indexes, q.indexes) for p, q in zip(x, y, strict=False))

    return (same(a.inputs, b.inputs) and same(a.outputs, b.outputs)
            and a.need_model_derivative == b.need_model_derivative
            and a.store_component_stats == b.store_component_stats)


def extrapolate_requests(requests: Sequence[ComputationRequest],
                         num_requests: int) -> list[ComputationRequest]:
    """``requests`` (chunks 0, 1, 2) continued to ``num_requests`` chunks: each further
    chunk is the previous one shifted by the time step between chunks 1 and 2
    (Kaldi's ExtrapolateComputationRequest). Chunks 1 and 2 must differ only by
    that shift."""
    if len(requests) != 3:
        raise ComputeError(f"a looped computation needs 3 requests, got {len(requests)}")
    r1, r2 = requests[1], requests[2]
    if not r1.inputs or not r2.inputs or not len(r1.inputs[0].indexes) \
            or not len(r2.inputs[0].indexes):
        raise ComputeError("looped requests need a non-empty first input")
    dt = int(r2.inputs[0].indexes[0, 1] - r1.inputs[0].indexes[0, 1])
    if not _same_request(_shifted(r2, -dt), r1):
        raise ComputeError("requests 2 and 3 of a looped computation must differ only by a "
                           f"time shift (tried {dt})")
    out = list(requests)
    while len(out) < num_requests:
        out.append(_shifted(out[-1], dt))
    return out


# -- compilation ---------------------------------------------------------------------
def compile_looped(nnet, requests: Sequence[ComputationRequest], options=None,
                   report=None, check: bool = False) -> NnetComputation:
    """Kaldi's CompileLooped: compile chunks 0, 1, 2 (``requests``) extrapolated to 5
    segments (then 10, 20, ... up to 80 when no repeat is found), optimize with
    ``options`` plus ``optimize_looped_computation``, and return the computation,
    which ends in a ``GOTO_LABEL``. ``report`` (an OptimizeReport) and ``check``
    (run the checker after every pass) are passed to the optimizer."""
    from ..optimize import OptimizeOptions, optimize
    from ..optimize.looped import fix_goto_label

    options = dataclasses.replace(options or OptimizeOptions(),
                                  optimize_looped_computation=True)
    num = 5
    while num <= 100:
        c = compile_segments(nnet, extrapolate_requests(requests, num))
        if report is not None:
            report.passes.clear()
        optimize(c, nnet, options, report=report, check=check)
        fix_goto_label(c)
        if c.commands and c.commands[-1].type is CommandType.GOTO_LABEL:
            return c
        num *= 2
    raise ComputeError(f"looped compilation found no repeating segments with {num // 2} "
                       "requests (the requests do not describe a steady state?)")
