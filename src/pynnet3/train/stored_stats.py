"""Component statistics a training step stores: straight into the model, as Kaldi's.

Kaldi's NnetTrainer::TrainInternal makes its NnetComputer with the model as a
*pointer* (``NnetComputer(opts, computation, nnet_, delta_nnet_)``), the constructor
that stores statistics in ``nnet`` instead of ``nnet_to_update`` (nnet-compute.h).
So the forward's StoreStats (nonlinearity value/derivative sums and counts,
BatchNorm count and sums) and the backprop statistics of non-updatable components
(their ``to_update`` is ``nnet_to_store_stats_``, nnet-compute.cc: self-repair
counters, output-derivative sums, BackpropTruncation's clipped/zeroed counts) go
into the model at weight one, when they are computed: a backward's self-repair
sees its own forward's statistics, and momentum, max-change and the backstitch
scales never touch them (the delta network's copies of these components hold zero
statistics from ``ScaleNnet(0.0)``, so AddNnetComponents adds nothing to them).
Kaldi's own runs show it: ``kaldi-reference/train-cli/xvector`` (momentum 0.5)
ends with ``<OderivCount>`` 24 on its log-softmax, three stored minibatches of 8
rows at full weight. Only an updatable component's backprop statistics go to the
delta (LstmNonlinearity's: ``Trainer.delta_stats``).

pynnet3's computer stores into the model as well; what is left here is a step that
fails part way (Kaldi dies then): :class:`StoredStats` puts the statistics the
failed pass had stored back as they were, so a failed call changes nothing.
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
    in a pass (an updatable one's change only with the update), and
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
    """Undo for the statistics a forward/backward pass stores (see the module doc)."""

    def __init__(self):
        self._before: dict[str, object] = {}

    def begin(self, nnet) -> None:
        """Call before a forward/backward pass: remember the model's statistics."""
        self._before = {name: copy.deepcopy(c) for name, c in stats_components(nnet)}

    def commit(self) -> None:
        """The pass ran: what it stored stays in the model."""
        self._before = {}

    def abort(self, nnet) -> None:
        """The pass failed: the model's statistics as before it."""
        for name, before in self._before.items():
            _component(nnet, name).__dict__.update(before.__dict__)
        self._before = {}
