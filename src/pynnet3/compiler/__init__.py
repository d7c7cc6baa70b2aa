"""ComputationRequest -> NnetComputation: graph, schedule, commands."""

from __future__ import annotations

from .commands import compile_commands
from .graph import build_graph
from .request import ComputationRequest, IoSpecification


def compile_computation(nnet, request: ComputationRequest):
    """Compile ``request`` on ``nnet`` into an unoptimized NnetComputation."""
    from ..optimize.io_ops import consolidate_io_operations

    builder, graph = build_graph(nnet, request)
    computation = compile_commands(nnet, request, builder, graph)
    # as Kaldi's compiler: inputs accepted first, outputs provided last in each segment
    consolidate_io_operations(computation)
    return computation


__all__ = ["ComputationRequest", "IoSpecification", "compile_computation"]
