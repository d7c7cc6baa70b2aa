"""Training like Kaldi's nnet3-train: :class:`Trainer` and :class:`TrainerOptions`.

``Trainer(nnet, TrainerOptions.from_flags({"max-param-change": 2.0, ...}))``
updates a network in place one minibatch at a time with NnetTrainer's semantics:
objectives ``linear`` and ``quadratic`` per output node, natural gradient
(:class:`OnlineNaturalGradient`) for the component types that have it in Kaldi,
momentum, per-component max-change and global max-param-change, L2
regularization, BatchNorm stats scaling, backstitch, ConstrainOrthonormal, and
component stats. The forward and backward passes run on the NumPy backend, or on
torch (``Trainer(..., backend="torch", device=...)``). docs/training.md has more.

Not here: chain (LF-MMI) objectives (nnet3-chain-train) and the
``xent``/other objective types besides linear and quadratic.
"""

from .natural_gradient import OnlineNaturalGradient
from .objective import compute_objective
from .options import TrainerOptions
from .preconditioners import make_preconditioners
from .trainer import OutputObjective, Trainer, TrainStats

__all__ = ["OnlineNaturalGradient", "OutputObjective", "TrainStats", "Trainer",
           "TrainerOptions", "compute_objective", "make_preconditioners"]
