"""A runtime-only fused kernel: a linear layer, a ReLU and a positive per-column map.

:class:`AffineReluComponent` computes ``y = max(x W'^T + b', floor)``, which is
exactly ``ReLU(x W^T + b) * s + o`` for a per-column scale ``s > 0`` and offset
``o`` (a test-mode BatchNorm, a FixedScale, ...; ``s = 1, o = 0`` for a ReLU
alone) with ``W' = s W``, ``b' = s b + o`` and ``floor = o``: ``max(z, 0) * s + o
= max(z * s + o, o)`` when ``s > 0``. The product is written once and one pass
applies bias, ReLU and map together, where the three components take four or
more passes over the output. The network optimizer's ``fuse-affine-relu`` rules
(graphopt/fusion.py) build it; nothing reads it from a file.

It is not a Kaldi type: a network holding one is written in its unfused form,
the original components and nodes (``unfused``), which Kaldi reads and which
compute the same. It is not updatable (the network optimizer re-expresses
parameters: an optimized network is for inference); its backprop gives input
derivatives (``dx`` of the ReLU mask ``y > floor``), so a network optimized with
``keep_derivatives`` keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Component, Flags
from .xp import namespace

# Optional compiler / cache hooks a fused layer has exactly when its linear part does.
_DELEGATED = ("reorder_indexes", "output_time_bounds", "input_indexes_within",
              "stretch_precomputed")


@dataclass
class UnfusedPart:
    """One component of a fused chain as it was: its node and component names and
    the component itself, first (the linear layer) to last (the fused node)."""

    node: str
    component_name: str
    component: Component


class AffineReluComponent(Component):
    """``max(linear(x), floor)`` (see module docstring). ``linear``: an Affine,
    NaturalGradientAffine, FixedAffine or Tdnn component with a bias, its weights
    already scaled; ``floor``: float32 [output-dim]; ``unfused``: the chain it
    replaces, which is what files hold."""

    type_name = "AffineReluComponent"

    def __init__(self, linear: Component, floor: np.ndarray, unfused: list[UnfusedPart]):
        self.linear = linear
        self.floor = np.ascontiguousarray(floor, dtype=np.float32)
        self.unfused = list(unfused)
        # max(y, 0) is a scalar bound: cheaper than a broadcast row of zeros
        self._zero_floor = not self.floor.any()

    @property
    def input_dim(self) -> int:
        return self.linear.input_dim

    @property
    def output_dim(self) -> int:
        return self.linear.output_dim

    def properties(self) -> Flags:
        keep = (Flags.SIMPLE | Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS
                | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS)
        return (self.linear.properties() & keep) | Flags.BACKPROP_NEEDS_OUTPUT

    def info(self) -> str:
        parts = " + ".join(p.component.type_name for p in self.unfused)
        return f"{super().info()}, fused=[{parts}]"

    def write(self, w) -> None:
        raise NotImplementedError(
            "AffineReluComponent is runtime-only: Nnet.write() saves its unfused form")

    def __getattr__(self, name: str):
        linear = self.__dict__.get("linear")
        if linear is None or name not in _DELEGATED:
            raise AttributeError(name)
        return getattr(linear, name)

    # -- indexes: the linear layer's ------------------------------------------------------
    def input_indexes(self, output_indexes):
        return self.linear.input_indexes(output_indexes)

    def precompute_indexes(self, input_indexes, output_indexes, need_backprop: bool):
        return self.linear.precompute_indexes(input_indexes, output_indexes, need_backprop)

    # -- math -------------------------------------------------------------------------------
    def _apply_floor(self, out_value) -> None:
        xp = namespace(out_value)
        if self._zero_floor:
            xp.maximum(out_value, 0.0, out=out_value)
        else:
            xp.maximum(out_value, xp.param(self.floor, like=out_value), out=out_value)

    def propagate(self, indexes, in_value, out_value):
        self.linear.propagate(indexes, in_value, out_value)
        self._apply_floor(out_value)
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is None:
            return
        xp = namespace(out_deriv)
        floor = 0.0 if self._zero_floor else xp.param(self.floor, like=out_deriv)
        dz = out_deriv * xp.astype(out_value > floor, out_deriv.dtype)
        self.linear.backprop(indexes, in_value, None, dz, None, None, in_deriv)


def propagate_blocks(self, indexes, blocks: list, out_value):
    self.linear.propagate_blocks(indexes, blocks, out_value)
    self._apply_floor(out_value)
    return None


def backprop_blocks(self, indexes, blocks: list, out_value, out_deriv, memo, grad,
                    in_deriv) -> None:
    self.backprop(indexes, None, out_value, out_deriv, memo, grad, in_deriv)


class BlockAffineReluComponent(AffineReluComponent):
    """An :class:`AffineReluComponent` whose linear part reads its input as column
    blocks without a spliced copy (the affine family's ``propagate_blocks``)."""

    propagate_blocks = propagate_blocks
    backprop_blocks = backprop_blocks


def fused_affine_relu(linear: Component, floor: np.ndarray,
                      unfused: list[UnfusedPart]) -> AffineReluComponent:
    """The fused component for ``linear`` (with block input when it has it)."""
    cls = BlockAffineReluComponent if hasattr(linear, "propagate_blocks") \
        else AffineReluComponent
    return cls(linear, floor, unfused)
