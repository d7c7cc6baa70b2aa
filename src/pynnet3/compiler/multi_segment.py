"""Several requests compiled into one computation of consecutive segments.

This is Kaldi's multi-request ``Compiler`` (used for looped computations): segment
``k`` serves request ``k``, may read every cindex that an earlier segment computed,
and computes only the cindexes that are new. The commands of the segments follow
each other, separated by ``NO_OPERATION_MARKER``; each segment starts with its
``ACCEPT_INPUT`` commands followed by a ``NO_OPERATION_PERMANENT`` (the point where
the looped optimization may splice the computation into a loop), and ends with its
``PROVIDE_OUTPUT`` commands. Derivatives are not supported, as in Kaldi.

The single-request pieces are reused: segment ``k``'s graph is a
:class:`~.graph.GraphBuilder` whose computability sees the inputs of segments
``0..k`` and whose demand stops at cindexes computed earlier; the commands are
emitted by one :class:`~.commands.CommandCompiler` over the steps of all segments
(so source lookups span segments), switching to segment ``k``'s computability
while it emits segment ``k``'s steps (IfDefined/Failover resolve exactly as the
graph did).
"""

from __future__ import annotations

import numpy as np

from ..computation import Command, CommandType, NnetComputation
from ..errors import ComputeError
from ..index import describe, pack, unique_keys
from .commands import CommandCompiler
from .computable import Computability
from .graph import ComputationGraph, GraphBuilder, Step
from .request import ComputationRequest, IoSpecification

CT = CommandType


