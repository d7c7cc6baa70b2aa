"""ComputationRequest -> NnetComputation: graph, schedule, commands."""

from __future__ import annotations

from .commands import compile_commands
from .graph import build_graph
from .request import ComputationRequest, IoSpecification


def compile_computation(nnet, request: ComputationRequest):
    """Compile ``request`` on ``nnet`` into an unoptimized NnetComputation."""
    builder, graph = build_graph(nnet, request)
    return compile_commands(nnet, request, builder, graph)


__all__ = ["ComputationRequest", "IoSpecification", "compile_computation"]
