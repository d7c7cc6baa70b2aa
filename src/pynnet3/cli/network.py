"""Command-line pieces for the network optimizer: ``pynnet3 optimize-network``, the
``--prepare-for-test`` of ``pynnet3 copy`` (Kaldi's nnet3-copy: test modes, then
the network optimizer) and ``show-computation --network-optimize``.

Each :class:`~pynnet3.NetworkOptions` field is a flag spelled as Kaldi spells
flags (``--constant-folding=false``, ``--keep-derivatives=true``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import TYPE_CHECKING

from ..graphopt import NetworkOptions, NetworkReport, optimize_network
from .kaldi_options import bool_option

if TYPE_CHECKING:
    from ..nnet import Nnet

_HELP = {
    "pruning": "remove identity components, full-width dim ranges and orphans",
    "shatter": "split composite components so their parts can fold",
    "constant_folding": "fold fixed per-element maps and affine chains into linear layers "
                        "(Kaldi's CollapseModel and more)",
    "arithmetic": "merge Sum terms; move descriptor Scale() into the weights",
    "parameter_fusion": "compute affine layers that read the same input as one GEMM",
    "fusion": "apply the fuse rule registry",
    "layout": "store linear layers' weights column-major (faster products of few rows)",
    "memory": "training: recompute cheap forward values during backprop where that "
              "lowers the peak memory (a command-level pass)",
    "keep_derivatives": "keep input derivatives exact too (not only outputs)",
    "max_iterations": "cap on repetitions of the whole pass sequence",
    "max_rule_steps": "cap on match-and-rewrite steps of one rule pass",
    "enable_rules": "comma-separated rules to run that are off by default "
                    "(split-recurrent-affine)",
    "disable_rules": "comma-separated rules not to run",
}


def add_network_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--<pass>=true|false`` (or ``--max-...=INT``) flag per NetworkOptions field."""
    g = parser.add_argument_group("network optimizer options (pynnet3.NetworkOptions)")
    for f in fields(NetworkOptions):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if isinstance(default, tuple):
            g.add_argument(flag, dest="net_" + f.name, type=_names, default=None,
                           metavar="RULE[,RULE...]",
                           help=f"{_HELP.get(f.name, f.name)} (default: none)")
        elif isinstance(default, bool):
            bool_option(g, flag, None,
                        f"{_HELP.get(f.name, f.name)} (default: {str(default).lower()})",
                        dest="net_" + f.name)
        else:
            g.add_argument(flag, dest="net_" + f.name, type=int, default=None, metavar="INT",
                           help=f"{_HELP.get(f.name, f.name)} (default: {default})")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def network_options_from_args(args) -> NetworkOptions:
    """The NetworkOptions of the network optimizer flags given (the others keep their
    defaults)."""
    changes = {f.name: getattr(args, "net_" + f.name) for f in fields(NetworkOptions)
               if getattr(args, "net_" + f.name, None) is not None}
    return NetworkOptions(**changes)


def prepare_for_test(nnet, options: NetworkOptions | None = None,
                     report: NetworkReport | None = None):
    """Kaldi's ``nnet3-copy --prepare-for-test``: BatchNorm and dropout in test mode,
    then the network optimizer (which covers Kaldi's CollapseModel). The result is
    a model Kaldi can read."""
    nnet = nnet.copy()
    nnet.set_test_mode(True)
    return optimize_network(nnet, options, report=report)


def add_prepare_for_test_flags(s: argparse.ArgumentParser) -> None:
    """``--prepare-for-test`` (of copy and am-copy: :func:`prepared_for_test`) and the
    network optimizer's flags it runs with."""
    bool_option(s, "--prepare-for-test", False,
                "as Kaldi's --prepare-for-test: BatchNorm and dropout in test mode, then the "
                "network optimizer in place of CollapseModel (folds BatchNorm, dropout, fixed "
                "scales into affine layers; the result is a model Kaldi reads) (default: false)")
    add_network_flags(s)


def prepared_for_test(nnet: Nnet, args: argparse.Namespace) -> Nnet:
    """``nnet`` prepared for test (:func:`prepare_for_test` with the command's network
    optimizer flags) when ``--prepare-for-test`` was given, else ``nnet``."""
    if not args.prepare_for_test:
        return nnet
    return prepare_for_test(nnet, network_options_from_args(args))


_SET_TEST_MODE_HELP = ("switch BatchNorm and dropout to test mode first (true; lets the "
                       "optimizer fold them) or training mode (false) (default: leave them as "
                       "they are)")


def add_set_test_mode_flag(s: argparse.ArgumentParser, help: str = _SET_TEST_MODE_HELP
                           ) -> None:
    """``--set-test-mode`` (:func:`apply_set_test_mode`); ``help`` says when the command
    applies it."""
    bool_option(s, "--set-test-mode", None, help)


def apply_set_test_mode(nnet: Nnet, args: argparse.Namespace) -> None:
    """``--set-test-mode``: BatchNorm and dropout of ``nnet`` switched to test (true)
    or training (false) mode; left as they are without the flag."""
    if args.set_test_mode is not None:
        nnet.set_test_mode(args.set_test_mode)


def cmd_optimize_network(args) -> int:
    from .files import read_model, write_model

    nnet = read_model(args.input)  # ('-': stdin)
    apply_set_test_mode(nnet, args)
    report = NetworkReport()
    preserve = tuple(p for p in (args.preserve or "").split(",") if p)
    out = optimize_network(nnet, network_options_from_args(args), preserve=preserve,
                           report=report)
    write_model(out, args.output, args.binary)  # ('-': stdout)
    if args.report:
        sys.stderr.write(str(report) + "\n")
    return 0
