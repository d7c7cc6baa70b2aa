"""pynnet3: a Python compiler, optimizer and runtime for Kaldi nnet3 networks."""

from __future__ import annotations

__version__ = "0.1.0"

from . import errors
from .compiler import ComputationRequest, IoSpecification, compile_computation
from .computation import NnetComputation
from .nnet import Nnet, read_nnet
from .optimize import OptimizeOptions
from .optimize import optimize as _optimize
from .runtime.computer import RunResult, run


def compile(nnet: Nnet, request: ComputationRequest,
            optimize: bool | OptimizeOptions = True) -> NnetComputation:
    """Compile ``request`` on ``nnet``; ``optimize`` is a bool or OptimizeOptions."""
    computation = compile_computation(nnet, request)
    if optimize is True:
        optimize = OptimizeOptions()
    if isinstance(optimize, OptimizeOptions) and optimize.optimize:
        computation = _optimize(computation, nnet, optimize)
    return computation


__all__ = ["ComputationRequest", "IoSpecification", "Nnet", "NnetComputation",
           "OptimizeOptions", "RunResult", "compile", "errors", "read_nnet", "run"]
