"""Kaldi's command-line conventions (util/parse-options.cc) for the commands that
stand in for Kaldi programs (info, init, copy, am-info, am-copy, compute,
xvector-compute, merge-egs, train, average), on top of argparse.

Kaldi's ParseOptions, unlike argparse: reads ``--config=FILE`` (lines ``--x=y``,
``#`` comments; the command line overrides them), normalizes option names
(``--max_param_change`` is ``--max-param-change``; case is ignored), takes a bare
boolean option as true (``--binary`` is ``--binary=true``) and registers the
standard options ``--config``, ``--print-args`` and ``--verbose`` in every program.
:func:`kaldi_argv` rewrites such a command line into one argparse reads the same
way; :func:`add_standard_options` adds the standard options. A boolean option's
values are read by :func:`kaldi_bool`; :func:`bool_option` declares one. Also the
option families several commands register (``--binary``, ``--optimization.*``,
CUDA-device and debug options) and the log line of Kaldi's programs
(:func:`kaldi_log`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cache import CachingCompiler
    from ..nnet import Nnet
    from ..optimize import OptimizeOptions

# Commands whose command lines follow Kaldi's conventions (main() applies kaldi_argv):
# each stands in for a Kaldi program (nnet3-info, nnet3-init, ...) and accepts every
# option that program registers.
KALDI_STYLE_COMMANDS = ("info", "init", "copy", "am-info", "am-copy", "compute",
                        "xvector-compute", "train", "merge-egs", "average")


class KaldiOptionError(Exception):
    """A bad --config file (argparse's usage errors are reported the same way)."""


def kaldi_bool(text: str) -> bool:
    """A boolean option's value: true/t/1/yes or false/f/0/no, any case."""
    low = text.lower()
    if low in ("true", "t", "1", "yes"):
        return True
    if low in ("false", "f", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def bool_option(g, flag: str, default: bool | None, help: str, dest: str | None = None
                ) -> None:
    """Declare the boolean option ``flag`` (``--flag=true|false``, read by
    :func:`kaldi_bool`; :func:`kaldi_argv` makes a bare ``--flag`` true) on the parser
    or argument group ``g``. ``dest`` defaults to the flag's name with ``_`` for
    ``-`` and ``.``."""
    g.add_argument(flag, dest=dest or flag[2:].replace("-", "_").replace(".", "_"),
                   type=kaldi_bool, default=default, metavar="true|false", help=help)


def kaldi_log(tool: str, level: str, message: str) -> None:
    """One line on stderr as Kaldi's programs log: ``LEVEL (pynnet3 TOOL) message``
    (LEVEL: LOG, WARNING, ERROR, VLOG[n])."""
    print(f"{level} (pynnet3 {tool}) {message}", file=sys.stderr)


def add_binary_option(s: argparse.ArgumentParser) -> None:
    """``--binary`` of the commands that write a model (as Kaldi's programs that write
    one: binary by default)."""
    bool_option(s, "--binary", True,
                "write the model in Kaldi's binary (true) or text (false) format (default: true)")


def add_standard_options(s: argparse.ArgumentParser, verbose: bool = True) -> None:
    """Kaldi's standard options: ``--config`` (expanded by :func:`kaldi_argv`; here
    only for --help), ``--print-args`` (accepted: pynnet3 does not echo its command
    line), ``--verbose`` (unless the command has its own)."""
    g = s.add_argument_group("standard options (as every Kaldi program has)")
    g.add_argument("--config", dest="kaldi_config", action="append", default=None,
                   metavar="FILE",
                   help="read options from FILE, one '--x=y' per line ('#' starts a "
                        "comment); options on the command line override them")
    bool_option(g, "--print-args", True,
                "accepted for Kaldi compatibility (pynnet3 does not print its command line)")
    if verbose:
        g.add_argument("--verbose", type=int, default=0, metavar="INT",
                       help="verbose level (accepted; this command logs the same at any "
                            "level) (default: 0)")


def add_cuda_device_options(s: argparse.ArgumentParser) -> None:
    """CuDevice::RegisterDeviceOptions (registered by a Kaldi program built with CUDA):
    accepted; pynnet3's GPU computes in float32 whatever they say."""
    g = s.add_argument_group("CUDA device options (Kaldi's, in a build with CUDA; accepted "
                             "and not used: pynnet3's GPU always computes in float32)")
    bool_option(g, "--cuda-use-tensor-cores", False,
                "Kaldi: FP16 tensor math (accepted; not used) (default: false)")
    bool_option(g, "--cuda-use-tf32-compute", False,
                "Kaldi: TF32 tensor math (accepted; not used) (default: false)")


def add_debug_options(g) -> None:
    """NnetSimpleComputationOptions' --debug-computation and NnetComputeOptions'
    --computation.debug, on the group (or parser) ``g``: accepted, no effect."""
    bool_option(g, "--debug-computation", False,
                "Kaldi: very verbose debug output of the computation (accepted; pynnet3 prints "
                "none, results are the same) (default: false)")
    bool_option(g, "--computation.debug", False,
                "Kaldi's NnetComputeOptions debug (accepted; pynnet3 prints no per-command debug "
                "output, results are the same) (default: false)")


def add_optimize_flags(s: argparse.ArgumentParser) -> None:
    """Kaldi's ``--optimization.<option>`` flags, one per OptimizeOptions field, each
    with its help line and default."""
    from dataclasses import fields

    from ..optimize import OptimizeOptions

    g = s.add_argument_group(
        "optimization options (Kaldi's NnetOptimizeOptions; each overrides one default)")
    defaults = OptimizeOptions()
    for f in fields(OptimizeOptions):
        flag = "--optimization." + f.name.replace("_", "-")
        default = _flag_value(getattr(defaults, f.name))
        text = f"{OptimizeOptions.help(f.name)} (default: {default})"
        if f.type in ("bool", bool):
            bool_option(g, flag, None, text, dest="opt_" + f.name)
        else:
            g.add_argument(flag, dest="opt_" + f.name, type=int, default=None, metavar="INT",
                           help=text)


def _flag_value(value) -> str:
    """A default as the command line spells it."""
    if value is None:
        return "unset"
    return str(value).lower() if isinstance(value, bool) else str(value)


def optimize_options_from_args(args: argparse.Namespace) -> OptimizeOptions:
    """The OptimizeOptions of the ``--optimization.*`` flags given (the others keep
    their defaults)."""
    from dataclasses import fields

    from ..optimize import OptimizeOptions

    given = {f.name: getattr(args, "opt_" + f.name) for f in fields(OptimizeOptions)
             if getattr(args, "opt_" + f.name, None) is not None}
    # Kaldi's defaults of the deriv-time options are the int32 extremes, meaning "no
    # limit": given (a Kaldi config file may spell them out), they are unset here too
    for name, unset in (("min_deriv_time", -2**31), ("max_deriv_time", 2**31 - 1),
                        ("max_deriv_time_relative", 2**31 - 1)):
        if given.get(name) == unset:
            del given[name]
    return OptimizeOptions(**given)


def caching_compiler_from_args(nnet: Nnet, args: argparse.Namespace) -> CachingCompiler:
    """The run's CachingCompiler for ``nnet``, configured by the command line: the
    ``--optimization.*`` flags and Kaldi's CachingOptimizingCompilerOptions
    (``args.cache_capacity``, ``args.use_shortcut``; nnet3-train spells them
    ``--compiler.cache-capacity``, ``--compiler.use-shortcut``)."""
    from ..cache import CachingCompiler

    return CachingCompiler(nnet, optimize=optimize_options_from_args(args),
                           capacity=args.cache_capacity, use_shortcut=args.use_shortcut)


def add_decoding_option_groups(s: argparse.ArgumentParser) -> None:
    """The option groups that end the options of nnet3-compute and
    nnet3-xvector-compute alike: CUDA device options, the standard options and
    ``--optimization.*``."""
    add_cuda_device_options(s)
    add_standard_options(s)
    add_optimize_flags(s)


def _bool_options(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions if action.type is kaldi_bool
            for opt in action.option_strings}


def _normalize(arg: str) -> tuple[str, str | None]:
    """``(--normalized-name, value or None)`` of a ``--name[=value]`` argument."""
    key, eq, value = arg[2:].partition("=")
    return "--" + key.replace("_", "-").lower(), (value if eq else None)


def _config_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise KaldiOptionError(f"cannot open config file {path!r}: {e.strerror or e}") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.startswith("--"):
            raise KaldiOptionError(f"reading config file {path!r}: line {number} does not "
                                   "look like a line from a Kaldi command-line program's "
                                   "config file: should be of the form --x=y")
        out.append(line)
    return out


def kaldi_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` (the command first) rewritten as Kaldi's ParseOptions reads it: the
    lines of each ``--config=FILE`` first (the command line then overrides them, as
    Kaldi reads config files before the command line), option names normalized,
    bare boolean options made ``=true``. Options stop at a lone ``--``, which is
    kept; everything else is unchanged."""
    bools = _bool_options(parser)
    command, rest = argv[0], list(argv[1:])
    end = rest.index("--") if "--" in rest else len(rest)
    config: list[str] = []
    out: list[str] = []
    for i, arg in enumerate(rest):
        if i >= end or not arg.startswith("--") or arg == "--":
            out.append(arg)
            continue
        key, value = _normalize(arg)
        if key == "--config" and value is not None:
            config += [_rewrite(line, bools) for line in _config_lines(value)]
        out.append(_rewrite(arg, bools))
    return [command] + config + out


def _rewrite(arg: str, bools: set[str]) -> str:
    key, value = _normalize(arg)
    if value is None:
        return key + "=true" if key in bools else key
    return f"{key}={value}"


__all__ = ["KALDI_STYLE_COMMANDS", "KaldiOptionError", "add_binary_option",
           "add_cuda_device_options", "add_debug_options", "add_decoding_option_groups",
           "add_optimize_flags", "add_standard_options", "bool_option",
           "caching_compiler_from_args", "kaldi_argv", "kaldi_bool", "kaldi_log",
           "optimize_options_from_args"]
