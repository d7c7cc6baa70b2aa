"""Component statistics a training step stores: straight into the model, as Kaldi's.

NnetTrainer builds its NnetComputer as ``NnetComputer(opts, computation, nnet_,
delta_nnet_)``: the constructor that takes the model by pointer, which stores
statistics (kStoreStats in the forward pass, and what the non-updatable
components' Backprop stores: ReLU output-derivative sums, self-repair counters)
into ``nnet_`` itself, not into the delta network (nnet-compute.h: "this version
will, for storing statistics, use 'nnet' instead of 'nnet_to_update'";
nnet-training.cc TrainInternal says the same). So a step's statistics reach the
model in full, whatever the momentum or the max-change factors, the backward
pass's self-repair already sees this minibatch's forward statistics, and
ScaleBatchnormStats then scales them with the rest. (Only updatable components'
Backprop statistics, LstmNonlinearity's, go to the delta: the trainer's
``delta_stats``.)

pynnet3's computer stores into the model as well; :class:`StoredStats` only
keeps a step that fails midway (e.g. supervision of the wrong shape, after the
forward stored its statistics) from leaving anything behind: the model's
statistics as before the pass are put back.
"""

from __future__ import annotations

import copy

from ..components.batchnorm import BatchNormComponent
from ..components.fused import AffineReluComponent
from .average import _INT_STATS, _SUM_STATS, _stat_names

_PART = "#relu"  # a fused kernel's ReLU part (components/fused.py) keeps its statistics


def _stores(c) -> bool:
    return isinstance(c, BatchNormComponent) or bool(_stat_names(c, _SUM_STATS)
                                                     or _stat_names(c, _INT_STATS))


def stats_components(nnet) -> list[tuple[str, object]]:
    """``(name, component)`` of the non-updatable components that store statistics
    (updatable ones: LstmNonlinearity's travel with its gradient in the trainer), and
    ``("<kernel>#relu", part)`` for the ReLU inside a fused kernel."""
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
    """Puts the model's statistics back when a training pass fails (see the module
    doc); a pass that completes leaves what it stored in the model."""

    def __init__(self):
        self._before: dict[str, object] = {}

    def before_pass(self, nnet, storing: bool) -> None:
        """Call before a pass whose forward stores statistics when ``storing``:
        remember the model's. (Without ``storing`` a pass that fails, i.e. fails
        before its backward, has stored nothing.)"""
        self._before = ({name: copy.deepcopy(c) for name, c in stats_components(nnet)}
                        if storing else {})

    def commit(self) -> None:
        """The pass ran: what it stored stays in the model."""
        self._before = {}

    def abort(self, nnet) -> None:
        """The pass failed: the model's statistics as before it."""
        for name, before in self._before.items():
            _component(nnet, name).__dict__.update(before.__dict__)
        self._before = {}
