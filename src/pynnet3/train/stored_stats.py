"""Component statistics a training step stores, routed as Kaldi's delta network does.

Kaldi's NnetComputer stores statistics (kStoreStats: nonlinearity value/derivative
sums and counts, self-repair counters, BatchNorm count and sums, truncation and
clipping counters) into the network being updated, i.e. the trainer's delta network.
UpdateNnetWithMaxChange then adds each non-updatable component of the delta to the
model times ``scale`` (``1 - momentum``, or the backstitch scale, times the global
max-param-change factor; nothing when the change was not finite), and the delta
keeps ``momentum`` times them (ScaleNnet). pynnet3's computer stores into the model
itself; :class:`StoredStats` moves each step's increment out of the model into a
delta of its own and adds it back with Kaldi's factor.

Invariant: outside a step, ``delta[name]`` holds what Kaldi's delta network holds
in that component's statistics (``Component::Scale`` / ``Add`` semantics, from
:mod:`pynnet3.train.average`).
"""

from __future__ import annotations

import copy

from ..components.batchnorm import BatchNormComponent
from ..components.fused import AffineReluComponent
from .average import _INT_STATS, _SUM_STATS, _stat_names, add_component, scale_component

_PART = "#relu"  # a fused kernel's ReLU part (components/fused.py) keeps its statistics


def _stores(c) -> bool:
    return isinstance(c, BatchNormComponent) or bool(_stat_names(c, _SUM_STATS)
                                                     or _stat_names(c, _INT_STATS))


def stats_components(nnet) -> list[tuple[str, object]]:
    """``(name, component)`` of the non-updatable components that store statistics
    (updatable ones: LstmNonlinearity's travel with its gradient in the trainer), and
    ``("<kernel>#relu", part)`` for the ReLU inside a fused kernel, whose statistics
    Kaldi's delta network would hold in that ReLU."""
    out = []
    for name, c in nnet.components.items():
        relu = c._relu() if isinstance(c, AffineReluComponent) else None
        if relu is not None and _stores(relu):
            out.append((name + _PART, relu))
        elif not c.is_updatable() and _stores(c):
            out.append((name, c))
    return out


def _component(nnet, name: str):
    """The component a :func:`stats_components` name stands for."""
    if name.endswith(_PART) and name not in nnet.components:
        return nnet.components[name[:-len(_PART)]]._relu()
    return nnet.components[name]


class StoredStats:
    """The statistics part of Kaldi's delta network (see the module doc)."""

    def __init__(self):
        self.delta: dict[str, object] = {}
        self._before: dict[str, object] = {}
        self._step: dict[str, object] = {}  # this step's increments, until commit()

    def before_pass(self, nnet, storing: bool) -> None:
        """Call before a forward/backward pass that stores stats when ``storing``."""
        self._before = ({name: copy.deepcopy(c) for name, c in stats_components(nnet)}
                        if storing else {})

    def after_pass(self, nnet) -> None:
        """Move what the pass stored out of the model (into the step's increments)."""
        for name, before in self._before.items():
            comp = _component(nnet, name)
            increment = copy.deepcopy(comp)
            add_component(increment, -1.0, before)
            comp.__dict__.update(before.__dict__)  # (the model as before the pass)
            if name in self._step:
                add_component(self._step[name], 1.0, increment)
            else:
                self._step[name] = increment
        self._before = {}

    def commit(self) -> None:
        """The step's passes all ran: their increments join the delta."""
        for name, increment in self._step.items():
            if name in self.delta:
                add_component(self.delta[name], 1.0, increment)
            else:
                self.delta[name] = increment
        self._step = {}

    def abort(self, nnet) -> None:
        """A pass failed: the model's stats as before it, the step's increments
        dropped (a failed step leaves no statistics behind)."""
        for name, before in self._before.items():
            _component(nnet, name).__dict__.update(before.__dict__)
        self._before, self._step = {}, {}

    def add_to(self, nnet, factor: float) -> None:
        """The update: the model's statistics += ``factor`` * the delta's."""
        for name, d in self.delta.items():
            add_component(_component(nnet, name), factor, d)

    def scale(self, momentum: float) -> None:
        """After the update: keep ``momentum`` times the delta (0 clears it)."""
        if momentum == 0.0:
            self.delta.clear()
            return
        for d in self.delta.values():
            scale_component(d, momentum)