def _member(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mask of ``keys`` that occur in the sorted unique array ``sorted_keys``."""
    if len(sorted_keys) == 0 or len(keys) == 0:
        return np.zeros(len(keys), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[pos] == keys


class _SegmentGraphBuilder(GraphBuilder):
    """The graph of one segment: computability over the inputs of this and all
    earlier segments; cindexes in ``done`` (computed by earlier segments) are
    neither demanded nor scheduled again, and are no dependency edges inside the
    segment (so recurrent phases start from the segment's first new cindexes)."""

    def __init__(self, nnet, request: ComputationRequest, inputs: dict[str, np.ndarray],
                 done: dict[str, np.ndarray]):
        super().__init__(nnet, request)
        self.comp = Computability(nnet, inputs)
        self.done = done

    def used_source_keys(self, name: str, keys: np.ndarray):
        for src, rows, skeys in super().used_source_keys(name, keys):
            old = self.done.get(src)
            if old is not None and len(old):
                new = ~_member(old, skeys)
                if not new.all():
                    if not new.any():
                        continue
                    rows, skeys = rows[new], skeys[new]
            yield src, rows, skeys

    def _mirror_steps(self, name: str, keys: np.ndarray, steps: list[Step],
                      epoch: int) -> list[Step]:
        # Mirroring only looks at this segment's source steps; if some of the
        # needed rows live in an earlier segment's step, fall back to one step.
        out = super()._mirror_steps(name, keys, steps, epoch)
        if out and sum(len(s.indexes) for s in out) != len(keys):
            return []
        return out


class _SegmentCommandCompiler(CommandCompiler):
    """Forward commands for the steps of all segments, with segment markers and a
    splice point after each segment's inputs; outputs are kept, everything else is
    deallocated at the end."""

    def __init__(self, nnet, request: ComputationRequest, graph: ComputationGraph,
                 segment_of_step: list[int], computabilities: list[Computability]):
        super().__init__(nnet, request, None, graph)
        self.segment_of_step = segment_of_step
        self.computabilities = computabilities

    def _computability_of(self, i: int):
        return self.computabilities[self.segment_of_step[i]]

    def compile(self) -> NnetComputation:
        self._deriv_flags()
        c = self.c
        steps, seg = self.steps, self.segment_of_step
        for i, step in enumerate(steps):
            if i and seg[i] != seg[i - 1]:
                c.add(Command(CT.NO_OPERATION_MARKER))
            self.comp = self.computabilities[seg[i]]
            self._forward_step(i, step)
            last_input = step.kind == "input" and (
                i + 1 == len(steps) or steps[i + 1].kind != "input" or seg[i + 1] != seg[i])
            if last_input:
                c.add(Command(CT.NO_OPERATION_PERMANENT))
        c.add(Command(CT.NO_OPERATION_MARKER))
        keep = {c.submatrices[self.value_sub[i]].matrix
                for i, step in enumerate(steps) if step.kind == "output"}
        for m in range(1, len(c.matrices)):
            if m not in keep:
                c.add(Command(CT.DEALLOC_MATRIX, matrix=m))
        return c


def _merged_request(requests: list[ComputationRequest]) -> ComputationRequest:
    """One request listing every input and output of all segments (what the
    computation as a whole accepts and provides)."""
    def merge(kind: str) -> list[IoSpecification]:
        out: dict[str, list[np.ndarray]] = {}
        for r in requests:
            for spec in getattr(r, kind):
                out.setdefault(spec.name, []).append(spec.indexes)
        return [IoSpecification(name, np.concatenate(v)) for name, v in out.items()]

    return ComputationRequest(merge("inputs"), merge("outputs"), False,
                              requests[0].store_component_stats)


def _check_requests(requests: list[ComputationRequest]) -> None:
    if not requests:
        raise ComputeError("compile_segments needs at least one request")
    for k, r in enumerate(requests):
        if r.need_derivatives():
            raise ComputeError(f"segment {k}: multi-segment computations cannot compute "
                               "derivatives (as in Kaldi)")
        if r.store_component_stats != requests[0].store_component_stats:
            raise ComputeError(f"segment {k}: store_component_stats differs from segment 0")


def compile_segments(nnet, requests: list[ComputationRequest]) -> NnetComputation:
    """Compile ``requests`` as consecutive segments of one unoptimized computation.

    Each input cindex may be supplied by one segment only; a segment's outputs
    must be computable from the inputs of that segment and the earlier ones."""
    _check_requests(requests)
    done: dict[str, np.ndarray] = {}
    given: dict[str, list[np.ndarray]] = {}
    steps: list[Step] = []
    segment_of_step: list[int] = []
    computabilities: list[Computability] = []
    for k, req in enumerate(requests):
        for spec in req.inputs:
            keys = pack(spec.indexes)
            again = _member(done.get(spec.name, np.zeros(0, np.int64)), keys)
            if again.any():
                raise ComputeError(f"segment {k}: input {spec.name!r} supplies "
                                   f"{describe(spec.indexes[again])}, which an earlier "
                                   "segment already supplied")
            given.setdefault(spec.name, []).append(spec.indexes)
        inputs = {name: np.concatenate(v) for name, v in given.items()}
        builder = _SegmentGraphBuilder(nnet, req, inputs, done)
        try:
            graph = builder.build()
        except ComputeError as e:
            raise ComputeError(f"segment {k}: {e}") from None
        new: dict[str, list[np.ndarray]] = {}
        for step in graph.steps:
            new.setdefault(step.node, []).append(pack(step.indexes))
        for node, parts in new.items():
            if node in done:
                parts.append(done[node])
            done[node] = unique_keys(np.concatenate(parts))
        steps.extend(graph.steps)
        segment_of_step.extend([k] * len(graph.steps))
        computabilities.append(graph.computability)
    graph = ComputationGraph(steps, computabilities[0])
    compiler = _SegmentCommandCompiler(nnet, _merged_request(requests), graph,
                                       segment_of_step, computabilities)
    return compiler.compile()


def segment_bounds(c: NnetComputation) -> list[tuple[int, int]]:
    """``[begin, end)`` command ranges of the segments of ``c`` (split at
    ``NO_OPERATION_MARKER``; a marker ends its segment)."""
    out = []
    begin = 0
    for i, cmd in enumerate(c.commands):
        if cmd.type is CT.NO_OPERATION_MARKER:
            out.append((begin, i))
            begin = i + 1
    if begin < len(c.commands):
        out.append((begin, len(c.commands)))
    return out


__all__ = ["compile_segments", "segment_bounds"]
