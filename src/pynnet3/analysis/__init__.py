"""Analysis of compiled computations (which commands touch which data) and the checker."""

from __future__ import annotations

from .accesses import AccessType, CommandAttributes, MatrixAccesses, VariableAccesses
from .analyzer import Analyzer
from .checker import check_computation
from .variables import ComputationVariables

__all__ = ["AccessType", "Analyzer", "CommandAttributes", "ComputationVariables",
           "MatrixAccesses", "VariableAccesses", "check_computation"]
