"""ComputationRequest: what a computation must do.

Which indexes of which inputs are supplied, which outputs are wanted (and with
which derivatives), whether model derivatives are wanted and whether component
statistics are stored. The JSON form is that of kaldi-reference ``request.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ComputeError
from ..index import as_indexes, check_range, describe


@dataclass
class IoSpecification:
    """One input or output: node name, its indexes (row order of the matrix) and
    whether its derivative is involved."""

    name: str
    indexes: np.ndarray
    has_deriv: bool = False

    def __post_init__(self):
        try:
            self.indexes = as_indexes(self.indexes)
            check_range(self.indexes)
        except (ValueError, TypeError) as e:
            raise ComputeError(f"IoSpecification {self.name!r}: {e}") from None

    def to_json(self) -> dict:
        return {"name": self.name, "has_deriv": self.has_deriv,
                "indexes": self.indexes.tolist()}

    @classmethod
    def from_json(cls, obj: dict) -> IoSpecification:
        try:
            return cls(obj["name"], as_indexes(obj.get("indexes", [])),
                       bool(obj.get("has_deriv", False)))
        except (KeyError, ValueError, TypeError) as e:
            raise ComputeError(f"bad IoSpecification {str(obj)[:80]}...: {e}") from None


@dataclass
class ComputationRequest:
    inputs: list[IoSpecification] = field(default_factory=list)
    outputs: list[IoSpecification] = field(default_factory=list)
    need_model_derivative: bool = False
    store_component_stats: bool = False

    @classmethod
    def from_json(cls, obj: dict) -> ComputationRequest:
        return cls([IoSpecification.from_json(o) for o in obj.get("inputs", [])],
                   [IoSpecification.from_json(o) for o in obj.get("outputs", [])],
                   bool(obj.get("need_model_derivative", False)),
                   bool(obj.get("store_component_stats", False)))

    def to_json(self) -> dict:
        return {"inputs": [i.to_json() for i in self.inputs],
                "outputs": [o.to_json() for o in self.outputs],
                "need_model_derivative": self.need_model_derivative,
                "store_component_stats": self.store_component_stats}

    def input(self, name: str) -> IoSpecification | None:
        return next((i for i in self.inputs if i.name == name), None)

    def output(self, name: str) -> IoSpecification | None:
        return next((o for o in self.outputs if o.name == name), None)

    def need_derivatives(self) -> bool:
        return self.need_model_derivative or any(i.has_deriv for i in self.inputs) or any(
            o.has_deriv for o in self.outputs)

    def __str__(self) -> str:
        lines = ["# Computation request:"]
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for k, s in enumerate(specs):
                lines.append(f"{kind}-{k}: name={s.name}, has-deriv={str(s.has_deriv).lower()}, "
                             f"indexes=[{describe(s.indexes, 8)}]")
        lines.append(f"need-model-derivative: {str(self.need_model_derivative).lower()}")
        lines.append(f"store-component-stats: {str(self.store_component_stats).lower()}")
        return "\n".join(lines)
