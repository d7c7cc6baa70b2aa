"""The pynnet3 command line, mirroring Kaldi's nnet3 tools (info, init, copy,
compute, xvector-compute, optimize-network, show-computation, demo). The help texts
live here, written for the terminal (:func:`build_parser`); flags are spelled as Kaldi
spells them (--binary=false).
Errors from bad input are printed as one line naming the file and place, with
exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..errors import PynnetError
from ..gcpause import pause_start_up, start_up_done
from ..runtime.allocator import tune_malloc
from .kaldi_options import (
    KALDI_STYLE_COMMANDS,
    KaldiOptionError,
    add_binary_option,
    add_optimize_flags,
    add_standard_options,
    bool_option,
    kaldi_argv,
    optimize_options_from_args,
)
from .usage import UsageError

# (.files, and NumPy and the network with it, load when a command runs: the console
# script pauses the garbage collector first, see entry_point)


def _cmd_info(args) -> int:
    from .files import read_model

    sys.stdout.write(read_model(args.model).info())
    return 0


def _cmd_init(args) -> int:
    """nnet3-init: CONFIG OUT, or EXISTING-MODEL CONFIG OUT (the config's lines add
    or replace nodes and components of the existing model)."""
    from ..nnet import Nnet
    from .files import read_config, read_model, write_model

    if args.existing is None:
        text, name = read_config(args.config)
        nnet = Nnet.from_config(text, seed=args.srand, source=name)
    else:
        import numpy as np

        nnet = read_model(args.existing)
        text, name = read_config(args.config)
        nnet.read_config(text, rng=np.random.default_rng(args.srand), source=name)
    write_model(nnet, args.out, args.binary)
    return 0


def _cmd_copy(args) -> int:
    """nnet3-copy's order: --nnet-config, --learning-rate, --scale, --edits-config,
    --edits, then BatchNorm's test mode (--batchnorm-test-mode, unless
    --prepare-for-test), --set-test-mode and --prepare-for-test. The edits are read and parsed
    before the model, so a bad one fails before any work."""
    from .editing import Editing
    from .files import read_model, write_model
    from .network import apply_set_test_mode, prepared_for_test

    editing = Editing(args, "copy")
    nnet = read_model(args.input)
    editing.add_nnet_config(nnet)
    editing.set_learning_rate(nnet)
    editing.scale_network(nnet)
    editing.apply_edits(nnet)
    if not args.prepare_for_test:
        # (as nnet3-copy: every copy sets BatchNorm's test mode, false by default)
        nnet.set_batchnorm_test_mode(args.batchnorm_test_mode)
    apply_set_test_mode(nnet, args)
    write_model(prepared_for_test(nnet, args), args.output, args.binary)
    return 0


def _cmd_show(args) -> int:
    from .. import ComputationRequest, OptimizeReport, compile
    from .files import STDIO, read_bytes, read_model

    if args.model == STDIO and args.request == STDIO:
        raise UsageError("pynnet3 show-computation",
                         "MODEL and --request cannot both be '-' (stdin)")
    nnet = read_model(args.model)
    net_report = None
    if args.network_optimize:
        from ..graphopt import NetworkReport, optimize_network
        from .network import network_options_from_args

        net_report = NetworkReport()
        nnet = optimize_network(nnet, network_options_from_args(args), report=net_report)
    req = ComputationRequest.from_json_text(*read_bytes(args.request))
    report = OptimizeReport() if args.report or args.report_plot else None
    options = optimize_options_from_args(args) if args.optimize else False
    if report is not None:  # the per-pass report needs the plain pipeline
        comp = compile(nnet, req, optimize=options, report=report, check=args.check)
    else:  # through the compile cache, as a program that compiles many requests would
        from ..cache import CachingCompiler

        comp = CachingCompiler(nnet, optimize=options, use_shortcut=args.use_shortcut,
                               check=args.check).compile(req)
    sys.stdout.write(str(req) + "\n")
    sys.stdout.write(str(comp))
    import json  # (loaded when used: compute never needs it)

    sys.stdout.write("# stats: " + json.dumps(comp.stats()) + "\n")
    from .draw import write_memory_plot, write_report_plot

    write_memory_plot(args, nnet, req, comp)
    write_report_plot(args, report, net_report)
    if net_report is not None:
        sys.stdout.write("# network optimizer report (rules applied, sizes after each pass)\n")
        sys.stdout.write(str(net_report) + "\n")
    if args.report:
        sys.stdout.write("# optimization report (sizes after each pass)\n")
        sys.stdout.write(str(report) + "\n")
    return 0


def _cmd_demo(args) -> int:
    from .demo import run_demo
    from .jobs import apply_num_threads

    apply_num_threads(args.num_threads)
    return run_demo(seed=args.seed)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 1 (as Kaldi's tools)."""

    def error(self, message: str):
        raise UsageError(self.prog, message, see_help=True)


