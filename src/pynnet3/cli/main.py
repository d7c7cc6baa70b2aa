"""The ``pynnet3`` command line, mirroring Kaldi's nnet3 tools.

``pynnet3 info MODEL``                      like nnet3-info
``pynnet3 init CONFIG OUT [--binary=...]``  like nnet3-init
``pynnet3 copy IN OUT [--binary=...]``      like nnet3-copy
``pynnet3 show-computation MODEL --request REQ.json [--optimize=true|false] [--report]
   [--check=true] [--optimization.<option>=...]``
``pynnet3 demo``                            compile and run the bundled TDNN-F example

Flags are spelled as Kaldi spells them (``--binary=false``). Errors from bad
input are printed as one line naming the file and place, with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields

from ..errors import FormatError, PynnetError
from ..runtime.allocator import tune_malloc


def kaldi_bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "t", "1", "yes"):
        return True
    if low in ("false", "f", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _cmd_info(args) -> int:
    from ..nnet import read_nnet

    sys.stdout.write(read_nnet(args.model).info())
    return 0


def _cmd_init(args) -> int:
    from pathlib import Path

    from ..nnet import Nnet

    text = Path(args.config).read_text()
    nnet = Nnet.from_config(text, seed=args.srand, source=args.config)
    nnet.write(args.out, binary=args.binary)
    return 0


def _cmd_copy(args) -> int:
    from ..nnet import read_nnet

    nnet = read_nnet(args.input)
    if args.set_test_mode is not None:
        nnet.set_test_mode(args.set_test_mode)
    nnet.write(args.output, binary=args.binary)
    return 0


def _cmd_show(args) -> int:
    from .. import ComputationRequest, OptimizeReport, compile
    from ..nnet import read_nnet

    nnet = read_nnet(args.model)
    with open(args.request) as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise FormatError(f"not valid JSON: {e.msg}", args.request, line=e.lineno) from None
    if not isinstance(obj, dict):
        raise FormatError("a request must be a JSON object", args.request)
    req = ComputationRequest.from_json(obj)
    report = OptimizeReport() if args.report else None
    options = optimize_options_from_args(args) if args.optimize else False
    if report is not None:  # the per-pass report needs the plain pipeline
        comp = compile(nnet, req, optimize=options, report=report, check=args.check)
    else:  # through the compile cache, as a program that compiles many requests would
        from ..cache import CachingCompiler

        comp = CachingCompiler(nnet, optimize=options, use_shortcut=args.use_shortcut,
                               check=args.check).compile(req)
    sys.stdout.write(str(req) + "\n")
    sys.stdout.write(str(comp))
    sys.stdout.write("# stats: " + json.dumps(comp.stats()) + "\n")
    if report is not None:
        sys.stdout.write("# optimization report (sizes after each pass)\n")
        sys.stdout.write(str(report) + "\n")
    return 0


def add_optimize_flags(s: argparse.ArgumentParser) -> None:
    """Kaldi's ``--optimization.<option>`` flags, one per OptimizeOptions field."""
    from ..optimize import OptimizeOptions

    g = s.add_argument_group("optimization options (Kaldi's NnetOptimizeOptions)")
    for f in fields(OptimizeOptions):
        flag = "--optimization." + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            g.add_argument(flag, dest="opt_" + f.name, type=kaldi_bool, default=None,
                           metavar="true|false")
        else:
            g.add_argument(flag, dest="opt_" + f.name, type=int, default=None, metavar="INT")


def optimize_options_from_args(args):
    from ..optimize import OptimizeOptions

    given = {f.name: getattr(args, "opt_" + f.name) for f in fields(OptimizeOptions)
             if getattr(args, "opt_" + f.name, None) is not None}
    return OptimizeOptions(**given)


def _cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(seed=args.seed)


class UsageError(Exception):
    """A bad command line (unknown flag, bad flag value, missing argument)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 1 (as Kaldi's tools)."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pynnet3", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="print nodes, components, dims, context (nnet3-info)")
    s.add_argument("model")
    s.set_defaults(fn=_cmd_info)

    s = sub.add_parser("init", help="initialize a network from a config (nnet3-init)")
    s.add_argument("config")
    s.add_argument("out")
    s.add_argument("--binary", type=kaldi_bool, default=True, metavar="true|false")
    s.add_argument("--srand", type=int, default=0, help="random seed for initialization")
    s.set_defaults(fn=_cmd_init)

    s = sub.add_parser("copy", help="copy a model, converting text/binary (nnet3-copy)")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("--binary", type=kaldi_bool, default=True, metavar="true|false")
    s.add_argument("--set-test-mode", dest="set_test_mode", type=kaldi_bool, default=None,
                   metavar="true|false", help="set BatchNorm/dropout test mode")
    s.set_defaults(fn=_cmd_copy)

    s = sub.add_parser("show-computation", help="print the compiled computation and stats")
    s.add_argument("model")
    s.add_argument("--request", required=True, help="request.json (kaldi-reference format)")
    s.add_argument("--optimize", type=kaldi_bool, default=True, metavar="true|false")
    s.add_argument("--use-shortcut", dest="use_shortcut", type=kaldi_bool, default=True,
                   metavar="true|false",
                   help="compile N identical sequences as 2 and expand (Kaldi's shortcut)")
    s.add_argument("--report", action="store_true",
                   help="print commands, matrices and peak memory after each pass")
    s.add_argument("--check", type=kaldi_bool, default=False, metavar="true|false",
                   help="run the computation checker after compilation and every pass")
    add_optimize_flags(s)
    s.set_defaults(fn=_cmd_show)

    s = sub.add_parser("demo", help="compile and run the bundled TDNN-F example")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=_cmd_demo)
    return p


def entry_point() -> int:
    """The ``pynnet3`` console script: it owns its process, so it keeps freed
    memory for the next compile (pynnet3.runtime.allocator explains why a library
    does not) and then runs :func:`main`."""
    tune_malloc()
    return main()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        print(one_line(str(e)), file=sys.stderr)
        return 1
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
