"""pynnet3: a Python compiler, optimizer and runtime for Kaldi nnet3 networks.

The public names are loaded on first use (PEP 562): ``import pynnet3`` costs only
this module, and a program that reads a model and decodes (``pynnet3 compute``)
never loads the export and training packages. Any submodule is also reachable as an
attribute (``pynnet3.graphopt``) without importing it first."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import errors

__version__ = "0.1.0"

# public name -> the module (relative to this package) that defines it
_LAZY = {
    "AcousticModel": ".am", "read_am": ".am",
    "check_computation": ".analysis",
    "CachingCompiler": ".cache",
    "ComputationRequest": ".compiler", "IoSpecification": ".compiler",
    "compile_computation": ".compiler",
    "NnetComputation": ".computation",
    "NetworkOptions": ".graphopt", "NetworkReport": ".graphopt",
    "optimize_network": ".graphopt",
    "Nnet": ".nnet", "read_nnet": ".nnet",
    "OptimizeOptions": ".optimize", "OptimizeReport": ".optimize",
    "RunResult": ".runtime.computer", "run": ".cache.running",
}

if TYPE_CHECKING:  # (for type checkers and IDEs; at run time __getattr__ loads them)
    from . import export, train
    from .am import AcousticModel, read_am
    from .cache import CachingCompiler
    from .cache.running import run
    from .compiler import ComputationRequest, IoSpecification
    from .computation import NnetComputation
    from .graphopt import NetworkOptions, NetworkReport, optimize_network
    from .nnet import Nnet, read_nnet
    from .optimize import OptimizeOptions, OptimizeReport
    from .runtime.computer import RunResult


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:  # a submodule (export, train, graphopt, ...): imported on first use
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(__all__))


def compile(nnet: Nnet, request: ComputationRequest,
            optimize: bool | OptimizeOptions = True, *,
            report: OptimizeReport | None = None, check: bool = False) -> NnetComputation:
    """Compile ``request`` on ``nnet``; ``optimize`` is a bool or OptimizeOptions.
    ``report`` (an OptimizeReport) is filled pass by pass; ``check`` runs the
    checker on the compiled computation and after every pass."""
    from .analysis import check_computation
    from .compiler import compile_computation
    from .optimize import OptimizeOptions
    from .optimize import optimize as _optimize

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
    from .analysis import check_computation

    check_computation(computation, nnet)


__all__ = ["AcousticModel", "CachingCompiler", "ComputationRequest", "IoSpecification",
           "NetworkOptions", "NetworkReport", "Nnet", "NnetComputation", "OptimizeOptions",
           "OptimizeReport", "RunResult", "check", "compile", "errors", "export",
           "optimize_network", "read_am", "read_nnet", "run", "train"]
