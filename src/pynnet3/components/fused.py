"""A runtime-only fused kernel: a linear layer, a ReLU and a positive per-column map.

:class:`AffineReluComponent` computes ``y = max(x W'^T + b', floor)``, which is
exactly ``ReLU(x W^T + b) * s + o`` for a per-column scale ``s > 0`` and offset
``o`` (a test-mode BatchNorm, a FixedScale, ...; ``s = 1, o = 0`` for a ReLU
alone) with ``W' = s W``, ``b' = s b + o`` and ``floor = o``: ``max(z, 0) * s + o
= max(z * s + o, o)`` when ``s > 0``. The product is written once and one pass
applies bias, ReLU and map together, where the three components take four or
more passes over the output. The network optimizer's ``fuse-affine-relu`` rules
(graphopt/fusion.py) build it; nothing reads it from a file.

It is not a Kaldi type: a network holding one is written in a standard form
(``unfused``), which Kaldi reads and which computes the same: the original
components and nodes while the parameters are as fused, else (after training)
the linear layer with bias ``b' - o``, the ReLU and a FixedBias ``o``
(``max(z, o) = ReLU(z - o) + o``). It trains as its linear layer does (the
scaled parameters, as any folded layer's): its settings (learning rate,
max-change, ...) are the linear layer's, read and written through it, and
its backprop passes the derivative through the ReLU mask ``y > floor``. In
training (stats stored, a model derivative) the ReLU's own work is kept: its
statistics go to the ReLU component of the written chain and its self-repair term
is added (seen through the map's scale: ``z' = s z + o``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from . import np_kernels
from .base import Component, Flags
from .xp import namespace


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
    already scaled; ``floor``: float32 [output-dim]; ``parts``: the chain it
    replaces, as it was."""

    type_name = "AffineReluComponent"
    _OWN = frozenset(("linear", "floor", "_zero_floor", "_parts", "_digest", "_trained",
                      "map_scale", "_settings", "_retuned"))

    def __init__(self, linear: Component, floor: np.ndarray, parts: list[UnfusedPart],
                 map_scale: np.ndarray | None = None):
        self.linear = linear
        self.floor = np.ascontiguousarray(floor, dtype=np.float32)
        # the map's per-column scale s (None: 1), to see the ReLU's own values and
        # derivatives in training (its statistics and self-repair)
        self.map_scale = None if map_scale is None or np.all(map_scale == 1) \
            else np.ascontiguousarray(map_scale, dtype=np.float64)
        self._parts = list(parts)
        self._digest = _params_digest(linear)
        self._settings = _scalar_settings(linear)
        self._retuned: tuple | None = None  # (settings changed, parts): as _trained
        # (digest, unfused parts) of the parameters last written after a change: the
        # same objects for every node using this component, so a file keeps one layer
        self._trained: tuple | None = None
        # max(y, 0) is a scalar bound: cheaper than a broadcast row of zeros
        self._zero_floor = not self.floor.any()

    # -- the linear layer's settings and hooks, read and written through it ---------------
    def __getattr__(self, name: str):
        linear = self.__dict__.get("linear")
        # (never the linear layer's own forward or backward hooks: a
        # propagate_overwrite / propagate_row_block / backprop_* of its would compute
        # the product without the ReLU; what this class runs, it defines)
        if linear is None or name.startswith(("__", "propagate", "backprop")):
            raise AttributeError(name)
        return getattr(linear, name)

    def __setattr__(self, name: str, value) -> None:
        linear = self.__dict__.get("linear")
        if name in self._OWN or linear is None or not hasattr(linear, name):
            object.__setattr__(self, name, value)
        else:
            setattr(linear, name, value)

    @property
    def input_dim(self) -> int:
        return self.linear.input_dim

    @property
    def output_dim(self) -> int:
        return self.linear.output_dim

    def properties(self) -> Flags:
        keep = (Flags.SIMPLE | Flags.UPDATABLE | Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS
                | Flags.BACKPROP_NEEDS_INPUT | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS)
        out = (self.linear.properties() & keep) | Flags.BACKPROP_NEEDS_OUTPUT
        return out | (self._relu().properties() & Flags.STORES_STATS)

    def info(self) -> str:
        parts = " + ".join(p.component.type_name for p in self._parts)
        return f"{super().info()}, fused=[{parts}]"

    def write(self, w) -> None:
        raise NotImplementedError(
            "AffineReluComponent is runtime-only: Nnet.write() saves its unfused form")

    @property
    def unfused(self) -> list[UnfusedPart]:
        """The standard chain a file holds for this component (module docstring)."""
        digest = _params_digest(self.linear)
        if digest == self._digest:
            return self._parts_with_settings()
        trained = self.__dict__.get("_trained")  # (None in copies pickled before it)
        if trained is not None and trained[0] == digest:
            return list(trained[1])
        lin = copy.copy(self.linear)
        lin.linear_params = self.linear.linear_params.copy()
        lin.bias_params = (self.linear.bias_params - self.floor).astype(np.float32)
        out = [UnfusedPart(self._parts[0].node, self._parts[0].component_name, lin),
               self._parts[1]]
        if not self._zero_floor:
            last = self._parts[-1]
            out.append(UnfusedPart(last.node, f"{last.component_name}.offset",
                                   _fixed_bias(self.floor)))
        self._trained = (digest, out)
        return list(out)

    def _parts_with_settings(self) -> list[UnfusedPart]:
        """The original chain, its linear layer with the settings (learning rate,
        max-change, ...) changed through the kernel since the fusion (e.g. by
        Nnet.set_learning_rate); the layer itself where it has them already (a layer
        the network also uses elsewhere got them there: it stays one layer)."""
        now = _scalar_settings(self.linear)
        before = self.__dict__.get("_settings")
        if before is None or now == before:
            return list(self._parts)
        first = self._parts[0]
        held = vars(first.component)
        stale = {name: value for name, value in now.items()
                 if before.get(name, _MISSING) != value and name in held
                 and held[name] != value}
        if not stale:
            return list(self._parts)
        key = tuple(sorted(stale.items()))
        retuned = self.__dict__.get("_retuned")
        if retuned is not None and retuned[0] == key:
            return list(retuned[1])
        comp = copy.copy(first.component)
        for name, value in stale.items():
            setattr(comp, name, value)
        out = [UnfusedPart(first.node, first.component_name, comp), *self._parts[1:]]
        self._retuned = (key, out)
        return list(out)

    # -- parameters: the linear layer's ------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        return self.linear.params()

    def export_gradient(self, grad: dict) -> dict:
        return self.linear.export_gradient(grad)

    def set_test_mode(self, test_mode: bool) -> None:
        self.linear.set_test_mode(test_mode)

    # -- indexes: the linear layer's ------------------------------------------------------
    def input_indexes(self, output_indexes):
        return self.linear.input_indexes(output_indexes)

    def precompute_indexes(self, input_indexes, output_indexes, need_backprop: bool):
        return self.linear.precompute_indexes(input_indexes, output_indexes, need_backprop)

    # -- math -------------------------------------------------------------------------------
    def _apply_floor(self, out_value) -> None:
        xp = namespace(out_value)
        if self._zero_floor and xp.is_numpy:
            np_kernels.relu(out_value, out_value)  # (np.maximum's floats, faster)
        elif self._zero_floor:
            xp.maximum(out_value, 0.0, out=out_value)
        else:
            xp.maximum(out_value, xp.param(self.floor, like=out_value), out=out_value)

    def _masked(self, out_value, out_deriv):
        xp = namespace(out_deriv)
        floor = 0.0 if self._zero_floor else xp.param(self.floor, like=out_deriv)
        return out_deriv * xp.astype(out_value > floor, out_deriv.dtype)

    # -- the ReLU's training behaviour: statistics and self-repair ---------------------------
    def _relu(self) -> Component:
        return self._parts[1].component

    def _scale_like(self, like):
        return namespace(like).param(self.map_scale, like=like)

    def _relu_output(self, out_value):
        """The ReLU's output ``max(z, 0) = (y - o) / s`` of the fused output ``y``."""
        if self.map_scale is None and self._zero_floor:
            return out_value
        xp = namespace(out_value)
        r = out_value if self._zero_floor else out_value - xp.param(self.floor, like=out_value)
        if self.map_scale is not None:
            r = r / self._scale_like(out_value)
        return xp.maximum(r, 0.0)  # (rounding: y = o gives exactly 0 only up to it)

    def store_stats(self, in_value, out_value, memo) -> None:
        """The ReLU's statistics (value and derivative sums, count), into the ReLU
        component of the chain the file holds, as the unfused network stores them."""
        self._relu().store_stats(None, self._relu_output(out_value), None)

    def zero_stats(self) -> None:
        self._relu().zero_stats()
        self.linear.zero_stats()

    def _training_deriv(self, out_value, out_deriv, masked):
        """The derivative for the linear layer in a training backprop: the ReLU's
        self-repair term and backprop statistics, as the unfused ReLU adds and stores
        them (its derivatives are ``s`` times the fused ones: ``z' = s z + o``)."""
        relu = self._relu()
        if self.map_scale is None:
            relu._repair(out_value, masked)
            relu.store_backprop_stats(out_deriv)
            return masked
        s = self._scale_like(out_deriv)
        dz = masked * s
        relu._repair(out_value, dz)
        relu.store_backprop_stats(out_deriv * s)
        return dz / s

    def propagate(self, indexes, in_value, out_value):
        self.linear.propagate(indexes, in_value, out_value)
        self._apply_floor(out_value)
        return None

    def propagate_row_block(self, in_value, block: tuple[int, int], src, table,
                            alpha: float, out_value, add_rows) -> bool:
        """:meth:`propagate` with a repeated-row input block (forward only; see
        AffineComponent.propagate_row_block); False where the linear layer has no
        such product."""
        fn = getattr(self.linear, "propagate_row_block", None)
        if fn is None or not fn(in_value, block, src, table, alpha, out_value, add_rows):
            return False
        self._apply_floor(out_value)
        return True

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if in_deriv is None and grad is None:
            return
        d = self._masked(out_value, out_deriv)
        if grad is not None:  # (Kaldi's to_update != NULL: a training backprop)
            d = self._training_deriv(out_value, out_deriv, d)
        self.linear.backprop(indexes, in_value, None, d, None, grad, in_deriv)


