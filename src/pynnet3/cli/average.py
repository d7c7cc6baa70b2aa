"""``pynnet3 average``: Kaldi's nnet3-average (the weighted average of several models'
parameters and statistics, e.g. of the models independent training jobs wrote)."""

from __future__ import annotations

from .kaldi_options import add_binary_option, add_standard_options, kaldi_log


def _cmd_average(args) -> int:
    from ..train.average import average_nnets, kaldi_weights
    from .files import read_model_or_am, write_model
    from .usage import UsageError

    if len(args.models) < 2:
        raise UsageError("pynnet3 average", "give at least one model to read and the model to "
                         "write", see_help=True)
    inputs, out = args.models[:-1], args.models[-1]
    _, total = kaldi_weights(args.weights, len(inputs))
    if total is not None and abs(total - 1.0) > 0.01:  # (Kaldi's GetWeights threshold)
        kaldi_log("average", "WARNING", f"Normalizing weights to sum to one, sum was "
                                        f"{total:.6g}")
    read = [read_model_or_am(path) for path in inputs]
    nnets = [nnet for nnet, _ in read]
    # (an acoustic model first: the average is one, with its transition model and priors)
    write_model(average_nnets(nnets, args.weights), out, args.binary, read[0][1])
    kaldi_log("average", "LOG", f"Averaged parameters of {len(inputs)} neural nets, and wrote "
                                f"to {out}")
    return 0


def add_average_command(sub, command) -> None:
    """Add ``average`` to the subparsers ``sub`` (``command`` makes one, as main.py's
    ``_command``)."""
    s = command(sub, "average", "average the parameters of several models (like "
                "nnet3-average)",
                "Average the parameters of several models with the same structure, as\n"
                "Kaldi's nnet3-average does: updatable parameters and component\n"
                "statistics (nonlinearity stats, BatchNorm counts and sums, so its mean and\n"
                "variance are count-weighted averages) are summed with the weights;\n"
                "options and learning rates are the first model's. The last argument is\n"
                "the output, written atomically; when the first model is an acoustic model\n"
                "(final.mdl) the output is one, with its transition model and priors.",
                usage="pynnet3 average [-h] [--binary=true|false] [--weights=W1:W2:...] [options] "
                      "MODEL1 [MODEL2 ...] OUT")
    s.add_argument("models", nargs="+", metavar="MODEL",
                   help="models to average (Kaldi nnet3, text or binary, gzipped or not), "
                        "then the model to write ('-': stdout)")
    add_binary_option(s)
    s.add_argument("--weights", default="", metavar="W1:W2:...",
                   help="colon-separated weights, one per input model, normalized to sum "
                        "to one (default: equal weights)")
    s.add_argument("--num-threads", dest="num_threads", type=int, default=-1, metavar="INT",
                   help="accepted for Kaldi compatibility (Kaldi's threads that read the "
                        "models; pynnet3 reads them in turn) (default: -1)")
    add_standard_options(s)
    s.set_defaults(fn=_cmd_average)
