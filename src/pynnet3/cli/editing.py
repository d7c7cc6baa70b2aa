"""What ``copy`` and ``am-copy`` (nnet3-copy, nnet3-am-copy) do to a network on the
way: edit directives (``--edits-config``, ``--edits``), read and parsed before the
model so that a bad one fails before any work, applied with Kaldi's log lines; and
``--scale``; and the flags of these steps, which both commands share."""

from __future__ import annotations

import argparse
import sys


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


def apply_read_edits(nnet, edits: list, tool: str) -> None:
    """Apply ``edits`` (from :func:`read_edits`) in order, logging as Kaldi does."""
    if not edits:
        return
    from ..edits import apply_edits

    for level, message in apply_edits(nnet, edits):
        print(f"{level} (pynnet3 {tool}) {message}", file=sys.stderr)


def scale_network(nnet, scale: float) -> None:
    """Kaldi's ScaleNnet: every component's parameters and statistics times ``scale``."""
    if scale == 1.0:
        return
    from ..train.average import scale_component

    for comp in nnet.components.values():
        scale_component(comp, scale)