_MISSING = object()

try:  # (the builtin module: hashlib would load OpenSSL, a few ms of every start)
    from _blake2 import blake2b as _blake2b
except ImportError:  # (an interpreter built without it)
    from hashlib import blake2b as _blake2b


def _scalar_settings(comp: Component) -> dict:
    """A component's plain settings (numbers, flags, strings: no parameters)."""
    return {k: v for k, v in vars(comp).items() if isinstance(v, (bool, int, float, str))}


def _params_digest(comp: Component) -> bytes:
    h = _blake2b(digest_size=16)
    for name, value in sorted(comp.params().items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(value).tobytes())
    return h.digest()


def _fixed_bias(bias: np.ndarray) -> Component:
    from .scale_offset import FixedBiasComponent  # (a sibling family module)

    return FixedBiasComponent(bias)


def propagate_blocks(self, indexes, blocks: list, out_value):
    self.linear.propagate_blocks(indexes, blocks, out_value)
    self._apply_floor(out_value)
    return None


def backprop_blocks(self, indexes, blocks: list, out_value, out_deriv, memo, grad,
                    in_deriv) -> None:
    if in_deriv is None and grad is None:
        return
    d = self._masked(out_value, out_deriv)
    if grad is not None:
        d = self._training_deriv(out_value, out_deriv, d)
    self.linear.backprop_blocks(indexes, blocks, None, d, None, grad, in_deriv)


class BlockAffineReluComponent(AffineReluComponent):
    """An :class:`AffineReluComponent` whose linear part reads its input as column
    blocks without a spliced copy (the affine family's ``propagate_blocks``)."""

    propagate_blocks = propagate_blocks
    backprop_blocks = backprop_blocks

    @property
    def deriv_blocks(self) -> bool:
        """The input derivative goes to the linear part's backprop unchanged."""
        return bool(getattr(self.linear, "deriv_blocks", False))


def fused_affine_relu(linear: Component, floor: np.ndarray, parts: list[UnfusedPart],
                      map_scale: np.ndarray | None = None) -> AffineReluComponent:
    """The fused component for ``linear`` (with block input when it has it)."""
    cls = BlockAffineReluComponent if hasattr(linear, "propagate_blocks") \
        else AffineReluComponent
    return cls(linear, floor, parts, map_scale)


def linear_part(comp: Component) -> Component:
    """The standard component whose indexes, frame-locality and natural-gradient
    preconditioners ``comp`` has: a fused kernel's linear layer, else ``comp``."""
    return comp.linear if isinstance(comp, AffineReluComponent) else comp
