"""ComputationRequest -> NnetComputation: graph, schedule, commands."""

from __future__ import annotations

import time

from .. import limits
from ..errors import ComputeError
from .commands import compile_commands
from .graph import build_graph
from .request import ComputationRequest, IoSpecification, request_for_frames


def compile_computation(nnet, request: ComputationRequest, timings: dict | None = None):
    """Compile ``request`` on ``nnet`` into an unoptimized NnetComputation.
    ``timings`` (optional): seconds spent are added under "graph", "schedule" and
    "commands" (the CachingCompiler's per-phase report)."""
    t0 = time.perf_counter()
    builder, graph = build_graph(nnet, request)
    t1 = time.perf_counter()
    # (inputs accepted first, outputs provided last in each segment, as Kaldi's
    # compiler: compile_commands emits them there)
    computation = compile_commands(nnet, request, builder, graph)
    check_matrix_sizes(computation)
    if timings is not None:
        schedule = builder.schedule_seconds
        for phase, seconds in (("graph", t1 - t0 - schedule), ("schedule", schedule),
                               ("commands", time.perf_counter() - t1)):
            timings[phase] = timings.get(phase, 0.0) + seconds
    return computation


def check_matrix_sizes(computation) -> None:
    """ComputeError when a matrix of ``computation`` holds more floats than the
    ``max_floats`` limit (pynnet3.limits): found before anything is allocated."""
    bound = limits.LIMITS.max_floats
    for k, m in enumerate(computation.matrices):
        if m.rows * m.cols > bound:  # (the message only when needed: this runs per compile)
            raise ComputeError(limits.exceeded(
                "max_floats", m.rows * m.cols,
                f"floats in matrix m{k} ({m.rows}x{m.cols}, node {m.node!r})"))


__all__ = ["ComputationRequest", "IoSpecification", "compile_computation", "request_for_frames"]