_DESCRIPTION = """\
Compile, optimize and run Kaldi nnet3 networks. The commands mirror Kaldi's
nnet3 tools; flags are spelled as Kaldi spells them (--binary=false). Errors
from bad input are printed on one line naming the file and the place, with
exit status 1."""

_EPILOG = """\
Run 'pynnet3 COMMAND --help' for the arguments and options of a command.
Start with 'pynnet3 demo'."""

_REQUEST_HELP = """\
request file (JSON): {"inputs": [{"name": NODE, "indexes": [[n, t, x], ...],
"has_deriv": false}, ...], "outputs": [...], "need_model_derivative": false,
"store_component_stats": false}; input names are the network's input nodes,
output names its output nodes (docs/request-json.md in the source tree has the
full schema)"""


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, without loading shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's RawDescriptionHelpFormatter, the terminal's width found without
    shutil: argparse makes a formatter for every add_argument, and the default one
    imports shutil (a few ms of every command's start)."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _command(sub, name: str, summary: str, description: str,
             usage: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=summary, description=description, usage=usage,
                          formatter_class=_Formatter)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``pynnet3`` argument parser: every command, argument and option has a help
    text in plain words (no markup), defaults included. Given the name of a command,
    a parser with that command alone (what :func:`main` parses a command line with:
    it loads and builds only what the command needs); the full one when ``command``
    is None or names no command (its help lists them all; an unknown name is its
    error)."""
    from .. import __version__

    p = _Parser(prog="pynnet3", description=_DESCRIPTION, epilog=_EPILOG,
                formatter_class=_Formatter)
    p.add_argument("--version", action="version", version=f"pynnet3 {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           title="commands")
    adders = ([_COMMANDS[command]] if command in _COMMANDS
              else list(dict.fromkeys(_COMMANDS.values())))
    for module, adder in adders:
        add = (globals()[adder] if module is None
               else getattr(importlib.import_module(f".{module}", __package__), adder))
        add(sub, _command)
    return p



def _add_info(sub, command) -> None:
    s = command(sub, "info", "print a model's nodes, components, dims and context "
                "(like nnet3-info)",
                "Print a model's nodes, components, dimensions, left/right context and\n"
                "parameter count, as Kaldi's nnet3-info does.",
                usage="pynnet3 info [options] MODEL")
    s.add_argument("model", metavar="MODEL",
                   help="model file: Kaldi nnet3, text or binary (detected)")
    add_standard_options(s)
    s.set_defaults(fn=_cmd_info)


def _add_init(sub, command) -> None:
    s = command(sub, "init", "initialize a network from a config (like nnet3-init)",
                "Build a network from a Kaldi nnet3 config with randomly initialized\n"
                "parameters and write it, as Kaldi's nnet3-init does. Given an existing\n"
                "model first, the config's lines add or replace nodes and components of\n"
                "that model instead (nnet3-init 1.raw nnet.config 2.raw).",
                usage="pynnet3 init [options] [EXISTING-MODEL] CONFIG OUT")
    s.add_argument("existing", nargs="?", default=None, metavar="EXISTING-MODEL",
                   help="a model (Kaldi nnet3, text or binary) the config adds to "
                        "(default: none, a new network)")
    s.add_argument("config", metavar="CONFIG", help="config file (Kaldi nnet3 config lines)")
    s.add_argument("out", metavar="OUT", help="where to write the model")
    add_binary_option(s)
    s.add_argument("--srand", type=int, default=0, metavar="INT",
                   help="random seed for the initial parameters (pynnet3's generator: "
                        "the values differ from Kaldi's for the same seed) (default: 0)")
    add_standard_options(s)
    s.set_defaults(fn=_cmd_init)


def _add_copy(sub, command) -> None:
    from .editing import add_editing_flags
    from .network import add_prepare_for_test_flags, add_set_test_mode_flag

    s = command(sub, "copy", "copy a model, converting text/binary, editing it (like "
                "nnet3-copy)",
                "Read a model and write it again, converting between text and binary,\n"
                "as Kaldi's nnet3-copy does. On the way, in this order: --nnet-config\n"
                "adds or replaces nodes and components, --learning-rate and --scale\n"
                "change every component, --edits-config then --edits apply Kaldi's edit\n"
                "directives (one per line, or separated by ';'):\n"
                "  convert-to-fixed-affine [name=PATTERN]\n"
                "  remove-orphan-nodes [remove-orphan-inputs=true|false]\n"
                "  remove-orphan-components\n"
                "  remove-orphans [remove-orphan-inputs=true|false]\n"
                "  set-learning-rate [name=PATTERN] learning-rate=LR\n"
                "  set-learning-rate-factor [name=PATTERN] learning-rate-factor=F\n"
                "  rename-node old-name=NAME new-name=NAME\n"
                "  remove-output-nodes name=PATTERN\n"
                "  set-dropout-proportion [name=PATTERN] proportion=P\n"
                "  apply-svd name=PATTERN [bottleneck-dim=D] [energy-threshold=E]\n"
                "            [shrinkage-threshold=S]\n"
                "  reduce-rank name=PATTERN rank=R\n"
                "PATTERN matches component names (output node names for\n"
                "remove-output-nodes); '*' matches any characters, the default is '*'.\n"
                "Then --batchnorm-test-mode (unless --prepare-for-test),\n"
                "--set-test-mode and --prepare-for-test.",
                usage="pynnet3 copy [options] IN OUT")
    s.add_argument("input", metavar="IN",
                   help="model to read: Kaldi nnet3, text or binary (detected)")
    s.add_argument("output", metavar="OUT", help="where to write the model")
    add_binary_option(s)
    add_editing_flags(s)
    bool_option(s, "--batchnorm-test-mode", False,
                "as nnet3-copy: BatchNorm components' test mode is set to this value unless "
                "--prepare-for-test is given (default: false, as Kaldi's: a plain copy puts "
                "BatchNorm in training mode)")
    add_set_test_mode_flag(s, "switch BatchNorm and dropout components to test mode (true) "
                              "or training mode (false), after --batchnorm-test-mode "
                              "(default: leave them as they are)")
    add_prepare_for_test_flags(s)
    add_standard_options(s)
    s.set_defaults(fn=_cmd_copy)


def _add_optimize_network(sub, command) -> None:
    from .network import add_network_flags, add_set_test_mode_flag, cmd_optimize_network

    s = command(sub, "optimize-network", "rewrite a model into an equivalent, faster one",
                "Run the network optimizer (pruning, constant folding, arithmetic\n"
                "simplification, parameter fusion, fusion) on a model and write the\n"
                "result, a model Kaldi reads. Outputs stay equal up to float rounding\n"
                "(with --keep-derivatives=true input derivatives too). --report prints\n"
                "the rules applied and the sizes after each pass on stderr.")
    s.add_argument("input", metavar="IN",
                   help="model to read: Kaldi nnet3, text or binary (detected)")
    s.add_argument("output", metavar="OUT", help="where to write the optimized model")
    add_binary_option(s)
    add_set_test_mode_flag(s)
    s.add_argument("--preserve", default="", metavar="NODE[,NODE...]",
                   help="nodes that must keep their names and values (output nodes always "
                        "do) (default: none)")
    s.add_argument("--report", action="store_true",
                   help="print the rules applied and the sizes after each pass on stderr")
    add_network_flags(s)
    s.set_defaults(fn=cmd_optimize_network)


def _add_show(sub, command) -> None:
    from .draw import add_memory_plot_flags
    from .network import add_network_flags

    s = command(sub, "show-computation", "print the compiled computation and its stats",
                "Compile a request for a model and print the request, the computation\n"
                "(Kaldi-style listing of its commands) and its statistics: commands,\n"
                "matrices, peak memory. With --report, also the sizes after every\n"
                "optimizer pass.",
                usage="pynnet3 show-computation [-h] MODEL --request REQUEST.json [options]\n"
                      "                                [--optimization.OPTION=VALUE ...]")
    s.add_argument("model", metavar="MODEL",
                   help="model file: Kaldi nnet3, text or binary (detected)")
    s.add_argument("--request", required=True, metavar="REQUEST.json", help=_REQUEST_HELP)
    bool_option(s, "--optimize", True, "run the optimizer (default: true)")
    bool_option(s, "--use-shortcut", True,
                "compile N identically shaped sequences as 2 and expand the result, as Kaldi's "
                "shortcut compilation (default: true)")
    s.add_argument("--report", action="store_true",
                   help="also print commands, matrices and peak memory after each "
                        "optimizer pass")
    bool_option(s, "--check", False,
                "run the computation checker after compiling and after every pass (default: false)")
    bool_option(s, "--network-optimize", False,
                "run the network optimizer on the model first and print its rule-by-rule report "
                "(default: false)")
    add_memory_plot_flags(s)
    add_optimize_flags(s)
    add_network_flags(s)
    s.set_defaults(fn=_cmd_show)


def _add_demo(sub, command) -> None:
    s = command(sub, "demo", "compile and run the bundled TDNN-F example",
                "Build the bundled TDNN-F network (examples/tdnnf.config in the package),\n"
                "compile and run a 150-frame decode request and an 8-sequence training\n"
                "request, and print commands, matrices, peak memory, compile and run time.")
    s.add_argument("--seed", type=int, default=0, metavar="INT",
                   help="random seed for the parameters and the features (default: 0)")
    from .jobs import add_thread_flag

    add_thread_flag(s)
    s.set_defaults(fn=_cmd_demo)


# Each command: the cli module that adds it (None: this one) and the function adding
# it to the subparsers, in the order --help lists them (a function that adds two
# commands is named for both, and runs once).
_COMMANDS: dict[str, tuple[str | None, str]] = {
    "info": (None, "_add_info"),
    "init": (None, "_add_init"),
    "copy": (None, "_add_copy"),
    "optimize-network": (None, "_add_optimize_network"),
    "show-computation": (None, "_add_show"),
    "am-info": ("am", "add_am_commands"),
    "am-copy": ("am", "add_am_commands"),
    "compute": ("compute", "add_compute_command"),
    "xvector-compute": ("xvector", "add_xvector_command"),
    "export": ("export", "add_export_command"),
    "merge-egs": ("egs", "add_egs_commands"),
    "train": ("train", "add_train_command"),
    "average": ("average", "add_average_command"),
    "demo": (None, "_add_demo"),
    "draw": ("draw", "add_draw_command"),
}


def entry_point() -> int:
    """The ``pynnet3`` console script: it owns its process, so it keeps freed
    memory for the next compile (pynnet3.runtime.allocator explains why a library
    does not) and pauses the garbage collector for the command's start-up
    (pynnet3.gcpause: a decoding command ends the pause once its model is ready,
    the others once their arguments are parsed), and then runs :func:`main`; a
    decoding command then ends the process at once (:func:`_exit_without_teardown`)."""
    pause_start_up()
    tune_malloc()
    try:
        status = main()
    finally:
        start_up_done()  # (a command that stopped before its start-up was done)
    if _RAN.get("command") in _EXIT_AT_ONCE:
        _exit_without_teardown(status)
    return status


# Commands whose process ends without the interpreter's teardown: their outputs are
# written, renamed and closed when main() returns, and tearing down the modules and
# the network, computations and buffers they hold takes ~25 ms (a tenth of
# nnet3-compute's whole run over 12k frames).
_EXIT_AT_ONCE = ("compute", "xvector-compute")
# Commands that end the console script's start-up pause of the garbage collector
# themselves (pynnet3.gcpause.start_up_done), once their model is read and prepared.
_PAUSED_START_UP = ("compute", "xvector-compute")
_RAN: dict[str, str] = {}  # (main() notes the command it ran)


def _exit_without_teardown(status: int) -> None:
    """``os._exit(status)`` after flushing stdout and stderr, when nothing else is
    owed to the process's end: no atexit callback (coverage, logging, Ray, weakref
    finalizers register one), no other thread, and no profiler or tracer running
    (``python -m cProfile -m pynnet3.cli.main ...`` writes its statistics after the
    program). Otherwise returns (a normal exit)."""
    import atexit
    import threading

    if (getattr(atexit, "_ncallbacks", lambda: 1)() or threading.active_count() > 1
            or sys.getprofile() is not None or sys.gettrace() is not None):
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # (None: the descriptor was closed at start)
                stream.flush()
    except (OSError, ValueError, AttributeError):  # (a closed or broken stream, or
        return  # one without flush: exit the usual way)
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit status. A
    bad command line (the parser's, or a command's own: :class:`UsageError`) and a
    command's error from bad input are one line on stderr and status 1."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        args = _parse(argv)
        _RAN["command"] = args.command
        if args.command not in _PAUSED_START_UP:
            start_up_done()  # (the collector back on, if the console script paused it)
        return _run(args)
    except UsageError as e:
        print(one_line(str(e)), file=sys.stderr)
        return 1


def _parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by the parser of the command it names (Kaldi's conventions for
    the commands that follow them)."""
    parser = build_parser(argv[0] if argv else None)
    if argv and argv[0] in KALDI_STYLE_COMMANDS:  # (Kaldi's option conventions)
        sub = parser._subparsers._group_actions[0].choices[argv[0]]
        try:
            argv = kaldi_argv(sub, argv)
        except KaldiOptionError as e:
            raise UsageError(f"pynnet3 {argv[0]}", str(e)) from None
    return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status. A pynnet3 error or an OSError is one
    line naming the command, status 1; a reader that went away ends it quietly."""
    try:
        return args.fn(args)
    except BrokenPipeError:
        # The reader went away (``pynnet3 show-computation ... | head``): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (PynnetError, OSError) as e:
        print(f"pynnet3 {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        return 1


def one_line(message: str) -> str:
    """Error messages may carry the offending config line on a second line;
    the command line prints them on one."""
    return " | ".join(part.strip() for part in message.splitlines() if part.strip())


if __name__ == "__main__":
    sys.exit(entry_point())
