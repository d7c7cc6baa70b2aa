"""pynnet3: a Python compiler, optimizer and runtime for Kaldi nnet3 networks."""

from __future__ import annotations

__version__ = "0.1.0"

from . import errors, export, train  # (export imports torch only when used)
from .am import AcousticModel, read_am
from .analysis import check_computation
from .cache import CachingCompiler
from .compiler import ComputationRequest, IoSpecification, compile_computation
from .computation import NnetComputation
from .graphopt import NetworkOptions, NetworkReport, optimize_network
from .nnet import Nnet, read_nnet
from .optimize import OptimizeOptions, OptimizeReport
from .optimize import optimize as _optimize
from .runtime.computer import RunResult, run


def compile(nnet: Nnet, request: ComputationRequest,
            optimize: bool | OptimizeOptions = True, *,
            report: OptimizeReport | None = None, check: bool = False) -> NnetComputation:
    """Compile ``request`` on ``nnet``; ``optimize`` is a bool or OptimizeOptions.
    ``report`` (an OptimizeReport) is filled pass by pass; ``check`` runs the
    checker on the compiled computation and after every pass."""
    computation = compile_computation(nnet, request)
    if check:
        check_computation(computation, nnet, context="after compilation")
    if optimize is True:
        optimize = OptimizeOptions()
    if isinstance(optimize, OptimizeOptions):
        computation = _optimize(computation, nnet, optimize, report=report, check=check)
    return computation


def check(computation: NnetComputation, nnet: Nnet) -> None:
    """Raise :class:`pynnet3.errors.CheckError` unless ``computation`` is valid for
    ``nnet`` (indexes, command order, no read of undefined data, matrix lifetimes)."""
    check_computation(computation, nnet)


__all__ = ["AcousticModel", "CachingCompiler", "ComputationRequest", "IoSpecification",
           "NetworkOptions", "NetworkReport", "Nnet", "NnetComputation", "OptimizeOptions",
           "OptimizeReport", "RunResult", "check", "compile", "errors", "export",
           "optimize_network", "read_am", "read_nnet", "run", "train"]
