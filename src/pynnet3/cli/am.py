"""``pynnet3 am-info`` and ``pynnet3 am-copy``: Kaldi's nnet3-am-info and
nnet3-am-copy for acoustic models (``final.mdl``: transition model, network,
priors). ``-`` is stdin / stdout."""

from __future__ import annotations

import sys

from ..am import AcousticModel
from .files import read_model_bytes, write_model


def read_am_file(path: str) -> AcousticModel:
    """An acoustic model, text or binary, from the rxfilename ``path`` (a file,
    stdin for ``-``, ``"command |"``), gzip-compressed or not."""
    return AcousticModel.from_bytes(*read_model_bytes(path))


def _cmd_am_info(args) -> int:
    sys.stdout.write(read_am_file(args.model).info())
    return 0


def _cmd_am_copy(args) -> int:
    am = read_am_file(args.input)
    write_model(am.nnet, args.output, args.binary, None if args.raw else am)
    return 0


def add_am_commands(sub, command, kaldi_bool) -> None:
    """Add ``am-info`` and ``am-copy`` to the subparsers ``sub`` (``command`` makes
    one, as main.py's ``_command``)."""
    s = command(sub, "am-info", "print an acoustic model's transition model, priors and "
                "network (like nnet3-am-info)",
                "Print a summary of an acoustic model (final.mdl): the transition model\n"
                "(phones, pdfs, transition states and transition-ids), the input and\n"
                "iVector dims, the left/right context, the priors (dim, sum, min, max),\n"
                "then the network as 'pynnet3 info' prints it.")
    s.add_argument("model", metavar="MODEL",
                   help="acoustic model: Kaldi final.mdl, text or binary (detected); "
                        "'-' reads stdin")
    s.set_defaults(fn=_cmd_am_info)

    s = command(sub, "am-copy", "copy an acoustic model, converting text/binary or "
                "extracting its network (like nnet3-am-copy)",
                "Read an acoustic model (final.mdl) and write it again, converting between\n"
                "text and binary, as Kaldi's nnet3-am-copy does. With --raw=true write\n"
                "only its network, a raw nnet3 model.")
    s.add_argument("input", metavar="IN",
                   help="acoustic model to read: Kaldi final.mdl, text or binary "
                        "(detected); '-' reads stdin")
    s.add_argument("output", metavar="OUT", help="where to write it; '-' writes stdout")
    s.add_argument("--binary", type=kaldi_bool, default=True, metavar="true|false",
                   help="write Kaldi's binary (true) or text (false) format (default: true)")
    s.add_argument("--raw", type=kaldi_bool, default=False, metavar="true|false",
                   help="write only the network, as a raw nnet3 model (default: false)")
    s.set_defaults(fn=_cmd_am_copy)
