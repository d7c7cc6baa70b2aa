"""``pynnet3 am-info`` and ``pynnet3 am-copy``: Kaldi's nnet3-am-info and
nnet3-am-copy for acoustic models (``final.mdl``: transition model, network,
priors). ``-`` is stdin / stdout."""

from __future__ import annotations

import sys

from ..am import AcousticModel
from .files import read_model_bytes, write_model
from .kaldi_options import add_binary_option, add_standard_options, bool_option, kaldi_log


def read_am_file(path: str) -> AcousticModel:
    """An acoustic model, text or binary, from the rxfilename ``path`` (a file,
    stdin for ``-``, ``"command |"``), gzip-compressed or not."""
    return AcousticModel.from_bytes(*read_model_bytes(path))


def _cmd_am_info(args) -> int:
    sys.stdout.write(read_am_file(args.model).info())
    return 0


def _cmd_am_copy(args) -> int:
    """nnet3-am-copy's order: --set-raw-nnet, --nnet-config,
    --convert-repeated-to-block, --learning-rate, --edits-config, --edits, the context
    recomputed (AmNnetSimple::SetContext), --scale, --prepare-for-test. The edits are
    parsed before the model is read, so a bad one fails before any work."""
    from .editing import Editing
    from .files import read_model
    from .network import prepared_for_test

    editing = Editing(args, "am-copy")
    am = read_am_file(args.input)
    if args.set_raw_nnet:
        am.nnet = read_model(args.set_raw_nnet)
        if am.priors.size and am.priors.size != am.num_pdfs:  # (as AmNnetSimple::SetNnet)
            kaldi_log("am-copy", "WARNING", "Removing priors since there is a dimension "
                      f"mismatch after changing the nnet: {am.priors.size} vs. {am.num_pdfs}")
            am.priors = am.priors[:0]
    nnet = am.nnet
    editing.add_nnet_config(nnet)
    if args.convert_repeated_to_block:
        from ..edits import convert_repeated_to_block

        convert_repeated_to_block(nnet)
    editing.set_learning_rate(nnet)
    editing.apply_edits(nnet)
    # (AmNnetSimple::Read and SetContext: the context is the network's, whatever the
    # file said)
    am.left_context, am.right_context = nnet.context()
    editing.scale_network(nnet)
    write_model(prepared_for_test(nnet, args), args.output, args.binary,
                None if args.raw else am)
    return 0


def add_am_commands(sub, command) -> None:
    """Add ``am-info`` and ``am-copy`` to the subparsers ``sub`` (``command`` makes
    one, as main.py's ``_command``)."""
    from .editing import add_editing_flags
    from .network import add_prepare_for_test_flags

    s = command(sub, "am-info", "print an acoustic model's transition model, priors and "
                "network (like nnet3-am-info)",
                "Print a summary of an acoustic model (final.mdl): the transition model\n"
                "(phones, pdfs, transition states and transition-ids), the input and\n"
                "iVector dims, the left/right context, the priors (dim, sum, min, max),\n"
                "then the network as 'pynnet3 info' prints it.",
                usage="pynnet3 am-info [options] MODEL")
    s.add_argument("model", metavar="MODEL",
                   help="acoustic model: Kaldi final.mdl, text or binary (detected); "
                        "'-' reads stdin")
    add_standard_options(s)
    s.set_defaults(fn=_cmd_am_info)

    s = command(sub, "am-copy", "copy an acoustic model, converting text/binary, editing "
                "it or extracting its network (like nnet3-am-copy)",
                "Read an acoustic model (final.mdl) and write it again, converting between\n"
                "text and binary, as Kaldi's nnet3-am-copy does. On the way, in this\n"
                "order: --set-raw-nnet replaces its network, --nnet-config adds or\n"
                "replaces nodes and components, --convert-repeated-to-block,\n"
                "--learning-rate, --edits-config then --edits (the edit directives of\n"
                "'pynnet3 copy'), the left/right context is recomputed from the network,\n"
                "then --scale and --prepare-for-test. With --raw=true write only its\n"
                "network, a raw nnet3 model.",
                usage="pynnet3 am-copy [options] IN OUT")
    s.add_argument("input", metavar="IN",
                   help="acoustic model to read: Kaldi final.mdl, text or binary "
                        "(detected); '-' reads stdin")
    s.add_argument("output", metavar="OUT", help="where to write it; '-' writes stdout")
    add_binary_option(s)
    bool_option(s, "--raw", False, "write only the network, as a raw nnet3 model (default: false)")
    s.add_argument("--set-raw-nnet", dest="set_raw_nnet", default="", metavar="MODEL",
                   help="replace the network with this raw model (the priors are dropped, "
                        "with a warning, when its output dim differs) (default: none)")
    bool_option(s, "--convert-repeated-to-block", False,
                "turn every (NaturalGradient)RepeatedAffineComponent, also inside "
                "CompositeComponents, into the equal BlockAffineComponent (default: false)")
    add_editing_flags(s)
    add_prepare_for_test_flags(s)
    add_standard_options(s)
    s.set_defaults(fn=_cmd_am_copy)
