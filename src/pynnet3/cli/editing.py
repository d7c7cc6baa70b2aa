"""What ``copy`` and ``am-copy`` (nnet3-copy, nnet3-am-copy) do to a network on the
way (:class:`Editing`): ``--nnet-config``, ``--learning-rate``, edit directives
(``--edits-config``, ``--edits``; read and parsed before the model so that a bad one
fails before any work, applied with Kaldi's log lines) and ``--scale``; and the
flags of these steps, which both commands share."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .kaldi_options import kaldi_log

if TYPE_CHECKING:
    from ..nnet import Nnet


def finite_float(text: str) -> float:
    """A flag's number: finite (nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_editing_flags(s: argparse.ArgumentParser) -> None:
    """--nnet-config, --learning-rate, --edits-config, --edits and --scale (the
    command applies them in its Kaldi program's order)."""
    s.add_argument("--nnet-config", dest="nnet_config", default="", metavar="CONFIG",
                   help="config file (as for init) whose lines add or replace components "
                        "and nodes of the network (default: none)")
    s.add_argument("--learning-rate", dest="learning_rate", type=finite_float, default=None,
                   metavar="LR",
                   help="if >= 0, set the learning rate of every updatable component to LR "
                        "(times its learning-rate-factor) (default: unchanged)")
    s.add_argument("--edits-config", dest="edits_config", default="", metavar="FILE",
                   help="file of edit directives (listed in pynnet3 copy --help), applied "
                        "in order after --nnet-config (default: none)")
    s.add_argument("--edits", default="", metavar="'DIRECTIVE; ...'",
                   help="edit directives on the command line, separated by ';', applied "
                        "after --edits-config, e.g. --edits=remove-orphans (default: none)")
    s.add_argument("--scale", type=finite_float, default=1.0, metavar="S",
                   help="scale the parameters (and statistics) of every component by S "
                        "(default: 1.0)")


class Editing:
    """The steps of the editing flags (:func:`add_editing_flags`) for a copy command
    (``tool``: copy, am-copy). Made before the model is read: the ``--nnet-config``
    file and the edit directives are read (and parsed) then, so that a bad one fails
    before any work; the command applies each step where its Kaldi program's order
    has it."""

    def __init__(self, args: argparse.Namespace, tool: str):
        from .files import read_config

        self.tool = tool
        self.edits = read_edits(args)
        self.nnet_config = read_config(args.nnet_config) if args.nnet_config else None
        self.learning_rate, self.scale = args.learning_rate, args.scale

    def add_nnet_config(self, nnet: Nnet) -> None:
        """``--nnet-config``: the config's lines add or replace nodes and components
        of ``nnet``."""
        if self.nnet_config is not None:
            text, name = self.nnet_config
            nnet.read_config(text, source=name)

    def set_learning_rate(self, nnet: Nnet) -> None:
        """``--learning-rate``: when given and >= 0, every updatable component's
        learning rate (times its learning-rate-factor)."""
        if self.learning_rate is not None and self.learning_rate >= 0:
            nnet.set_learning_rate(self.learning_rate)

    def apply_edits(self, nnet: Nnet) -> None:
        """``--edits-config`` then ``--edits``, applied in order, logged as Kaldi
        does."""
        if not self.edits:
            return
        from ..edits import apply_edits

        for level, message in apply_edits(nnet, self.edits):
            kaldi_log(self.tool, level, message)

    def scale_network(self, nnet: Nnet) -> None:
        """``--scale`` (:func:`scale_network`)."""
        scale_network(nnet, self.scale)


def read_edits(args) -> list:
    """The directives of ``--edits-config`` then ``--edits``, parsed (none: [])."""
    from ..edits import edits_from_option, parse_edits
    from .files import read_config

    edits = []
    if args.edits_config:
        edits += parse_edits(*read_config(args.edits_config))
    if args.edits:
        edits += parse_edits(edits_from_option(args.edits), "--edits")
    return edits


def scale_network(nnet, scale: float) -> None:
    """Kaldi's ScaleNnet: every component's parameters and statistics times ``scale``."""
    if scale == 1.0:
        return
    from ..train.average import scale_component

    for comp in nnet.components.values():
        scale_component(comp, scale)
